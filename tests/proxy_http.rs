//! Plain-HTTP routes: what crosses the proxy, byte for byte, and what not.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::support::{client, dashd, eventually, raw_exchange, test_module, WAIT};

fn header_names(echo: &Value) -> Vec<String> {
    echo["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .map(|h| h[0].as_str().expect("name").to_owned())
        .collect()
}

/// Method, path and query reach the module byte-exact; the body and
/// end-to-end headers too.
#[tokio::test]
async fn forwards_method_path_query_and_body_exactly() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let response = client()
        .put(d.url("/test/echo?x=1&y=%20z&x=2&empty="))
        .header("x-custom", "one")
        .header("x-custom", "two")
        .body("hello body")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let echo: Value = response.json().await.expect("json");
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["path"], "/test/echo");
    assert_eq!(echo["query"], "x=1&y=%20z&x=2&empty=");
    assert_eq!(echo["body_len"], 10);
    let customs: Vec<&str> = echo["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .filter(|h| h[0] == "x-custom")
        .map(|h| h[1].as_str().expect("value"))
        .collect();
    assert_eq!(customs, ["one", "two"]);

    let escaped = client()
        .get(d.url("/test/echo/a%2Fb%20c?q=%2F"))
        .send()
        .await
        .expect("request");
    let echo: Value = escaped.json().await.expect("json");
    assert_eq!(echo["path"], "/test/echo/a%2Fb%20c");
    assert_eq!(echo["query"], "q=%2F");
}

/// With debug logging on, a request for a module route is traced as the
/// host's own are, though it skips the host's router: a `request` span
/// naming the module and the route's kind, ended with the status and the
/// time the answer took.
#[tokio::test]
async fn a_proxied_request_gets_a_request_span() {
    let d = dashd()
        .module(test_module("tm"))
        .env("RAY_DASHD_LOG", "info,ray_dashd=debug")
        .start();
    d.healthy("tm", 0).await;
    let response = client()
        .get(d.url("/test/echo?traced=1"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let line = eventually(WAIT, || async {
        d.log()
            .lines()
            .find(|l| l.contains("finished processing request") && l.contains("traced=1"))
            .map(str::to_owned)
    })
    .await
    .unwrap_or_else(|| panic!("no span for the proxied request:\n{}", d.log()));
    for field in [
        "request{method=GET uri=/test/echo?traced=1",
        "module=\"tm\"",
        "kind=http",
        "status=200",
        "latency_us=",
    ] {
        assert!(line.contains(field), "{field} not in: {line}");
    }
}

/// Hop-by-hop request headers, including one named in `Connection`, do not
/// reach the module; end-to-end ones do.
#[tokio::test]
async fn strips_hop_by_hop_request_headers() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let request = "GET /test/echo HTTP/1.1\r\nHost: localhost\r\n\
        Connection: close, X-Hop-Req\r\nX-Hop-Req: secret\r\nKeep-Alive: timeout=5\r\n\
        Proxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n\
        Trailer: X-Trail\r\nUpgrade: h2c\r\nX-End-To-End: kept\r\n\r\n";
    let response = raw_exchange(d.addr(), request.as_bytes());
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").expect("head end") + 4..];
    // The body may be chunked; the JSON object sits between the braces.
    let json = &body[body.find('{').expect("json start")..=body.rfind('}').expect("json end")];
    let echo: Value = serde_json::from_str(json).expect("echo json");
    let names = header_names(&echo);
    for hop in [
        "connection",
        "x-hop-req",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "transfer-encoding",
    ] {
        assert!(!names.contains(&hop.to_owned()), "{hop} crossed: {names:?}");
    }
    assert!(names.contains(&"x-end-to-end".to_owned()), "{names:?}");
    assert!(names.contains(&"host".to_owned()), "{names:?}");
}

/// Hop-by-hop response headers, including one named in `Connection`, do not
/// reach the client.
#[tokio::test]
async fn strips_hop_by_hop_response_headers() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let response = client()
        .get(d.url("/test/hop"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let headers = response.headers();
    for hop in [
        "x-hop-resp",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
        "trailer",
    ] {
        assert!(!headers.contains_key(hop), "{hop} crossed: {headers:?}");
    }
    assert_eq!(headers["x-end-to-end"], "kept");
    assert_eq!(response.text().await.expect("body"), "hop");
}

/// Repeated response headers such as `Set-Cookie` stay repeated.
#[tokio::test]
async fn keeps_repeated_set_cookie_headers() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let response = client()
        .get(d.url("/test/cookies"))
        .send()
        .await
        .expect("request");
    let cookies: Vec<&str> = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().expect("ascii"))
        .collect();
    assert_eq!(cookies, ["a=1", "b=2", "c=3"]);
}

/// Redirects and other statuses are passed through, never followed.
#[tokio::test]
async fn passes_statuses_and_redirects_through() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    for code in [201u16, 302, 307, 404, 418, 500, 503] {
        let response = client()
            .get(d.url(&format!("/test/status/{code}")))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), code);
        if code == 302 || code == 307 {
            assert_eq!(response.headers()["location"], "/test/echo?redirected=1");
        }
        assert_eq!(
            response.text().await.expect("body"),
            format!("status {code}")
        );
    }
}

/// Request bodies stream through up to the limit; over it the client gets
/// 413, whether the length is declared or the body is chunked.
#[tokio::test]
async fn request_body_limit_answers_413() {
    let limit = 1024 * 1024;
    let d = dashd()
        .server("max_request_body_bytes", &limit.to_string())
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let at_limit = client()
        .post(d.url("/test/body"))
        .body(vec![7u8; limit])
        .send()
        .await
        .expect("request");
    assert_eq!(at_limit.status(), 200);
    let counted: Value = at_limit.json().await.expect("json");
    assert_eq!(counted["bytes"], limit as u64);

    let declared = client()
        .post(d.url("/test/body"))
        .body(vec![7u8; limit + 1])
        .send()
        .await
        .expect("request");
    assert_eq!(declared.status(), 413);

    // No Content-Length: the body is cut off while streaming.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![1u8; 64 * 1024])).collect();
    let chunked = client()
        .post(d.url("/test/body"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .expect("request");
    assert_eq!(chunked.status(), 413);
    let body: Value = chunked.json().await.expect("json body");
    assert!(
        body["message"].as_str().expect("message").contains("limit"),
        "{body}"
    );
}

/// A module that answers before it has read the whole upload: the answer
/// reaches the client, and the connection it came on, still busy with the
/// upload, is not handed to the next request, which is answered at once
/// rather than after the upload.
#[tokio::test]
async fn a_request_never_waits_for_another_requests_upload() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let (upload, chunks) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    upload
        .send(Ok(vec![1u8; 1024]))
        .await
        .expect("first chunk queued");
    let early = client()
        .post(d.url("/test/early"))
        .body(reqwest::Body::wrap_stream(
            tokio_stream::wrappers::ReceiverStream::new(chunks),
        ))
        .send()
        .await
        .expect("answered before the upload ended");
    assert_eq!(early.status(), 200);
    assert_eq!(
        early.text().await.expect("body"),
        "answered before the body"
    );
    // The upload is still open (`upload` is held); other requests go on.
    for _ in 0..3 {
        let next = tokio::time::timeout(
            Duration::from_secs(10),
            client().get(d.url("/test/echo")).send(),
        )
        .await
        .expect("a request waited for another's upload")
        .expect("request");
        assert_eq!(next.status(), 200);
    }
    drop(upload);
}

/// The host's side of a client connection carries a TCP keepalive timer
/// (`/proc/net/tcp` timer kind 2), first probe within 60 s of silence, so
/// a client that vanished without closing is noticed.
#[tokio::test]
async fn client_connections_have_a_tcp_keepalive() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    // One exchange first, so that the host has accepted the connection and
    // set it up; then it stays open and idle.
    let mut idle = TcpStream::connect(d.addr()).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    idle.write_all(b"GET /api/healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut head = [0u8; 12];
    idle.read_exact(&mut head).expect("response");
    assert_eq!(&head, b"HTTP/1.1 200");
    let client_port = idle.local_addr().expect("local addr").port();
    let host_port = d.addr().port();
    // One row per socket: `sl local rem st tx:rx tr:when ...`, ports in hex.
    // The timer kind of the host's side: 2 (keepalive) once the exchange's
    // own timers are done.
    let last_seen = std::sync::Mutex::new(String::from("no row"));
    let host_side = eventually(WAIT, || async {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let timer = table.lines().skip(1).find_map(|row| {
            let fields: Vec<&str> = row.split_whitespace().collect();
            let port = |addr: &str| {
                addr.rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            (port(fields[1]) == Some(host_port) && port(fields[2]) == Some(client_port))
                .then(|| fields[5].to_owned())
        })?;
        *last_seen.lock().expect("lock") = timer.clone();
        timer.starts_with("02:").then_some(timer)
    })
    .await;
    let host_side = host_side.unwrap_or_else(|| {
        panic!(
            "no keepalive timer on the host's side: {}",
            last_seen.lock().expect("lock")
        )
    });
    let (_, when) = host_side.split_once(':').expect("tr:when");
    let ticks = u64::from_str_radix(when, 16).expect("hex ticks");
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    assert!(
        ticks <= 60 * hz,
        "first probe {ticks} ticks away, more than 60 s"
    );
    drop(idle);
}

/// The default limit is 100 MiB: a larger declared body is refused before
/// any of it is read.
#[tokio::test]
async fn default_body_limit_is_100_mib() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let request = format!(
        "POST /test/body HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        100 * 1024 * 1024 + 1
    );
    let response = raw_exchange(d.addr(), request.as_bytes());
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
}

/// Unknown path 404, wrong method 405 with Allow, both with a JSON reason.
#[tokio::test]
async fn unknown_path_404_wrong_method_405() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let missing = client()
        .get(d.url("/no/such/route"))
        .send()
        .await
        .expect("request");
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.expect("json");
    assert!(body["message"]
        .as_str()
        .expect("message")
        .contains("/no/such/route"));

    let wrong = client()
        .delete(d.url("/test/cookies"))
        .send()
        .await
        .expect("request");
    assert_eq!(wrong.status(), 405);
    assert_eq!(wrong.headers()["allow"], "GET, HEAD");
}

/// A module that takes too long to start its response gets 504, naming it.
#[tokio::test]
async fn slow_module_answers_504() {
    let d = dashd()
        .server("http_response_timeout_secs", "0.5")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let response = client()
        .get(d.url("/test/slow?ms=10000"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 504);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["module"], "tm");
}

/// 400 requests in flight at once all succeed.
#[tokio::test]
async fn serves_400_concurrent_requests() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let c = client();
    let requests = (0..400).map(|i| {
        let c = c.clone();
        let url = d.url(&format!("/test/slow?ms=300&i={i}"));
        async move {
            let response = c.get(url).send().await.expect("request");
            let status = response.status();
            (status, response.text().await.expect("body"))
        }
    });
    let results = futures_util::future::join_all(requests).await;
    let ok = results
        .iter()
        .filter(|(status, body)| *status == 200 && body == "slow done")
        .count();
    assert_eq!(
        ok,
        400,
        "failures: {:?}",
        results.iter().find(|(s, _)| *s != 200)
    );
}

/// HEAD on a GET route is forwarded and answers without a body.
#[tokio::test]
async fn head_uses_get_route() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let response = client()
        .head(d.url("/test/cookies"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers().get_all("set-cookie").iter().count(), 3);
}

/// A request head over `max_header_bytes` is refused with 431 before it
/// reaches a module, counted as it came: blanks the parser skips count too.
#[tokio::test]
async fn oversized_request_head_is_refused() {
    let d = dashd()
        .server("max_header_bytes", "16384")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    for big in [
        format!("X-Big: {}", "a".repeat(32 * 1024)),
        format!("X-Pad:{}x", " ".repeat(32 * 1024)),
    ] {
        let request = format!("GET /test/echo HTTP/1.1\r\nHost: localhost\r\n{big}\r\n\r\n");
        let response = raw_exchange(d.addr(), request.as_bytes());
        assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    }
    let fine = client()
        .get(d.url("/test/echo"))
        .header("x-small", "a".repeat(4 * 1024))
        .send()
        .await
        .expect("request");
    assert_eq!(fine.status(), 200);
}

/// A request of 100 header lines reaches its module; one of 101 is refused
/// with 431 (hyper's count, which the host keeps: see `listener.rs`).
#[tokio::test]
async fn a_request_of_more_than_100_header_lines_is_refused() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let head = |lines: usize| {
        // `Host` and `Connection` are two of the lines.
        let extra: String = (0..lines - 2).map(|i| format!("X-H{i}: v\r\n")).collect();
        format!("GET /test/echo HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra}\r\n")
    };
    let at_limit = raw_exchange(d.addr(), head(100).as_bytes());
    assert!(at_limit.starts_with("HTTP/1.1 200"), "{at_limit}");
    assert!(
        at_limit.contains("x-h97"),
        "the module saw every header: {at_limit}"
    );
    let over = raw_exchange(d.addr(), head(101).as_bytes());
    assert!(over.starts_with("HTTP/1.1 431"), "{over}");
}

/// Sends `head` and then `body` bytes one at a time, `pause` apart, on a
/// raw connection; returns it for the answer to be read.
async fn trickle(
    d: &crate::support::Dashd,
    head: &str,
    body: &[u8],
    pause: Duration,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(d.addr())
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("head");
    for byte in body {
        stream
            .write_all(&[*byte])
            .await
            .expect("a byte of the body");
        // Pacing the upload, not waiting for a condition.
        tokio::time::sleep(pause).await;
    }
    stream
}

/// Reads what the host answers until it closes the connection (bounded).
async fn read_answer(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("the host closed the connection in time")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The line ray-dashd logs when a request body's timeout expires.
const BODY_TIMEOUT_LINE: &str = "client sent nothing of its request body for the body timeout";

/// A request body that stops coming is cut once the module has waited the
/// body timeout for more: the client gets 408 and its connection closed,
/// the module's request is cancelled, and one info line says why.
#[tokio::test]
async fn a_stalled_request_body_is_cut_after_the_body_timeout() {
    let d = dashd()
        .server("client_body_timeout_secs", "1")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let head = "POST /test/body HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n";
    let started = std::time::Instant::now();
    let mut stream = trickle(&d, head, b"0123456789", Duration::ZERO).await;
    d.wait_in_flight(1).await;
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("client_body_timeout_secs"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "cut after {:?}: before the body timeout",
        started.elapsed()
    );
    let released = eventually(WAIT, || async {
        let stats = d.test_stats().await?;
        (stats["requests_in_flight"] == 0).then_some(())
    })
    .await;
    assert!(released.is_some(), "the module's request was not cancelled");
    let log = d.logged(BODY_TIMEOUT_LINE).await;
    assert_eq!(log.matches(BODY_TIMEOUT_LINE).count(), 1, "{log}");
    assert!(!log.lines().any(|l| l.contains("WARN")), "{log}");
}

/// An upload that trickles in, each byte well within the body timeout but
/// all of it taking longer, goes through whole.
#[tokio::test]
async fn a_slow_but_steady_upload_outlasts_the_body_timeout() {
    let d = dashd()
        .server("client_body_timeout_secs", "1")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let head = "POST /test/body HTTP/1.1\r\nHost: localhost\r\nContent-Length: 12\r\nConnection: close\r\n\r\n";
    let mut stream = trickle(&d, head, b"0123456789ab", Duration::from_millis(250)).await;
    let answer = read_answer(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.ends_with("{\"bytes\":12}"), "{answer}");
}

/// A malformed chunked body is the client's fault: 400 with the reason,
/// and no warning in the log (it was a 502 "module failed" and a WARN per
/// request).
#[tokio::test]
async fn a_malformed_chunked_body_is_400_and_no_warning() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let answer = raw_exchange(
        d.addr(),
        b"POST /test/body HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
          Connection: close\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("bad request body"), "{answer}");
    let log = d.log();
    assert!(!log.lines().any(|l| l.contains("WARN")), "{log}");
}

/// A module answer with both `Content-Length` and `Transfer-Encoding` is
/// refused with 502 and the reason (RFC 9112 §6.3), not passed on with a
/// length that does not match its body.
#[tokio::test]
async fn a_module_answer_with_content_length_and_transfer_encoding_is_502() {
    let d = dashd()
        .module(
            crate::support::raw_module(
                "raw",
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n\
                  b\r\nhello world\r\n0\r\n\r\n",
            )
            .routes(&[("GET", "/raw/smuggle", "http")]),
        )
        .start();
    d.healthy("raw", 0).await;
    let response = client()
        .get(d.url("/raw/smuggle"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("json");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains("both Transfer-Encoding and Content-Length"),
        "{body}"
    );
}

/// A route with a `fallback` module: a request its module declines (421
/// with the contract's decline header) is answered by the fallback, which
/// it starts when the fallback is started on demand, whether the route's
/// answers are shared or not; a route without one gives the client the
/// decline as it is.
#[tokio::test]
async fn a_declined_request_is_answered_by_the_routes_fallback() {
    for shared in [false, true] {
        let mut front = test_module("front")
            .routes(&[("GET", "/test/decline", "http")])
            .env("TEST_MODULE_DECLINE", "1")
            .fallback("/test/decline", "back");
        if shared {
            front = front.cached("/test/decline", "1");
        }
        let d = dashd()
            .module(front)
            .module(
                test_module("back")
                    .routes(&[("GET", "/test/count", "http")])
                    .on_demand(),
            )
            .start();
        d.healthy("front", 0).await;
        assert_eq!(d.module("back").await["state"], "dormant");
        let answer = client()
            .get(d.url("/test/decline"))
            .send()
            .await
            .expect("decline");
        assert_eq!(answer.status(), 200, "shared: {shared}");
        assert!(answer.headers().get("x-ray-dashd-decline").is_none());
        let info: Value = answer.json().await.expect("json");
        assert_eq!(info["module"], "back", "shared: {shared}: {info}");
        assert_eq!(d.module("back").await["state"], "healthy");
    }
    let d = dashd()
        .module(
            test_module("lone")
                .routes(&[("GET", "/test/decline", "http")])
                .env("TEST_MODULE_DECLINE", "1"),
        )
        .start();
    d.healthy("lone", 0).await;
    let answer = client()
        .get(d.url("/test/decline"))
        .send()
        .await
        .expect("decline");
    assert_eq!(answer.status(), 421);
    assert_eq!(
        answer.headers()["x-ray-dashd-decline"],
        "the test module declines"
    );
}

/// Requests sent back to back on one connection are answered in order,
/// whichever path serves each: bodiless GETs on the fast path, then a POST
/// with a body, which goes to hyper with the bytes after it, then a GET
/// asking to close, answered with `connection: close` before the close.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order_across_both_paths() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    let answer = raw_exchange(
        d.addr(),
        b"GET /test/echo?n=1 HTTP/1.1\r\nHost: localhost\r\n\r\n\
          GET /test/echo?n=2 HTTP/1.1\r\nHost: localhost\r\n\r\n\
          POST /test/echo?n=3 HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc\
          GET /test/echo?n=4 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(answer.matches("HTTP/1.1 200 OK\r\n").count(), 4, "{answer}");
    let at = |n: u32| {
        answer
            .find(&format!("\"query\":\"n={n}\""))
            .unwrap_or_else(|| panic!("no answer to request {n}: {answer}"))
    };
    assert!(at(1) < at(2) && at(2) < at(3) && at(3) < at(4), "{answer}");
    assert!(answer.contains("\"body_len\":3"), "{answer}");
    let last_head = &answer[answer.rfind("HTTP/1.1 200 OK").expect("an answer")..];
    assert!(last_head.contains("connection: close\r\n"), "{answer}");
}

/// A client that closes its connection while a module works on its GET
/// gives the request up: the module's connection is let go at once, not
/// when the module answers.
#[tokio::test]
async fn a_client_gone_gives_up_its_module_request() {
    let d = dashd()
        .server("http_response_timeout_secs", "300")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let mut client = TcpStream::connect(d.addr()).expect("connect");
    client
        .write_all(b"GET /test/slow?ms=120000 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let busy = |c: &Value| {
        c["open"]
            .as_u64()
            .zip(c["idle"].as_u64())
            .map(|(o, i)| o - i)
    };
    let in_flight = eventually(WAIT, || async {
        (busy(&d.module("tm").await["connections"]) == Some(1)).then_some(())
    })
    .await;
    assert!(in_flight.is_some(), "the request never reached the module");
    drop(client);
    let let_go = eventually(WAIT, || async {
        (busy(&d.module("tm").await["connections"]) == Some(0)).then_some(())
    })
    .await;
    assert!(
        let_go.is_some(),
        "the module's connection is still in use: {}",
        d.module("tm").await["connections"]
    );
}

/// A module answer with no framing at all (its body ends when the module
/// closes) reaches the client whole, chunked, its repeated headers kept.
#[tokio::test]
async fn an_answer_ended_by_the_modules_close_is_passed_on_whole() {
    let d = dashd()
        .module(
            crate::support::raw_module(
                "raw",
                b"HTTP/1.1 200 OK\r\nX-Tag: a\r\nX-Tag: b\r\n\r\nuntil the module closes",
            )
            .routes(&[("GET", "/raw/unframed", "http")]),
        )
        .start();
    d.healthy("raw", 0).await;
    let response = client()
        .get(d.url("/raw/unframed"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let tags: Vec<_> = response.headers().get_all("x-tag").iter().collect();
    assert_eq!(tags, ["a", "b"]);
    assert_eq!(
        response.headers()["transfer-encoding"],
        "chunked",
        "{:?}",
        response.headers()
    );
    assert_eq!(
        response.text().await.expect("body"),
        "until the module closes"
    );
}

/// A module that closes each connection after its answer, though the
/// answer says nothing of it: the next request finds the kept connection
/// closed before any answer and goes again on a new one, unseen by the
/// client.
#[tokio::test]
async fn a_connection_the_module_closed_after_its_answer_is_not_a_failure() {
    let d = dashd()
        .module(
            crate::support::raw_module("raw", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                .routes(&[("GET", "/raw/once", "http")]),
        )
        .start();
    d.healthy("raw", 0).await;
    for i in 0..5 {
        let response = client()
            .get(d.url("/raw/once"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "request {i}");
        assert_eq!(response.text().await.expect("body"), "hello", "request {i}");
    }
}
