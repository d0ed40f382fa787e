//! Ray's token authentication (`RAY_AUTH_MODE=token`), as the proxy needs it:
//! clients must present the cluster's token (Ray's proxier checks it on
//! every call), and the proxy presents it to the GCS and the runtime env
//! agent. The token is found as Ray finds it: `RAY_AUTH_TOKEN`, else the
//! file named by `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`.

/// The metadata key (and HTTP header) carrying `Bearer <token>`.
pub const AUTHORIZATION: &str = "authorization";
/// Ray's answer to a call without the right token.
pub const UNAUTHENTICATED: &str = "Invalid or missing authentication token";

/// The cluster's token (the host checks the same one); its `Debug` form
/// does not show it and it is compared in constant time.
pub use ray_dashd_contract::Token;

/// Why the proxy cannot check tokens as `RAY_AUTH_MODE` asks: it will not
/// serve unprotected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// A mode the proxy does not know.
    #[error("RAY_AUTH_MODE={0:?} is not supported by the client proxy")]
    UnsupportedMode(String),
    /// Token mode, and no token where Ray looks for one.
    #[error("RAY_AUTH_MODE=token, but no token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token")]
    NotFound,
}

/// The token when `mode` (`RAY_AUTH_MODE`) asks for one; an error when it
/// does and none is found, so that the proxy never serves unprotected.
pub fn token(
    mode: Option<&str>,
    lookup: impl Fn(&str) -> Option<String>,
    read: impl Fn(&str) -> Option<String>,
) -> Result<Option<Token>, TokenError> {
    match mode.map(str::trim) {
        None | Some("") | Some("disabled") => return Ok(None),
        Some("token") => {}
        Some(other) => return Err(TokenError::UnsupportedMode(other.to_owned())),
    }
    let from_file = |path: &str| {
        read(path)
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    };
    let found = lookup("RAY_AUTH_TOKEN")
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .or_else(|| lookup("RAY_AUTH_TOKEN_PATH").and_then(|p| from_file(&p)))
        .or_else(|| lookup("HOME").and_then(|home| from_file(&format!("{home}/.ray/auth_token"))));
    found
        .and_then(|t| Token::new(&t))
        .map(Some)
        .ok_or(TokenError::NotFound)
}

/// [`token`] from the process environment and files.
pub fn token_from_env() -> Result<Option<Token>, TokenError> {
    token(
        std::env::var("RAY_AUTH_MODE").ok().as_deref(),
        |var| std::env::var(var).ok(),
        |path| std::fs::read_to_string(path).ok(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |var| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn token_is_found_as_ray_finds_it() {
        let no_files = |_: &str| None;
        assert_eq!(token(None, env(&[]), no_files), Ok(None));
        assert_eq!(
            token(Some("disabled"), env(&[("RAY_AUTH_TOKEN", "x")]), no_files),
            Ok(None)
        );
        let t = token(
            Some("token"),
            env(&[("RAY_AUTH_TOKEN", " abc \n")]),
            no_files,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.bearer(), "Bearer abc");
        let files = |path: &str| (path == "/t").then(|| "from-file\n".to_owned());
        let t = token(Some("token"), env(&[("RAY_AUTH_TOKEN_PATH", "/t")]), files)
            .unwrap()
            .unwrap();
        assert_eq!(t.bearer(), "Bearer from-file");
        let home = |path: &str| (path == "/h/.ray/auth_token").then(|| "home".to_owned());
        let t = token(Some("token"), env(&[("HOME", "/h")]), home)
            .unwrap()
            .unwrap();
        assert_eq!(t.bearer(), "Bearer home");
        assert!(token(Some("token"), env(&[]), no_files).is_err());
        assert!(token(Some("k8s"), env(&[]), no_files).is_err());
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }
}
