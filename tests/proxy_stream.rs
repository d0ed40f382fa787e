//! Streamed routes: chunks flow as written, memory stays flat, and a client
//! that leaves cancels the module's request.

use futures_util::StreamExt;
use serde_json::Value;

use crate::support::{client, dashd, eventually, rss_kib, test_module, WAIT};

async fn stats(d: &crate::support::Dashd) -> Value {
    d.test_stats().await.expect("test module stats")
}

/// The first chunk reaches the client while the module still holds back the
/// rest; dropping the client cancels the module's stream.
#[tokio::test]
async fn first_chunk_arrives_before_stream_ends_and_client_leaving_cancels() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let response = client()
        .get(d.url("/test/stream?chunks=3&size=5&delay_ms=60000"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(WAIT, body.next())
        .await
        .expect("first chunk in time")
        .expect("a chunk")
        .expect("chunk ok");
    assert_eq!(&first[..], b"aaaaa");
    let before = stats(&d).await;
    assert_eq!(before["streams_started"], 1);
    assert_eq!(before["streams_completed"], 0, "the stream is not over yet");
    drop(body);
    let cancelled = eventually(WAIT, || async {
        (stats(&d).await["streams_cancelled"] == 1).then_some(())
    })
    .await;
    assert!(cancelled.is_some(), "module's stream was not cancelled");
}

/// A 1 GiB stream crosses whole, and the host's memory stays flat.
#[tokio::test]
async fn streams_one_gib_with_flat_memory() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let baseline = rss_kib(d.pid());
    let chunks = 16 * 1024;
    let size = 64 * 1024;
    let response = client()
        .get(d.url(&format!("/test/stream?chunks={chunks}&size={size}")))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut total = 0u64;
    let mut peak = baseline;
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        total += chunk.expect("chunk").len() as u64;
        n += 1;
        if n % 512 == 0 {
            peak = peak.max(rss_kib(d.pid()));
        }
    }
    assert_eq!(total, (chunks * size) as u64);
    let growth_mib = (peak.saturating_sub(baseline)) / 1024;
    assert!(
        growth_mib < 32,
        "host RSS grew by {growth_mib} MiB while streaming 1 GiB (baseline {baseline} KiB)"
    );
}

/// A client that reads slowly holds the module back instead of filling the
/// host's memory.
#[tokio::test]
async fn slow_client_applies_backpressure() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let baseline = rss_kib(d.pid());
    // 256 MiB offered; the client reads only the first chunk, then waits.
    let response = client()
        .get(d.url("/test/stream?chunks=4096&size=65536"))
        .send()
        .await
        .expect("request");
    let mut body = response.bytes_stream();
    body.next().await.expect("first chunk").expect("ok");
    // Give the module every chance to run ahead while nobody reads.
    let mut peak = baseline;
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        peak = peak.max(rss_kib(d.pid()));
    }
    let growth_mib = peak.saturating_sub(baseline) / 1024;
    assert!(
        growth_mib < 16,
        "host buffered {growth_mib} MiB for a client that does not read"
    );
    let s = stats(&d).await;
    assert_eq!(
        s["streams_completed"], 0,
        "the module finished despite the stalled client"
    );
}

/// Opens a raw connection with a small receive buffer (so that the host's
/// writes soon wait for the client) and sends a GET for `path`.
fn raw_get(d: &crate::support::Dashd, path: &str) -> std::net::TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
    socket.connect(&d.addr().into()).expect("connect");
    let mut stream = std::net::TcpStream::from(socket);
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    std::io::Write::write_all(
        &mut stream,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
    .expect("request");
    stream
}

/// The line ray-dashd logs when a client's send timeout expires.
const SEND_TIMEOUT_LINE: &str = "client took nothing written to it for the send timeout";

/// A client that stops reading a stream is cut once a write has waited the
/// send timeout: its connection is closed, the module sees its request
/// cancelled, and one info line says why.
#[tokio::test]
async fn client_that_stops_reading_is_cut_after_the_send_timeout() {
    let d = dashd()
        .server("client_send_timeout_secs", "1")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let mut stream = raw_get(&d, "/test/stream?chunks=1000000&size=65536");
    let mut first = [0u8; 4096];
    let n = std::io::Read::read(&mut stream, &mut first).expect("first bytes");
    assert!(first[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &first[..n]);
    // From here the client reads nothing: the host's writes soon wait.
    let stopped = std::time::Instant::now();
    let cancelled = eventually(WAIT, || async {
        (stats(&d).await["streams_cancelled"] == 1).then_some(())
    })
    .await;
    assert!(
        cancelled.is_some(),
        "the module's stream was not cancelled; log:\n{}",
        d.log()
    );
    let after = stopped.elapsed();
    assert!(
        after >= std::time::Duration::from_secs(1),
        "cut {after:?} after the client stopped reading: before the send timeout"
    );
    // The connection is closed: what was in flight drains, then it ends.
    let mut rest = Vec::new();
    let ended = std::io::Read::read_to_end(&mut stream, &mut rest);
    assert!(
        ended.is_ok()
            || ended
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the client's connection did not end: {ended:?}"
    );
    let log = d.logged(SEND_TIMEOUT_LINE).await;
    assert_eq!(
        log.matches(SEND_TIMEOUT_LINE).count(),
        1,
        "one line for one timeout; log:\n{log}"
    );
    assert!(
        !log.lines().any(|l| l.contains("WARN")),
        "a client's timeout is no warning; log:\n{log}"
    );
}

/// A client that reads a stream slowly but steadily, for longer than the
/// send timeout, is not cut: each write it takes starts the timeout over.
#[tokio::test]
async fn slow_but_steady_reader_outlasts_the_send_timeout() {
    let d = dashd()
        .server("client_send_timeout_secs", "1")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let mut stream = raw_get(&d, "/test/stream?chunks=1000000&size=65536");
    let mut buf = vec![0u8; 128 * 1024];
    let started = std::time::Instant::now();
    let mut total = 0usize;
    // About 6 MB/s, far below what the module offers: the host's writes
    // keep waiting for this client, which keeps taking a little.
    while started.elapsed() < std::time::Duration::from_secs(3) {
        let n = std::io::Read::read(&mut stream, &mut buf).expect("read");
        assert!(n > 0, "cut after {:?} ({total} bytes)", started.elapsed());
        total += n;
        // Pacing the reads, not waiting for a condition.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let s = stats(&d).await;
    assert_eq!(s["streams_cancelled"], 0, "cut while still reading: {s}");
    assert!(!d.log().contains(SEND_TIMEOUT_LINE), "{}", d.log());
}

/// A stream whose module sends a little now and then, with pauses longer
/// than nothing but shorter than the timeout, for longer than the send
/// timeout in all, arrives whole: only a client that takes nothing is cut.
#[tokio::test]
async fn slow_stream_lasting_longer_than_the_send_timeout_is_not_cut() {
    let d = dashd()
        .server("client_send_timeout_secs", "1")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let response = client()
        .get(d.url("/test/stream?chunks=12&size=16&delay_ms=250"))
        .send()
        .await
        .expect("request");
    let body = tokio::time::timeout(WAIT, response.bytes())
        .await
        .expect("stream ended in time")
        .expect("whole stream");
    assert_eq!(body.len(), 12 * 16);
    let s = stats(&d).await;
    assert_eq!(s["streams_completed"], 1, "{s}");
}
