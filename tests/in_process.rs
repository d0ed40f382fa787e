//! ray-dashd's whole server in the test's own process, through
//! [`ray_dashd::run`] with a listener and a shutdown future of the test's,
//! instead of the binary: modules are real processes (the test module),
//! the rest (config, supervisor, proxy, API, drain and stop) runs here, so
//! its state can be driven and awaited directly.
//!
//! A test binary of its own: `run` ends with a sweep of every process left
//! below the host, which here is the test process, so no other test may
//! run beside it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use ray_dashd::cli::Cli;
use ray_dashd::config::Config;
use ray_dashd::ray::{RayHosting, RayStatus};
use ray_dashd::session::Session;
use ray_dashd::{run, Prepared};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

// Its helpers are `pub` for the integration tests' sibling modules.
#[allow(unreachable_pub)]
#[path = "bins.rs"]
mod bins;
use bins::test_module_bin;

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(20);

/// What `launch` would prepare for `config_text` in `session_dir`, without
/// Ray, reload or TLS.
fn prepare(session_dir: &Path, config_text: &str) -> Prepared {
    let cli = Cli::parse_from([
        "ray-dashd",
        "--session-dir",
        &session_dir.display().to_string(),
        "--port",
        "0",
    ]);
    let config = Config::from_toml("in_process.toml", config_text, &cli).expect("config");
    let session = Session::prepare(&config.session_dir).expect("session");
    Prepared {
        config,
        session,
        ray: None,
        token: None,
        ray_status: RayStatus {
            state: RayHosting::Off,
            message: "off in this test".to_owned(),
            python: None,
            python_source: None,
            ray_version: None,
        },
        early: Vec::new(),
        nofile: 1024,
        reload: None,
        tls: None,
        ray_metrics: None,
    }
}

/// `GET path` answered as JSON, or `None` until it is.
async fn get_json(client: &reqwest::Client, addr: SocketAddr, path: &str) -> Option<Value> {
    let response = client
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .ok()?;
    response.json().await.ok()
}

/// Serves two modules; a request reaches each; the shutdown future given
/// to `run` drains a request in flight, stops the modules and removes
/// their sockets, and `run` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_modules_until_its_shutdown_future_completes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let module = test_module_bin();
    let config = format!(
        r#"
[ray]
modules = "off"

[[modules]]
name = "a"
command = ["{m}"]
routes = [
  {{ method = "GET", path = "/test/echo", type = "http" }},
  {{ method = "GET", path = "/test/slow", type = "http" }},
  {{ method = "GET", path = "/test/stats", type = "http" }},
]

[[modules]]
name = "b"
command = ["{m}"]
routes = []
"#,
        m = module.display()
    );
    let prepared = prepare(dir.path(), &config);
    let sockets = prepared.session.dir.join("sockets");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(run(prepared, listener, async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();

    // Both modules healthy, through the host's own API.
    let deadline = tokio::time::Instant::now() + WAIT;
    let modules = loop {
        if let Some(Value::Array(modules)) = get_json(&client, addr, "/api/modules").await {
            if modules.len() == 2 && modules.iter().all(|m| m["state"] == "healthy") {
                break modules;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "modules never healthy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let pids: Vec<i32> = modules
        .iter()
        .map(|m| m["pid"].as_i64().expect("pid") as i32)
        .collect();
    assert!(sockets.join("dash_a").exists() && sockets.join("dash_b").exists());

    // A module route, proxied.
    let echoed = client
        .get(format!("http://{addr}/test/echo?x=1"))
        .send()
        .await
        .expect("GET /test/echo");
    assert_eq!(echoed.status(), 200);

    // A slow request in flight when the shutdown future completes is
    // answered before `run` returns.
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move {
            let response = client
                .get(format!("http://{addr}/test/slow?ms=1000"))
                .send()
                .await
                .expect("GET /test/slow");
            (response.status(), response.text().await.expect("body"))
        }
    });
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stats = get_json(&client, addr, "/test/stats").await;
        if stats.is_some_and(|s| s["requests_in_flight"].as_u64() >= Some(1)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slow request never reached the module"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(())
        .expect("run is waiting on its shutdown future");
    let (status, body) = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("answered")
        .expect("task");
    assert_eq!((status.as_u16(), body.as_str()), (200, "slow done"));
    tokio::time::timeout(WAIT, server)
        .await
        .expect("run returned")
        .expect("run did not panic");

    // Modules stopped, sockets removed, the port closed.
    assert!(!sockets.join("dash_a").exists() && !sockets.join("dash_b").exists());
    for pid in pids {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z ") && !stat.contains(") X "));
        assert!(!alive, "module process {pid} outlived run");
    }
    assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}
