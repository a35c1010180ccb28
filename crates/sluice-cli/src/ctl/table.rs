//! Plain-text tables: a header row, columns as wide as their widest cell, two spaces apart.

/// Where a column's cells sit: text to the left, numbers to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A table built row by row, then rendered at once (widths need every row).
#[derive(Debug)]
pub(crate) struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column headers.
    pub(crate) fn new(columns: &[(&'static str, Align)]) -> Self {
        Self {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; control characters in cells are escaped (names come from the network).
    pub(crate) fn row<const N: usize>(&mut self, cells: [String; N]) {
        debug_assert_eq!(N, self.columns.len());
        self.rows.push(cells.iter().map(|c| printable(c)).collect());
    }

    /// Appends the header and the rows to `out`, each line starting with `indent`.
    pub(crate) fn render(&self, indent: &str, out: &mut String) {
        let header: Vec<String> = self.columns.iter().map(|(h, _)| h.to_string()).collect();
        let widths = self.widths(&header);
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::from(indent);
            for ((cell, width), (_, align)) in row.iter().zip(&widths).zip(&self.columns) {
                let pad = " ".repeat(width - cell.chars().count());
                match align {
                    Align::Left => line.extend([cell.as_str(), &pad, "  "]),
                    Align::Right => line.extend([pad.as_str(), cell, "  "]),
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }

    fn widths(&self, header: &[String]) -> Vec<usize> {
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        widths
    }
}

/// `s` with control characters escaped, so that a name cannot move the cursor or recolour
/// the terminal.
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = Table::new(&[("NAME", Align::Left), ("IDLE", Align::Right)]);
        t.row(["default".into(), "3".into()]);
        t.row(["b".into(), "12345".into()]);
        let mut out = String::new();
        t.render("  ", &mut out);
        assert_eq!(
            out,
            "  NAME      IDLE\n  default      3\n  b        12345\n"
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("a\u{1b}[31mb\n"), "a\\u{1b}[31mb\\n");
    }
}
