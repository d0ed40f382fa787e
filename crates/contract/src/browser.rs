//! Ray's signs that a request comes from a browser (its dashboard's
//! `is_browser_request`): a `User-Agent` that starts with `Mozilla`, or any
//! header that only browsers send (RFC 6454 `Origin`, the Fetch standard's
//! `Sec-Fetch-*` and CORS preflight headers) or that they send on every
//! request (`Referer`). Ray's dashboard refuses such requests its writes,
//! and its modules (from 2.60) mask runtime-env secrets in what they answer
//! them; the host and the modules that stand in for Ray's read the same
//! signs here.

/// The headers whose presence alone marks a browser's request (lowercase).
pub const BROWSER_HEADERS: [&str; 8] = [
    "referer",
    "origin",
    "sec-fetch-mode",
    "sec-fetch-dest",
    "sec-fetch-site",
    "sec-fetch-user",
    "access-control-request-method",
    "access-control-request-headers",
];

/// Whether a request looks like a browser's; `header` gives the value of
/// the first header of a (lowercase) name, if there is one.
pub fn from_browser<'a>(header: impl Fn(&str) -> Option<&'a [u8]>) -> bool {
    header("user-agent").is_some_and(|ua| ua.starts_with(b"Mozilla"))
        || BROWSER_HEADERS.iter().any(|name| header(name).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a [u8]> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes())
        }
    }

    #[test]
    fn browsers_by_ray_signs() {
        assert!(from_browser(with(&[("user-agent", "Mozilla/5.0")])));
        assert!(from_browser(with(&[("sec-fetch-mode", "cors")])));
        assert!(from_browser(with(&[("origin", "null")])));
        assert!(!from_browser(with(&[("user-agent", "curl/8.5.0")])));
        assert!(!from_browser(with(&[(
            "user-agent",
            "python-requests/2.32"
        )])));
        assert!(!from_browser(with(&[])));
    }
}
