//! Unit tests of the guard: hosts, origins, Ray's browser rule, the config
//! values and the refusals' responses.

use super::*;
use clap::Parser;

use crate::cli::Cli;
use crate::config::Config;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const ANY: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// The guard of a server bound to `bound` with the `[server]` lines `server`.
fn guard(bound: IpAddr, server: &str, ray: bool) -> Guard {
    let cli = Cli::parse_from(["ray-dashd"]);
    let config = Config::from_toml("t.toml", &format!("[server]\n{server}"), &cli).expect("config");
    Guard::new(&config.server, bound, ray)
}

fn request(method: Method, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).expect("request")
}

fn get_host(host: &str) -> Request<()> {
    request(Method::GET, "/api/modules", &[("host", host)])
}

/// Both checks, as `Dispatch` runs them.
fn admit(guard: &Guard, request: &Request<()>) -> Result<(), Refusal> {
    let host = guard.check_host(request)?;
    guard.check_origin(request, host)
}

#[test]
fn loopback_binding_answers_loopback_hosts_only() {
    let g = guard(LOOPBACK, "", false);
    for host in [
        "localhost",
        "localhost:8265",
        "LocalHost:1",
        "127.0.0.1",
        "127.0.0.1:8265",
        "127.3.2.1:80",
        "[::1]",
        "[::1]:8265",
        "[::ffff:127.0.0.1]:8265",
        "",
    ] {
        assert_eq!(g.check_host(&get_host(host)), Ok(Some(host)), "{host}");
    }
    for (host, name) in [
        ("evil.example", "evil.example"),
        ("evil.example:8265", "evil.example"),
        ("localhost.evil.example", "localhost.evil.example"),
        ("127.0.0.1.nip.io:8265", "127.0.0.1.nip.io"),
        ("10.0.0.1:8265", "10.0.0.1"),
        ("0.0.0.0:8265", "0.0.0.0"),
        ("[::2]:8265", "[::2]"),
    ] {
        assert_eq!(
            g.check_host(&get_host(host)),
            Err(Refusal::HostNotAllowed {
                host: name.to_owned()
            }),
            "{host}"
        );
    }
    let v6 = guard(IpAddr::from(Ipv6Addr::LOCALHOST), "", false);
    assert!(v6.check_host(&get_host("evil.example")).is_err());
}

#[test]
fn allowed_hosts_admit_their_names_on_any_port() {
    let g = guard(
        LOOPBACK,
        "allowed_hosts = [\"Dash.Example.com\", \"10.0.0.5\"]\n",
        false,
    );
    for host in [
        "dash.example.com",
        "DASH.example.com:443",
        "10.0.0.5:8265",
        "localhost:8265",
    ] {
        assert!(g.check_host(&get_host(host)).is_ok(), "{host}");
    }
    assert!(g.check_host(&get_host("evil.example")).is_err());
}

#[test]
fn other_bindings_check_hosts_only_when_allowed_hosts_is_set() {
    let open = guard(ANY, "", false);
    for host in ["evil.example", "10.0.0.5:8265", "localhost"] {
        assert!(open.check_host(&get_host(host)).is_ok(), "{host}");
    }
    let listed = guard(ANY, "allowed_hosts = [\"dash.example.com\"]\n", false);
    assert!(listed
        .check_host(&get_host("dash.example.com:8265"))
        .is_ok());
    assert!(listed.check_host(&get_host("127.0.0.1:8265")).is_ok());
    assert!(listed.check_host(&get_host("evil.example")).is_err());
}

#[test]
fn host_must_be_present_once_and_valid() {
    let open = guard(ANY, "", false);
    let none = request(Method::GET, "/", &[]);
    assert_eq!(open.check_host(&none), Err(Refusal::MissingHost));
    let two = request(
        Method::GET,
        "/",
        &[("host", "localhost"), ("host", "localhost")],
    );
    assert_eq!(open.check_host(&two), Err(Refusal::DuplicateHost));
    for bad in ["a b", "x:y", "[zz]:1", "[::1]x", "user@localhost", "a/b"] {
        assert_eq!(
            open.check_host(&get_host(bad)),
            Err(Refusal::BadHost),
            "{bad}"
        );
    }
    // HTTP/1.0 needs no Host.
    let mut old = request(Method::GET, "/", &[]);
    *old.version_mut() = Version::HTTP_10;
    assert_eq!(guard(LOOPBACK, "", false).check_host(&old), Ok(None));
    let mut old_two = two;
    *old_two.version_mut() = Version::HTTP_10;
    assert_eq!(open.check_host(&old_two), Err(Refusal::DuplicateHost));
}

#[test]
fn absolute_form_target_must_name_an_answered_host_too() {
    let g = guard(LOOPBACK, "", false);
    let r = request(
        Method::GET,
        "http://evil.example/api/modules",
        &[("host", "localhost")],
    );
    assert!(matches!(
        g.check_host(&r),
        Err(Refusal::HostNotAllowed { .. })
    ));
    let r = request(
        Method::GET,
        "http://127.0.0.1:8265/api/modules",
        &[("host", "localhost:8265")],
    );
    assert_eq!(g.check_host(&r), Ok(Some("127.0.0.1:8265")));
}

/// A rebound page's request names its own host in both Host and Origin, so
/// it passes the origin check; the host check refuses it.
#[test]
fn rebound_page_is_refused_by_its_host() {
    let g = guard(LOOPBACK, "", false);
    let r = request(
        Method::POST,
        "/api/modules/logs/restart",
        &[
            ("host", "evil.example:8265"),
            ("origin", "http://evil.example:8265"),
        ],
    );
    assert!(matches!(admit(&g, &r), Err(Refusal::HostNotAllowed { .. })));
}

fn websocket(origin: Option<&str>) -> Request<()> {
    let mut headers = vec![
        ("host", "127.0.0.1:8265"),
        ("connection", "upgrade"),
        ("upgrade", "websocket"),
    ];
    headers.extend(origin.map(|o| ("origin", o)));
    request(Method::GET, "/api/dashd/logs/ws?name=x", &headers)
}

#[test]
fn websockets_from_other_origins_are_refused() {
    let g = guard(LOOPBACK, "", false);
    assert_eq!(admit(&g, &websocket(None)), Ok(()));
    assert_eq!(admit(&g, &websocket(Some("http://127.0.0.1:8265"))), Ok(()));
    assert_eq!(
        admit(&g, &websocket(Some("HTTPS://127.0.0.1:8265"))),
        Ok(())
    );
    for origin in [
        "http://evil.example",
        "http://127.0.0.1:9999",
        "http://localhost:8265",
        "file://127.0.0.1:8265",
        "127.0.0.1:8265",
    ] {
        assert_eq!(
            admit(&g, &websocket(Some(origin))),
            Err(Refusal::ForeignOrigin {
                origin: origin.to_owned(),
                websocket: true
            }),
            "{origin}"
        );
    }
    assert_eq!(
        admit(&g, &websocket(Some("null"))),
        Err(Refusal::OpaqueOrigin { websocket: true })
    );
    let mut cross_site = websocket(None);
    cross_site
        .headers_mut()
        .insert(SEC_FETCH_SITE, HeaderValue::from_static("cross-site"));
    assert_eq!(
        admit(&g, &cross_site),
        Err(Refusal::CrossSite { websocket: true })
    );
}

#[test]
fn allowed_origins_admit_websockets_and_writes() {
    let g = guard(
        LOOPBACK,
        "allowed_origins = [\"https://Dash.Example.com:443\", \"http://localhost:3000\"]\n",
        false,
    );
    assert_eq!(
        admit(&g, &websocket(Some("https://dash.example.com"))),
        Ok(())
    );
    let post = request(
        Method::POST,
        "/test/echo",
        &[
            ("host", "127.0.0.1:8265"),
            ("origin", "http://localhost:3000"),
            ("sec-fetch-site", "cross-site"),
        ],
    );
    assert_eq!(admit(&g, &post), Ok(()));
    assert!(admit(&g, &websocket(Some("http://localhost:3001"))).is_err());
}

#[test]
fn writes_from_other_origins_or_sites_are_refused_reads_pass() {
    let g = guard(ANY, "", false);
    let with = |method: Method, headers: &[(&str, &str)]| {
        let mut all = vec![("host", "10.0.0.5:8265")];
        all.extend_from_slice(headers);
        admit(&g, &request(method, "/test/echo", &all))
    };
    let foreign = [("origin", "http://evil.example")];
    for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
        assert_eq!(
            with(method.clone(), &foreign),
            Err(Refusal::ForeignOrigin {
                origin: "http://evil.example".to_owned(),
                websocket: false
            }),
            "{method}"
        );
    }
    assert_eq!(
        with(Method::POST, &[("sec-fetch-site", "cross-site")]),
        Err(Refusal::CrossSite { websocket: false })
    );
    assert_eq!(
        with(Method::POST, &[("origin", "null")]),
        Err(Refusal::OpaqueOrigin { websocket: false })
    );
    assert_eq!(
        with(Method::POST, &[("origin", "http://10.0.0.5:8265")]),
        Ok(())
    );
    assert_eq!(
        with(Method::POST, &[("sec-fetch-site", "same-origin")]),
        Ok(())
    );
    assert_eq!(with(Method::POST, &[]), Ok(()));
    for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
        assert_eq!(with(method.clone(), &foreign), Ok(()), "{method}");
        let cross = [("sec-fetch-site", "cross-site")];
        assert_eq!(with(method.clone(), &cross), Ok(()), "{method}");
    }
    // HTTP/1.0 without Host names no host, so no origin is its own.
    let mut old = request(Method::POST, "/test/echo", &foreign[..1]);
    *old.version_mut() = Version::HTTP_10;
    assert!(admit(&g, &old).is_err());
}

#[test]
fn ray_browser_rule_comes_first_with_its_exceptions() {
    let g = guard(LOOPBACK, "", true);
    let host = ("host", "127.0.0.1:8265");
    let mozilla = [host, ("user-agent", "Mozilla/5.0")];
    assert_eq!(
        admit(&g, &request(Method::POST, "/api/jobs/", &mozilla)),
        Err(Refusal::BrowserWrite {
            method: Method::POST
        })
    );
    for name in ray_dashd_contract::browser::BROWSER_HEADERS {
        let r = request(Method::DELETE, "/api/jobs/x", &[host, (name, "x")]);
        assert!(
            matches!(admit(&g, &r), Err(Refusal::BrowserWrite { .. })),
            "{name}"
        );
    }
    let cli = [host, ("user-agent", "python-requests/2.32")];
    assert_eq!(
        admit(&g, &request(Method::POST, "/api/jobs/", &cli)),
        Ok(())
    );
    for method in [Method::GET, Method::OPTIONS] {
        assert_eq!(admit(&g, &request(method, "/api/jobs/", &mozilla)), Ok(()));
    }
    for path in ["/api/authenticate", "/api/modules/JobHead/restart"] {
        assert_eq!(admit(&g, &request(Method::POST, path, &mozilla)), Ok(()));
        // The exceptions still answer only their own origin.
        let foreign = [host, ("origin", "http://evil.example")];
        assert!(matches!(
            admit(&g, &request(Method::POST, path, &foreign)),
            Err(Refusal::ForeignOrigin { .. })
        ));
    }
    // Without Ray the same browser write passes: it is same-origin.
    let plain = guard(LOOPBACK, "", false);
    assert_eq!(
        admit(&plain, &request(Method::POST, "/api/jobs/", &mozilla)),
        Ok(())
    );
}

async fn body_of(response: Response) -> serde_json::Value {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("body");
    serde_json::from_slice(&bytes).expect("json")
}

#[tokio::test]
async fn refusals_name_the_setting_that_admits_them() {
    let host = Refusal::HostNotAllowed {
        host: "evil.example".to_owned(),
    }
    .into_response();
    assert_eq!(host.status(), StatusCode::FORBIDDEN);
    let body = body_of(host).await;
    assert_eq!(body["setting"], "server.allowed_hosts");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("add \"evil.example\" to server.allowed_hosts"),
        "{message}"
    );

    let origin = Refusal::ForeignOrigin {
        origin: "http://evil.example".to_owned(),
        websocket: true,
    }
    .into_response();
    assert_eq!(origin.status(), StatusCode::FORBIDDEN);
    let body = body_of(origin).await;
    assert_eq!(body["setting"], "server.allowed_origins");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.starts_with("a websocket handshake from origin \"http://evil.example\"")
            && message.contains("add \"http://evil.example\" to server.allowed_origins"),
        "{message}"
    );

    let missing = Refusal::MissingHost.into_response();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(missing.headers()[header::CONNECTION], "close");
    assert!(body_of(missing).await["message"]
        .as_str()
        .expect("message")
        .contains("RFC 9112"));

    let ray = Refusal::BrowserWrite {
        method: Method::POST,
    }
    .into_response();
    assert_eq!(ray.status(), StatusCode::METHOD_NOT_ALLOWED);
    let text = axum::body::to_bytes(ray.into_body(), 1024)
        .await
        .expect("body");
    assert_eq!(&text[..], b"'POST' method not allowed for browser traffic.");
}
