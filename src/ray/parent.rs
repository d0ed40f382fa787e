//! The routes Ray's dashboard parent answers itself (not its modules), with
//! the same status codes, bodies and cookies: `/timezone`,
//! `/api/authentication_mode`, `/api/authenticate`, `/usage_stats_enabled`,
//! `/cluster_id`, and `/api/gcs_healthz` from the cached GCS check.
//! Ray's web UI files are served by the host's router (`server/assets.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use super::auth;
use super::gcs::Liveness;
use super::RayParent;
use crate::routes::host::{HostHandler, ParentRoute, HOST_ROUTES};

/// The parent-side routes (those [`HOST_ROUTES`] gives to
/// [`HostHandler::RayParent`]), for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>(parent: Arc<RayParent>) -> Router<S> {
    let mut router = Router::new();
    for route in HOST_ROUTES {
        let HostHandler::RayParent(which) = route.handler else {
            continue;
        };
        let handler = match which {
            ParentRoute::GcsHealth => get(gcs_healthz),
            ParentRoute::Timezone => get(timezone),
            ParentRoute::AuthenticationMode => get(authentication_mode),
            ParentRoute::Authenticate => post(authenticate),
            ParentRoute::UsageStatsEnabled => get(usage_stats_enabled),
            ParentRoute::ClusterId => get(cluster_id),
        };
        router = router.route(route.path, handler);
    }
    router.with_state(parent)
}

/// 200 `success` (as `application/text`, Ray's type) when the latest GCS
/// check is recent and succeeded; else 503 with the reason, as the status
/// line's reason phrase and in the body (`503: <reason>`), as Ray's aiohttp
/// answers.
async fn gcs_healthz(State(parent): State<Arc<RayParent>>) -> Response {
    match parent.gcs.liveness() {
        Liveness::Alive => (
            [
                (header::CONTENT_TYPE, "application/text; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            "success",
        )
            .into_response(),
        Liveness::NotAlive(why) => service_unavailable(&format!("Health check failed: {why}")),
    }
}

/// 503 with `reason` as the reason phrase (HTTP/1.1) and the body.
fn service_unavailable(reason: &str) -> Response {
    // A reason phrase may hold no control characters (RFC 9112 §4).
    let phrase: String = reason.chars().filter(|c| !c.is_control()).collect();
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CACHE_CONTROL, "no-store")],
        format!("503: {phrase}"),
    )
        .into_response();
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(phrase.into_bytes()) {
        response.extensions_mut().insert(phrase);
    }
    response
}

async fn timezone(State(parent): State<Arc<RayParent>>) -> Response {
    Json(parent.timezone.clone()).into_response()
}

/// The mode; while it is `disabled`, also removes a cookie left from a
/// time it was `token`.
async fn authentication_mode(State(parent): State<Arc<RayParent>>) -> Response {
    let mode = if parent.token.is_some() {
        "token"
    } else {
        "disabled"
    };
    let mut response = Json(json!({ "authentication_mode": mode })).into_response();
    if parent.token.is_none() {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, auth::clear_cookie());
    }
    response
}

async fn authenticate(State(parent): State<Arc<RayParent>>, headers: HeaderMap) -> Response {
    auth::authenticate(parent.token.as_ref(), &headers)
}

/// Ray's `rest_response` shape: `result`, `msg`, and `data` with camelCase keys.
fn rest_response(message: &str, data: serde_json::Value) -> Response {
    Json(json!({ "result": true, "msg": message, "data": data })).into_response()
}

async fn usage_stats_enabled(State(parent): State<Arc<RayParent>>) -> Response {
    rest_response(
        "Fetched usage stats enabled",
        json!({
            "usageStatsEnabled": parent.usage_stats_enabled,
            "usageStatsPromptEnabled": parent.usage_stats_prompt_enabled,
        }),
    )
}

async fn cluster_id(State(parent): State<Arc<RayParent>>) -> Response {
    match parent.gcs.cluster_id() {
        Some(id) => rest_response("Fetched cluster id", json!({ "clusterId": id })),
        // Ray's parent learns it before serving; the host once the GCS answers.
        None => service_unavailable("the cluster id is not known yet: the GCS has not answered"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{HeaderValue, Request};
    use tower::ServiceExt;

    use crate::ray::auth::Token;
    use crate::ray::gcs::GcsStatus;

    /// `Content-Type` of JSON answers.
    const JSON: HeaderValue = HeaderValue::from_static("application/json");

    fn parent(token: Option<&str>) -> Arc<RayParent> {
        Arc::new(RayParent {
            ray_version: "2.60.0".to_owned(),
            ui_dir: None,
            timezone: json!({ "offset": "+00:00", "value": "UTC" }),
            token: token.and_then(Token::new),
            usage_stats_enabled: false,
            usage_stats_prompt_enabled: true,
            gcs: GcsStatus::default(),
            redaction: Default::default(),
        })
    }

    async fn call(parent: Arc<RayParent>, method: &str, path: &str) -> (Response, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", "Bearer t0k")
            .body(Body::empty())
            .expect("request");
        let response = routes::<()>(parent)
            .oneshot(request)
            .await
            .expect("infallible");
        let (head, body) = response.into_parts();
        let body = axum::body::to_bytes(body, 1 << 16).await.expect("body");
        (
            Response::from_parts(head, Body::empty()),
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    #[tokio::test]
    async fn gcs_healthz_is_503_with_the_reason_until_a_check_succeeded() {
        let (response, body) = call(parent(None), "GET", "/api/gcs_healthz").await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "503: Health check failed: the GCS has not been checked yet"
        );
        let phrase = response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .expect("reason phrase");
        assert_eq!(
            phrase.as_bytes(),
            b"Health check failed: the GCS has not been checked yet"
        );
    }

    #[tokio::test]
    async fn gcs_healthz_is_rays_success_text_when_the_check_succeeded() {
        let p = parent(None);
        p.gcs.record_alive_for_tests();
        let (response, body) = call(p, "GET", "/api/gcs_healthz").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body, "success");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/text; charset=utf-8"
        );
    }

    #[tokio::test]
    async fn authentication_mode_names_the_mode_and_clears_the_cookie_when_off() {
        let (off, body) = call(parent(None), "GET", "/api/authentication_mode").await;
        assert_eq!(body, r#"{"authentication_mode":"disabled"}"#);
        assert_eq!(
            off.headers()[header::SET_COOKIE],
            "ray-authentication-token=\"\"; Max-Age=0; Path=/"
        );
        let (on, body) = call(parent(Some("t0k")), "GET", "/api/authentication_mode").await;
        assert_eq!(body, r#"{"authentication_mode":"token"}"#);
        assert!(on.headers().get(header::SET_COOKIE).is_none());
    }

    #[tokio::test]
    async fn authenticate_is_post_only_and_needs_token_mode() {
        let (off, body) = call(parent(None), "POST", "/api/authenticate").await;
        assert_eq!(off.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(body, "Unauthorized: Token authentication is not enabled");
        let (on, _) = call(parent(Some("t0k")), "POST", "/api/authenticate").await;
        assert_eq!(on.status(), StatusCode::OK);
        assert!(on.headers()[header::SET_COOKIE]
            .to_str()
            .expect("ascii")
            .starts_with("ray-authentication-token=t0k;"));
        let (get, _) = call(parent(Some("t0k")), "GET", "/api/authenticate").await;
        assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn usage_stats_and_cluster_id_have_rays_rest_shape() {
        let p = parent(None);
        let (response, body) = call(Arc::clone(&p), "GET", "/usage_stats_enabled").await;
        assert_eq!(response.headers()[header::CONTENT_TYPE], JSON);
        let body: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(
            body,
            json!({
                "result": true,
                "msg": "Fetched usage stats enabled",
                "data": { "usageStatsEnabled": false, "usageStatsPromptEnabled": true },
            })
        );
        let (unknown, _) = call(Arc::clone(&p), "GET", "/cluster_id").await;
        assert_eq!(unknown.status(), StatusCode::SERVICE_UNAVAILABLE);
        p.gcs.record_alive_for_tests();
        let (_, body) = call(p, "GET", "/cluster_id").await;
        let body: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(
            body,
            json!({ "result": true, "msg": "Fetched cluster id", "data": { "clusterId": "c0ffee" } })
        );
    }
}
