//! Tests of the websocket route: the router served on a Unix socket in a
//! temp dir, with a tokio-tungstenite client.

use std::fs;
use std::path::PathBuf;

use axum::http::StatusCode;
use tokio::net::{UnixListener, UnixStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};
use tokio_tungstenite::WebSocketStream;

use crate::fixture::{encode, Fixture, SECRET, WAIT};
use crate::follow::POLL_INTERVAL;
use crate::PREFIX;

type Client = WebSocketStream<UnixStream>;

/// The fixture's router, served on `<tmp>/s.sock`.
fn serve(fixture: &Fixture) -> PathBuf {
    let socket = fixture.tmp.path().join("s.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let app = fixture.router();
    tokio::spawn(async move { axum::serve(listener, app).await });
    socket
}

async fn connect(socket: &PathBuf, query: &str) -> Result<Client, WsError> {
    let stream = UnixStream::connect(socket).await.unwrap();
    let url = format!("ws://localhost{PREFIX}/ws?{query}");
    let (client, _) = tokio_tungstenite::client_async(url, stream).await?;
    Ok(client)
}

/// The next text, close or end, skipping pings and pongs; fails after WAIT.
async fn next_message(client: &mut Client) -> Option<WsMessage> {
    use futures_util::StreamExt;
    let next = async {
        loop {
            match client.next().await {
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => {}
                Some(Ok(message)) => return Some(message),
                Some(Err(_)) | None => return None,
            }
        }
    };
    tokio::time::timeout(WAIT, next)
        .await
        .expect("no message in time")
}

async fn next_text(client: &mut Client) -> String {
    match next_message(client).await {
        Some(WsMessage::Text(text)) => text.as_str().to_owned(),
        other => panic!("expected text, got {other:?}"),
    }
}

/// Reads messages until their concatenation ends with `want`; each must
/// be whole lines.
async fn read_until(client: &mut Client, want: &str) -> String {
    let mut received = String::new();
    while !received.ends_with(want) {
        let text = next_text(client).await;
        assert!(text.ends_with('\n'), "message is not whole lines: {text:?}");
        received.push_str(&text);
    }
    received
}

/// Expects a close frame with code 1011 and returns its reason.
async fn expect_close_1011(client: &mut Client) -> String {
    match next_message(client).await {
        Some(WsMessage::Close(Some(frame))) => {
            assert_eq!(frame.code, CloseCode::Error);
            frame.reason.as_str().to_owned()
        }
        other => panic!("expected close 1011, got {other:?}"),
    }
}

/// The socket sends the last lines, then appended lines as whole-line
/// messages.
#[tokio::test]
async fn websocket_sends_tail_then_appended_lines() {
    let fixture = Fixture::new();
    fixture.write("f.log", b"a\nb\nc\n");
    let socket = serve(&fixture);
    let mut client = connect(&socket, "name=f.log&lines=2").await.unwrap();
    assert_eq!(next_text(&mut client).await, "b\nc\n");
    fixture.append("f.log", "d\ne\n");
    assert_eq!(read_until(&mut client, "e\n").await, "d\ne\n");
    fixture.append("f.log", "f\n");
    assert_eq!(read_until(&mut client, "f\n").await, "f\n");
}

/// `{"pause":true}` stops lines from coming; `{"pause":false}` delivers
/// what was written meanwhile.
#[tokio::test]
async fn websocket_pause_holds_lines_until_resumed() {
    use futures_util::SinkExt;
    let fixture = Fixture::new();
    fixture.write("f.log", b"a\n");
    let socket = serve(&fixture);
    let mut client = connect(&socket, "name=f.log&lines=1").await.unwrap();
    assert_eq!(next_text(&mut client).await, "a\n");

    client
        .send(WsMessage::text(r#"{"pause":true}"#))
        .await
        .unwrap();
    // The server reads in order: its pong proves the pause was handled.
    client.send(WsMessage::Ping("p".into())).await.unwrap();
    use futures_util::StreamExt;
    let pong = tokio::time::timeout(WAIT, client.next()).await.unwrap();
    assert!(matches!(pong, Some(Ok(WsMessage::Pong(_)))), "{pong:?}");

    fixture.append("f.log", "while paused\n");
    // Several polls' worth of silence: nothing may arrive while paused.
    let silent = tokio::time::timeout(POLL_INTERVAL * 4, client.next()).await;
    assert!(silent.is_err(), "got a message while paused: {silent:?}");

    client
        .send(WsMessage::text(r#"{"pause":false}"#))
        .await
        .unwrap();
    assert_eq!(
        read_until(&mut client, "while paused\n").await,
        "while paused\n"
    );
}

/// A missing file closes the socket with 1011 and the reason.
#[tokio::test]
async fn websocket_closes_1011_when_file_missing() {
    let fixture = Fixture::new();
    let socket = serve(&fixture);
    let mut client = connect(&socket, "name=missing.log").await.unwrap();
    let reason = expect_close_1011(&mut client).await;
    assert!(reason.contains("no such file"), "{reason}");
}

/// When the name is replaced by a link leading out of the folder, the
/// socket closes with 1011, saying why, and the file outside is never sent.
#[tokio::test]
async fn websocket_closes_1011_when_file_rotates_out_of_reach() {
    let fixture = Fixture::new();
    fixture.write("f.log", b"a\n");
    let socket = serve(&fixture);
    let mut client = connect(&socket, "name=f.log&lines=1").await.unwrap();
    assert_eq!(next_text(&mut client).await, "a\n");
    let link = fixture.logs().join("f.log");
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(fixture.outside().join("secret"), &link).unwrap();
    let reason = expect_close_1011(&mut client).await;
    assert!(reason.contains("refused"), "{reason}");
    assert!(reason.contains("symlink"), "{reason}");
    assert!(!reason.contains(SECRET.trim()));
}

/// Names that lead out of the folder, and symlinks even when they lead
/// inside, as the last component or on the way, are refused with 400
/// before the upgrade, like on every other route.
#[tokio::test]
async fn websocket_refuses_escaping_names_and_links_before_upgrade() {
    let fixture = Fixture::new();
    let logs = fixture.logs();
    fs::create_dir(logs.join("sub")).unwrap();
    fixture.write("a/inside.log", b"inside\n");
    std::os::unix::fs::symlink("/etc/hosts", logs.join("hosts-link")).unwrap();
    std::os::unix::fs::symlink(fixture.outside(), logs.join("sub/link-to-outside")).unwrap();
    std::os::unix::fs::symlink("inside.log", logs.join("a/alias.log")).unwrap();
    std::os::unix::fs::symlink("a", logs.join("a-link")).unwrap();
    let socket = serve(&fixture);
    for name in [
        "../outside/secret",
        "/etc/passwd",
        "a/../../outside/secret",
        "hosts-link",
        "sub/link-to-outside/secret",
        "a/alias.log",
        "a-link/inside.log",
    ] {
        let query = format!("name={}", encode(name));
        match connect(&socket, &query).await {
            Err(WsError::Http(response)) => {
                assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{name}");
                let body = response.body().as_deref().unwrap_or_default();
                let text = String::from_utf8_lossy(body);
                assert!(text.contains("\"refused\""), "{name}: {text}");
            }
            Ok(_) => panic!("{name} was upgraded"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}
