//! `server.allowed_hosts` and `server.allowed_origins`: each entry checked
//! and put in the normal form the request guard (`server::guard`) compares,
//! and the `host[:port]` syntax the guard reads `Host` with.

use std::net::Ipv6Addr;

/// The settings that admit more hosts and origins, as errors and the
/// guard's refusals name them.
pub(crate) const ALLOWED_HOSTS: &str = "server.allowed_hosts";
pub(crate) const ALLOWED_ORIGINS: &str = "server.allowed_origins";

/// Why an entry of `server.allowed_hosts` is refused: the problem, for the
/// config error naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HostEntryError {
    /// The entry is empty.
    #[error("must not be empty")]
    Empty,
    /// The entry has a `*`.
    #[error("wildcards are not supported; list each host name")]
    Wildcard,
    /// The entry is a URL (an origin, say).
    #[error("{entry:?} is a URL; give the host name alone (origins go in {origins})", origins = ALLOWED_ORIGINS)]
    Url {
        /// The entry.
        entry: String,
    },
    /// The entry is an IPv6 address without its brackets.
    #[error("write an IPv6 address in brackets, as Host has it: \"[{entry}]\"")]
    BareIpv6 {
        /// The entry.
        entry: String,
    },
    /// The entry has a port.
    #[error("{entry:?} has a port; give the host without it (every port is admitted): {host:?}")]
    Port {
        /// The entry.
        entry: String,
        /// The entry without its port.
        host: String,
    },
    /// The entry is no host name or IP address.
    #[error("{entry:?} is not a host name or IP address")]
    NotAHost {
        /// The entry.
        entry: String,
    },
}

/// Checks an entry of `server.allowed_hosts` and gives the form the guard
/// compares: a host name or IP address without a port, lowercase.
pub(crate) fn allowed_host(entry: &str) -> Result<String, HostEntryError> {
    if entry.is_empty() {
        return Err(HostEntryError::Empty);
    }
    if entry.contains('*') {
        return Err(HostEntryError::Wildcard);
    }
    let entry_owned = || entry.to_owned();
    if entry.contains("://") {
        return Err(HostEntryError::Url {
            entry: entry_owned(),
        });
    }
    if entry.parse::<Ipv6Addr>().is_ok() {
        return Err(HostEntryError::BareIpv6 {
            entry: entry_owned(),
        });
    }
    match split_authority(entry) {
        Some((host, None)) if !host.is_empty() => Ok(host.to_ascii_lowercase()),
        Some((host, Some(_))) if !host.is_empty() => Err(HostEntryError::Port {
            entry: entry_owned(),
            host: host.to_owned(),
        }),
        _ => Err(HostEntryError::NotAHost {
            entry: entry_owned(),
        }),
    }
}

/// Why an entry of `server.allowed_origins` is refused: the problem, for
/// the config error naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OriginEntryError {
    /// The entry is `*`.
    #[error("\"*\" is not supported: it would let every web page open websockets and send writes here; list each origin")]
    Wildcard,
    /// The entry is `null`.
    #[error("\"null\" is not supported: every sandboxed or local page sends it")]
    Null,
    /// The entry is not `scheme://host[:port]`.
    #[error("{entry:?} is not an origin: write scheme://host[:port], such as \"https://dash.example.com\"")]
    Shape {
        /// The entry.
        entry: String,
    },
    /// The scheme is neither `http` nor `https`.
    #[error("{entry:?}: the scheme must be http or https")]
    Scheme {
        /// The entry.
        entry: String,
    },
    /// The entry has a path.
    #[error("{entry:?}: an origin has no path; write \"{origin}\"")]
    Path {
        /// The entry.
        entry: String,
        /// The entry without its path.
        origin: String,
    },
    /// The port is not 1 to 65535.
    #[error("{entry:?}: the port must be 1 to 65535")]
    Port {
        /// The entry.
        entry: String,
    },
}

/// Checks an entry of `server.allowed_origins` and gives the form browsers
/// send in `Origin` (lowercase, the default port left out), which the guard
/// compares.
pub(crate) fn allowed_origin(entry: &str) -> Result<String, OriginEntryError> {
    match entry {
        "*" => return Err(OriginEntryError::Wildcard),
        "null" => return Err(OriginEntryError::Null),
        _ => {}
    }
    let entry_owned = || entry.to_owned();
    let shape = || OriginEntryError::Shape {
        entry: entry_owned(),
    };
    let (scheme, authority) = entry.split_once("://").ok_or_else(shape)?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => {
            return Err(OriginEntryError::Scheme {
                entry: entry_owned(),
            })
        }
    };
    if let Some((authority, _)) = authority.split_once('/') {
        return Err(OriginEntryError::Path {
            entry: entry_owned(),
            origin: format!("{scheme}://{authority}"),
        });
    }
    let (host, port) = split_authority(authority)
        .filter(|(host, _)| !host.is_empty())
        .ok_or_else(shape)?;
    let host = host.to_ascii_lowercase();
    match port {
        None => Ok(format!("{scheme}://{host}")),
        Some(port) if port == default_port => Ok(format!("{scheme}://{host}")),
        Some(port) => match port.parse::<u16>() {
            Ok(n) if n > 0 => Ok(format!("{scheme}://{host}:{n}")),
            _ => Err(OriginEntryError::Port {
                entry: entry_owned(),
            }),
        },
    }
}

/// The bytes of a `reg-name` (RFC 3986 §3.2.2: unreserved, sub-delims,
/// and `%` of a percent-encoding), as a table: every request's `Host` is
/// checked against it.
const REG_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric();
        b += 1;
    }
    let others = b"-._~!$&'()*+,;=%";
    let mut i = 0;
    while i < others.len() {
        table[others[i] as usize] = true;
        i += 1;
    }
    table
};

/// Splits `host[:port]` (RFC 3986 §3.2.2, as `Host` carries it) into the
/// host (an IPv6 address keeps its brackets) and the port; `None` when it is
/// not that.
pub(crate) fn split_authority(authority: &str) -> Option<(&str, Option<&str>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        rest[..end].parse::<Ipv6Addr>().ok()?;
        let port = match &rest[end + 1..] {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        (&authority[..end + 2], port)
    } else {
        match authority.bytes().position(|b| b == b':') {
            Some(colon) => (&authority[..colon], Some(&authority[colon + 1..])),
            None => (authority, None),
        }
    };
    let host_ok = host.starts_with('[') || host.bytes().all(|b| REG_NAME[usize::from(b)]);
    let port_ok = port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()));
    (host_ok && port_ok).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port_and_bad_ones_are_refused() {
        assert_eq!(split_authority("localhost"), Some(("localhost", None)));
        assert_eq!(
            split_authority("127.0.0.1:8265"),
            Some(("127.0.0.1", Some("8265")))
        );
        assert_eq!(split_authority("[::1]:80"), Some(("[::1]", Some("80"))));
        assert_eq!(split_authority("[::1]"), Some(("[::1]", None)));
        assert_eq!(
            split_authority("a-b_c~d!$&'()*+,;=%41.x"),
            Some(("a-b_c~d!$&'()*+,;=%41.x", None))
        );
        assert_eq!(split_authority("h:"), Some(("h", Some(""))));
        for bad in [
            "a b", "a/b", "a@b", "a\\b", "h\u{e9}", "h:8x", "h:1:2", "[::1", "[zz]", "[::1]x",
        ] {
            assert_eq!(split_authority(bad), None, "{bad:?} accepted");
        }
    }

    #[test]
    fn allowed_hosts_entries_are_host_names_without_ports() {
        assert_eq!(
            allowed_host("Dash.Example.com"),
            Ok("dash.example.com".to_owned())
        );
        assert_eq!(allowed_host("10.0.0.5"), Ok("10.0.0.5".to_owned()));
        assert_eq!(allowed_host("[FE80::1]"), Ok("[fe80::1]".to_owned()));
        for (entry, problem) in [
            ("", "must not be empty"),
            ("*", "wildcards are not supported"),
            ("*.example.com", "wildcards are not supported"),
            ("https://dash.example.com", "server.allowed_origins"),
            ("::1", "\"[::1]\""),
            ("dash.example.com:8265", "every port is admitted"),
            ("dash example", "not a host name"),
            ("dash.example.com/x", "not a host name"),
        ] {
            let error = allowed_host(entry).expect_err(entry).to_string();
            assert!(error.contains(problem), "{entry}: {error}");
        }
    }

    #[test]
    fn allowed_origins_entries_are_normalized_as_browsers_send_them() {
        for (entry, normal) in [
            ("https://Dash.Example.com", "https://dash.example.com"),
            ("HTTPS://dash.example.com:443", "https://dash.example.com"),
            ("http://localhost:80", "http://localhost"),
            ("http://localhost:3000", "http://localhost:3000"),
            ("http://[::1]:8265", "http://[::1]:8265"),
        ] {
            assert_eq!(allowed_origin(entry), Ok(normal.to_owned()), "{entry}");
        }
        for (entry, problem) in [
            ("*", "every web page"),
            ("null", "sandboxed"),
            ("dash.example.com", "scheme://host[:port]"),
            ("ftp://dash.example.com", "http or https"),
            (
                "https://dash.example.com/",
                "no path; write \"https://dash.example.com\"",
            ),
            ("https://", "scheme://host[:port]"),
            ("https://dash.example.com:0", "1 to 65535"),
            ("https://dash.example.com:99999", "1 to 65535"),
            ("https://dash.example.com:", "1 to 65535"),
        ] {
            let error = allowed_origin(entry).expect_err(entry).to_string();
            assert!(error.contains(problem), "{entry}: {error}");
        }
    }
}
