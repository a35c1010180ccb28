//! [`Token`]: a bearer token, resolved, never printed, compared in constant time.

use std::fmt;

/// A bearer token (a configuration resolves it from `env:`/`file:`); never printed.
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

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn a_token_matches_only_the_whole_string() {
        let secret = Token(b"secret".to_vec());
        assert!(secret.matches(b"secret"));
        assert!(!secret.matches(b"secreT"));
        assert!(!secret.matches(b"secret2"));
        assert!(!secret.matches(b"secre"));
        assert!(!Token(Vec::new()).matches(b"x"));
        assert!(Token(Vec::new()).matches(b""));
    }

    #[test]
    fn any_of_several_tokens_matches() {
        let tokens = [Token(b"old".to_vec()), Token(b"new".to_vec())];
        assert!(Token::any_matches(&tokens, b"old"));
        assert!(Token::any_matches(&tokens, b"new"));
        assert!(!Token::any_matches(&tokens, b"other"));
        assert!(!Token::any_matches(&[], b""));
    }
}
