//! Token authentication as Ray's dashboard parent does it with
//! `RAY_AUTH_MODE=token`: every request but a few public paths must carry
//! the cluster's token (modules check nothing; the host checks for them),
//! and `POST /api/authenticate` turns a valid token into a cookie for the
//! web UI. When Ray's modules are not hosted, [`token_from_env`] finds the
//! token as Ray's loader would, so that token mode never serves open.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use ray_dashd_contract::token::BEARER;

/// The cluster's token (the client proxy checks the same one); its `Debug`
/// never shows it and it is compared in constant time.
pub use ray_dashd_contract::Token;

/// The cookie Ray's web UI authenticates with.
pub const COOKIE: &str = "ray-authentication-token";
/// How long the cookie lives, in seconds (30 days, as Ray sets it).
const COOKIE_MAX_AGE_SECS: u32 = 30 * 24 * 60 * 60;
/// Where proxies that own `Authorization` themselves (KubeRay) put the token.
const RAY_AUTHORIZATION: &str = "x-ray-authorization";

/// Paths anyone may reach: what the web UI needs to load and ask for a
/// token, and the health checks. The same list as Ray's parent.
const PUBLIC_PATHS: [&str; 8] = [
    "/",
    "/favicon.ico",
    "/api/authentication_mode",
    "/api/authenticate",
    "/api/healthz",
    "/api/gcs_healthz",
    "/api/local_raylet_healthz",
    "/-/healthz",
];
/// The web UI's assets, public as a whole.
const PUBLIC_PREFIX: &str = "/static/";
/// Most of a token file read: a token is one short line (Ray's are 64 hex
/// digits), and a link to something endless must not stall the start.
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

/// Why ray-dashd will not serve in Ray's token mode: it cannot check tokens
/// as that mode asks. Each message says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Token mode, and no token in any place Ray looks.
    #[error("RAY_AUTH_MODE=token, but no token was found: set RAY_AUTH_TOKEN, or write the token to {default} or to a file named by RAY_AUTH_TOKEN_PATH (as for `ray start`); or unset RAY_AUTH_MODE to serve without authentication")]
    Missing {
        /// The default token file that was tried.
        default: String,
    },
    /// Token mode, and `RAY_AUTH_TOKEN` holds only blanks.
    #[error("RAY_AUTH_MODE=token, but RAY_AUTH_TOKEN is blank: set it to the cluster's token, or unset it to read the token from a file")]
    Blank,
    /// Token mode, and `RAY_AUTH_TOKEN_PATH` names no readable token.
    #[error("RAY_AUTH_MODE=token, but RAY_AUTH_TOKEN_PATH names {path}, which {problem}: put the token there, or point RAY_AUTH_TOKEN_PATH at the token's file")]
    Unreadable {
        /// The file named.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A Kubernetes mode, which ray-dashd cannot check.
    #[error("{setting} asks for Ray's Kubernetes token authentication, which ray-dashd does not support; use RAY_AUTH_MODE=token with a token of your own")]
    Kubernetes {
        /// The variable that asked for it.
        setting: &'static str,
    },
}

/// The token to require when Ray's modules are not hosted (Ray's own
/// answer, from `head_facts.py`, is used when they are), found as Ray's
/// `AuthenticationTokenLoader` finds it: with `RAY_AUTH_MODE=token` (any
/// case), `RAY_AUTH_TOKEN`, else the first line of the file named by
/// `RAY_AUTH_TOKEN_PATH` (no further fallback, as in Ray), else the first
/// line of `$HOME/.ray/auth_token`; each trimmed of blanks. `Ok(None)` when
/// token mode is off; an error when it is on and no token is found, so
/// that token mode never serves without one. `var` reads the environment.
pub fn token_from_env(var: impl Fn(&str) -> Option<OsString>) -> Result<Option<Token>, TokenError> {
    let text = |name: &str| {
        var(name)
            .map(|v| v.to_string_lossy().trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    match text("RAY_AUTH_MODE")
        .map(|m| m.to_ascii_lowercase())
        .as_deref()
    {
        Some("token") => {}
        // Ray 2.52 and 2.53 had a mode of this name.
        Some("k8s") => {
            return Err(TokenError::Kubernetes {
                setting: "RAY_AUTH_MODE=k8s",
            })
        }
        _ => return Ok(None),
    }
    // Ray reads this flag as a boolean: `true` (any case) or `1`.
    if text("RAY_ENABLE_K8S_TOKEN_AUTH").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    {
        return Err(TokenError::Kubernetes {
            setting: "RAY_ENABLE_K8S_TOKEN_AUTH",
        });
    }
    // Set, it is the token, blank or not (Ray looks no further either).
    if let Some(token) = var("RAY_AUTH_TOKEN").filter(|t| !t.is_empty()) {
        return Token::new(token.to_string_lossy().trim())
            .map(Some)
            .ok_or(TokenError::Blank);
    }
    if let Some(path) = var("RAY_AUTH_TOKEN_PATH").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return match read_token_file(&path) {
            Ok(Some(token)) => Ok(Some(token)),
            Ok(None) => Err(TokenError::Unreadable {
                path: path.display().to_string(),
                problem: "is empty".to_owned(),
            }),
            Err(e) => Err(TokenError::Unreadable {
                path: path.display().to_string(),
                problem: format!("cannot be read ({e})"),
            }),
        };
    }
    // Without a home, Ray looks in the working folder.
    let home = var("HOME")
        .filter(|h| !h.is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let default = home.join(".ray").join("auth_token");
    match read_token_file(&default) {
        Ok(Some(token)) => Ok(Some(token)),
        _ => Err(TokenError::Missing {
            default: default.display().to_string(),
        }),
    }
}

/// The token on the first line of `path`, trimmed; `None` when blank.
fn read_token_file(path: &std::path::Path) -> std::io::Result<Option<Token>> {
    let file = std::fs::File::open(path)?;
    let mut line = String::new();
    BufReader::new(file.take(MAX_TOKEN_FILE_BYTES)).read_line(&mut line)?;
    Ok(Token::new(line.trim()))
}

/// Whether `path` may be reached without a token.
pub fn is_public(path: &str) -> bool {
    if PUBLIC_PATHS.contains(&path) {
        return true;
    }
    // A dot segment could climb out of `/static/`; such a path is not public.
    path.strip_prefix(PUBLIC_PREFIX)
        .is_some_and(|rest| !rest.split('/').any(|seg| seg == "." || seg == ".."))
}

/// The token a request presents, in Ray's order: `Authorization`, then
/// `X-Ray-Authorization`, then the web UI's cookie (as `Bearer <cookie>`).
fn presented(headers: &HeaderMap) -> Option<Vec<u8>> {
    for name in [header::AUTHORIZATION.as_str(), RAY_AUTHORIZATION] {
        if let Some(value) = headers.get(name).filter(|v| !v.is_empty()) {
            return Some(value.as_bytes().to_vec());
        }
    }
    let cookie = cookie(headers, COOKIE)?;
    Some(format!("{BEARER}{cookie}").into_bytes())
}

/// The value of cookie `name` in the request's `Cookie` headers, without
/// the quotes a quoted value has.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| n.trim() == name)
        .map(|(_, v)| {
            let v = v.trim();
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v)
        })
        .filter(|v| !v.is_empty())
}

/// `None` when `request` may pass; else Ray's answer: 401 when it carries
/// no token, 403 when the token is wrong.
pub fn refuse_unauthenticated(token: &Token, request: &Request<Body>) -> Option<Response> {
    if is_public(request.uri().path()) {
        return None;
    }
    match presented(request.headers()) {
        None => Some(missing_token()),
        Some(value) if !token.accepts(&value) => Some(invalid_token()),
        Some(_) => None,
    }
}

fn missing_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        "Unauthorized: Missing authentication token",
    )
        .into_response()
}

fn invalid_token() -> Response {
    (
        StatusCode::FORBIDDEN,
        "Forbidden: Invalid authentication token",
    )
        .into_response()
}

/// `POST /api/authenticate`: a valid `Authorization: Bearer <token>`
/// becomes an HttpOnly cookie for the web UI (the browser's later requests
/// carry it); `token` is `None` when token authentication is off.
pub fn authenticate(token: Option<&Token>, headers: &HeaderMap) -> Response {
    let Some(token) = token else {
        return (
            StatusCode::UNAUTHORIZED,
            "Unauthorized: Token authentication is not enabled",
        )
            .into_response();
    };
    let Some(value) = headers.get(header::AUTHORIZATION).filter(|v| !v.is_empty()) else {
        return missing_token();
    };
    if !token.accepts(value.as_bytes()) {
        return invalid_token();
    }
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; Max-Age={COOKIE_MAX_AGE_SECS}; Path=/; SameSite=Strict",
        token.secret()
    );
    let body = serde_json::json!({ "status": "authenticated", "message": "Token is valid" });
    let mut response = Json(body).into_response();
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        // A token Ray accepted in a header is a valid header value, and so
        // a valid cookie; this is only reached with a token of other bytes.
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal Server Error: the token cannot be set as a cookie",
        )
            .into_response(),
    }
}

/// The `Set-Cookie` that removes the UI's cookie, sent while token
/// authentication is off (as Ray does with `/api/authentication_mode`).
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("ray-authentication-token=\"\"; Max-Age=0; Path=/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
        let mut builder = Request::builder().uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).expect("request")
    }

    fn token() -> Token {
        Token::new("s3cret").expect("non-empty")
    }

    #[test]
    fn token_is_compared_exactly_with_rays_bearer_prefix() {
        let t = token();
        assert!(t.accepts(b"Bearer s3cret"));
        for wrong in [
            &b"bearer s3cret"[..],
            b"Bearer  s3cret",
            b"Bearer s3cret ",
            b"s3cret",
            b"Bearer s3cre",
            b"Bearer s3cretx",
            b"Bearer ",
            b"",
        ] {
            assert!(!t.accepts(wrong), "{}", String::from_utf8_lossy(wrong));
        }
        assert!(Token::new("").is_none());
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn public_paths_need_no_token_others_do() {
        let t = token();
        for path in [
            "/",
            "/favicon.ico",
            "/api/authentication_mode",
            "/api/authenticate",
            "/api/healthz",
            "/api/gcs_healthz",
            "/static/js/main.js",
        ] {
            assert!(
                refuse_unauthenticated(&t, &request(path, &[])).is_none(),
                "{path}"
            );
        }
        for path in [
            "/api/jobs/",
            "/api/version",
            "/cluster_id",
            "/dashd/",
            "/api/modules",
            "/static/../api/jobs/",
            "/static",
            "/index.html",
        ] {
            let refused = refuse_unauthenticated(&t, &request(path, &[])).expect(path);
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{path}");
        }
    }

    #[test]
    fn token_is_read_from_header_fallback_header_or_cookie() {
        let t = token();
        let pass = |headers: &[(&str, &str)]| {
            refuse_unauthenticated(&t, &request("/api/jobs/", headers)).map(|r| r.status())
        };
        assert_eq!(pass(&[("authorization", "Bearer s3cret")]), None);
        assert_eq!(pass(&[("x-ray-authorization", "Bearer s3cret")]), None);
        assert_eq!(
            pass(&[("cookie", "a=b; ray-authentication-token=s3cret")]),
            None
        );
        assert_eq!(
            pass(&[("cookie", "ray-authentication-token=\"s3cret\"")]),
            None
        );
        assert_eq!(
            pass(&[("authorization", "Bearer nope")]),
            Some(StatusCode::FORBIDDEN)
        );
        // `Authorization` comes first: a wrong one is not saved by a right cookie.
        assert_eq!(
            pass(&[
                ("authorization", "Bearer nope"),
                ("cookie", "ray-authentication-token=s3cret")
            ]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            pass(&[("cookie", "other=s3cret")]),
            Some(StatusCode::UNAUTHORIZED)
        );
    }

    /// Finds the token as Ray's loader does, from `vars` (a test's own
    /// environment), or says why not.
    fn from_env(vars: &[(&str, &str)]) -> Result<Option<Token>, TokenError> {
        let vars: std::collections::HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        token_from_env(|name| vars.get(name).cloned())
    }

    fn accepted(found: Result<Option<Token>, TokenError>, secret: &str) -> bool {
        found
            .expect("a token")
            .expect("token mode")
            .accepts(format!("Bearer {secret}").as_bytes())
    }

    #[test]
    fn token_mode_finds_the_token_where_ray_looks_in_rays_order() {
        let home = tempfile::tempdir().expect("tempdir");
        let home_str = home.path().to_str().expect("utf-8");
        std::fs::create_dir(home.path().join(".ray")).expect("mkdir");
        std::fs::write(
            home.path().join(".ray/auth_token"),
            "  from-home \nsecond line\n",
        )
        .expect("write");
        let named = home.path().join("named");
        std::fs::write(&named, "from-path\n").expect("write");
        let named = named.to_str().expect("utf-8");

        assert!(from_env(&[]).expect("off").is_none());
        assert!(
            from_env(&[("RAY_AUTH_MODE", "disabled"), ("RAY_AUTH_TOKEN", "x")])
                .expect("off")
                .is_none()
        );
        let mode = ("RAY_AUTH_MODE", "Token");
        assert!(accepted(
            from_env(&[
                mode,
                ("RAY_AUTH_TOKEN", " from-env\n"),
                ("RAY_AUTH_TOKEN_PATH", named),
                ("HOME", home_str)
            ]),
            "from-env"
        ));
        assert!(accepted(
            from_env(&[mode, ("RAY_AUTH_TOKEN_PATH", named), ("HOME", home_str)]),
            "from-path"
        ));
        assert!(accepted(from_env(&[mode, ("HOME", home_str)]), "from-home"));
    }

    #[test]
    fn token_mode_without_a_token_is_an_error_naming_the_fix() {
        let empty = tempfile::tempdir().expect("tempdir");
        let home = empty.path().to_str().expect("utf-8");
        let mode = ("RAY_AUTH_MODE", "token");
        let missing = from_env(&[mode, ("HOME", home)]).expect_err("no token");
        assert_eq!(
            missing.to_string(),
            format!(
                "RAY_AUTH_MODE=token, but no token was found: set RAY_AUTH_TOKEN, or write the \
                 token to {home}/.ray/auth_token or to a file named by RAY_AUTH_TOKEN_PATH (as \
                 for `ray start`); or unset RAY_AUTH_MODE to serve without authentication"
            )
        );
        // A named file that is missing is not made up for by the default one.
        std::fs::create_dir(empty.path().join(".ray")).expect("mkdir");
        std::fs::write(empty.path().join(".ray/auth_token"), "t").expect("write");
        let gone = empty.path().join("gone");
        let gone = gone.to_str().expect("utf-8");
        let unreadable =
            from_env(&[mode, ("HOME", home), ("RAY_AUTH_TOKEN_PATH", gone)]).expect_err("gone");
        assert!(
            unreadable.to_string().contains(&format!(
                "RAY_AUTH_TOKEN_PATH names {gone}, which cannot be read"
            )),
            "{unreadable}"
        );
        assert!(matches!(
            from_env(&[mode, ("HOME", home), ("RAY_AUTH_TOKEN", " \t")]),
            Err(TokenError::Blank)
        ));
        assert!(matches!(
            from_env(&[("RAY_AUTH_MODE", "k8s")]),
            Err(TokenError::Kubernetes { .. })
        ));
        assert!(matches!(
            from_env(&[
                mode,
                ("RAY_AUTH_TOKEN", "t"),
                ("RAY_ENABLE_K8S_TOKEN_AUTH", "true")
            ]),
            Err(TokenError::Kubernetes { .. })
        ));
    }

    #[tokio::test]
    async fn authenticate_sets_rays_cookie_for_a_valid_token_only() {
        let t = token();
        let mut headers = HeaderMap::new();
        let off = authenticate(None, &headers);
        assert_eq!(off.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            authenticate(Some(&t), &headers).status(),
            StatusCode::UNAUTHORIZED
        );
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(
            authenticate(Some(&t), &headers).status(),
            StatusCode::FORBIDDEN
        );
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        let ok = authenticate(Some(&t), &headers);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()[header::SET_COOKIE],
            "ray-authentication-token=s3cret; HttpOnly; Max-Age=2592000; Path=/; SameSite=Strict"
        );
        let body = axum::body::to_bytes(ok.into_body(), 1024)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            body,
            serde_json::json!({ "status": "authenticated", "message": "Token is valid" })
        );
    }
}
