//! The README's "With Ray" block runs as written, on Ray's default ports
//! (`/opt/ray` is the venv scripts/test installs the wheel into, named by
//! `RAY_DASHD_TEST_WHEEL_VENV`): `ray start` with Ray's own ports, ray-dashd
//! on 8265 and 10001, a job, a `ray://` client. Then Ray's Prometheus
//! service discovery lists an address that serves ray-dashd's series and
//! those of the dashboard process `ray start` runs itself (which holds
//! Ray's metrics port, 44227): nothing of either is lost.
//!
//! Ray's default ports are the machine's: with one of them taken (a Ray of
//! one's own running), the test fails naming it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::install::wheel_venv;
use crate::support::ray::{run_bounded, text, RAY_WAIT};
use crate::support::DEFAULT_PORT_NUMBERS;

/// The README, as the test reads its blocks.
const README: &str = include_str!("../README.md");

/// The lines of the first `sh` block of the README's section `heading`.
fn readme_block(heading: &str) -> Vec<String> {
    let section = README
        .split(&format!("\n## {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("the README has no section {heading:?}"));
    let section = section.split("\n## ").next().unwrap_or(section);
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("the README's {heading:?} has no sh block"));
    block.lines().map(str::to_owned).collect()
}

/// What the block's processes leave running, stopped by pid when the test
/// ends, passed or not: ray-dashd, then the process group `ray start` and
/// all it started run in.
struct Started {
    dashd: Option<Child>,
    ray_group: Option<i32>,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(mut dashd) = self.dashd.take() {
            let _ = dashd.kill();
            let _ = dashd.wait();
        }
        if let Some(group) = self.ray_group.take() {
            let group = Pid::from_raw(group);
            let _ = nix::sys::signal::killpg(group, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && nix::sys::signal::killpg(group, None).is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
        }
    }
}

/// `line` run by `sh` with the venv's tools first found as the README's
/// `/opt/ray`, bounded by [`RAY_WAIT`]; its output, which must say success.
fn run_line(line: &str, env: &[(&str, String)]) -> String {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(line)
        .envs(env.iter().map(|(k, v)| (k, v)));
    let out = run_bounded(command);
    assert!(out.status.success(), "`{line}` failed:\n{}", text(&out));
    text(&out)
}

/// The taken ones of [`DEFAULT_PORT_NUMBERS`].
fn taken_ports() -> Vec<u16> {
    DEFAULT_PORT_NUMBERS
        .into_iter()
        .filter(|port| std::net::TcpListener::bind(("0.0.0.0", *port)).is_err())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_with_ray_block_runs_as_written_on_default_ports() {
    let _default_ports = crate::support::DEFAULT_PORTS.lock().await;
    // 44227 and 44228 lie in Linux's ephemeral range (32768-60999): another
    // test's outgoing connection can hold one for a moment. Such a port is
    // waited for, within WAIT; one held longer fails the test as before.
    let _ = crate::support::eventually(crate::support::WAIT, || async {
        taken_ports().is_empty().then_some(())
    })
    .await;
    let taken = taken_ports();
    assert!(
        taken.is_empty(),
        "this test runs Ray and ray-dashd on their default ports, and {taken:?} are taken \
         on this machine (a Ray of one's own?); free them and run it again"
    );
    let venv = wheel_venv();
    let opt_ray = venv.display().to_string();
    let lines: Vec<String> = readme_block("With Ray")
        .into_iter()
        .map(|line| line.replace("/opt/ray", &opt_ray))
        .collect();
    assert_eq!(
        lines.len(),
        5,
        "the block changed; update this test: {lines:#?}"
    );
    // No usage reports to send from here (no network).
    let env = [("RAY_USAGE_STATS_ENABLED", "0".to_owned())];
    let logs = tempfile::tempdir().expect("tempdir");
    let mut started = Started {
        dashd: None,
        ray_group: None,
    };

    // `ray start …`: in a process group of its own, which what it starts
    // stays in (stopped by that group, never by name).
    let mut ray_start = Command::new("sh");
    ray_start
        .arg("-c")
        .arg(&lines[0])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    let mut ray_start = ray_start.spawn().expect("ray start");
    started.ray_group = Some(ray_start.id() as i32);
    let status = wait_bounded(&mut ray_start, RAY_WAIT);
    assert_eq!(status, Some(0), "`{}` failed or did not finish", lines[0]);
    let session = std::fs::canonicalize("/tmp/ray/session_latest").expect("the session Ray made");

    // `ray-dashd --session-dir /tmp/ray/session_latest &`
    let background = lines[1]
        .strip_suffix('&')
        .expect("the block starts ray-dashd in the background")
        .trim();
    let log = std::fs::File::create(logs.path().join("ray-dashd.log")).expect("log");
    let mut dashd = Command::new("sh");
    dashd
        .arg("-c")
        .arg(format!("exec {background}"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0);
    started.dashd = Some(dashd.spawn().expect("ray-dashd"));
    let dashd_log =
        || std::fs::read_to_string(logs.path().join("ray-dashd.log")).unwrap_or_default();

    // `until curl …; do sleep 1; done`, `ray job submit …`, `ray.init(…)`.
    let version = run_line(&lines[2], &env);
    assert!(
        version.contains("\"ray_version\""),
        "{version}\n{}",
        dashd_log()
    );
    let job = run_line(&lines[3], &env);
    assert!(
        job.lines().any(|l| l.trim() == "42") && job.contains("succeeded"),
        "{job}\n{}",
        dashd_log()
    );
    let client = run_line(&lines[4], &env);
    assert!(client.contains("'CPU'"), "{client}\n{}", dashd_log());

    // Ray's Prometheus service discovery, as `ray metrics launch-prometheus`
    // writes it, finds ray-dashd's series and Ray's dashboard process's.
    let python = venv.join("bin/python");
    let gcs = std::fs::read_to_string("/tmp/ray/ray_current_cluster")
        .expect("ray_current_cluster")
        .trim()
        .to_owned();
    let targets = discovery_targets(&python, &gcs, &session);
    let head_ip = gcs
        .rsplit_once(':')
        .map(|(ip, _)| ip.to_owned())
        .expect("GCS ip");
    let ours = format!("{head_ip}:44228");
    assert!(
        targets.contains(&ours),
        "discovery lists {targets:?}, not ray-dashd's {ours}\n{}",
        dashd_log()
    );
    // Scraped on loopback: both listen on all addresses.
    let rays_own = scrape("http://127.0.0.1:44227/metrics").await;
    let rays_pid = series_label(&rays_own, "ray_component_rss_mb{", "pid")
        .unwrap_or_else(|| panic!("Ray's dashboard process serves no memory series:\n{rays_own}"));
    let dashd_pid = started.dashd.as_ref().expect("ray-dashd").id().to_string();
    let wanted = [
        r#"ray_dashboard_api_requests_count_requests_total{method="POST",endpoint="/api/jobs/""#
            .to_owned(),
        r#"Component="dashboard_JobHead""#.to_owned(),
        format!(r#"pid="{dashd_pid}""#),
        format!(r#"pid="{rays_pid}""#),
    ];
    let deadline = Instant::now() + RAY_WAIT;
    let merged = loop {
        let merged = scrape("http://127.0.0.1:44228/metrics").await;
        if wanted.iter().all(|w| merged.contains(w.as_str())) {
            break merged;
        }
        assert!(
            Instant::now() < deadline,
            "{ours} lacks one of {wanted:?}:\n{merged}\n{}",
            dashd_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        merged.starts_with("# HELP") || merged.starts_with("# TYPE"),
        "{merged}"
    );
    assert_eq!(
        merged.matches("# TYPE ray_component_rss_mb ").count(),
        1,
        "a family served twice:\n{merged}"
    );

    // SIGTERM: ray-dashd exits 0.
    let mut dashd = started.dashd.take().expect("ray-dashd");
    crate::support::kill(u64::from(dashd.id()), Signal::SIGTERM);
    let status = wait_bounded(&mut dashd, Duration::from_secs(30));
    assert_eq!(status, Some(0), "ray-dashd on SIGTERM:\n{}", dashd_log());
    // The session folder stays, as Ray leaves it (removed, it would leave
    // `session_latest` dangling, which the next `ray start` fails to
    // replace).
    drop(started);
}

/// `child`'s exit code once it exits within `within` (a signal: -1).
fn wait_bounded(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status.code().unwrap_or(-1));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The targets of Ray's file-based Prometheus discovery for the cluster at
/// `gcs`.
fn discovery_targets(python: &Path, gcs: &str, session: &Path) -> Vec<String> {
    let scratch: PathBuf = session.join("logs");
    let mut discover = Command::new(python);
    discover
        .args([
            "-c",
            "import sys\nfrom ray._private.metrics_agent import PrometheusServiceDiscoveryWriter\n\
             w = PrometheusServiceDiscoveryWriter(sys.argv[1], sys.argv[2])\n\
             print(w.get_file_discovery_content())",
            gcs,
            &scratch.to_string_lossy(),
        ])
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .stdin(Stdio::null());
    let out = run_bounded(discover);
    assert!(out.status.success(), "{}", text(&out));
    let content: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    content[0]["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect()
}

/// The body of a GET of `url` (an error's text instead, to show).
async fn scrape(url: &str) -> String {
    match crate::support::client().get(url).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(e) => format!("GET {url}: {e}"),
    }
}

/// The value of label `label` in the first series of `text` that starts
/// with `series`.
fn series_label(text: &str, series: &str, label: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with(series))?;
    let start = line.find(&format!("{label}=\""))? + label.len() + 2;
    let end = line[start..].find('"')?;
    Some(line[start..start + end].to_owned())
}
