//! `ray.init("ray://…")` through ray-dashd's client proxy module, against a
//! real Ray head (private ports, temp dir, stopped by pid): a task, an
//! actor, 12 MiB put/get, a task's print on the client, `env_vars` and
//! `working_dir` runtime envs, two clients at once with servers of their
//! own, a dropped connection resumed within the grace period, and the
//! server gone after `ray.shutdown()`. The head runs with token auth, so
//! every call also proves the token reaches the proxy, its GCS calls, the
//! runtime env agent and the servers; a call without it is refused.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::support::ray::{
    clients, driver, free_port, ray_python, run_driver, text, token, RayHead, RAY_WAIT,
};
use crate::support::{bin_dir, command_module, dashd, eventually, process_gone};

const MODULE: &str = "ray_client_proxy";

/// A driver left running, killed by pid if the test ends first.
struct Running(Option<Child>);

impl Running {
    fn wait(mut self) -> std::process::Output {
        let child = self.0.take().expect("child");
        child.wait_with_output().expect("driver output")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_driver(mut command: Command) -> Running {
    Running(Some(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn driver"),
    ))
}

async fn wait_file(path: &Path) {
    let found = eventually(RAY_WAIT, || async { path.exists().then_some(()) }).await;
    assert!(found.is_some(), "{} never appeared", path.display());
}

/// A TCP relay in front of the proxy whose connections can be cut, as a
/// network drop would.
struct Relay {
    port: u16,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay bind");
        let port = listener.local_addr().expect("addr").port();
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let held = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let relay = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().expect("lock").push(relay.abort_handle());
            }
        });
        Relay {
            port,
            connections,
            task,
        }
    }

    /// Drops every open connection.
    fn cut(&self) -> usize {
        let mut connections = self.connections.lock().expect("lock");
        let n = connections.len();
        for c in connections.drain(..) {
            c.abort();
        }
        n
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_client_works_through_the_proxy() {
    let python = ray_python();
    let head = RayHead::start(&python);
    let client_port = free_port();
    let proxy = bin_dir()
        .join("ray-dashd-client-proxy")
        .display()
        .to_string();
    let port_text = client_port.to_string();
    let python_text = python.display().to_string();
    let d = dashd()
        .session_dir(&head.session())
        .toml("[ray]\nmodules = \"off\"\n")
        .module(
            command_module(
                MODULE,
                &[
                    &proxy,
                    "--ray-client-port",
                    &port_text,
                    "--gcs-address",
                    &head.gcs,
                    "--python",
                    &python_text,
                    // Each server on a port the kernel picks.
                    "--port-range",
                    "auto",
                ],
            )
            .routes(&[("GET", "/api/client_proxy/clients", "http")]),
        )
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", &token())
        .start();
    d.healthy(MODULE, 0).await;
    let spare = eventually(RAY_WAIT, || async {
        (clients(&d).await["spare_ready"] == true).then_some(())
    })
    .await;
    assert!(
        spare.is_some(),
        "no spare server: {}\n{}",
        clients(&d).await,
        d.log()
    );
    assert_eq!(clients(&d).await["server_ports"], "auto");
    let address = format!("127.0.0.1:{client_port}");

    // The head runs with token auth: a call without the token is refused.
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let refused = ray_proto::rpc::raylet_driver_client::RayletDriverClient::new(channel)
        .cluster_info(ray_proto::rpc::ClusterInfoRequest { r#type: 6 })
        .await
        .expect_err("a PING without the token is refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    let basics = run_driver(&head, &python, &address, "basics");
    assert_eq!(basics["task"], 42, "{basics}");
    assert_eq!(basics["actor"], 2, "{basics}");
    assert_eq!(basics["put_get_equal"], true, "{basics}");
    assert_eq!(basics["print_seen"], true, "{basics}");
    assert_eq!(basics["num_clients"], 1, "{basics}");
    eprintln!("connect with a warm spare: {} s", basics["connect_s"]);

    // Two clients with runtime environments, side by side (each driver
    // spends seconds importing Ray and setting up its environment).
    let (env_vars, working_dir) = std::thread::scope(|s| {
        let env_vars = s.spawn(|| run_driver(&head, &python, &address, "env_vars"));
        let working_dir = s.spawn(|| run_driver(&head, &python, &address, "working_dir"));
        (
            env_vars.join().expect("env_vars driver"),
            working_dir.join().expect("working_dir driver"),
        )
    });
    assert_eq!(env_vars["env_var"], "through-the-proxy", "{env_vars}");
    assert_eq!(
        working_dir["working_dir"], "from the working dir",
        "{working_dir}"
    );

    // Two clients at once: two servers.
    let flags_a = tempfile::tempdir().expect("flags");
    let flags_b = tempfile::tempdir().expect("flags");
    let a = spawn_driver(driver(&head, &python, &address, "hold", flags_a.path()));
    let b = spawn_driver(driver(&head, &python, &address, "hold", flags_b.path()));
    wait_file(&flags_a.path().join("connected")).await;
    wait_file(&flags_b.path().join("connected")).await;
    let view = clients(&d).await;
    let listed = view["clients"].as_array().expect("clients").clone();
    assert_eq!(listed.len(), 2, "{view}");
    assert_ne!(listed[0]["server_pid"], listed[1]["server_pid"], "{view}");
    let pids: Vec<u32> = listed
        .iter()
        .map(|c| c["server_pid"].as_u64().expect("pid") as u32)
        .collect();
    // Both ask for connection_info while both are connected.
    for flags in [&flags_a, &flags_b] {
        std::fs::write(flags.path().join("go"), "").expect("go");
    }
    for flags in [&flags_a, &flags_b] {
        wait_file(&flags.path().join("asked")).await;
    }
    for flags in [&flags_a, &flags_b] {
        std::fs::write(flags.path().join("done"), "").expect("done");
    }
    for run in [a, b] {
        let output = run.wait();
        assert!(output.status.success(), "{}", text(&output));
        let result: Value = serde_json::from_str(
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .last()
                .expect("json"),
        )
        .expect("json");
        assert_eq!(result["task"], 10);
        assert_eq!(
            result["num_clients_now"], 2,
            "num_clients is the proxy's count: {result}"
        );
    }
    // ray.shutdown(): the servers go, promptly.
    let gone = eventually(Duration::from_secs(30), || async {
        (pids.iter().all(|p| process_gone(*p)) && clients(&d).await["num_clients"] == 0)
            .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "servers left after ray.shutdown(): {}",
        clients(&d).await
    );

    // A dropped connection, resumed within the grace period.
    let relay = Relay::start(client_port).await;
    let flags = tempfile::tempdir().expect("flags");
    let resumed = spawn_driver(driver(
        &head,
        &python,
        &format!("127.0.0.1:{}", relay.port),
        "resume",
        flags.path(),
    ));
    wait_file(&flags.path().join("connected")).await;
    let before = clients(&d).await["clients"][0].clone();
    assert!(relay.cut() > 0, "no connection to cut");
    let started = Instant::now();
    let back = eventually(RAY_WAIT, || async {
        let entry = clients(&d).await["clients"][0].clone();
        (entry["reconnected"] == true && entry["attached"] == true).then_some(entry)
    })
    .await;
    let Some(back) = back else {
        panic!("client did not reconnect: {}", clients(&d).await)
    };
    eprintln!("reconnected after {:?}", started.elapsed());
    assert_eq!(
        back["server_pid"], before["server_pid"],
        "reconnect got another server"
    );
    std::fs::write(flags.path().join("go"), "").expect("go");
    let output = resumed.wait();
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("\"task\": 10"),
        "{}",
        text(&output)
    );
}
