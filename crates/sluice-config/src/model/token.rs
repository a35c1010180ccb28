//! [`Token`]: a bearer token, resolved, never printed, compared in constant time.

use std::fmt;

/// A bearer token, already resolved from `env:`/`file:`; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub Vec<u8>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

impl Token {
    /// Whether `given` is this token, in time that depends only on the longer length (so a
    /// guess learns nothing from how long the comparison took).
    pub fn matches(&self, given: &[u8]) -> bool {
        let len = self.0.len().max(given.len());
        let mut diff = u8::from(self.0.len() != given.len());
        for i in 0..len {
            diff |= self.0.get(i).copied().unwrap_or(0) ^ given.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }

    /// Whether `given` is one of `tokens`. Every token is compared in full, so the time taken
    /// does not say which one (or how much of one) matched; no tokens match nothing.
    pub fn any_matches(tokens: &[Token], given: &[u8]) -> bool {
        tokens.iter().fold(false, |ok, t| ok | t.matches(given))
    }
}
