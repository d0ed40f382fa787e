//! Descriptors: ray-dashd raises its soft open-file limit, caps client
//! connections below what the limit leaves room for, and paces failed
//! accepts, so that a crowd of idle clients starves neither health checks,
//! nor existing clients, nor module connections, nor floods the log.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::support::{dashd, eventually, test_module, Dashd, WAIT};

/// The open-file limit the tests start ray-dashd with.
const LOW: u64 = 256;
/// Idle clients: more than `LOW`.
const IDLE: usize = 300;
/// How soon `/api/healthz` must answer on a new connection while idle
/// clients hold every slot: connections over the cap are served within 2 s
/// (`server::accept::OVERFLOW_DEADLINE`), so a place is free by then.
const HEALTHZ_WITHIN: Duration = Duration::from_secs(5);

/// Opens `n` connections that send nothing; those the server closes stay
/// open on this side.
fn idle_clients(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect()
}

/// Sends `GET path` on the kept-alive `stream` and returns the answer's
/// status line and body.
fn get(stream: &mut TcpStream, path: &str) -> (String, String) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())
                        .flatten()
                })
                .expect("content-length");
            if buf.len() >= end + 4 + length {
                let status = text.lines().next().unwrap_or_default().to_owned();
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
                return (status, body);
            }
        }
        let n = stream.read(&mut chunk).expect("read the answer");
        assert!(n > 0, "connection closed; got {text:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `/api/healthz` on a new connection, tried until it answers or `within`.
async fn healthz_within(d: &Dashd, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    eventually(within, || async {
        let response = http.get(d.url("/api/healthz")).send().await.ok()?;
        (response.status() == 200 && response.text().await.ok()? == "success")
            .then(|| started.elapsed())
    })
    .await
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// At a soft and hard limit of 256, 300 idle clients: `/api/healthz`
/// answers on a new connection, a client connected before keeps being
/// served (by the host and through a module), the module stays healthy,
/// and no accept fails.
#[tokio::test]
async fn healthz_and_existing_clients_outlast_more_idle_clients_than_descriptors() {
    let d = dashd().nofile(LOW, LOW).module(test_module("a")).start();
    d.healthy("a", 0).await;
    let mut existing = TcpStream::connect(d.addr()).expect("connect");
    assert_eq!(get(&mut existing, "/api/healthz").1, "success");
    let started = Instant::now();
    let idle = idle_clients(d.addr(), IDLE);
    assert_eq!(idle.len(), IDLE, "the kernel took every connection");
    let answered = healthz_within(&d, HEALTHZ_WITHIN).await;
    assert!(
        answered.is_some(),
        "/api/healthz did not answer within {HEALTHZ_WITHIN:?}; log:\n{}",
        d.log()
    );
    d.logged("client connection limit reached").await;
    assert_eq!(get(&mut existing, "/api/healthz").1, "success");
    let (status, _) = get(&mut existing, "/test/echo");
    assert!(status.contains(" 200 "), "{status}");
    let (_, report) = get(&mut existing, "/api/modules/a");
    let module: serde_json::Value = serde_json::from_str(&report).expect("module json");
    assert_eq!(module["state"], "healthy", "{module:#}");
    assert_eq!(module["incarnation"], 0, "{module:#}");
    let log = d.log();
    assert_eq!(count(&log, "accept failed"), 0, "log:\n{log}");
    let warnings = count(&log, "client connection limit reached");
    let allowed = started.elapsed().as_secs() as usize + 2;
    assert!(
        warnings <= allowed,
        "{warnings} warnings in {:?}; log:\n{log}",
        started.elapsed()
    );
    drop(idle);
}

/// A soft limit below the hard one is raised to it (and logged); modules
/// get the limit ray-dashd was started with back.
#[tokio::test]
async fn the_soft_descriptor_limit_is_raised_and_modules_get_theirs_back() {
    let d = dashd().nofile(LOW, 4096).module(test_module("a")).start();
    let module = d.healthy("a", 0).await["pid"].as_u64().expect("pid") as u32;
    let log = d.log();
    assert!(
        log.lines().any(|l| l.contains("raised the open-file limit")
            && l.contains("soft_before=256")
            && l.contains("soft=4096")),
        "log:\n{log}"
    );
    let limits = |pid: u32| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("open files line")
            .to_owned();
        line.split_whitespace()
            .skip(3)
            .take(2)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(limits(d.pid()), ["4096", "4096"]);
    assert_eq!(limits(module), ["256", "4096"]);
}

/// With the cap set above what the limit holds, accepts fail for want of
/// descriptors: they are paced (10 ms doubling to 1 s) and warned about
/// at most once a second, and serving resumes once clients leave.
#[tokio::test]
async fn failed_accepts_back_off_instead_of_flooding_the_log() {
    let d = dashd()
        .nofile(LOW, LOW)
        .server("max_connections", "1000")
        .start();
    let idle = idle_clients(d.addr(), IDLE);
    d.logged("accept failed").await;
    // An observation window, not a wait for readiness: what the log gets
    // while accepts keep failing.
    let before = count(&d.log(), "accept failed");
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let during = count(&d.log(), "accept failed") - before;
    assert!(
        during <= 4,
        "{during} accept warnings in {window:?} (at most one a second); log:\n{}",
        d.log()
    );
    drop(idle);
    let answered = healthz_within(&d, WAIT).await;
    assert!(
        answered.is_some(),
        "/api/healthz did not answer once the clients left; log:\n{}",
        d.log()
    );
}
