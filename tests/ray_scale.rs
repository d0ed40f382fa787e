//! A big cluster's state at a small size, from `bench/ray_synth_cluster.py`
//! (the tool `bench/ray_scale.sh` runs at 2,000 nodes): 200 nodes
//! registered in a real Ray 2.60.0 head's GCS (kept alive by the bench's
//! fake raylets), 1,000 actors that can never be placed, 5,000 finished
//! tasks and 50 finished jobs. Ray's own dashboard (started again once the
//! cluster is built, with a sockets folder of its own) and ray-dashd hosting
//! the same modules answer Ray's release-test routes side by side, asked at
//! once, and the two sets are compared after parsing
//! (`bench/compare_answers.py`, the fields that change by themselves left
//! out) until they are the same. Ray's web UI is then walked page by page in
//! a browser on both (`tests/ui/ray_walk.mjs`) and must show the same.
//! ray-dashd shares those answers and holds Ray's modules to the `[ray]`
//! memory budget.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::eventually;
use crate::support::ray::{
    all_ray_modules_up, authed, free_port, hosting, json_of, ray_python, run_bounded, text, token,
    RayHead, RAY_WAIT,
};

const NODES: usize = 200;
const ACTORS: usize = 1000;

/// The release test's routes whose answers come from the GCS alone (its
/// `/events` gains the autoscaler's events by itself; `/api/v0/logs` is
/// asked for the head node, as a bare one answers 400).
const PATHS: [&str; 5] = [
    "/logical/actors",
    "/nodes?view=summary",
    "/api/cluster_status",
    "/api/jobs/",
    "/api/prometheus_health",
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `bench/ray_synth_cluster.py` holding the synthetic state; stopped (and
/// its driver and raylets with it) by pid when dropped.
struct Synth(Child);

impl Drop for Synth {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds the synthetic cluster on `head`; returns once its summary is out.
fn synthesize(head: &RayHead, python: &Path, dir: &Path) -> (Synth, Value) {
    let summary = dir.join("synth.json");
    let mut command = Command::new(python);
    command
        .arg(repo().join("bench/ray_synth_cluster.py"))
        .args(["--gcs-address", &head.gcs])
        .args([
            "--nodes",
            &NODES.to_string(),
            "--actors",
            &ACTORS.to_string(),
        ])
        .args(["--tasks", "5000", "--jobs", "50"])
        .arg("--raylets-bin")
        .arg(crate::bins::bin_dir().join("ray-dashd-bench"))
        // A node on one of them would keep the README's Ray, which a test
        // may start meanwhile, off its default ports.
        .arg("--avoid-ports")
        .arg(
            crate::support::DEFAULT_PORT_NUMBERS
                .map(|p| p.to_string())
                .join(","),
        )
        .arg("--summary-file")
        .arg(&summary)
        .arg("--exit-with-parent")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("synth.err")).expect("synth.err"));
    head.env(&mut command);
    let mut synth = Synth(command.spawn().expect("ray_synth_cluster.py"));
    let deadline = Instant::now() + RAY_WAIT;
    loop {
        if let Some(found) = std::fs::read_to_string(&summary)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        {
            return (synth, found);
        }
        let exited = synth.0.try_wait().expect("try_wait");
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "the synthetic cluster was not built ({exited:?}): {}",
            std::fs::read_to_string(dir.join("synth.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `compare_answers.py` with `args`, the cluster's token in its
/// environment; whether it exited 0, and its output.
fn compare_answers(python: &Path, args: &[&str]) -> (bool, String) {
    let mut command = Command::new(python);
    command
        .arg(repo().join("bench/compare_answers.py"))
        .args(args)
        .env("RAY_AUTH_TOKEN", token());
    run_script(command)
}

/// `tests/ui/ray_walk.mjs` on Ray's dashboard at `reference` and ray-dashd
/// at `candidate` (headless Chromium, as scripts/test sets it up): whether
/// every page agreed, and its report.
fn walk_ray_ui(reference: &str, candidate: &str) -> (bool, String) {
    let mut command = Command::new("node");
    command
        .arg(repo().join("tests/ui/ray_walk.mjs"))
        .args(["--token", &token(), "--settle-ms", "1000"])
        .args([reference, candidate]);
    run_script(command)
}

/// Saves `paths`' answers at `base` into a new folder under `dir` named
/// after `tag` and the round; the folder.
fn save_answers(python: &Path, dir: &Path, tag: &str, base: &str, paths: &[&str]) -> PathBuf {
    static ROUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let round = ROUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let saved = dir.join(format!("{tag}.{round}"));
    let saved_arg = saved.display().to_string();
    let mut args = vec!["--save", saved_arg.as_str(), base];
    args.extend(paths.iter().copied());
    let (ok, out) = compare_answers(python, &args);
    assert!(ok, "saving the answers of {base}: {out}");
    saved
}

/// Whether two saved sets of `paths`' answers are the same; the report.
fn same_answers(python: &Path, a: &Path, b: &Path, paths: &[&str]) -> (bool, String) {
    let (a, b) = (a.display().to_string(), b.display().to_string());
    let (same, out) = compare_answers(python, &["--dirs", &a, &b]);
    (same && out.matches("same").count() == paths.len(), out)
}

/// Waits until the dashboard at `base` answers every path and lists every
/// actor.
async fn ready(base: &str) {
    answering(base).await;
    let all = eventually(RAY_WAIT, || async {
        (actors_listed(base).await? >= ACTORS).then_some(())
    })
    .await;
    assert!(all.is_some(), "{base} never listed {ACTORS} actors");
}

/// Runs `command` within [`RAY_WAIT`]: whether it exited 0, and its
/// stdout and stderr.
fn run_script(command: Command) -> (bool, String) {
    let output = run_bounded(command);
    (output.status.success(), text(&output))
}

/// Waits until every path answers (any status: `/api/prometheus_health`
/// answers 500 without a Prometheus) at `base`.
async fn answering(base: &str) {
    for path in PATHS {
        let answered = eventually(RAY_WAIT, || async {
            let response = authed().get(format!("{base}{path}")).send().await.ok()?;
            (response.status() != 404 && response.status() != 503).then_some(())
        })
        .await;
        assert!(answered.is_some(), "{base}{path} never answered");
    }
}

/// The number of actors `/logical/actors` lists at `base`.
async fn actors_listed(base: &str) -> Option<usize> {
    let answer: Value = authed()
        .get(format!("{base}/logical/actors"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(answer["data"]["actors"].as_object()?.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synthetic_big_cluster_is_answered_as_rays_own_dashboard_answers() {
    let python = ray_python();
    let ray_port = free_port();
    let head = RayHead::start_with_dashboard(&python, ray_port);
    // Ray's dashboard reads the GCS's actor table once, when it starts, and
    // then follows what the GCS publishes: one that was up while the actors
    // were made listed a pending actor's node as nil for minutes after one
    // started later listed the head's, which the table holds. It is stopped
    // while the cluster is built and started again after, as ray-dashd is.
    let rays_dashboard = head.stop_rays_dashboard();
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = scratch.path();
    let (_synth, summary) = synthesize(&head, &python, dir);
    assert_eq!(summary["nodes_alive"], NODES, "{summary}");
    let head_node = summary["head_node_id"]
        .as_str()
        .expect("head_node_id")
        .to_owned();
    let logs = format!("/api/v0/logs?node_id={head_node}");
    let mut paths: Vec<&str> = PATHS.to_vec();
    paths.push(&logs);

    // Ray's own dashboard (a sockets folder of its own) and ray-dashd
    // hosting the same modules, side by side, each once it lists every
    // actor.
    let ray_base = format!("http://127.0.0.1:{ray_port}");
    let _ray = rays_dashboard.start(&dir.join("ray-dashboard.log"), dir);
    let d = hosting(&head, &python, 0, "memory_budget_mib = 4096\n").start();
    all_ray_modules_up(&d).await;
    let dashd_base = d.url("").trim_end_matches('/').to_owned();
    for base in [&ray_base, &dashd_base] {
        ready(base).await;
    }
    // The two are asked at once, again, until they answer the same (the
    // head's agent reports to a dashboard just started within seconds).
    let last = std::sync::Mutex::new(String::new());
    let same = eventually(RAY_WAIT, || async {
        let ray = save_answers(&python, dir, "ray", &ray_base, &paths);
        let dashd = save_answers(&python, dir, "dashd", &dashd_base, &paths);
        let (same, out) = same_answers(&python, &ray, &dashd, &paths);
        *last.lock().expect("last") = out;
        same.then_some(())
    })
    .await;
    assert!(
        same.is_some(),
        "ray-dashd's answers differ from Ray's:\n{}",
        last.lock().expect("last")
    );

    // Ray's web UI in a browser, every page: the same on both.
    let (walked, out) = walk_ray_ui(&ray_base, &dashd_base);
    assert!(walked, "Ray's web UI differs on ray-dashd:\n{out}");
    let pages = out.lines().filter(|l| l.starts_with("same\t")).count();
    assert!(pages >= 10, "too few pages walked:\n{out}");

    // Shared, and within the budget, which ray-dashd reports.
    let shared = authed()
        .get(d.url("/nodes?view=summary"))
        .send()
        .await
        .expect("GET /nodes");
    assert!(shared.headers().contains_key("x-dashd-shared"));
    let node_head = eventually(RAY_WAIT, || async {
        let report = json_of(authed().get(d.url("/api/modules/NodeHead"))).await?;
        (report["memory_bytes"].as_u64()? > 0).then_some(report)
    })
    .await
    .expect("NodeHead's memory reported");
    assert_eq!(
        node_head["memory_budget_bytes"],
        4096u64 << 20,
        "{node_head}"
    );
    assert_eq!(node_head["restarts"], 0, "{node_head}");
}
