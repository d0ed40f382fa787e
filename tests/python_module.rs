//! A module written as a plain Python aiohttp script qualifies, a burst of
//! requests to it is queued, not refused, and a thousand websockets to it
//! stay open at once. The Python with aiohttp comes
//! from `RAY_DASHD_TEST_PYTHON` (scripts/test sets it); without it these
//! tests fail.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{client, command_module, dashd, python, ModuleDef};

/// The aiohttp script as a module serving `/api/py/hello` and `/api/py/ws`.
fn aiohttp_module(name: &str) -> ModuleDef {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/aiohttp_module.py"
    );
    command_module(name, &[&python(), script]).routes(&[
        ("GET", "/api/py/hello", "http"),
        ("GET", "/api/py/ws", "websocket"),
    ])
}

/// The aiohttp script is supervised and its http and websocket routes work.
#[tokio::test]
async fn aiohttp_script_is_a_module() {
    let d = dashd().module(aiohttp_module("py")).start();
    d.healthy("py", 0).await;
    let hello: Value = client()
        .get(d.url("/api/py/hello?a=1"))
        .send()
        .await
        .expect("hello")
        .json()
        .await
        .expect("json");
    assert_eq!(hello["module"], "py");
    assert_eq!(hello["query"], "a=1");
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/api/py/ws"))
        .await
        .expect("ws");
    ws.send(Message::Text("hi".into())).await.expect("send");
    let reply = tokio::time::timeout(crate::support::WAIT, ws.next())
        .await
        .expect("reply in time")
        .expect("open")
        .expect("ok");
    assert_eq!(reply, Message::Text("py:hi".into()));
}

/// A burst far beyond aiohttp's listen backlog (128) all answers 200: the
/// host opens no more connections than the module's cap and queues the
/// rest, where it used to open one per request and have some connects
/// refused with EAGAIN (502 "cannot connect").
#[tokio::test]
async fn a_burst_beyond_the_backlog_all_answers() {
    const REQUESTS: usize = 1000;
    const CONCURRENCY: usize = 500;
    let d = dashd().module(aiohttp_module("py")).start();
    d.healthy("py", 0).await;
    let client = client();
    let url = d.url("/api/py/hello?busy_ms=2");
    let statuses: Vec<(u16, String)> = futures_util::stream::iter(0..REQUESTS)
        .map(|_| {
            let request = client.get(&url).send();
            async move {
                match request.await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        (status, response.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, e.to_string()),
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let failed: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    let log = d.log();
    let tail: String = log.lines().rev().take(40).collect::<Vec<_>>().join("\n");
    assert!(
        failed.is_empty(),
        "{} of {REQUESTS} failed; first: {:?}\nlast log lines, newest first:\n{tail}",
        failed.len(),
        failed.first(),
    );
}

/// A thousand websockets to one aiohttp module through the host, all open
/// at once, each echoing; the host counts them as long-lived, and answers
/// its health check and a proxied request meanwhile. (They used to hold
/// one of the module's 100 connections each: the 101st waited for one
/// with no bound.)
#[tokio::test]
async fn a_thousand_websockets_to_one_aiohttp_module_all_echo() {
    const SOCKETS: usize = 1000;
    // This test's own ends of the sockets, and the host's and the module's
    // (they inherit the limit), need more than the usual 1,024.
    let nofile = ray_dashd::descriptors::raise_nofile_limit();
    assert!(
        nofile >= 3 * SOCKETS as u64,
        "the open-file limit ({nofile}) is too low for {SOCKETS} websockets; raise it (ulimit -Hn)"
    );
    let d = dashd().module(aiohttp_module("py")).start();
    d.healthy("py", 0).await;
    let url = d.ws_url("/api/py/ws");
    let opened: Vec<_> = futures_util::stream::iter(0..SOCKETS)
        .map(|_| tokio_tungstenite::connect_async(url.clone()))
        .buffer_unordered(100)
        .collect()
        .await;
    let failed = opened.iter().filter(|o| o.is_err()).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {SOCKETS} websockets not opened; first: {:?}",
        opened.iter().find_map(|o| o.as_ref().err())
    );
    let mut sockets: Vec<_> = opened.into_iter().flatten().map(|(ws, _)| ws).collect();
    let connections = d.module("py").await["connections"].clone();
    assert_eq!(connections["long_lived"], SOCKETS, "{connections}");

    let echoes =
        futures_util::future::join_all(sockets.iter_mut().enumerate().map(|(i, ws)| async move {
            ws.send(Message::Text(i.to_string().into())).await.ok()?;
            let reply = tokio::time::timeout(crate::support::WAIT, ws.next()).await;
            match reply {
                Ok(Some(Ok(Message::Text(text)))) => {
                    (text.as_str() == format!("py:{i}")).then_some(())
                }
                _ => None,
            }
        }))
        .await;
    let silent = echoes.iter().filter(|e| e.is_none()).count();
    assert_eq!(silent, 0, "{silent} of {SOCKETS} websockets did not echo");

    let health = client()
        .get(d.url("/api/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let hello = client()
        .get(d.url("/api/py/hello"))
        .send()
        .await
        .expect("hello");
    assert_eq!(hello.status(), 200);
    let module = d.module("py").await;
    assert_eq!(module["restarts"], 0, "{module}");
}
