//! Shared answers of routes declared with `cache_secs`: identical `GET`s
//! at once reach the module once; an answer is served again while it is
//! young enough, and a fresh one fetched behind it; answers for one client
//! and failures are never kept; a write forgets what was kept.

use std::sync::Mutex;

use futures_util::future::join_all;
use serde_json::Value;

use crate::support::{client, dashd, eventually, test_module, Dashd, WAIT};

/// One `GET`: its status, how it was served (`x-dashd-shared`) and the
/// module's count in it.
async fn get(d: &Dashd, path: &str) -> (u16, String, u64) {
    get_with(d, path, &[]).await
}

/// One `GET` with `headers`, as [`get`].
async fn get_with(d: &Dashd, path: &str, headers: &[(&str, &str)]) -> (u16, String, u64) {
    let mut request = client().get(d.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("GET");
    let status = response.status().as_u16();
    let how = response
        .headers()
        .get("x-dashd-shared")
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    let body: Value = response.json().await.expect("json");
    (status, how, body["n"].as_u64().expect("n"))
}

/// A module whose `/test/count` answers may be `secs` old.
fn counting(secs: &str) -> Dashd {
    dashd()
        .module(test_module("tm").cached("/test/count", secs))
        .start()
}

#[tokio::test]
async fn identical_gets_at_once_reach_the_module_once() {
    let d = counting("30");
    d.healthy("tm", 0).await;
    // The module takes a second: all 20 are in before it answers.
    let answers = join_all((0..20).map(|_| get(&d, "/test/count?ms=1000"))).await;
    let fetched = answers
        .iter()
        .filter(|(_, how, _)| how == "fetched")
        .count();
    let joined = answers.iter().filter(|(_, how, _)| how == "joined").count();
    assert_eq!((fetched, joined), (1, 19), "{answers:?}");
    let n = answers[0].2;
    assert!(
        answers.iter().all(|a| a.0 == 200 && a.2 == n),
        "{answers:?}"
    );
    // Young: served again, the module not asked.
    assert_eq!(
        get(&d, "/test/count?ms=1000").await,
        (200, "hit".to_owned(), n)
    );
    // Another query is another answer.
    let (_, how, other) = get(&d, "/test/count?ms=1").await;
    assert_eq!((how.as_str(), other), ("fetched", n + 1));
    // Not a cached route's request: the test module's other routes.
    let stats = client()
        .get(d.url("/test/stats"))
        .send()
        .await
        .expect("stats");
    assert!(stats.headers().get("x-dashd-shared").is_none());
}

/// Past its refresh age an answer is still served while the next is
/// fetched behind it; no answer older than `cache_secs` is served.
#[tokio::test]
async fn an_aging_answer_is_served_while_the_next_is_fetched() {
    // A fetch takes a second, so the answer is fetched again from 2 s (the
    // earlier of 4 s less 1.25 times that and half of 4 s), in before it
    // is 4 s old: a second spare, for a machine busy with other tests.
    let d = counting("4");
    d.healthy("tm", 0).await;
    let (_, how, first) = get(&d, "/test/count?ms=1000").await;
    assert_eq!(how, "fetched");
    let seen = Mutex::new(Vec::new());
    let newer = eventually(WAIT, || async {
        let (status, how, n) = get(&d, "/test/count?ms=1000").await;
        assert_eq!(status, 200);
        seen.lock().expect("seen").push((how.clone(), n));
        (n > first).then_some((how, n))
    })
    .await
    .expect("a newer answer");
    let seen = seen.into_inner().expect("seen");
    // A stale answer (the first) was served while the second was fetched,
    // and the newer one came from that fetch, not from a client's wait.
    assert!(
        seen.iter().any(|(how, n)| how == "stale" && *n == first),
        "{seen:?}"
    );
    assert_eq!(newer.1, first + 1, "{seen:?}");
    assert!(matches!(newer.0.as_str(), "hit" | "stale"), "{seen:?}");
}

#[tokio::test]
async fn answers_for_one_client_and_failures_are_not_kept() {
    let d = counting("30");
    d.healthy("tm", 0).await;
    // Set-Cookie: each client gets an answer of its own.
    let answers =
        join_all((0..5).map(|_| get(&d, "/test/count?ms=300&header=set-cookie:a%3Db"))).await;
    let mut ns: Vec<u64> = answers.iter().map(|a| a.2).collect();
    ns.sort_unstable();
    ns.dedup();
    assert_eq!(ns.len(), 5, "{answers:?}");
    // A 500 reaches those who waited for it, but is not kept.
    let failed = join_all((0..5).map(|_| get(&d, "/test/count?ms=300&status=500"))).await;
    assert!(
        failed.iter().all(|a| a.0 == 500 && a.2 == failed[0].2),
        "{failed:?}"
    );
    let (status, how, n) = get(&d, "/test/count?ms=300&status=500").await;
    assert_eq!((status, how.as_str(), n), (500, "fetched", failed[0].2 + 1));
}

/// A write through the host forgets the kept answers: a client reads its
/// own writes.
#[tokio::test]
async fn a_write_forgets_what_was_kept() {
    let d = counting("30");
    d.healthy("tm", 0).await;
    let (_, _, n) = get(&d, "/test/count").await;
    assert_eq!(get(&d, "/test/count").await.1, "hit");
    let wrote = client()
        .post(d.url("/test/echo"))
        .body("x")
        .send()
        .await
        .expect("POST");
    assert_eq!(wrote.status(), 200);
    assert_eq!(
        get(&d, "/test/count").await,
        (200, "fetched".to_owned(), n + 1)
    );
}

/// A large JSON answer goes gzipped to a client that accepts gzip (once
/// compressed, whoever asks), as it is to one that does not.
#[tokio::test]
async fn a_large_answer_is_gzipped_for_clients_that_accept_it() {
    use std::io::Read;

    let d = counting("30");
    d.healthy("tm", 0).await;
    let path = "/test/count?pad=200000";
    let plain = client().get(d.url(path)).send().await.expect("GET");
    assert!(plain.headers().get("content-encoding").is_none());
    let plain: Value = plain.json().await.expect("json");
    for _ in 0..2 {
        let packed = client()
            .get(d.url(path))
            .header("accept-encoding", "gzip, deflate, br")
            .send()
            .await
            .expect("GET");
        assert_eq!(packed.headers()["content-encoding"], "gzip");
        assert_eq!(packed.headers()["x-dashd-shared"], "hit");
        let bytes = packed.bytes().await.expect("body");
        assert!(bytes.len() < 10_000, "{} bytes gzipped", bytes.len());
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .expect("gunzip");
        let unpacked: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(unpacked, plain);
    }
}

/// A `GET` after a write does not join a fetch begun before the write:
/// it fetches for itself, and sees what the write changed.
#[tokio::test]
async fn a_get_after_a_write_does_not_join_an_older_fetch() {
    let d = counting("30");
    d.healthy("tm", 0).await;
    let before = tokio::spawn({
        let d_url = d.url("/test/count?ms=1500");
        async move {
            let response = client().get(d_url).send().await.expect("GET");
            let body: Value = response.json().await.expect("json");
            body["n"].as_u64().expect("n")
        }
    });
    // The first fetch is under way at the module.
    d.wait_in_flight(1).await;
    let wrote = client()
        .post(d.url("/test/echo"))
        .body("x")
        .send()
        .await
        .expect("POST");
    assert_eq!(wrote.status(), 200);
    let (_, how, after) = get(&d, "/test/count?ms=1500").await;
    let before = before.await.expect("task");
    assert_eq!(how, "fetched");
    assert_eq!(after, before + 1);
}

/// Ray's modules mask runtime-env secrets in answers to requests that look
/// like a browser's: a browser is never served an answer another client
/// fetched, nor the other way round; browsers share among themselves.
#[tokio::test]
async fn browsers_and_other_clients_are_answered_apart() {
    let d = counting("30");
    d.healthy("tm", 0).await;
    let path = "/test/count?ms=1";
    let (_, how, cli) = get(&d, path).await;
    assert_eq!(how, "fetched");
    let firefox = [("user-agent", "Mozilla/5.0 (X11; Linux x86_64; rv:140.0)")];
    let (_, how, browser) = get_with(&d, path, &firefox).await;
    assert_eq!((how.as_str(), browser), ("fetched", cli + 1));
    // Any of Ray's signs makes a browser's request, and browsers share.
    for sign in [
        ("sec-fetch-mode", "cors"),
        ("origin", "http://127.0.0.1:8265"),
        ("referer", "http://127.0.0.1:8265/"),
    ] {
        let (_, how, n) = get_with(&d, path, &[sign]).await;
        assert_eq!((how.as_str(), n), ("hit", browser), "{sign:?}");
    }
    // A user agent that is not a browser's, and none: the other kind.
    let (_, how, n) = get_with(&d, path, &[("user-agent", "curl/8.5.0")]).await;
    assert_eq!((how.as_str(), n), ("hit", cli));
}
