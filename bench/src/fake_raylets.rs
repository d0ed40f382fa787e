//! `fake-raylets`: the node managers of `bench/ray_synth_cluster.py`'s
//! synthetic nodes, each on a loopback port of its own, answering the calls
//! that Ray's head makes to every raylet of a big cluster:
//!
//! - `grpc.health.v1.Health/Check` (the GCS's health check, every 3 s per
//!   node): SERVING, for any service name;
//! - `ray.rpc.NodeManagerService/GetResourceLoad` (the GCS pulls it every
//!   second from every node): that node's own reply, so the GCS and its
//!   autoscaler state keep the node as registered (idle, all resources free);
//! - `ray.rpc.NodeManagerService/GetNodeStats` (Ray's NodeHead, every 15 s
//!   per node): one reply for all (an idle raylet with no workers);
//! - anything else: UNIMPLEMENTED.
//!
//! The replies are serialized by the Python script, from the protos of the
//! Ray it runs with, so nothing here depends on Ray's version. Input file
//! (`--input`), one line each: the `GetNodeStats` reply in hex, then per
//! node its loopback address and its `GetResourceLoad` reply in hex. Each
//! node gets a listener on its address (a free port); their ports, in the
//! order of the input, go to `--ports-file` as `{"ports": [...]}` (written
//! whole, then renamed). Serves
//! HTTP/2 (gRPC) until SIGTERM or SIGINT, or until its parent exits, then
//! prints `{nodes, connections, calls: {method: n}}`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// `grpc.health.v1.HealthCheckResponse { status: SERVING }`.
const HEALTH_SERVING: &[u8] = &[0x08, 0x01];

type GrpcBody =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// Calls answered, by method.
type Calls = Arc<Mutex<BTreeMap<String, u64>>>;

/// What every listener shares.
#[derive(Debug)]
struct Canned {
    node_stats: Bytes,
    calls: Calls,
}

fn hex_decode(line: &str) -> anyhow::Result<Bytes> {
    let line = line.trim();
    anyhow::ensure!(line.len() % 2 == 0, "odd number of hex digits");
    let mut out = BytesMut::with_capacity(line.len() / 2);
    for pair in line.as_bytes().chunks(2) {
        let s = std::str::from_utf8(pair).context("not ASCII")?;
        out.put_u8(u8::from_str_radix(s, 16).with_context(|| format!("bad hex {s:?}"))?);
    }
    Ok(out.freeze())
}

/// A gRPC answer: headers, one length-prefixed message, `grpc-status: 0`.
fn grpc_ok(message: &[u8]) -> Response<GrpcBody> {
    let mut data = BytesMut::with_capacity(5 + message.len());
    data.put_u8(0);
    data.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    data.put_slice(message);
    grpc_response(vec![Frame::data(data.freeze())], "0", None)
}

fn grpc_response(
    mut frames: Vec<Frame<Bytes>>,
    status: &'static str,
    message: Option<&'static str>,
) -> Response<GrpcBody> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    if let Some(m) = message {
        trailers.insert("grpc-message", HeaderValue::from_static(m));
    }
    frames.push(Frame::trailers(trailers));
    let body = StreamBody::new(futures_util::stream::iter(
        frames.into_iter().map(Ok).collect::<Vec<_>>(),
    ));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

async fn answer(
    request: Request<Incoming>,
    canned: Arc<Canned>,
    resource_load: Bytes,
) -> Result<Response<GrpcBody>, Infallible> {
    let method = request.uri().path().to_owned();
    // Read the request to its end first: an answer before the request's end
    // makes the server reset the stream.
    let _ = request.into_body().collect().await;
    let response = match method.as_str() {
        "/grpc.health.v1.Health/Check" => grpc_ok(HEALTH_SERVING),
        "/ray.rpc.NodeManagerService/GetResourceLoad" => grpc_ok(&resource_load),
        "/ray.rpc.NodeManagerService/GetNodeStats" => grpc_ok(&canned.node_stats),
        _ => grpc_response(vec![], "12", Some("not a real raylet")),
    };
    if let Ok(mut calls) = canned.calls.lock() {
        *calls.entry(method).or_default() += 1;
    }
    Ok(response)
}

/// Serves every connection accepted on `listener` as node `resource_load`'s.
async fn serve_node(
    listener: TcpListener,
    canned: Arc<Canned>,
    resource_load: Bytes,
    conns: Arc<Mutex<u64>>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: try again a little later.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        if let Ok(mut n) = conns.lock() {
            *n += 1;
        }
        let (canned, resource_load) = (canned.clone(), resource_load.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, canned.clone(), resource_load.clone()));
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn write_ports(path: &Path, ports: &[u16]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json!({ "ports": ports }).to_string())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

/// Runs until SIGTERM, SIGINT or the parent's end.
/// No node listens on a port of `avoid`.
pub(crate) async fn run(
    input: &Path,
    ports_file: &Path,
    avoid: &[u16],
) -> anyhow::Result<serde_json::Value> {
    // SIGTERM when the script that started us ends, however it ends.
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
        .context("PR_SET_PDEATHSIG")?;
    let text =
        std::fs::read_to_string(input).with_context(|| format!("read {}", input.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let node_stats =
        hex_decode(lines.next().context("empty input")?).context("GetNodeStats reply")?;
    let nodes = lines
        .enumerate()
        .map(|(i, l)| {
            let (ip, hex) = l
                .trim()
                .split_once(' ')
                .with_context(|| format!("node {i}: expected `IP HEX`"))?;
            let ip: std::net::IpAddr = ip
                .parse()
                .with_context(|| format!("node {i}: bad IP {ip:?}"))?;
            anyhow::ensure!(ip.is_loopback(), "node {i}: {ip} is not a loopback address");
            let load =
                hex_decode(hex).with_context(|| format!("GetResourceLoad reply of node {i}"))?;
            Ok((ip, load))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let canned = Arc::new(Canned {
        node_stats,
        calls: Arc::default(),
    });
    let conns = Arc::new(Mutex::new(0u64));
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut ports = Vec::with_capacity(nodes.len());
    // Held until every node listens, so that the kernel hands out others.
    let mut passed_over = Vec::new();
    for (ip, load) in nodes {
        let listener = loop {
            let listener = TcpListener::bind((ip, 0))
                .await
                .with_context(|| format!("bind {ip}:0"))?;
            if !avoid.contains(&listener.local_addr()?.port()) {
                break listener;
            }
            passed_over.push(listener);
        };
        ports.push(listener.local_addr()?.port());
        tokio::spawn(serve_node(listener, canned.clone(), load, conns.clone()));
    }
    drop(passed_over);
    write_ports(ports_file, &ports)?;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => if nix::unistd::getppid() != parent { break },
        }
    }
    let calls = canned.calls.lock().map(|c| c.clone()).unwrap_or_default();
    let connections = conns.lock().map(|n| *n).unwrap_or(0);
    Ok(json!({ "nodes": ports.len(), "connections": connections, "calls": calls }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_lines_decode() {
        assert_eq!(
            hex_decode("0801\n").expect("hex"),
            Bytes::from_static(HEALTH_SERVING)
        );
        assert!(hex_decode("080").is_err());
        assert!(hex_decode("zz").is_err());
    }

    #[tokio::test]
    async fn answers_are_grpc_framed_with_trailers() {
        let response = grpc_ok(HEALTH_SERVING);
        assert_eq!(
            response.headers()[http::header::CONTENT_TYPE],
            "application/grpc"
        );
        let collected = response.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(collected.to_bytes().as_ref(), &[0, 0, 0, 0, 2, 0x08, 0x01]);
        let unimplemented = grpc_response(vec![], "12", Some("x"))
            .into_body()
            .collect()
            .await;
        let unimplemented = unimplemented.expect("body");
        assert_eq!(
            unimplemented.trailers().expect("trailers")["grpc-status"],
            "12"
        );
    }
}
