//! The request guard: whether the server answers a request at all, judged by
//! the names it carries (`Host`, `Origin`, `Sec-Fetch-Site`) before any route
//! runs. [`Dispatch`](super::Dispatch) runs it on every request, a
//! module's or the host's own; it allocates nothing unless it refuses.
//!
//! Any page in the operator's browser can send requests to 127.0.0.1:8265,
//! so web pages are treated as adversaries:
//! - DNS rebinding: a page whose name was rebound to this machine sends its
//!   own name in `Host` and reads the answers as same-origin. On a loopback
//!   address only loopback names and `server.allowed_hosts` are answered.
//! - Cross-site websocket hijacking and request forgery: browsers connect
//!   websockets and send form posts across origins without asking (no CORS
//!   preflight), but name the page's origin in `Origin` (RFC 6454 §7, the
//!   Fetch standard). Those from another origin are refused unless listed in
//!   `server.allowed_origins`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use axum::http::{header, HeaderValue, Method, Request, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::config::hosts::{split_authority, ALLOWED_HOSTS, ALLOWED_ORIGINS};
use crate::config::ServerSettings;
use crate::proxy::from_browser;

/// Host names that mean this machine whatever DNS says; loopback IP literals
/// (127.0.0.0/8, `[::1]`) are recognised by parsing.
const LOOPBACK_NAMES: [&str; 1] = ["localhost"];

/// The loopback hosts, as refusals and docs name them.
const LOOPBACK_TEXT: &str = "localhost, 127.x.x.x or [::1] (any port)";

/// The Fetch standard's request header naming how the page that sent a
/// request relates to its target; `cross-site` means another site's page.
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// Which requests the server answers, by the names they carry.
#[derive(Debug)]
pub struct Guard {
    /// Whether `Host` must name loopback or one of `allowed_hosts`: when
    /// bound to a loopback address, or when `allowed_hosts` is set.
    check_hosts: bool,
    /// `server.allowed_hosts`: lowercase host names, no port.
    allowed_hosts: Box<[Box<str>]>,
    /// `server.allowed_origins`: lowercase `scheme://host[:port]`, no
    /// default port, as browsers serialize an origin.
    allowed_origins: Box<[Box<str>]>,
    /// Ray's rule, on when Ray's modules are hosted: requests that look like
    /// a browser's may not write, but to Ray's two exceptions.
    ray_browser_rule: bool,
}

/// Why a request was refused; each becomes one response in
/// [`Refusal::into_response`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An HTTP/1.1 request without `Host`.
    #[error("an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)")]
    MissingHost,
    /// More than one `Host` header.
    #[error("a request may have only one Host header (RFC 9112 §3.2)")]
    DuplicateHost,
    /// A `Host` that is not `host[:port]`.
    #[error("the Host header is not a valid host[:port] (RFC 9112 §3.2)")]
    BadHost,
    /// A host that is neither loopback nor allowed (DNS rebinding).
    #[error("host {host:?} is not served here: only requests for {LOOPBACK_TEXT} or for a host in {ALLOWED_HOSTS} are answered, so that a web page whose DNS name was pointed at this machine cannot use it; add {host:?} to {ALLOWED_HOSTS} to admit it")]
    HostNotAllowed {
        /// The host, without its port.
        host: String,
    },
    /// A websocket or a write from a page of another origin.
    #[error("{} from origin {origin:?} is refused: only pages of this server's own origin or of {ALLOWED_ORIGINS} may open websockets or send writes here; add {origin:?} to {ALLOWED_ORIGINS} to admit it", what(*websocket))]
    ForeignOrigin {
        /// The `Origin` as sent.
        origin: String,
        /// Whether it was a websocket handshake (else a write).
        websocket: bool,
    },
    /// A websocket or a write from an opaque origin, which no setting admits.
    #[error("{} from the opaque origin \"null\" (a sandboxed, local or redirected page) is refused; no setting admits it", what(*websocket))]
    OpaqueOrigin {
        /// Whether it was a websocket handshake (else a write).
        websocket: bool,
    },
    /// A websocket or a write the browser marked `Sec-Fetch-Site: cross-site`.
    #[error("{} marked Sec-Fetch-Site: cross-site is refused: another site's page sent it; pages of an origin in {ALLOWED_ORIGINS} are admitted", what(*websocket))]
    CrossSite {
        /// Whether it was a websocket handshake (else a write).
        websocket: bool,
    },
    /// Ray's rule: a write that looks like a browser's.
    #[error("'{method}' method not allowed for browser traffic.")]
    BrowserWrite {
        /// The request's method.
        method: Method,
    },
}

fn what(websocket: bool) -> &'static str {
    if websocket {
        "a websocket handshake"
    } else {
        "a state-changing request"
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, error, setting) = match &self {
            Refusal::MissingHost | Refusal::DuplicateHost | Refusal::BadHost => {
                (StatusCode::BAD_REQUEST, "Bad Request", None)
            }
            Refusal::HostNotAllowed { .. } => {
                (StatusCode::FORBIDDEN, "Forbidden", Some(ALLOWED_HOSTS))
            }
            Refusal::ForeignOrigin { .. } | Refusal::CrossSite { .. } => {
                (StatusCode::FORBIDDEN, "Forbidden", Some(ALLOWED_ORIGINS))
            }
            Refusal::OpaqueOrigin { .. } => (StatusCode::FORBIDDEN, "Forbidden", None),
            // Ray's answer, word for word.
            Refusal::BrowserWrite { .. } => {
                return (StatusCode::METHOD_NOT_ALLOWED, self.to_string()).into_response()
            }
        };
        let mut body = serde_json::json!({ "error": error, "message": self.to_string() });
        if let Some(setting) = setting {
            body["setting"] = setting.into();
        }
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::BAD_REQUEST {
            // A malformed request leaves the connection's framing in doubt.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl Guard {
    /// The guard of a server bound to `bound` with `settings`; `ray` when
    /// Ray's modules are hosted (Ray's browser rule applies).
    pub fn new(settings: &ServerSettings, bound: IpAddr, ray: bool) -> Guard {
        let boxed = |list: &[String]| list.iter().map(|s| Box::from(s.as_str())).collect();
        Guard {
            check_hosts: bound.to_canonical().is_loopback() || !settings.allowed_hosts.is_empty(),
            allowed_hosts: boxed(&settings.allowed_hosts),
            allowed_origins: boxed(&settings.allowed_origins),
            ray_browser_rule: ray,
        }
    }

    /// The protocol and the host: exactly one valid `Host` (HTTP/1.0 may send
    /// none), naming a host this server answers for. Returns the host the
    /// request is for (`host[:port]`; `None` when it names none), for
    /// [`Guard::check_origin`].
    pub fn check_host<'r, B>(&self, request: &'r Request<B>) -> Result<Option<&'r str>, Refusal> {
        let mut values = request.headers().get_all(header::HOST).iter();
        let host = match (values.next(), values.next()) {
            (Some(value), None) => Some(
                value
                    .to_str()
                    .ok()
                    .filter(|h| split_authority(h).is_some())
                    .ok_or(Refusal::BadHost)?,
            ),
            (Some(_), Some(_)) => return Err(Refusal::DuplicateHost),
            // HTTP/1.0 needs no Host (RFC 9112 §3.2 binds HTTP/1.1), and no
            // browser sends such a request, so it cannot be a rebound page.
            (None, _) if request.version() < Version::HTTP_11 => None,
            (None, _) => return Err(Refusal::MissingHost),
        };
        // In absolute form the target's authority names the host and Host is
        // to be ignored (RFC 9112 §3.2.2); the module still sees Host, so
        // both must pass.
        let target = request.uri().authority().map(|a| a.as_str());
        if self.check_hosts {
            for name in [host, target].into_iter().flatten() {
                self.admit_host(name)?;
            }
        }
        Ok(target.or(host))
    }

    fn admit_host(&self, authority: &str) -> Result<(), Refusal> {
        let host = split_authority(authority).map_or(authority, |(host, _)| host);
        // An empty Host names no host (RFC 9112 §3.2 allows it); browsers
        // always name one.
        if host.is_empty()
            || names_loopback(host)
            || self
                .allowed_hosts
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(host))
        {
            return Ok(());
        }
        Err(Refusal::HostNotAllowed {
            host: host.to_owned(),
        })
    }

    /// The request's origin: a websocket handshake or a write (any method
    /// but GET, HEAD and OPTIONS) from a page of another origin, or marked
    /// `Sec-Fetch-Site: cross-site`, is refused unless its origin is allowed.
    /// `host` is what [`Guard::check_host`] returned. With Ray's modules,
    /// Ray's stricter rule for browser writes comes first.
    pub fn check_origin<B>(&self, request: &Request<B>, host: Option<&str>) -> Result<(), Refusal> {
        let headers = request.headers();
        let method = request.method();
        let safe = method == Method::GET || method == Method::HEAD || method == Method::OPTIONS;
        // A page cannot set `Upgrade` (a forbidden header name in the Fetch
        // standard): a request that carries one from a browser is a
        // websocket handshake.
        let websocket = headers.contains_key(header::UPGRADE);
        if safe && !websocket {
            return Ok(());
        }
        if self.ray_browser_rule && !safe {
            refuse_browser_write(request)?;
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.as_bytes();
            if self
                .allowed_origins
                .iter()
                .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin))
            {
                // Listed: admitted from another site too.
                return Ok(());
            }
            if origin == b"null" {
                return Err(Refusal::OpaqueOrigin { websocket });
            }
            if !same_origin(origin, host) {
                return Err(Refusal::ForeignOrigin {
                    origin: String::from_utf8_lossy(origin).into_owned(),
                    websocket,
                });
            }
        }
        if headers
            .get(SEC_FETCH_SITE)
            .is_some_and(|site| site.as_bytes().eq_ignore_ascii_case(b"cross-site"))
        {
            return Err(Refusal::CrossSite { websocket });
        }
        Ok(())
    }
}

/// Whether `origin` (`scheme://host[:port]`) is the origin of `host`
/// (`host[:port]`, as the request names it): the same host and port, over
/// HTTP or HTTPS (a TLS-terminating proxy may sit in front).
fn same_origin(origin: &[u8], host: Option<&str>) -> bool {
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return false;
    };
    let authority = if let Some(rest) = strip_prefix_ignore_case(origin, b"http://") {
        rest
    } else if let Some(rest) = strip_prefix_ignore_case(origin, b"https://") {
        rest
    } else {
        return false;
    };
    let authority = authority.strip_suffix(b"/").unwrap_or(authority);
    authority.eq_ignore_ascii_case(host.as_bytes())
}

fn strip_prefix_ignore_case<'a>(bytes: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let head = bytes.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &bytes[prefix.len()..])
}

/// Whether `host` (no port; an IPv6 address in brackets) always means this
/// machine: `localhost`, 127.0.0.0/8 or `[::1]`.
fn names_loopback(host: &str) -> bool {
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<Ipv6Addr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    }
    LOOPBACK_NAMES
        .iter()
        .any(|name| name.eq_ignore_ascii_case(host))
        || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Ray's dashboard answers a request that looks like a browser's with 405
/// unless it is GET, HEAD or OPTIONS: a page from elsewhere (or a rebound
/// DNS name) must not be able to submit jobs. The same here, when Ray's
/// modules are hosted.
fn refuse_browser_write<B>(request: &Request<B>) -> Result<(), Refusal> {
    if !from_browser(request.headers()) || browser_may_write(request.uri().path()) {
        return Ok(());
    }
    Err(Refusal::BrowserWrite {
        method: request.method().clone(),
    })
}

/// Paths a browser may write to under Ray's rule: the login form Ray's UI
/// posts, and this host's own restart and reload actions (a page of
/// another origin is refused those by the `Origin` check).
fn browser_may_write(path: &str) -> bool {
    path == "/api/authenticate"
        || path == crate::routes::host::RELOAD_PATH
        || (path.starts_with("/api/modules/") && path.ends_with("/restart"))
}

#[cfg(test)]
mod tests;
