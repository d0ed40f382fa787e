//! The request guard against the real binary: web pages of other origins
//! cannot open websockets or write, rebound DNS names are not answered, and
//! a request's `Host` must be there once; on the host's own routes and the
//! proxied module routes alike.

use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::{self};

use crate::support::{
    bin_dir, client, command_module, dashd, eventually, raw_exchange, test_module, Dashd, WAIT,
};

/// The logs module, with its routes as the default config has them.
fn logs_module() -> crate::support::ModuleDef {
    let bin = bin_dir().join("ray-dashd-logs");
    command_module("logs", &[bin.to_str().expect("utf8 path")]).routes(&[
        ("GET", "/api/dashd/logs/files", "http"),
        ("GET", "/api/dashd/logs/ws", "websocket"),
    ])
}

/// The websocket routes under test: the logs module's and the test module's.
const WEBSOCKETS: [&str; 2] = ["/api/dashd/logs/ws?name=dashboard.log", "/test/ws/echo"];

/// Opens a websocket to `path` with `headers`; the handshake's status and,
/// when refused, the JSON body.
async fn handshake(d: &Dashd, path: &str, headers: &[(&str, &str)]) -> (u16, Option<Value>) {
    let mut request = d.ws_url(path).into_client_request().expect("request");
    for (name, value) in headers {
        request.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((_ws, response)) => (response.status().as_u16(), None),
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            let json = serde_json::from_slice(body).ok();
            (response.status().as_u16(), json)
        }
        Err(other) => panic!("{path}: handshake failed: {other}"),
    }
}

async fn ready(d: &Dashd) {
    d.healthy("tm", 0).await;
    d.healthy("logs", 0).await;
}

/// A page of another origin cannot open a websocket, on the logs module's
/// route or a module's own; the dashboard's own page and tools that send no
/// `Origin` can.
#[tokio::test]
async fn websockets_from_other_origins_are_refused() {
    let d = dashd()
        .module(test_module("tm"))
        .module(logs_module())
        .start();
    ready(&d).await;
    let own = format!("http://{}", d.addr());
    for path in WEBSOCKETS {
        let (status, body) = handshake(&d, path, &[("origin", "http://evil.example")]).await;
        assert_eq!(status, 403, "{path}");
        let body = body.expect("json body");
        assert_eq!(body["setting"], "server.allowed_origins", "{body}");
        let message = body["message"].as_str().expect("message");
        assert!(message.contains("server.allowed_origins"), "{message}");
        let (status, _) = handshake(&d, path, &[("origin", own.as_str())]).await;
        assert_eq!(status, 101, "{path} from its own origin");
        let (status, _) = handshake(&d, path, &[]).await;
        assert_eq!(status, 101, "{path} without Origin");
        let (status, _) = handshake(&d, path, &[("sec-fetch-site", "cross-site")]).await;
        assert_eq!(status, 403, "{path} marked cross-site");
    }
}

/// An origin listed in `server.allowed_origins` may open websockets and
/// write, from another site too.
#[tokio::test]
async fn allowed_origins_admit_websockets_and_writes() {
    let d = dashd()
        .server("allowed_origins", "[\"https://dash.example.com\"]")
        .module(test_module("tm"))
        .module(logs_module())
        .start();
    ready(&d).await;
    let listed = [
        ("origin", "https://dash.example.com"),
        ("sec-fetch-site", "cross-site"),
    ];
    for path in WEBSOCKETS {
        assert_eq!(handshake(&d, path, &listed).await.0, 101, "{path}");
        let other = [("origin", "https://other.example.com")];
        assert_eq!(handshake(&d, path, &other).await.0, 403, "{path}");
    }
    let post = client()
        .post(d.url("/test/echo"))
        .header("origin", "https://dash.example.com")
        .header("sec-fetch-site", "cross-site")
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(post.status(), 200);
}

/// `GET` with `host`; the status and the body.
async fn get_with_host(d: &Dashd, path: &str, host: &str) -> (u16, String) {
    // Connect to loopback whatever address is bound; `host` is only named.
    let url = format!("http://127.0.0.1:{}{path}", d.addr().port());
    let response = client()
        .get(url)
        .header("host", host)
        .send()
        .await
        .expect("get");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// On a loopback address (the default) a request for another host name (a
/// page whose DNS name was rebound to 127.0.0.1) is refused, naming the
/// setting that admits it, on the host's routes and on module routes;
/// loopback names on any port are answered, and so are allowed hosts.
#[tokio::test]
async fn loopback_binding_answers_only_loopback_and_allowed_hosts() {
    let d = dashd()
        .server("allowed_hosts", "[\"dash.example.com\"]")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let port = d.addr().port();
    for path in ["/api/modules", "/test/echo", "/"] {
        for host in ["evil.example", "evil.example:8265"] {
            let (status, body) = get_with_host(&d, path, host).await;
            assert_eq!(status, 403, "{path} for {host}");
            let body: Value = serde_json::from_str(&body).expect("json");
            assert_eq!(body["setting"], "server.allowed_hosts", "{body}");
            let message = body["message"].as_str().expect("message");
            assert!(
                message.contains("add \"evil.example\" to server.allowed_hosts"),
                "{message}"
            );
        }
        for host in [
            format!("localhost:{port}"),
            "localhost".to_owned(),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
            format!("dash.example.com:{port}"),
            "Dash.Example.com".to_owned(),
        ] {
            let (status, body) = get_with_host(&d, path, &host).await;
            assert_eq!(status, 200, "{path} for {host}: {body}");
        }
    }
    // A rebound page posts as its own origin: refused for its host.
    let restart = client()
        .post(d.url("/api/modules/tm/restart"))
        .header("host", format!("evil.example:{port}"))
        .header("origin", format!("http://evil.example:{port}"))
        .send()
        .await
        .expect("post");
    assert_eq!(restart.status(), 403);
}

/// Bound to another address without `server.allowed_hosts`, any `Host` is
/// answered (Ray's behaviour); with it set, only loopback and listed ones.
#[tokio::test]
async fn other_bindings_check_hosts_only_when_allowed_hosts_is_set() {
    let open = dashd()
        .server("host", "\"0.0.0.0\"")
        .module(test_module("tm"))
        .start();
    open.healthy("tm", 0).await;
    for path in ["/api/modules", "/test/echo"] {
        for host in ["evil.example", "10.1.2.3:8265"] {
            assert_eq!(get_with_host(&open, path, host).await.0, 200, "{host}");
        }
    }
    let listed = dashd()
        .server("host", "\"0.0.0.0\"")
        .server("allowed_hosts", "[\"dash.example.com\"]")
        .module(test_module("tm"))
        .start();
    // `healthy` asks for the bound address, 0.0.0.0, which is no loopback name.
    let up = eventually(WAIT, || async {
        let (status, _) = get_with_host(&listed, "/test/echo", "localhost").await;
        (status == 200).then_some(())
    })
    .await;
    assert!(up.is_some(), "module not ready:\n{}", listed.log());
    for path in ["/api/modules", "/test/echo"] {
        assert_eq!(get_with_host(&listed, path, "evil.example").await.0, 403);
        for host in ["dash.example.com:8265", "localhost"] {
            assert_eq!(get_with_host(&listed, path, host).await.0, 200, "{host}");
        }
    }
}

/// Without Ray's modules, a write from a page of another origin (or marked
/// cross-site) is refused before it reaches the module; one from the
/// dashboard's own page, or from a tool that sends no `Origin`, passes.
#[tokio::test]
async fn cross_origin_writes_to_module_routes_are_refused() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let own = format!("http://{}", d.addr());
    let post = |headers: &[(&'static str, String)]| {
        let mut request = client().post(d.url("/test/echo")).body("x");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.send()
    };
    let foreign = post(&[("origin", "http://evil.example".to_owned())])
        .await
        .expect("post");
    assert_eq!(foreign.status(), 403);
    let body: Value = foreign.json().await.expect("json");
    assert_eq!(body["setting"], "server.allowed_origins", "{body}");
    let cross_site = post(&[("sec-fetch-site", "cross-site".to_owned())])
        .await
        .expect("post");
    assert_eq!(cross_site.status(), 403);
    let same = post(&[
        ("origin", own.clone()),
        ("sec-fetch-site", "same-origin".to_owned()),
        ("user-agent", "Mozilla/5.0".to_owned()),
    ])
    .await
    .expect("post");
    assert_eq!(same.status(), 200);
    assert_eq!(post(&[]).await.expect("post").status(), 200);
    // The host's own write too.
    let restart = client()
        .post(d.url("/api/modules/tm/restart"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .expect("restart");
    assert_eq!(restart.status(), 403);
}

/// The status code of a raw response (`HTTP/1.x NNN ...`).
fn status(response: &str) -> &str {
    response.split(' ').nth(1).unwrap_or_default()
}

/// An HTTP/1.1 request without `Host`, or any with two, is answered 400
/// and not forwarded (RFC 9112 §3.2); HTTP/1.0 may omit it.
#[tokio::test]
async fn missing_or_repeated_host_is_400() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    for path in ["/test/echo", "/api/healthz"] {
        for head in [
            format!("GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n"),
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
            format!("GET {path} HTTP/1.0\r\nHost: localhost\r\nHost: evil.example\r\n\r\n"),
            format!("GET {path} HTTP/1.1\r\nHost: local host\r\nConnection: close\r\n\r\n"),
        ] {
            let response = raw_exchange(d.addr(), head.as_bytes());
            assert_eq!(status(&response), "400", "{head:?}: {response}");
            assert!(response.contains("RFC 9112"), "{response}");
        }
        let old = format!("GET {path} HTTP/1.0\r\n\r\n");
        let response = raw_exchange(d.addr(), old.as_bytes());
        assert_eq!(status(&response), "200", "{response}");
    }
}

/// `GET path` with `token` as `Authorization: Bearer`, when given; the
/// status.
async fn status_with_token(d: &Dashd, path: &str, token: Option<&str>) -> u16 {
    let mut request = client().get(d.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("request").status().as_u16()
}

/// With `RAY_AUTH_MODE=token` and Ray's modules not hosted (no Ray head
/// here), the host's own API and the modules' routes, the logs module's
/// included, need the token found as Ray finds it (here `RAY_AUTH_TOKEN`):
/// 401 without it, 403 with a wrong one, 200 with it. Health stays public.
/// (They answered anyone before.)
#[tokio::test]
async fn token_mode_without_ray_requires_the_token() {
    let d = dashd()
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", "s3cret")
        .module(test_module("tm"))
        .module(logs_module())
        .start();
    let ready = eventually(WAIT, || async {
        let response = client()
            .get(d.url("/api/modules"))
            .bearer_auth("s3cret")
            .send()
            .await
            .ok()?;
        let reports: Vec<Value> = response.json().await.ok()?;
        reports
            .iter()
            .all(|report| report["state"] == "healthy")
            .then_some(())
    })
    .await;
    assert!(ready.is_some(), "modules not healthy; log:\n{}", d.log());
    for path in [
        "/api/modules",
        "/api/dashd/logs/files",
        "/test/echo",
        "/dashd/",
    ] {
        assert_eq!(status_with_token(&d, path, None).await, 401, "{path}");
        assert_eq!(
            status_with_token(&d, path, Some("nope")).await,
            403,
            "{path}"
        );
        assert_eq!(
            status_with_token(&d, path, Some("s3cret")).await,
            200,
            "{path}"
        );
    }
    assert_eq!(status_with_token(&d, "/api/healthz", None).await, 200);
}

/// With `RAY_AUTH_MODE=token`, Ray's modules not hosted and no token where
/// Ray looks (`RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`),
/// ray-dashd does not start: exit 1, with one line saying why and how to
/// fix it. (It served everyone before.)
#[test]
fn token_mode_without_a_token_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir");
    let config = dir.path().join("dashd.toml");
    std::fs::write(&config, "[server]\n").expect("config");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
        .arg("--session-dir")
        .arg(dir.path().join("s"))
        .arg("--port")
        .arg("0")
        .arg("--config")
        .arg(&config)
        .env("RAY_AUTH_MODE", "token")
        .env("HOME", &home)
        .env_remove("RAY_AUTH_TOKEN")
        .env_remove("RAY_AUTH_TOKEN_PATH")
        .env_remove("RAY_ENABLE_K8S_TOKEN_AUTH")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ray-dashd");
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ray-dashd did not exit: it started without a token");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "ray-dashd: RAY_AUTH_MODE=token, but no token was found: set RAY_AUTH_TOKEN, or \
             write the token to {}/.ray/auth_token or to a file named by RAY_AUTH_TOKEN_PATH \
             (as for `ray start`); or unset RAY_AUTH_MODE to serve without authentication",
            home.display()
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
}
