//! How a service splits its declared capacity across the nodes it reaches
//! (`protocol/README.md`, "The split", normative so that every SDK agrees; the vectors'
//! `splits` and `fleet.json` hold them to it): a node's floor of one session counts only where
//! it asks this instance for it (`FLOOR`), the rest goes by demand, and step 5 moves a session
//! only when that brings the targets nearer the quotas.

/// What the instance knows of one node when it plans.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeView {
    /// The link is up and the node has not said `DRAINING` (or it has no control links).
    pub live: bool,
    /// The smoothed demand.
    pub demand: f64,
    /// Sessions held there (registered or being dialed) less those asked to retire.
    pub held: usize,
    /// The node asks this instance for its floor of one session (its last `FLOOR`, or none).
    pub floor: bool,
}

/// The targets, and whether step 5 moved a session (`moves`: whether it may; not while it
/// is held after a move). `quiet` (no live node's last sample was above 0) leaves the split
/// as it is: step 5 gives only to a node owed its floor that holds none, and step 4 gives
/// to such a node first.
pub fn targets(
    capacity: usize,
    nodes: &[NodeView],
    moves: bool,
    quiet: bool,
) -> (Vec<usize>, bool) {
    let q = quotas(capacity, nodes);
    // Step 2: start from what is held, and nothing where the node is not live.
    let mut t: Vec<usize> = nodes
        .iter()
        .map(|n| if n.live { n.held } else { 0 })
        .collect();
    let live: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].live).collect();
    let floors = live.iter().filter(|&&i| nodes[i].floor).count();
    let owed: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| nodes[i].floor && capacity >= floors)
        .collect();
    // While quiet, the nodes owed their floor that hold none.
    let bare = |t: &[usize]| -> Vec<usize> {
        if quiet {
            owed.iter().copied().filter(|&i| t[i] == 0).collect()
        } else {
            Vec::new()
        }
    };
    let over = |t: &[usize], i: usize| t[i] as f64 - q[i];
    let holding = |t: &[usize]| (0..t.len()).filter(|&i| t[i] > 0).collect::<Vec<_>>();
    // Step 3.
    while t.iter().sum::<usize>() > capacity {
        let Some(j) = first_max(holding(&t), |i| over(&t, i)) else {
            break;
        };
        t[j] -= 1;
    }
    // Step 4.
    while t.iter().sum::<usize>() < capacity {
        let first = bare(&t);
        let takers = if first.is_empty() { &live } else { &first };
        let Some(i) = first_max(takers.iter().copied(), |i| -over(&t, i)) else {
            break;
        };
        t[i] += 1;
    }
    // Step 5, unless it is held.
    let moved = moves && step_5(&mut t, &q, |t| if quiet { bare(t) } else { live.clone() });
    (t, moved)
}

/// Step 5: moves one session at a time from the node most over its quota to the taker
/// (a live node, or while quiet a bare one) most under it, while the two deviations sum
/// above one. Such a move shrinks the sum of `|t - q|`, and the move back would need the
/// opposite, so none comes back while the quotas hold still. Returns whether it moved any.
fn step_5(t: &mut [usize], q: &[f64], takers: impl Fn(&[usize]) -> Vec<usize>) -> bool {
    let mut moved = false;
    loop {
        let over = |t: &[usize], i: usize| t[i] as f64 - q[i];
        let short = first_max(takers(t), |i| -over(t, i));
        let long = first_max((0..t.len()).filter(|&i| t[i] > 0), |i| over(t, i));
        match (short, long) {
            (Some(i), Some(j)) if over(t, j) - over(t, i) > 1.0 => {
                t[i] += 1;
                t[j] -= 1;
                moved = true;
            }
            _ => return moved,
        }
    }
}

/// Step 1, each node's real share: a base of one on each live node that asks for its floor
/// (while the capacity covers them all), the rest among all live nodes by demand (evenly
/// without any), computed as the protocol writes it so that ties fall alike in every SDK.
fn quotas(capacity: usize, nodes: &[NodeView]) -> Vec<f64> {
    let live = nodes.iter().filter(|n| n.live).count();
    if live == 0 {
        return vec![0.0; nodes.len()];
    }
    let floors = nodes.iter().filter(|n| n.live && n.floor).count();
    let base = usize::from(capacity >= floors);
    let rest = (capacity - base * floors) as f64;
    let total: f64 = nodes
        .iter()
        .filter(|n| n.live)
        .map(|n| n.demand.max(0.0))
        .sum();
    nodes
        .iter()
        .map(|n| {
            if !n.live {
                return 0.0;
            }
            let base = if n.floor { base as f64 } else { 0.0 };
            if total > 0.0 {
                base + (rest * n.demand.max(0.0)) / total
            } else {
                base + rest / live as f64
            }
        })
        .collect()
}

/// The first index with the largest key.
fn first_max(
    indices: impl IntoIterator<Item = usize>,
    key: impl Fn(usize) -> f64,
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for i in indices {
        let k = key(i);
        if best.is_none_or(|(_, b)| k > b) {
            best = Some((i, k));
        }
    }
    best.map(|(i, _)| i)
}

/// The next smoothed demand after a sample: half way from the last value to the sample, or
/// the sample itself when there was none.
pub fn smooth(last: Option<f64>, sample: f64) -> f64 {
    match last {
        Some(d) => d + (sample - d) / 2.0,
        None => sample,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn view(n: &crate::vectors::SplitNode) -> NodeView {
        NodeView {
            live: n.live,
            demand: n.demand,
            held: n.held,
            floor: n.floor,
        }
    }

    #[test]
    fn the_split_vectors_give_their_targets() {
        let v = crate::vectors::load().unwrap();
        assert!(v.splits.iter().any(|c| c.nodes.iter().any(|n| !n.floor)));
        for case in &v.splits {
            let nodes: Vec<NodeView> = case.nodes.iter().map(view).collect();
            let (t, _) = targets(case.capacity, &nodes, true, case.quiet);
            assert_eq!(t, case.targets, "{}", case.name);
        }
    }

    #[test]
    fn the_sum_is_the_capacity_and_never_more() {
        let node = |demand, held, floor| NodeView {
            live: true,
            demand,
            held,
            floor,
        };
        for capacity in 0..40 {
            let nodes = [node(3.0, 7, true), node(0.0, 9, false), node(11.0, 1, true)];
            let (t, _) = targets(capacity, &nodes, true, false);
            assert_eq!(t.iter().sum::<usize>(), capacity, "{capacity}: {t:?}");
        }
    }

    #[test]
    fn a_held_step_5_moves_nothing_but_steps_1_to_4_still_run() {
        let node = |demand, held| NodeView {
            live: true,
            demand,
            held,
            floor: true,
        };
        let shifted = [node(2.0, 2), node(2.0, 2), node(30.0, 2)];
        assert_eq!(targets(6, &shifted, true, false), (vec![1, 1, 4], true));
        assert_eq!(targets(6, &shifted, false, false), (vec![2, 2, 2], false));
        // A node down is no move of step 5: its share goes to the others all the same.
        let down = [
            NodeView {
                live: false,
                ..node(2.0, 2)
            },
            node(2.0, 2),
            node(2.0, 2),
        ];
        assert_eq!(targets(6, &down, false, false), (vec![0, 3, 3], false));
    }

    #[test]
    fn smoothing_goes_half_way() {
        assert_eq!(smooth(None, 8.0), 8.0);
        assert_eq!(smooth(Some(8.0), 0.0), 4.0);
    }
}
