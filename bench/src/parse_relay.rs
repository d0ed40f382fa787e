//! `parse-relay`: the least an HTTP/1 proxy that parses can cost here.
//!
//! Between the bare relay (`tcp-relay`, which parses nothing) and a real
//! proxy: each client connection's task reads a request head, parses it
//! (httparse), writes it to a module connection taken from a pool (the
//! hop-by-hop headers left out, HTTP/1.1), parses the answer's head, and
//! passes the head and its `Content-Length` body back, all in that one
//! task, with buffers it keeps from request to request. It routes nothing,
//! checks no `Host`, keeps no deadline, and takes nothing but a GET without
//! a body (else 501) nor an answer framed otherwise than by `Content-Length`
//! (the connection is closed): it is not a product, only a measure of what a
//! purpose-built proxy path would cost beside hyper's
//! (docs/benchmarks.md, session 27).
//!
//! Runs until SIGTERM or SIGINT, then prints one JSON line:
//! `{connections, failed_accepts, requests, failed_connects, refused}`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::net::{accept_until_signal, BoxIo, Target};

/// Each head's buffer, and the most a head may take.
const HEAD_BYTES: usize = 8 << 10;
/// The most header lines a head may have.
const MAX_HEADERS: usize = 64;

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

#[derive(Debug, Default)]
struct Totals {
    requests: AtomicU64,
    failed_connects: AtomicU64,
    refused: AtomicU64,
}

/// Module connections between requests.
type Pool = Arc<Mutex<Vec<BoxIo>>>;

/// Serves every connection accepted on `listen`, forwarding to `to`, until
/// SIGTERM or SIGINT.
pub(crate) async fn run(listen: SocketAddr, to: Target) -> anyhow::Result<serde_json::Value> {
    let totals = Arc::new(Totals::default());
    let pool = Pool::default();
    let to = Arc::new(to);
    let accepted = accept_until_signal("parse-relay", listen, |client| {
        let (totals, pool, to) = (totals.clone(), pool.clone(), to.clone());
        tokio::spawn(async move {
            // An error is one side going away: the drop closes the other.
            let _ = serve(client, &pool, &to, &totals).await;
        });
    })
    .await?;
    Ok(json!({
        "connections": accepted.connections,
        "failed_accepts": accepted.failed_accepts,
        "requests": totals.requests.load(Ordering::Relaxed),
        "failed_connects": totals.failed_connects.load(Ordering::Relaxed),
        "refused": totals.refused.load(Ordering::Relaxed),
    }))
}

/// Whether `name` is a hop-by-hop header.
fn hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Appends `name: value\r\n` for each end-to-end header of `headers`.
fn put_headers(out: &mut Vec<u8>, headers: &[httparse::Header<'_>]) {
    for h in headers.iter().filter(|h| !hop_by_hop(h.name)) {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The request head for the module, written into `out`: `Ok(None)` while
/// `bytes` hold no whole head, else the head's length in `bytes`.
fn request_head(bytes: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, &'static str> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err("400 Bad Request"),
    };
    let has_body = request.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            || (h.name.eq_ignore_ascii_case("content-length") && h.value != b"0")
    });
    // A GET's answer always has the body its length names (a HEAD's would
    // not), which is all the relay reads.
    if has_body || request.method != Some("GET") {
        return Err("501 Not Implemented");
    }
    out.clear();
    out.extend_from_slice(request.method.unwrap_or("GET").as_bytes());
    out.push(b' ');
    out.extend_from_slice(request.path.unwrap_or("/").as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    put_headers(out, request.headers);
    Ok(Some(len))
}

/// The answer's head for the client, written into `out`: `Ok(None)` while
/// `bytes` hold no whole head, else the head's length in `bytes` and the
/// body's.
fn answer_head(bytes: &[u8], out: &mut Vec<u8>) -> anyhow::Result<Option<(usize, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let len = match answer.parse(bytes).context("the module's answer")? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let body = answer
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .context("an answer without Content-Length")?;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(answer.code.unwrap_or(502).to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(answer.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    put_headers(out, answer.headers);
    Ok(Some((len, body)))
}

/// Serves one client connection until it closes or fails.
async fn serve(
    mut client: TcpStream,
    pool: &Pool,
    to: &Target,
    totals: &Totals,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; HEAD_BYTES];
    let mut have = 0;
    let mut answer = vec![0u8; HEAD_BYTES];
    let mut out = Vec::with_capacity(1024);
    loop {
        let head = loop {
            match request_head(&buf[..have], &mut out) {
                Ok(Some(len)) => break len,
                Ok(None) if have < buf.len() => {}
                Ok(None) => {
                    return refuse(&mut client, "431 Request Header Fields Too Large", totals).await
                }
                Err(status) => return refuse(&mut client, status, totals).await,
            }
            let n = client.read(&mut buf[have..]).await?;
            if n == 0 {
                return Ok(());
            }
            have += n;
        };
        // Bytes of a next request, if the client sent one already.
        buf.copy_within(head..have, 0);
        have -= head;
        let pooled = pool.lock().ok().and_then(|mut idle| idle.pop());
        let mut module = match pooled {
            Some(module) => module,
            None => match to.connect().await {
                Ok(module) => module,
                Err(e) => {
                    totals.failed_connects.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            },
        };
        module.write_all(&out).await?;
        let mut got = 0;
        let (head, body) = loop {
            anyhow::ensure!(got < answer.len(), "the module's answer head is too long");
            let n = module.read(&mut answer[got..]).await?;
            anyhow::ensure!(n > 0, "the module closed its connection");
            got += n;
            if let Some(lengths) = answer_head(&answer[..got], &mut out)? {
                break lengths;
            }
        };
        // The head and what came of the body with it, then the rest as it comes.
        let with_head = body.min(got - head);
        anyhow::ensure!(
            got - head == with_head,
            "the module answered more than asked"
        );
        out.extend_from_slice(&answer[head..head + with_head]);
        client.write_all(&out).await?;
        let mut left = body - with_head;
        while left > 0 {
            let n = module.read(&mut answer[..left.min(HEAD_BYTES)]).await?;
            anyhow::ensure!(n > 0, "the module closed its connection");
            client.write_all(&answer[..n]).await?;
            left -= n;
        }
        totals.requests.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut idle) = pool.lock() {
            idle.push(module);
        }
    }
}

/// Answers `status` with no body and ends the connection.
async fn refuse(client: &mut TcpStream, status: &str, totals: &Totals) -> anyhow::Result<()> {
    totals.refused.fetch_add(1, Ordering::Relaxed);
    let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    client.write_all(answer.as_bytes()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_head_loses_its_hop_by_hop_headers() {
        let mut out = Vec::new();
        let bytes = b"GET /a?b HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nX-A: 1\r\n\r\nGET";
        let len = request_head(bytes, &mut out).expect("parses");
        assert_eq!(len, Some(bytes.len() - 3));
        assert_eq!(out, b"GET /a?b HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\n");
        assert_eq!(request_head(b"GET / HTTP/1.1\r\nHo", &mut out), Ok(None));
        let with_body = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
        assert_eq!(
            request_head(with_body, &mut out),
            Err("501 Not Implemented")
        );
        let head = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(request_head(head, &mut out), Err("501 Not Implemented"));
    }

    #[test]
    fn the_answer_head_keeps_its_status_and_names_its_body() {
        let mut out = Vec::new();
        let bytes = b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nKeep-Alive: 5\r\n\r\nno";
        let lengths = answer_head(bytes, &mut out).expect("parses");
        assert_eq!(lengths, Some((bytes.len() - 2, 2)));
        assert_eq!(out, b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(answer_head(chunked, &mut out).is_err());
    }
}
