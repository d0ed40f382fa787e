use super::*;
use crate::proxy::COALESCE_BYTES;

use futures_util::stream;
use http::Response as HttpResponse;

/// The request `plain_get` takes from `head`, with the head's length and
/// its close flag; panics when it takes none.
fn taken(head: &str) -> (Request<Body>, usize, bool) {
    plain_get(head.as_bytes()).unwrap_or_else(|| panic!("not taken: {head:?}"))
}

#[test]
fn a_plain_get_is_taken_with_its_headers_in_order_and_repeats() {
    let head = "GET /api/jobs/?limit=5 HTTP/1.1\r\nHost: 127.0.0.1:8265\r\n\
                X-Tag: a\r\nAccept: */*\r\nX-Tag: b\r\n\r\n";
    let (request, len, close) = taken(head);
    assert_eq!(len, head.len());
    assert!(!close);
    assert_eq!(request.method(), http::Method::GET);
    assert_eq!(request.version(), http::Version::HTTP_11);
    assert_eq!(request.uri().path(), "/api/jobs/");
    assert_eq!(request.uri().query(), Some("limit=5"));
    assert_eq!(request.headers()["host"], "127.0.0.1:8265");
    let tags: Vec<_> = request.headers().get_all("x-tag").iter().collect();
    assert_eq!(tags, ["a", "b"]);
}

#[test]
fn the_head_length_leaves_a_pipelined_request_unread() {
    let first = "GET /a HTTP/1.1\r\nHost: h\r\n\r\n";
    let both = format!("{first}GET /b HTTP/1.1\r\nHost: h\r\n\r\n");
    let (request, len, _) = taken(&both);
    assert_eq!(request.uri().path(), "/a");
    assert_eq!(len, first.len());
    let (request, _, _) = taken(&both[len..]);
    assert_eq!(request.uri().path(), "/b");
}

#[test]
fn connection_close_is_seen_among_other_tokens() {
    let (_, _, close) = taken("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Close\r\n\r\n");
    assert!(close);
    let (_, _, close) = taken("GET / HTTP/1.1\r\nHost: h\r\nConnection: closed\r\n\r\n");
    assert!(!close);
}

/// Everything but a complete, bodiless HTTP/1.1 GET in origin form goes to
/// hyper.
#[test]
fn anything_else_is_left_to_hyper() {
    let many = format!(
        "GET / HTTP/1.1\r\nHost: h\r\n{}\r\n",
        "X-A: 1\r\n".repeat(MAX_HEADER_LINES)
    );
    for head in [
        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
        "HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: h\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
        "GET http://h/ HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET * HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Name: h\r\n\r\n",
        "get / HTTP/1.1\r\nHost: h\r\n\r\n",
        many.as_str(),
    ] {
        assert!(plain_get(head.as_bytes()).is_none(), "taken: {head:?}");
    }
}

/// Writes `response` as the fast path does; returns the bytes.
async fn written(response: Response, close: bool) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buffer = Vec::new();
    write_response(&mut out, &mut buffer, response, close)
        .await
        .map(|()| out)
}

/// The head's status, its headers (lower-case names, in order) and the
/// bytes after it.
fn split(bytes: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut lines = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut lines);
    let httparse::Status::Complete(len) = head.parse(bytes).expect("a valid head") else {
        panic!("a partial head: {:?}", String::from_utf8_lossy(bytes));
    };
    let headers = head
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    (head.code.expect("a status"), headers, bytes[len..].to_vec())
}

fn names(headers: &[(String, String)]) -> Vec<&str> {
    headers.iter().map(|(name, _)| name.as_str()).collect()
}

#[tokio::test]
async fn a_body_of_known_size_gets_content_length_and_a_date() {
    let response = HttpResponse::builder()
        .status(201)
        .header("x-a", "1")
        .header("x-a", "2")
        .body(Body::from("hello"))
        .expect("response");
    let bytes = written(response, false).await.expect("written");
    assert!(bytes.starts_with(b"HTTP/1.1 201 Created\r\n"), "{bytes:?}");
    let (status, headers, body) = split(&bytes);
    assert_eq!(status, 201);
    assert_eq!(names(&headers), ["x-a", "x-a", "date", "content-length"]);
    assert_eq!(headers[1].1, "2");
    assert_eq!(headers[3].1, "5");
    httpdate::parse_http_date(&headers[2].1).expect("an HTTP date");
    assert_eq!(body, b"hello");
}

#[tokio::test]
async fn a_date_and_content_length_given_are_kept_not_repeated() {
    let response = HttpResponse::builder()
        .header("date", "Thu, 01 Jan 1970 00:00:00 GMT")
        .header("content-length", "2")
        .body(Body::from("ok"))
        .expect("response");
    let (_, headers, body) = split(&written(response, true).await.expect("written"));
    assert_eq!(names(&headers), ["date", "content-length", "connection"]);
    assert_eq!(headers[0].1, "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(headers[2].1, "close");
    assert_eq!(body, b"ok");
}

#[tokio::test]
async fn a_body_of_unknown_size_is_chunked() {
    let chunks = stream::iter(["hello", "", " world"].map(|c| Ok::<_, io::Error>(Bytes::from(c))));
    let response = Response::new(Body::from_stream(chunks));
    let (_, headers, body) = split(&written(response, false).await.expect("written"));
    assert_eq!(names(&headers), ["date", "transfer-encoding"]);
    assert_eq!(body, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
}

#[tokio::test]
async fn a_large_chunk_goes_out_whole_after_the_head() {
    let large = Bytes::from(vec![b'x'; COALESCE_BYTES * 3]);
    let response = Response::new(Body::from(large.clone()));
    let (_, headers, body) = split(&written(response, false).await.expect("written"));
    assert_eq!(headers.last().map(|h| h.1.as_str()), Some("49152"));
    assert_eq!(body, large);
}

#[tokio::test]
async fn no_content_has_no_framing_and_no_body() {
    let response = HttpResponse::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Body::empty())
        .expect("response");
    let (status, headers, body) = split(&written(response, false).await.expect("written"));
    assert_eq!(status, 204);
    assert_eq!(names(&headers), ["date"]);
    assert!(body.is_empty());
}

/// A body that ends short of its `Content-Length`, or runs past it, or
/// breaks, fails the write (the connection then closes, as hyper's does).
#[tokio::test]
async fn a_body_that_breaks_or_misses_its_length_is_an_error() {
    for (length, chunks) in [
        ("5", vec![Ok("abc")]),
        ("2", vec![Ok("abc")]),
        ("9", vec![Ok("abc"), Err(())]),
    ] {
        let chunks = stream::iter(chunks.into_iter().map(|c| {
            c.map(Bytes::from)
                .map_err(|()| io::Error::other("the module went away"))
        }));
        let response = HttpResponse::builder()
            .header("content-length", length)
            .body(Body::from_stream(chunks))
            .expect("response");
        assert!(written(response, false).await.is_err(), "length {length}");
    }
}

#[tokio::test]
async fn an_informational_status_is_not_written_as_an_answer() {
    let response = HttpResponse::builder()
        .status(StatusCode::CONTINUE)
        .body(Body::empty())
        .expect("response");
    let error = written(response, false).await.expect_err("written");
    assert!(error.to_string().contains("informational"), "{error}");
}
