//! The UI's files: ray-dashd's own, built into the binary from `static/`
//! and served wherever no route claims the path; and Ray's web UI from the
//! installed Ray, at `/`, when Ray's modules are hosted.

use std::path::Path;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::services::{ServeDir, ServeFile};
use tower_http::set_header::SetResponseHeaderLayer;

use super::AppState;
use crate::routes::host::RayUiRoute;

/// The UI, built into the binary from `static/`.
#[derive(rust_embed::RustEmbed)]
#[folder = "static/"]
struct Assets;

/// Adds the route of `part` of Ray's web UI, in the folder `ui`, at `path`.
pub(super) fn ray_ui_route(
    router: Router<AppState>,
    path: &'static str,
    part: RayUiRoute,
    ui: &Path,
) -> Router<AppState> {
    match part {
        RayUiRoute::Index => router.route_service(
            path,
            tower::ServiceBuilder::new()
                .layer(no_store())
                .service(ServeFile::new(ui.join("index.html"))),
        ),
        RayUiRoute::Favicon => router.route_service(path, ServeFile::new(ui.join("favicon.ico"))),
        // Nested, so that the folder sees the path below the prefix.
        RayUiRoute::Static => router.nest_service(
            path.strip_suffix("/{*path}")
                .expect("UNWRAP: the static folder's route ends in a catch-all"),
            ServeDir::new(ui.join("static")),
        ),
    }
}

/// `Cache-Control: no-store`, as Ray sends its `index.html`.
fn no_store() -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))
}

/// Serves a file of the embedded UI at its own path or under `/dashd/`;
/// `/` and folders serve their `index.html`. Only embedded files exist, so
/// no path can reach outside `static/`.
pub(super) fn static_asset(method: &Method, path: &str, headers: &HeaderMap) -> Option<Response> {
    if method != Method::GET && method != Method::HEAD {
        return None;
    }
    let relative = path
        .strip_prefix("/dashd")
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        .unwrap_or(path);
    let relative = relative.trim_start_matches('/');
    let name = if relative.is_empty() || relative.ends_with('/') {
        format!("{relative}index.html")
    } else {
        relative.to_owned()
    };
    let file = Assets::get(&name)?;
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()[..16]));
    let cache = if name.ends_with(".html") {
        "no-cache"
    } else {
        "public, max-age=300, must-revalidate"
    };
    let mut response = if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else if method == Method::HEAD {
        Response::new(Body::empty())
    } else {
        Response::new(Body::from(file.data.into_owned()))
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(file.metadata.mimetype()) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    Some(response)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
