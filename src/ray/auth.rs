//! Token authentication as Ray's dashboard parent does it with
//! `RAY_AUTH_MODE=token`: every request but a few public paths must carry
//! the cluster's token (modules check nothing; the host checks for them),
//! and `POST /api/authenticate` turns a valid token into a cookie for the
//! web UI.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Json, Response};

/// The cookie Ray's web UI authenticates with.
pub const COOKIE: &str = "ray-authentication-token";
/// How long the cookie lives, in seconds (30 days, as Ray sets it).
const COOKIE_MAX_AGE_SECS: u32 = 30 * 24 * 60 * 60;
/// The form a token takes in `Authorization`; Ray accepts exactly this
/// prefix, with this case.
const BEARER: &str = "Bearer ";
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

/// The cluster's token. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token; `None` when `secret` is empty (Ray has no empty tokens).
    pub fn new(secret: &str) -> Option<Token> {
        (!secret.is_empty()).then(|| Token(Arc::from(secret)))
    }

    /// `Bearer <token>`, the value of `Authorization` (HTTP) and of the
    /// `authorization` gRPC metadata Ray's servers check.
    pub fn bearer(&self) -> String {
        format!("{BEARER}{}", self.0)
    }

    /// Whether `value` is `Bearer <this token>`. Compared in constant time,
    /// so response times do not tell how much of a guess was right.
    pub fn accepts(&self, value: &[u8]) -> bool {
        let Some(given) = value.strip_prefix(BEARER.as_bytes()) else {
            return false;
        };
        let expected = self.0.as_bytes();
        if given.len() != expected.len() {
            return false;
        }
        given
            .iter()
            .zip(expected)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }
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
        token.0
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
