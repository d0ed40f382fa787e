//! Websocket routes: handshake through the module, messages both ways in
//! order, pings per hop, close codes across, size limits, HTTP fallback.

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::support::{cpu_ticks, dashd, eventually, test_module, WAIT};

async fn next_message<S>(ws: &mut S) -> Message
where
    S: futures_util::Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("message in time")
        .expect("stream open")
        .expect("message ok")
}

/// Messages from the module reach the client in order, text and binary,
/// then the module's close code and reason.
#[tokio::test]
async fn module_messages_arrive_in_order_then_close() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (mut ws, response) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/out?count=200"))
        .await
        .expect("connect");
    assert_eq!(response.status(), 101);
    for i in 0u32..200 {
        let expected = if i % 2 == 0 {
            Message::Text(format!("msg-{i}").into())
        } else {
            Message::Binary(i.to_be_bytes().to_vec().into())
        };
        assert_eq!(next_message(&mut ws).await, expected, "message {i}");
    }
    match next_message(&mut ws).await {
        Message::Close(Some(frame)) => {
            assert_eq!(frame.code, CloseCode::Normal);
            assert_eq!(frame.reason, "done");
        }
        other => panic!("expected close, got {other:?}"),
    }
}

/// Client messages reach the module and come back; the proxy answers pings.
#[tokio::test]
async fn echoes_text_binary_and_answers_pings() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    ws.send(Message::Text("hello".into())).await.expect("send");
    assert_eq!(next_message(&mut ws).await, Message::Text("hello".into()));
    ws.send(Message::Binary(vec![0, 1, 2, 255].into()))
        .await
        .expect("send");
    assert_eq!(
        next_message(&mut ws).await,
        Message::Binary(vec![0, 1, 2, 255].into())
    );
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .expect("ping");
    assert_eq!(
        next_message(&mut ws).await,
        Message::Pong(b"are you there".to_vec().into())
    );
    // A 16 MiB message is well within the default 64 MiB limit.
    let big = vec![42u8; 16 * 1024 * 1024];
    ws.send(Message::Binary(big.clone().into()))
        .await
        .expect("send big");
    assert_eq!(next_message(&mut ws).await, Message::Binary(big.into()));
}

/// The client's close code and reason reach the module.
#[tokio::test]
async fn client_close_code_reaches_module() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    ws.close(Some(CloseFrame {
        code: CloseCode::from(4001),
        reason: "client says bye".into(),
    }))
    .await
    .expect("close");
    let recorded = eventually(WAIT, || async {
        let close = d.test_stats().await?["ws_last_close"].clone();
        (!close.is_null()).then_some(close)
    })
    .await
    .expect("module saw a close");
    assert_eq!(recorded["code"], 4001);
    assert_eq!(recorded["reason"], "client says bye");
}

/// The module's close code and reason reach the client.
#[tokio::test]
async fn module_close_code_reaches_client() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    ws.send(Message::Text("close:4002:module says later".into()))
        .await
        .expect("send");
    match next_message(&mut ws).await {
        Message::Close(Some(frame)) => {
            assert_eq!(u16::from(frame.code), 4002);
            assert_eq!(frame.reason, "module says later");
        }
        other => panic!("expected close, got {other:?}"),
    }
}

/// A module that answers the upgrade with plain HTTP has its answer passed
/// to the client unchanged.
#[tokio::test]
async fn falls_back_to_the_modules_http_answer() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let err = tokio_tungstenite::connect_async(d.ws_url("/test/ws/not"))
        .await
        .expect_err("not a websocket");
    match err {
        tungstenite::Error::Http(response) => {
            assert_eq!(response.status(), 403);
            assert_eq!(response.headers()["x-test"], "fallback");
            let body = response.body().as_deref().unwrap_or_default();
            assert_eq!(String::from_utf8_lossy(body), "no websocket here");
        }
        other => panic!("expected an HTTP answer, got {other:?}"),
    }
}

/// A message over the configured limit closes the socket with 1009.
#[tokio::test]
async fn oversized_message_closes_with_1009() {
    let d = dashd()
        .server("max_websocket_message_bytes", "65536")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    ws.send(Message::Binary(vec![1u8; 65536].into()))
        .await
        .expect("send");
    assert_eq!(
        next_message(&mut ws).await,
        Message::Binary(vec![1u8; 65536].into())
    );
    ws.send(Message::Binary(vec![1u8; 65537].into()))
        .await
        .expect("send");
    match next_message(&mut ws).await {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Size),
        other => panic!("expected close 1009, got {other:?}"),
    }
}

/// A websocket to a module that dies is closed with 1012 or cut, never left
/// hanging.
#[tokio::test]
async fn module_failure_closes_websocket() {
    let d = dashd().module(test_module("tm")).start();
    let report = d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    ws.send(Message::Text("x".into())).await.expect("send");
    assert_eq!(next_message(&mut ws).await, Message::Text("x".into()));
    crate::support::kill(
        report["pid"].as_u64().expect("pid"),
        nix::sys::signal::Signal::SIGKILL,
    );
    let end = tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("websocket ended in time");
    match end {
        Some(Ok(Message::Close(Some(frame)))) => {
            assert!(
                frame.code == CloseCode::Error || frame.code == CloseCode::Restart,
                "{frame:?}"
            );
        }
        None | Some(Err(_)) => {}
        other => panic!("expected the websocket to end, got {other:?}"),
    }
}

/// Each hop answers its own pings: the client gets its pong from the host
/// even while the module cannot answer anything.
#[tokio::test]
async fn host_answers_client_pings_while_module_is_stopped() {
    let d = dashd().module(test_module("tm")).start();
    let report = d.healthy("tm", 0).await;
    let pid = report["pid"].as_u64().expect("pid");
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    crate::support::kill(pid, nix::sys::signal::Signal::SIGSTOP);
    ws.send(Message::Ping(b"hop".to_vec().into()))
        .await
        .expect("ping");
    let pong = next_message(&mut ws).await;
    crate::support::kill(pid, nix::sys::signal::Signal::SIGCONT);
    assert_eq!(pong, Message::Pong(b"hop".to_vec().into()));
}

/// A client that hangs up while the module neither answers nor closes
/// leaves the relay waiting for the module, idle: the host does not spin
/// (it once did, on the other direction's closed queue, until the closing
/// deadline).
#[tokio::test]
async fn relay_waiting_on_a_silent_module_stays_idle() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(d.ws_url("/test/ws/out?count=1&hold_ms=20000"))
            .await
            .expect("connect");
    assert_eq!(next_message(&mut ws).await, Message::Text("msg-0".into()));
    drop(ws);
    // Not a wait for a condition but a measuring window: the relay sees the
    // client go within milliseconds; a spinning one would then use all of
    // the window's CPU, an idle one almost none.
    let before = cpu_ticks(d.pid());
    let window = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let used = cpu_ticks(d.pid()) - before;
    let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .expect("sysconf")
        .expect("CLK_TCK") as u64;
    let allowed = window.elapsed().as_secs() * ticks_per_sec / 4;
    assert!(
        used < allowed,
        "ray-dashd used {used} ticks of CPU in {:?} while idle (allowed {allowed})",
        window.elapsed()
    );
}

/// A websocket open when ray-dashd gets SIGTERM is closed with 1001 "going
/// away": the host is shutting down, the module is not being restarted
/// (1012 is for that).
#[tokio::test]
async fn websocket_open_at_shutdown_closes_with_1001() {
    let mut d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    ws.send(Message::Text("x".into())).await.expect("send");
    assert_eq!(next_message(&mut ws).await, Message::Text("x".into()));
    d.signal(nix::sys::signal::Signal::SIGTERM);
    match next_message(&mut ws).await {
        Message::Close(Some(frame)) => {
            assert_eq!(frame.code, CloseCode::Away, "{frame:?}");
            assert!(frame.reason.contains("shutting down"), "{frame:?}");
        }
        other => panic!("expected a close, got {other:?}"),
    }
    assert_eq!(d.wait_exit(WAIT).code(), Some(0), "log:\n{}", d.log());
}

/// A websocket that carries nothing for longer than the send timeout stays
/// open: the timeout is for writes the client does not take, not silence.
#[tokio::test]
async fn idle_websocket_outlasts_the_send_timeout() {
    let d = dashd()
        .server("client_send_timeout_secs", "0.5")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("connect");
    // Silence on both sides, three times the timeout.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    ws.send(Message::Text("still here".into()))
        .await
        .expect("send");
    assert_eq!(
        next_message(&mut ws).await,
        Message::Text("still here".into())
    );
}

/// A websocket client that stops reading while its module keeps sending is
/// cut after the send timeout, with the one log line, like a stream's.
#[tokio::test]
async fn websocket_client_that_stops_reading_is_cut_after_the_send_timeout() {
    let d = dashd()
        .server("client_send_timeout_secs", "1")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
    socket.connect(&d.addr().into()).expect("connect");
    socket.set_nonblocking(true).expect("nonblocking");
    let stream = tokio::net::TcpStream::from_std(socket.into()).expect("tokio stream");
    // 64 KiB messages: the kernel's buffers (up to 4 MiB for a TCP socket
    // on loopback) fill in a few dozen, not in seconds of CPU spent on
    // short ones.
    let (ws, _) =
        tokio_tungstenite::client_async(d.ws_url("/test/ws/out?count=100000000&pad=65536"), stream)
            .await
            .expect("handshake");
    // Reads nothing from here on.
    let logged = eventually(WAIT, || async {
        d.log()
            .contains("client took nothing written to it for the send timeout")
            .then_some(())
    })
    .await;
    assert!(logged.is_some(), "not cut; log:\n{}", d.log());
    drop(ws);
}
