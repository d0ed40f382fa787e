//! `server.url_prefix`: the whole dashboard answered under a path, as a
//! reverse proxy that mounts it there expects. [`Dispatch`](super::Dispatch)
//! takes the prefix off each request's path once, before the guard and
//! the routes, so nothing below knows of it, and puts it back on the
//! `Location` of redirects, which modules and the host write for the paths
//! they see.

use std::sync::Arc;

use axum::http::uri::{PathAndQuery, Uri};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// A prefix checked by the config: `/` then segments of unreserved
/// characters, no trailing `/`.
#[derive(Debug, Clone)]
pub(crate) struct UrlPrefix(Arc<str>);

/// Where a request's path lies with respect to the prefix.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Under it: the URI without it.
    Under(Uri),
    /// The prefix itself, without the `/` that would make relative links
    /// resolve under it: redirected there.
    Bare,
    /// Outside it: no route.
    Outside,
}

impl UrlPrefix {
    /// `None` for the empty prefix (the dashboard at `/`).
    pub(crate) fn new(prefix: &str) -> Option<UrlPrefix> {
        (!prefix.is_empty()).then(|| UrlPrefix(Arc::from(prefix)))
    }

    /// The part of `path` under the prefix (`""` for the prefix itself).
    pub(crate) fn strip<'p>(&self, path: &'p str) -> Option<&'p str> {
        let rest = path.strip_prefix(&*self.0)?;
        (rest.is_empty() || rest.starts_with('/')).then_some(rest)
    }

    /// Where `uri` lies.
    pub(crate) fn place(&self, uri: &Uri) -> Placed {
        let rest = match self.strip(uri.path()) {
            None => return Placed::Outside,
            Some("") => return Placed::Bare,
            Some(rest) => rest,
        };
        let path_and_query = match uri.query() {
            Some(query) => format!("{rest}?{query}"),
            None => rest.to_owned(),
        };
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(
            PathAndQuery::try_from(path_and_query)
                .expect("UNWRAP: a suffix of a valid path, with its query, is valid"),
        );
        Placed::Under(Uri::from_parts(parts).expect("UNWRAP: only the path changed"))
    }

    /// The redirect from the bare prefix to the prefix with a `/`, the
    /// query kept; 308, so that the method and body are kept too.
    pub(crate) fn redirect_bare(&self, uri: &Uri) -> Response {
        let location = match uri.query() {
            Some(query) => format!("{}/?{query}", self.0),
            None => format!("{}/", self.0),
        };
        let mut response = StatusCode::PERMANENT_REDIRECT.into_response();
        if let Ok(location) = HeaderValue::try_from(location) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        response
    }

    /// Puts the prefix on a `Location` that is an absolute path (not one
    /// with a scheme or a host, nor `//host`, which lead elsewhere).
    pub(crate) fn restore_location(&self, response: &mut Response) {
        let Some(location) = response.headers().get(header::LOCATION) else {
            return;
        };
        let bytes = location.as_bytes();
        if !bytes.starts_with(b"/") || bytes.starts_with(b"//") {
            return;
        }
        let mut prefixed = Vec::with_capacity(self.0.len() + bytes.len());
        prefixed.extend_from_slice(self.0.as_bytes());
        prefixed.extend_from_slice(bytes);
        if let Ok(value) = HeaderValue::from_bytes(&prefixed) {
            response.headers_mut().insert(header::LOCATION, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix() -> UrlPrefix {
        UrlPrefix::new("/ray/dash").expect("a prefix")
    }

    fn uri(text: &str) -> Uri {
        text.parse().expect("uri")
    }

    #[test]
    fn paths_under_the_prefix_lose_it_and_keep_their_query() {
        let p = prefix();
        assert_eq!(
            p.place(&uri("/ray/dash/api/x?a=1")),
            Placed::Under(uri("/api/x?a=1"))
        );
        assert_eq!(p.place(&uri("/ray/dash/")), Placed::Under(uri("/")));
        assert_eq!(
            p.place(&uri("http://127.0.0.1:1/ray/dash/y")),
            Placed::Under(uri("http://127.0.0.1:1/y"))
        );
        assert_eq!(p.place(&uri("/ray/dash?a=1")), Placed::Bare);
        assert_eq!(p.place(&uri("/ray/dashboard/x")), Placed::Outside);
        assert_eq!(p.place(&uri("/api/x")), Placed::Outside);
        assert_eq!(p.place(&uri("/ray")), Placed::Outside);
        assert!(UrlPrefix::new("").is_none());
    }

    #[test]
    fn redirects_to_absolute_paths_get_the_prefix() {
        let p = prefix();
        let mut response = StatusCode::FOUND.into_response();
        for (location, want) in [
            ("/x?y=1", "/ray/dash/x?y=1"),
            ("//elsewhere/x", "//elsewhere/x"),
            ("http://h/x", "http://h/x"),
            ("relative", "relative"),
        ] {
            response
                .headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static(location));
            p.restore_location(&mut response);
            assert_eq!(response.headers()[header::LOCATION], want, "{location}");
        }
        let bare = p.redirect_bare(&uri("/ray/dash?q=2"));
        assert_eq!(bare.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(bare.headers()[header::LOCATION], "/ray/dash/?q=2");
    }
}
