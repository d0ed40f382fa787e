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
