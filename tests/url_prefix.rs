//! `--url-prefix`: everything (the host's API and UI, module routes of
//! each kind, websockets) answered under the prefix and nothing outside
//! it, redirects pointed back under it, and bad prefixes refused. With Ray's
//! CLI: `ray_serving.rs`.

use std::process::Command;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{self, Message};

use crate::support::{client, dashd, test_module, WAIT};

const PREFIX: &str = "/ray/dash-1";

/// Under the prefix the host's API and UI, a module's http, stream and
/// websocket routes answer; the same paths without it, or under a path
/// that only begins like it, are 404; a module's redirect to an absolute
/// path comes back under the prefix, and the bare prefix redirects to
/// itself with a `/`.
#[tokio::test]
async fn everything_is_served_under_the_prefix_and_nothing_outside() {
    let d = dashd()
        .module(test_module("tm"))
        .arg("--url-prefix")
        .arg(PREFIX)
        .prefixed(PREFIX)
        .start();
    d.healthy("tm", 0).await;
    let c = client();
    let get = |url: String| {
        let c = c.clone();
        async move { c.get(url).send().await.expect("GET") }
    };
    let at = |path: &str| format!("http://{}{path}", d.addr());

    assert_eq!(get(d.url("/api/healthz")).await.status(), 200);
    let echo = get(d.url("/test/echo?x=1")).await;
    assert_eq!(echo.status(), 200);
    let body = echo.text().await.expect("body");
    // The module sees the path without the prefix.
    assert!(body.contains("/test/echo"), "{body}");
    assert!(!body.contains(PREFIX), "{body}");
    let stream = get(d.url("/test/stream?chunks=3&size=5")).await;
    assert_eq!(stream.status(), 200);
    assert_eq!(
        stream.bytes().await.expect("stream body").as_ref(),
        b"aaaaabbbbbccccc"
    );
    let ui = get(d.url("/dashd/")).await;
    assert_eq!(ui.status(), 200);
    assert!(ui.text().await.expect("ui").contains("app.js"));

    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("websocket under the prefix");
    ws.send(Message::Text("hi".into())).await.expect("send");
    let back = tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("message");
    assert_eq!(back, Message::Text("hi".into()));

    for path in [
        "/api/healthz",
        "/test/echo",
        "/test/stream",
        "/dashd/",
        "/",
        "/ray/dash-1x/api/healthz",
        "/ray/api/healthz",
    ] {
        assert_eq!(get(at(path)).await.status(), 404, "{path}");
    }
    let outside = format!("ws://{}/test/ws/echo", d.addr());
    match tokio_tungstenite::connect_async(outside).await {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 404),
        other => panic!("a websocket outside the prefix: {other:?}"),
    }

    let redirect = get(d.url("/test/status/302")).await;
    assert_eq!(redirect.status(), 302);
    assert_eq!(
        redirect.headers()["location"],
        format!("{PREFIX}/test/echo?redirected=1").as_str()
    );
    let bare = get(at(&format!("{PREFIX}?a=1"))).await;
    assert_eq!(bare.status(), 308);
    assert_eq!(
        bare.headers()["location"],
        format!("{PREFIX}/?a=1").as_str()
    );
}

/// The prefix from the config file and from `RAY_DASHD_URL_PREFIX` works
/// as the flag does.
#[tokio::test]
async fn the_prefix_comes_from_the_file_or_the_environment() {
    let from_file = dashd()
        .server("url_prefix", "\"/from-file\"")
        .prefixed("/from-file")
        .start();
    let from_env = dashd()
        .env("RAY_DASHD_URL_PREFIX", "/from-env")
        .prefixed("/from-env")
        .start();
    for d in [&from_file, &from_env] {
        let ok = client()
            .get(d.url("/api/healthz"))
            .send()
            .await
            .expect("GET");
        assert_eq!(ok.status(), 200, "{}", d.url("/api/healthz"));
    }
}

/// Prefixes that are not one clean absolute path are config errors (exit
/// 64) naming `server.url_prefix`.
#[test]
fn bad_prefixes_are_refused() {
    for bad in [
        "ray", "/", "/ray/", "//ray", "/a//b", "/a/./b", "/a/..", "/a b", "/a%20b", "/a?b",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
            .args(["--check-config", "--url-prefix", bad])
            .env_remove("RAY_DASHD_CONFIG")
            .env_remove("RAY_DASHD_URL_PREFIX")
            .output()
            .expect("run ray-dashd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bad}: {stderr}");
        assert!(stderr.contains(": server.url_prefix: "), "{bad}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{bad}: {stderr}");
    }
}
