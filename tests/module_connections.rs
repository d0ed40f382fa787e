//! Connections to a module: never more than its `max_connections`, the
//! requests beyond waiting their turn, a full queue answered 503 and a
//! request that waited out its deadline 504; streams and websockets take
//! no connection once answered, and count under their own cap instead.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{client, dashd, eventually, test_module, Dashd, ModuleDef, TEST_ROUTES, WAIT};

/// The test module with at most `max` connections, and no periodic health
/// check to open one more while the tests fill the pool (a probe never
/// waits for the cap; see `ModulePool::probe`).
fn capped(max: usize) -> ModuleDef {
    test_module("tm")
        .supervision("max_connections", &max.to_string())
        .supervision("health_interval_secs", "3600")
}

/// The module's `connections` in `/api/modules/tm`.
async fn connections(d: &Dashd) -> Value {
    d.module("tm").await["connections"].clone()
}

/// Waits until the module's `connections[field]` (`open`, `queued`…) is
/// `n`.
async fn wait_connections(d: &Dashd, field: &str, n: u64) {
    let reached = eventually(WAIT, || async {
        (connections(d).await[field].as_u64() == Some(n)).then_some(())
    })
    .await;
    assert!(
        reached.is_some(),
        "connections.{field} never reached {n}: {}",
        connections(d).await
    );
}

/// 60 requests at once, each holding its connection 100 ms, to a module
/// with a cap of 4: all answer 200, the module never sees more than 4
/// connections (it counts them itself), and the host shows the queue.
#[tokio::test]
async fn connections_to_a_module_never_exceed_its_cap() {
    const REQUESTS: usize = 60;
    let d = dashd().module(capped(4)).start();
    d.healthy("tm", 0).await;
    let client = client();
    let url = d.url("/test/slow?ms=100");
    let burst = futures_util::future::join_all((0..REQUESTS).map(|_| {
        let request = client.get(&url).send();
        async move { request.await.map(|r| r.status().as_u16()).unwrap_or(0) }
    }));
    let seen_queued = eventually(WAIT, || async {
        let c = connections(&d).await;
        (c["queued"].as_u64() > Some(0)).then_some(c)
    });
    let (statuses, seen_queued) = tokio::join!(burst, seen_queued);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let stats = d.test_stats().await.expect("stats");
    assert_eq!(
        stats["connections_peak"], 4,
        "the module saw more (or fewer) connections than its cap: {stats}"
    );
    let seen_queued = seen_queued.expect("no request was ever seen queued");
    assert_eq!(seen_queued["max"], 4, "{seen_queued}");
    assert_eq!(seen_queued["open"], 4, "{seen_queued}");
    let after = connections(&d).await;
    assert_eq!((&after["open"], &after["queued"]), (&4.into(), &0.into()));
}

/// With the only connection held by a slow request and one request
/// waiting, the next request is refused at once: 503, `Retry-After`, a
/// reason. The waiting one goes through when the slow one is given up.
#[tokio::test]
async fn a_full_queue_is_answered_503_with_retry_after() {
    let d = dashd()
        .module(capped(1).supervision("max_queued_requests", "1"))
        .start();
    d.healthy("tm", 0).await;
    let client = client();
    let slow = tokio::spawn(client.get(d.url("/test/slow?ms=600000")).send());
    wait_connections(&d, "open", 1).await;
    let waiting = tokio::spawn(client.get(d.url("/test/echo")).send());
    wait_connections(&d, "queued", 1).await;

    let refused = client
        .get(d.url("/test/echo"))
        .send()
        .await
        .expect("refused");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["module"], "tm");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("module tm is busy")
            && message.contains("1 connections in use")
            && message.contains("1 requests waiting"),
        "{message}"
    );

    slow.abort();
    let answered = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the queued request never got the connection")
        .expect("task")
        .expect("queued request");
    assert_eq!(answered.status(), 200);
}

/// With the only connection held by a stream not answered yet, an `http`
/// request waits for one until `http_response_timeout_secs`, then gets 504
/// and why; once the stream is given up its connection serves requests
/// again.
#[tokio::test]
async fn a_request_queued_past_its_deadline_gets_504() {
    // `/test/slow` as a stream: no deadline, and its slot held until its
    // answer starts.
    let routes: Vec<_> = TEST_ROUTES
        .iter()
        .map(|&(method, path, kind)| {
            (
                method,
                path,
                if path == "/test/slow" { "stream" } else { kind },
            )
        })
        .collect();
    let d = dashd()
        .server("http_response_timeout_secs", "1")
        .module(capped(1).routes(&routes))
        .start();
    d.healthy("tm", 0).await;
    let slow = tokio::spawn(client().get(d.url("/test/slow?ms=600000")).send());
    wait_connections(&d, "open", 1).await;

    let timed_out = tokio::time::timeout(WAIT, client().get(d.url("/test/echo")).send())
        .await
        .expect("no answer at the deadline")
        .expect("answer");
    assert_eq!(timed_out.status(), 504);
    let body: Value = timed_out.json().await.expect("json");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("module tm had no free connection within 1s")
            && message.contains("all 1 in use"),
        "{message}"
    );

    slow.abort();
    let answered = client()
        .get(d.url("/test/echo"))
        .send()
        .await
        .expect("echo");
    assert_eq!(answered.status(), 200);
}

/// Opens a websocket to the test module's echo route and checks it echoes.
async fn echoing_websocket(
    d: &Dashd,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("websocket");
    ws.send(Message::Text("hi".into())).await.expect("send");
    let echo = tokio::time::timeout(WAIT, ws.next()).await.expect("echo");
    assert_eq!(echo.expect("open").expect("ok"), Message::Text("hi".into()));
    ws
}

/// Streams and websockets give their connection's slot back once
/// answered: with a cap of one connection, a websocket and a stream stay
/// open while requests are answered at once (none may wait), and
/// `/api/modules` counts them apart.
#[tokio::test]
async fn streams_and_websockets_take_no_connection_slot() {
    let d = dashd()
        .module(capped(1).supervision("max_queued_requests", "0"))
        .start();
    d.healthy("tm", 0).await;
    let mut ws = echoing_websocket(&d).await;
    let stream = client()
        .get(d.url("/test/stream?chunks=100000&delay_ms=100"))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);
    for _ in 0..3 {
        let answered = client()
            .get(d.url("/test/echo"))
            .send()
            .await
            .expect("echo");
        assert_eq!(
            answered.status(),
            200,
            "refused while a stream and a websocket are open"
        );
    }
    let c = connections(&d).await;
    assert_eq!(
        (&c["long_lived"], &c["open"]),
        (&2.into(), &1.into()),
        "{c}"
    );

    ws.send(Message::Text("still".into())).await.expect("send");
    let echo = tokio::time::timeout(WAIT, ws.next()).await.expect("echo");
    assert_eq!(
        echo.expect("open").expect("ok"),
        Message::Text("still".into())
    );
    drop((ws, stream));
    let closed = eventually(WAIT, || async {
        (connections(&d).await["long_lived"] == 0).then_some(())
    })
    .await;
    assert!(closed.is_some(), "{}", connections(&d).await);
}

/// Beyond `max_long_lived_connections` open, the next websocket or stream
/// is refused at once: 503, `Retry-After`, the reason naming the setting.
/// Those open still echo, and one closed makes room.
#[tokio::test]
async fn streams_and_websockets_beyond_their_cap_get_503() {
    let d = dashd()
        .module(test_module("tm").supervision("max_long_lived_connections", "2"))
        .start();
    d.healthy("tm", 0).await;
    let mut first = echoing_websocket(&d).await;
    let stream = client()
        .get(d.url("/test/stream?chunks=100000&delay_ms=100"))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);

    let refused = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo")).await;
    let Err(tokio_tungstenite::tungstenite::Error::Http(refused)) = refused else {
        panic!("a third long-lived connection was not refused: {refused:?}");
    };
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = String::from_utf8_lossy(refused.body().as_deref().unwrap_or_default()).into_owned();
    assert!(
        body.contains("all 2 streams and websockets")
            && body.contains("max_long_lived_connections"),
        "{body}"
    );
    let refused = client()
        .get(d.url("/test/stream?chunks=1"))
        .send()
        .await
        .expect("stream refused");
    assert_eq!(refused.status(), 503);
    // Requests are answered meanwhile.
    let answered = client()
        .get(d.url("/test/echo"))
        .send()
        .await
        .expect("echo");
    assert_eq!(answered.status(), 200);

    first
        .send(Message::Text("open".into()))
        .await
        .expect("send");
    let echo = tokio::time::timeout(WAIT, first.next())
        .await
        .expect("echo");
    assert_eq!(
        echo.expect("open").expect("ok"),
        Message::Text("open".into())
    );
    drop(stream);
    let room = eventually(WAIT, || async {
        (connections(&d).await["long_lived"] == 1).then_some(())
    })
    .await;
    assert!(room.is_some(), "{}", connections(&d).await);
    echoing_websocket(&d).await;
}

/// The limits show in `/api/modules/{name}` while the module is healthy.
#[tokio::test]
async fn the_module_report_shows_its_connections() {
    let d = dashd()
        .module(capped(7).supervision("max_queued_requests", "3"))
        .start();
    d.healthy("tm", 0).await;
    let answered = client()
        .get(d.url("/test/echo"))
        .send()
        .await
        .expect("echo");
    assert_eq!(answered.status(), 200);
    let _ = answered.bytes().await;
    let c = connections(&d).await;
    assert_eq!((&c["max"], &c["max_queued"]), (&7.into(), &3.into()), "{c}");
    assert_eq!(
        (&c["long_lived"], &c["max_long_lived"]),
        (&0.into(), &2048.into()),
        "{c}"
    );
    // Idle now: the echo's connection and, when a health check came
    // between, the check's (checks go through hyper's client, a GET for a
    // module route over a bare connection).
    assert_eq!(c["open"], c["idle"], "{c}");
    assert!((1..=2).contains(&c["open"].as_u64().expect("open")), "{c}");
    assert_eq!(c["queued"], 0, "{c}");
}
