//! A module written as a plain Python aiohttp script qualifies, and a burst
//! of requests to it is queued, not refused. The Python with aiohttp comes
//! from `RAY_DASHD_TEST_PYTHON` (scripts/test sets it); without it these
//! tests fail.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{client, command_module, dashd, ModuleDef};

/// The Python with aiohttp. Missing, the test fails: a test that passed
/// without running would hide what it guards.
fn python() -> String {
    std::env::var("RAY_DASHD_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("set RAY_DASHD_TEST_PYTHON to a Python with aiohttp (scripts/test does)")
    })
}

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
