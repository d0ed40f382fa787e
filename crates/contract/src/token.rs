//! The cluster's token of Ray's token authentication (`RAY_AUTH_MODE=token`):
//! what the host checks on every request and the client proxy on every
//! call, and what both present to Ray's servers.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq;

/// How a token is presented in `Authorization` (HTTP) and in the
/// `authorization` gRPC metadata: Ray accepts exactly this prefix, with
/// this case.
pub const BEARER: &str = "Bearer ";

/// The cluster's token. Never empty (Ray has no empty tokens); its `Debug`
/// form does not show it, and it is compared in constant time.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token; `None` when `secret` is empty.
    pub fn new(secret: &str) -> Option<Token> {
        (!secret.is_empty()).then(|| Token(Arc::from(secret)))
    }

    /// `Bearer <token>`, the value of `Authorization` (HTTP) and of the
    /// `authorization` gRPC metadata Ray's servers check.
    pub fn bearer(&self) -> String {
        format!("{BEARER}{}", self.0)
    }

    /// The secret itself, for where it must be written out whole (the web
    /// UI's cookie); never for a log.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `value` (of `Authorization` or the like) is exactly
    /// `Bearer <this token>`.
    pub fn accepts(&self, value: &[u8]) -> bool {
        value
            .strip_prefix(BEARER.as_bytes())
            .is_some_and(|given| self.matches(given))
    }

    /// Whether `given` is this token. Compared in constant time for a given
    /// length, so response times do not tell how much of a guess was
    /// right; a guess of another length is refused at once, which tells
    /// only the length.
    pub fn matches(&self, given: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(given).into()
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for Token {}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::new("s3cret").expect("non-empty")
    }

    #[test]
    fn an_empty_token_is_none() {
        assert!(Token::new("").is_none());
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        assert_eq!(format!("{:?}", token()), "Token(<redacted>)");
        assert_eq!(format!("{:?}", Some(token())), "Some(Token(<redacted>))");
    }

    #[test]
    fn the_same_token_matches() {
        assert!(token().matches(b"s3cret"));
        assert_eq!(token(), Token::new("s3cret").expect("non-empty"));
    }

    #[test]
    fn another_token_of_the_same_length_does_not_match() {
        assert!(!token().matches(b"s3creT"));
        assert!(!token().matches(b"t3cret"));
        assert_ne!(token(), Token::new("S3cret").expect("non-empty"));
    }

    #[test]
    fn a_token_of_another_length_does_not_match() {
        assert!(!token().matches(b""));
        assert!(!token().matches(b"s3cre"));
        assert!(!token().matches(b"s3crets"));
        assert_ne!(token(), Token::new("s3cret2").expect("non-empty"));
    }

    #[test]
    fn only_the_exact_bearer_value_is_accepted() {
        let t = token();
        assert_eq!(t.bearer(), "Bearer s3cret");
        assert_eq!(t.secret(), "s3cret");
        assert!(t.accepts(b"Bearer s3cret"));
        assert!(!t.accepts(b"bearer s3cret"));
        assert!(!t.accepts(b"Bearer  s3cret"));
        assert!(!t.accepts(b"Bearer s3cret "));
        assert!(!t.accepts(b"Bearer s3creT"));
        assert!(!t.accepts(b"s3cret"));
        assert!(!t.accepts(b"Bearer "));
        assert!(!t.accepts(b""));
    }
}
