//! Hop-by-hop headers: they describe one connection and never cross the
//! proxy, in either direction (RFC 9110 §7.6.1). And the signs of a
//! browser's request, which both the request guard and the shared answers
//! read, and of a module's answer that declines a request.

use http::header::{self, HeaderMap, HeaderName};
use http::StatusCode;

/// The hop-by-hop headers RFC 9110 §7.6.1 lists, with `Keep-Alive`,
/// `Proxy-Connection` and the proxy authentication pair that RFC 9110
/// §11.7 scopes to one hop.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is one of the hop-by-hop headers (any case).
pub(crate) fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop| hop.as_str().eq_ignore_ascii_case(name))
}

// An answer's head as the proxy writes it to a client itself (the fast
// path's answers, the bare exchange's relayed ones), line by line.

/// Appends the status line of an HTTP/1.1 answer.
pub(crate) fn put_status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends one header line.
pub(crate) fn put_header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends the line that frames a body: its length when known, else
/// chunked.
pub(crate) fn put_framing_line(out: &mut Vec<u8>, length: Option<u64>) {
    match length {
        Some(length) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(length.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
}

/// Appends a `date` line with the current time, formatted at most once a
/// second per thread.
pub(crate) fn put_date_line(out: &mut Vec<u8>) {
    use std::cell::RefCell;
    use std::time::SystemTime;
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let second = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    out.extend_from_slice(b"date: ");
    CACHED.with_borrow_mut(|(at, date)| {
        if *at != second || date.is_empty() {
            *at = second;
            *date = httpdate::fmt_http_date(now);
        }
        out.extend_from_slice(date.as_bytes());
    });
    out.extend_from_slice(b"\r\n");
}

/// Why a module declined a request, when its answer (`status`, `headers`)
/// is a decline: 421 with [`DECLINE_HEADER`](ray_dashd_contract::names::DECLINE_HEADER).
pub(crate) fn declined(status: StatusCode, headers: &HeaderMap) -> Option<String> {
    use ray_dashd_contract::names::{DECLINE_HEADER, DECLINE_STATUS};
    (status.as_u16() == DECLINE_STATUS)
        .then(|| headers.get(DECLINE_HEADER))
        .flatten()
        .map(|why| String::from_utf8_lossy(why.as_bytes()).into_owned())
}

/// Whether a request looks like a browser's, by Ray's signs
/// ([`ray_dashd_contract::browser`]): Ray's dashboard refuses such requests
/// its writes, and its modules (from 2.60) mask runtime-env secrets in what
/// they answer them.
pub(crate) fn from_browser(headers: &HeaderMap) -> bool {
    ray_dashd_contract::browser::from_browser(|name| headers.get(name).map(|v| v.as_bytes()))
}

/// The comma-separated tokens of every `name` header (RFC 9110 §5.6.1),
/// trimmed.
pub(crate) fn tokens(headers: &HeaderMap, name: HeaderName) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The comma-separated tokens of a `Connection` value, trimmed.
pub(crate) fn connection_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Removes the hop-by-hop headers and every header that `Connection` names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over their few names says so
    // without hashing each of the nine (a header `Connection` names is
    // only there to strip with `Connection`).
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = tokens(headers, header::CONNECTION)
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn strips_listed_and_connection_named_headers_keeps_repeats() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("X-Secret, keep-alive"),
        );
        h.append(header::CONNECTION, HeaderValue::from_static("x-other"));
        h.append("x-secret", HeaderValue::from_static("1"));
        h.append("x-other", HeaderValue::from_static("1"));
        h.append("keep-alive", HeaderValue::from_static("timeout=5"));
        h.append("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.append(header::TE, HeaderValue::from_static("trailers"));
        h.append(header::TRAILER, HeaderValue::from_static("x-t"));
        h.append(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.append(header::UPGRADE, HeaderValue::from_static("h2c"));
        h.append(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic x"),
        );
        h.append(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic"),
        );
        h.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["set-cookie"]);
        assert_eq!(h.get_all(header::SET_COOKIE).iter().count(), 2);
    }

    #[test]
    fn each_hop_by_hop_header_alone_is_stripped_and_others_kept() {
        for name in &HOP_BY_HOP {
            let mut h = HeaderMap::new();
            h.append(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            h.append(name.clone(), HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h);
            let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            assert_eq!(left, ["content-type"], "{name} was kept");
        }
        let mut h = HeaderMap::new();
        h.append(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
    }
}
