//! Client connections idle between requests: parked with no HTTP state
//! (`ray_dashd_client_connections_waiting` counts them), and served again
//! on the same socket, a request half sent before the park, and a
//! websocket upgrade, included.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{dashd, eventually, metric_value, raw_exchange, test_module, WAIT};

/// `ray_dashd_client_connections_waiting`, scraped on a connection of its
/// own, closed after the answer (so never counted itself).
fn waiting(addr: SocketAddr) -> Option<u64> {
    let text = raw_exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    metric_value(&text, "ray_dashd_client_connections_waiting").map(|v| v as u64)
}

/// Waits until exactly `n` client connections are parked.
async fn until_waiting(addr: SocketAddr, n: u64) {
    let last = std::sync::Mutex::new(None);
    let seen = eventually(WAIT, || async {
        let now = waiting(addr);
        *last.lock().expect("lock") = now;
        (now == Some(n)).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "{n} parked connections expected; the gauge said {:?}",
        last.lock().expect("lock")
    );
}

/// A keep-alive connection to `addr`, reads bounded.
fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    stream
}

/// Reads one answer with a `content-length` from `stream`: its status line
/// and its body.
fn read_answer(stream: &mut TcpStream) -> (String, String) {
    let (status, _, body) = read_whole(stream);
    (status, body)
}

/// Reads one answer: its status line and its head.
fn read_head_and_answer(stream: &mut TcpStream) -> (String, String) {
    let (status, head, _) = read_whole(stream);
    (status, head)
}

/// Reads one answer with a `content-length` from `stream`: its status
/// line, its head and its body.
fn read_whole(stream: &mut TcpStream) -> (String, String, String) {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("read head");
        assert_eq!(n, 1, "closed mid-head: {}", String::from_utf8_lossy(&got));
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).expect("utf-8 head");
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("read body");
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

const HEALTHZ: &[u8] = b"GET /api/healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Three keep-alive clients, idle after one request each, are all parked;
/// each is answered again on its socket; one that closes while parked is
/// let go.
#[tokio::test]
async fn idle_keep_alive_clients_are_parked_and_answered_again() {
    let d = dashd().start();
    let mut clients: Vec<TcpStream> = (0..3).map(|_| connect(d.addr())).collect();
    for client in &mut clients {
        client.write_all(HEALTHZ).expect("request");
        let (status, _) = read_answer(client);
        assert_eq!(status, "HTTP/1.1 200 OK");
    }
    until_waiting(d.addr(), 3).await;
    for client in &mut clients {
        client.write_all(HEALTHZ).expect("request after the park");
        let (status, _) = read_answer(client);
        assert_eq!(status, "HTTP/1.1 200 OK");
    }
    until_waiting(d.addr(), 3).await;
    drop(clients.pop());
    until_waiting(d.addr(), 2).await;
}

/// A connection whose request head stops halfway is not parked (hyper
/// would only have answered it with `connection: close`): once a client
/// that went idle later is parked, it still is not, and when the rest of
/// its head comes it is answered and kept alive.
#[tokio::test]
async fn a_request_half_sent_is_not_parked_and_kept_alive() {
    let d = dashd().start();
    let mut half = connect(d.addr());
    half.write_all(b"GET /api/healthz HTTP/1.1\r\nHo")
        .expect("first half");
    let mut later = connect(d.addr());
    later.write_all(HEALTHZ).expect("request");
    let (status, _) = read_answer(&mut later);
    assert_eq!(status, "HTTP/1.1 200 OK");
    // `later` went idle after `half` did, so `half` would be parked by now.
    until_waiting(d.addr(), 1).await;
    half.write_all(b"st: localhost\r\n\r\n")
        .expect("second half");
    let (status, head) = read_head_and_answer(&mut half);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    half.write_all(HEALTHZ).expect("the next request");
    let (status, _) = read_answer(&mut half);
    assert_eq!(status, "HTTP/1.1 200 OK");
}

/// A websocket opened on a connection that was parked after a request
/// relays as on a fresh one.
#[tokio::test]
async fn a_parked_connection_upgrades_to_a_websocket() {
    let d = dashd().module(test_module("tm")).start();
    // Ready without a keep-alive client of the test's own left behind.
    let ready = eventually(WAIT, || async {
        raw_exchange(
            d.addr(),
            b"GET /test/echo HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .starts_with("HTTP/1.1 200")
        .then_some(())
    })
    .await;
    assert!(ready.is_some(), "module never served; log:\n{}", d.log());
    let mut client = connect(d.addr());
    client.write_all(HEALTHZ).expect("request");
    let (status, _) = read_answer(&mut client);
    assert_eq!(status, "HTTP/1.1 200 OK");
    until_waiting(d.addr(), 1).await;
    client.set_nonblocking(true).expect("nonblocking");
    let stream = tokio::net::TcpStream::from_std(client).expect("tokio stream");
    let (mut ws, _) = tokio_tungstenite::client_async(d.ws_url("/test/ws/echo"), stream)
        .await
        .expect("websocket handshake on the parked connection");
    for text in ["one", "two"] {
        ws.send(Message::text(text)).await.expect("send");
        let echo = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("echo in time")
            .expect("open")
            .expect("frame");
        assert_eq!(echo, Message::text(text));
    }
    assert!(
        !d.log().contains("not a bare socket"),
        "the relay did not take the bare socket back:\n{}",
        d.log()
    );
}

/// GETs for a module's route, served without a hyper connection, park the
/// same way: two keep-alive clients are parked after their answers and
/// answered again on their sockets; a third whose head stopped halfway is
/// not parked, and is answered once the rest comes, kept alive.
#[tokio::test]
async fn module_gets_are_parked_and_answered_again() {
    const ECHO: &[u8] = b"GET /test/echo?again=1 HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let mut half = connect(d.addr());
    half.write_all(b"GET /test/echo?again=1 HTTP/1.1\r\nHo")
        .expect("first half");
    let mut clients: Vec<TcpStream> = (0..2).map(|_| connect(d.addr())).collect();
    for round in 0..2 {
        for client in &mut clients {
            client.write_all(ECHO).expect("request");
            let (status, body) = read_answer(client);
            assert_eq!(status, "HTTP/1.1 200 OK", "round {round}");
            assert!(
                body.contains("\"query\":\"again=1\""),
                "round {round}: {body}"
            );
        }
        until_waiting(d.addr(), 2).await;
    }
    half.write_all(b"st: localhost\r\n\r\n")
        .expect("second half");
    let (status, head, body) = read_whole(&mut half);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("\"query\":\"again=1\""), "{body}");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    half.write_all(ECHO).expect("the next request");
    let (status, _) = read_answer(&mut half);
    assert_eq!(status, "HTTP/1.1 200 OK");
}
