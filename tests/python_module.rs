//! A module written as a plain Python aiohttp script qualifies. The Python
//! with aiohttp comes from `RAY_DASHD_TEST_PYTHON` (scripts/test sets it).

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{client, command_module, dashd};

fn python() -> Option<String> {
    match std::env::var("RAY_DASHD_TEST_PYTHON") {
        Ok(python) => Some(python),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("RAY_DASHD_TEST_PYTHON must name a Python with aiohttp in CI")
        }
        Err(_) => {
            eprintln!("skipped: set RAY_DASHD_TEST_PYTHON to a Python with aiohttp");
            None
        }
    }
}

/// The aiohttp script is supervised and its http and websocket routes work.
#[tokio::test]
async fn aiohttp_script_is_a_module() {
    let Some(python) = python() else { return };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/aiohttp_module.py"
    );
    let d = dashd()
        .module(command_module("py", &[&python, script]).routes(&[
            ("GET", "/api/py/hello", "http"),
            ("GET", "/api/py/ws", "websocket"),
        ]))
        .start();
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
