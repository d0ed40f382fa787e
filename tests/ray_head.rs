//! Against a real Ray head (`ray==2.60.0` from the venv named by
//! `RAY_DASHD_TEST_RAY_PYTHON`; scripts/test makes it): Ray's own dashboard
//! modules run under ray-dashd, and Ray's own command-line tools work
//! through it. The head runs on private ports in a temp dir, with Ray's
//! token authentication on (`RAY_AUTH_MODE=token`, a token of its own), and
//! is stopped by pid (the fixture: [`crate::support::ray`]).

use std::process::Output;
use std::time::Duration;

use nix::sys::signal::Signal;
use ray_dashd_contract::proc;
use serde_json::Value;

use crate::support::ray::{
    all_ray_modules_healthy, all_ray_modules_up, authed, clients, free_port, hosting,
    on_demand_modules_start_when_asked, ray_module_healthy, ray_python, ray_state_answers_as_rays,
    submission_id, submit_six_times_seven, text, token, RayHead, RAY_WAIT,
};
use crate::support::{dashd, eventually, file_with, kill, process_gone, Dashd};

/// `[ray] gcs_gone_secs` of the test: short, so that the end of the test,
/// which stops the head, is not long; long enough that a GCS slowed down by
/// a busy machine is not taken for gone.
const GCS_GONE_SECS: u64 = 6;

/// A runtime env with a secret in it, and the secret.
const SECRET_RUNTIME_ENV: &str = r#"{"env_vars": {"DASHD_SECRET": "s3cret-value"}}"#;
const SECRET_VALUE: &str = "s3cret-value";

/// Whether the Ray of `python` masks runtime-env secrets in what its
/// modules answer a browser (Ray 2.60 does; 2.45 does not).
fn masks_secrets_for_browsers(python: &std::path::Path) -> bool {
    let probe = std::process::Command::new(python)
        .args(["-c", "import ray.dashboard.runtime_env_redaction"])
        .output()
        .expect("run the head's python");
    probe.status.success()
}

/// pid, parent and process group of a process.
struct Stat {
    pid: i32,
    ppid: i32,
    pgrp: i32,
}

/// [`Stat`] of every process.
fn stat_fields() -> Vec<Stat> {
    let Ok(pids) = proc::pids() else {
        return vec![];
    };
    pids.filter_map(|pid| {
        let stat = proc::stat(pid).ok()?;
        Some(Stat {
            pid: i32::try_from(stat.pid).ok()?,
            ppid: i32::try_from(stat.ppid).ok()?,
            pgrp: i32::try_from(stat.pgrp).ok()?,
        })
    })
    .collect()
}

/// On a head started with `--include-dashboard=false` (and Ray's token
/// authentication on), ray-dashd hosts Ray's
/// nine modules (those started on demand dormant until a request for one
/// of their routes starts them); `ray job submit` (whose log tail is the websocket route, and
/// with `--working-dir` the package upload), `ray job logs --follow` of a
/// running job, `ray job list`, `status`, `stop` and `delete`, `ray summary
/// tasks`, `ray list nodes` and `ray logs` (found through the GCS key
/// ray-dashd writes; a file's content is the stream route) work through it,
/// with the token; JobHead runs forked from
/// the zygote, and when its shim is killed its process ends, a new one
/// replaces it, and the jobs submitted before are still listed. The host
/// answers what Ray's parent answers itself, checks the token as Ray does,
/// answers `/api/gcs_healthz` from its own GCS check while ReportHead is
/// frozen, and when the head is stopped, reports the GCS down and exits 3
/// with its modules stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_cli_works_through_ray_dashd() {
    let python = ray_python();
    let head = RayHead::start(&python);
    let mut d = hosting(
        &head,
        &python,
        free_port(),
        &format!("gcs_gone_secs = {GCS_GONE_SECS}\n"),
    )
    .start();
    all_ray_modules_up(&d).await;
    // Those started on demand start when asked (forked from the zygote).
    on_demand_modules_start_when_asked(&d).await;
    // The zygote the host started before its supervisor (it reads Ray's
    // route table from it) is the one the supervisor keeps: incarnation 0,
    // preloaded once.
    let zygote = module(&d, "RayZygote").await;
    assert_eq!(
        (zygote["incarnation"].as_u64(), zygote["restarts"].as_u64()),
        (Some(0), Some(0)),
        "{zygote:#}"
    );
    let zygote_log = file_with(
        &head.session().join("logs/dashboard_RayZygote.err"),
        "zygote: preloaded",
    )
    .await;
    assert_eq!(
        zygote_log.matches("zygote: preloaded").count(),
        1,
        "{zygote_log}"
    );
    // Each module has set glibc's malloc to give memory back, both
    // settings taken (none is in the environment here).
    file_with(
        &head.session().join("logs/dashboard_NodeHead.err"),
        "lean malloc (malloc_trim_threshold, malloc_arena_max; trim every 10s)",
    )
    .await;
    // With Ray's modules comes the Ray Client proxy.
    ray_module_healthy(&d, &authed(), "ray_client_proxy").await;
    // Its servers' ports come from the kernel: `hosting` sets
    // RAY_DASHD_CLIENT_PROXY_PORT_RANGE=auto, which reaches the module.
    let proxy_view = clients(&d).await;
    assert_eq!(proxy_view["server_ports"], "auto", "{proxy_view}");
    let address = d.url("");

    let submitted = submit_six_times_seven(
        &head,
        &d,
        &address,
        &["--runtime-env-json", SECRET_RUNTIME_ENV],
    );
    let out = text(&submitted);
    assert!(out.contains("succeeded"), "{out}");
    let id = submission_id(&submitted);

    // The CLI calls below do not depend on each other, and each spends
    // seconds importing Ray or waiting on a job: they run side by side.
    let work = tempfile::tempdir().expect("working dir");
    std::fs::write(
        work.path().join("greeting.txt"),
        "hello from the working dir",
    )
    .expect("write");
    let work_dir = work.path().display().to_string();
    let raylet_out = std::fs::read_to_string(head.session().join("logs/raylet.out"))
        .expect("the head's raylet.out");
    let last_line = raylet_out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("raylet.out has a line")
        .to_owned();
    let (uploaded, followed, summary, nodes, logs, content, status) = std::thread::scope(|s| {
        let cli = |args: Vec<&'static str>, owned: Vec<String>| {
            let head = &head;
            s.spawn(move || {
                let mut all: Vec<&str> = args;
                all.extend(owned.iter().map(String::as_str));
                head.cli(&all)
            })
        };
        // A working_dir is uploaded through the package routes before the
        // job runs.
        let uploaded = cli(
            vec!["job", "submit"],
            vec![
                "--address".into(),
                address.clone(),
                "--working-dir".into(),
                work_dir.clone(),
                "--".into(),
                "python".into(),
                "-c".into(),
                "print(open('greeting.txt').read())".into(),
            ],
        );
        // `ray job logs --follow` tails a running job over the websocket
        // route and ends when the job does.
        let followed = s.spawn(|| {
            let running = head.submit_no_wait(
                &address,
                "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(1)",
            );
            head.cli(&["job", "logs", "--address", &address, "--follow", &running])
        });
        let summary = cli(vec!["summary", "tasks", "--address"], vec![address.clone()]);
        let nodes = cli(vec!["list", "nodes", "--address"], vec![address.clone()]);
        // `ray logs` finds the dashboard only through the GCS key; a file's
        // content comes through the stream route (`/api/v0/logs/file`).
        let logs = cli(vec!["logs", "cluster", "--address"], vec![head.gcs.clone()]);
        let content = cli(
            vec!["logs", "cluster", "raylet.out", "--address"],
            vec![head.gcs.clone()],
        );
        let status = cli(
            vec!["job", "status", "--address"],
            vec![address.clone(), id.clone()],
        );
        let join = |h: std::thread::ScopedJoinHandle<'_, Output>| h.join().expect("CLI thread");
        (
            join(uploaded),
            join(followed),
            join(summary),
            join(nodes),
            join(logs),
            join(content),
            join(status),
        )
    });
    assert!(uploaded.status.success(), "{}", text(&uploaded));
    assert!(
        text(&uploaded).contains("hello from the working dir"),
        "{}",
        text(&uploaded)
    );
    assert!(followed.status.success(), "{}", text(&followed));
    for i in 0..4 {
        assert!(
            text(&followed).contains(&format!("tick {i}")),
            "{}",
            text(&followed)
        );
    }
    assert!(summary.status.success(), "{}", text(&summary));
    assert!(
        text(&summary).contains("Tasks Summary"),
        "{}",
        text(&summary)
    );
    assert!(nodes.status.success(), "{}", text(&nodes));
    assert!(text(&nodes).contains("ALIVE"), "{}", text(&nodes));
    assert!(logs.status.success(), "{}\nlog:\n{}", text(&logs), d.log());
    assert!(text(&logs).contains("raylet.out"), "{}", text(&logs));
    assert!(content.status.success(), "{}", text(&content));
    assert!(
        text(&content).contains(&last_line),
        "{last_line:?} not in:\n{}",
        text(&content)
    );
    // `ray job status`, `stop` and `delete`.
    assert!(status.status.success(), "{}", text(&status));
    assert!(
        text(&status).contains(&format!("Job '{id}' succeeded")),
        "{}",
        text(&status)
    );
    let long = head.submit_no_wait(&address, "import time; time.sleep(120)");
    let stopped = head.cli(&["job", "stop", "--address", &address, &long]);
    assert!(stopped.status.success(), "{}", text(&stopped));
    let is_stopped = eventually(RAY_WAIT, || async {
        let status = head.cli(&["job", "status", "--address", &address, &long]);
        text(&status)
            .contains(&format!("Job '{long}' was stopped"))
            .then_some(())
    })
    .await;
    assert!(is_stopped.is_some(), "job {long} never STOPPED");
    // Ray's JobHead keeps watching a stopped job's supervisor for up to a
    // second; if the job is deleted meanwhile, the watcher writes a fresh
    // FAILED record for it ("Entrypoint not found."). Every delete must
    // succeed, and the job must be gone once one has outlived the watcher.
    let gone = eventually(RAY_WAIT, || async {
        let deleted = head.cli(&["job", "delete", "--address", &address, &long]);
        assert!(deleted.status.success(), "{}", text(&deleted));
        let listed = head.cli(&["job", "list", "--address", &address]);
        assert!(listed.status.success(), "{}", text(&listed));
        (!text(&listed).contains(&long)).then(|| text(&listed))
    })
    .await
    .unwrap_or_else(|| panic!("job {long} still listed after deletes"));
    assert!(gone.contains(&id), "{id} kept: {gone}");

    // What Ray's dashboard parent serves itself: its web UI at `/` (ours
    // moves to `/dashd/`), the UI's files, the time zone, the auth mode.
    // The UI's page and files are public; the rest needs the token.
    let public = crate::support::client();
    let client = authed();
    let index = public.get(d.url("/")).send().await.expect("index");
    assert_eq!(index.status(), 200);
    let index = index.text().await.expect("index body");
    assert!(
        index.contains("<title>Ray Dashboard</title>"),
        "{index}\nlog:\n{}",
        d.log()
    );
    let script = index
        .split("src=\"./")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a script in Ray's index.html");
    let asset = public
        .get(d.url(&format!("/{script}")))
        .send()
        .await
        .expect("asset");
    assert_eq!(asset.status(), 200, "{script}");
    assert!(asset.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .contains("javascript"));
    let ours = client.get(d.url("/dashd/")).send().await.expect("our UI");
    assert!(ours
        .text()
        .await
        .expect("body")
        .contains("<title>ray-dashd</title>"));
    let timezone: Value = client
        .get(d.url("/timezone"))
        .send()
        .await
        .expect("tz")
        .json()
        .await
        .expect("json");
    assert!(
        timezone["offset"].is_string() && timezone["value"].is_string(),
        "{timezone}"
    );
    let auth: Value = public
        .get(d.url("/api/authentication_mode"))
        .send()
        .await
        .expect("auth")
        .json()
        .await
        .expect("json");
    assert_eq!(auth["authentication_mode"], "token");
    // Writes that look like a browser's are refused, as Ray refuses them.
    let browser_post = client
        .post(d.url("/api/jobs/"))
        .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64)")
        .body("{}")
        .send()
        .await
        .expect("browser post");
    assert_eq!(browser_post.status(), 405);
    // The job list, for the CLI and then for a browser: Ray masks the
    // runtime env's secrets for browsers (where its release does), and a
    // browser is not served the answer the host keeps for the CLI.
    let cli_jobs = client
        .get(d.url("/api/jobs/"))
        .send()
        .await
        .expect("cli get")
        .text()
        .await
        .expect("body");
    assert!(cli_jobs.contains(SECRET_VALUE), "{cli_jobs}");
    let browser_get = client
        .get(d.url("/api/jobs/"))
        .header("origin", "http://elsewhere.example")
        .send()
        .await
        .expect("browser get");
    assert_eq!(browser_get.status(), 200);
    let browser_jobs = browser_get.text().await.expect("body");
    assert!(browser_jobs.contains("DASHD_SECRET"), "{browser_jobs}");
    assert_eq!(
        browser_jobs.contains(SECRET_VALUE),
        !masks_secrets_for_browsers(&python),
        "{browser_jobs}"
    );
    // Those lists came from the GCS (the Ray state module), the same as
    // Ray's JobHead lists them.
    let jobs = ray_state_answers_as_rays(&d).await;
    assert!(
        jobs.iter().filter(|j| j["type"] == "SUBMISSION").count() >= 2,
        "{jobs:?}"
    );

    // The token, as Ray's parent checks it: module routes, the host's own
    // and Ray's parent routes alike; 401 without one, 403 with a wrong one.
    for path in ["/api/version", "/api/modules", "/cluster_id"] {
        let bare = public.get(d.url(path)).send().await.expect("bare");
        assert_eq!(bare.status(), 401, "{path}");
        assert_eq!(
            bare.text().await.expect("body"),
            "Unauthorized: Missing authentication token"
        );
        let wrong = public
            .get(d.url(path))
            .header("authorization", "Bearer not-the-token")
            .send()
            .await
            .expect("wrong");
        assert_eq!(wrong.status(), 403, "{path}");
    }
    // The UI's login: a valid token becomes the cookie, and the cookie passes.
    let login = public
        .post(d.url("/api/authenticate"))
        .header("authorization", format!("Bearer {}", token()))
        .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64)")
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        cookie.starts_with(&format!("ray-authentication-token={};", token()))
            && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let version: Value = public
        .get(d.url("/api/version"))
        .header("cookie", format!("ray-authentication-token={}", token()))
        .send()
        .await
        .expect("version")
        .json()
        .await
        .expect("json");
    assert_eq!(version["ray_version"], "2.60.0");

    // Ray's parent routes: usage stats as Ray's helpers see them in
    // ray-dashd's environment, the cluster id from the GCS.
    let usage: Value = client
        .get(d.url("/usage_stats_enabled"))
        .send()
        .await
        .expect("usage")
        .json()
        .await
        .expect("json");
    assert_eq!(usage["result"], true);
    assert_eq!(usage["data"]["usageStatsEnabled"], false, "{usage}");
    let cluster: Value = client
        .get(d.url("/cluster_id"))
        .send()
        .await
        .expect("cluster id")
        .json()
        .await
        .expect("json");
    let cluster_id = cluster["data"]["clusterId"].as_str().unwrap_or_default();
    assert!(
        cluster_id.len() == 56 && cluster_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{cluster}"
    );

    // `/api/gcs_healthz` is the host's (ReportHead no longer claims it) and
    // answers from the cached check even while ReportHead is frozen
    // (ray#63574: a blocked module must not fail the head's liveness probe).
    let report_head = module(&d, "ReportHead").await;
    assert!(
        !report_head["routes"]
            .as_array()
            .expect("routes")
            .iter()
            .any(|r| r["path"] == "/api/gcs_healthz"),
        "{report_head}"
    );
    let report_pid = report_head["pid"].as_u64().expect("pid");
    kill(report_pid, Signal::SIGSTOP);
    let health = public
        .get(d.url("/api/gcs_healthz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    kill(report_pid, Signal::SIGCONT);
    let health = health.expect("gcs_healthz within 2 s");
    assert_eq!(health.status(), 200);
    assert_eq!(
        health.headers()["content-type"],
        "application/text; charset=utf-8"
    );
    assert_eq!(health.text().await.expect("body"), "success");

    // Forked from the zygote (the default launch): the module's process
    // is a child of RayZygote in the process group of JobHead's shim, and
    // killing the shim ends it.
    let zygote = module(&d, "RayZygote").await["pid"]
        .as_u64()
        .expect("zygote pid") as i32;
    let job_head = module(&d, "JobHead").await;
    let shim = job_head["pid"].as_u64().expect("pid");
    let child = stat_fields()
        .into_iter()
        .find(|s| s.pgrp == shim as i32 && s.pid != shim as i32 && s.ppid == zygote)
        .unwrap_or_else(|| {
            panic!(
                "no child of the zygote in JobHead's group\nlog:\n{}",
                d.log()
            )
        })
        .pid;
    kill(shim, Signal::SIGKILL);
    let gone = eventually(RAY_WAIT, || async {
        process_gone(child as u32).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "JobHead's forked process {child} outlived its shim"
    );
    wait_healthy(&d, "JobHead", 1).await;
    let listed = head.cli(&["job", "list", "--address", &address]);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(text(&listed).contains(&id), "{id} not in {}", text(&listed));

    // The head stops (as with `ray stop`): the GCS is reported down at once,
    // and after `gcs_gone_secs` ray-dashd stops its modules and exits 3.
    let pids: Vec<u64> = all_ray_modules_healthy(&d)
        .await
        .iter()
        .filter_map(|m| m["pid"].as_u64())
        .collect();
    let mut head = head;
    let stopping = tokio::task::spawn_blocking(move || {
        head.stop();
        head
    });
    let down = eventually(RAY_WAIT, || async {
        let response = public.get(d.url("/api/gcs_healthz")).send().await.ok()?;
        if response.status() != 503 {
            return None;
        }
        response.text().await.ok()
    })
    .await
    .unwrap_or_else(|| panic!("GCS never reported down; log:\n{}", d.log()));
    assert!(down.starts_with("503: Health check failed: "), "{down}");
    let exit = d.wait_exit(Duration::from_secs(GCS_GONE_SECS) + RAY_WAIT);
    assert_eq!(exit.code(), Some(3), "{exit:?}\nlog:\n{}", d.log());
    assert!(d.log().contains("the Ray head is gone"), "{}", d.log());
    for pid in pids {
        let gone = eventually(RAY_WAIT, || async {
            process_gone(pid as u32).then_some(())
        })
        .await;
        assert!(gone.is_some(), "module process {pid} outlived ray-dashd");
    }
    drop(stopping.await.expect("head stopped"));
}

/// `GET /api/modules/<name>`, with the token.
async fn module(d: &Dashd, name: &str) -> Value {
    authed()
        .get(d.url(&format!("/api/modules/{name}")))
        .send()
        .await
        .expect("GET /api/modules/<name>")
        .json()
        .await
        .expect("module json")
}

/// On a real head with Ray's own client proxier (as `ray start --head
/// --include-dashboard=false` leaves it), ray-dashd with no Python named
/// finds the head's (the venv's, from the dashboard agent's command; not
/// the venv's base interpreter that `/proc/<pid>/exe` names) and says so
/// in one INFO line; and its client proxy, given Ray's proxier's port,
/// waits, naming Ray's proxier (pid and `--mode=proxy`) and the ways out,
/// without being restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heads_python_is_found_and_rays_proxier_named() {
    let python = ray_python();
    let head = RayHead::start(&python);
    let ray_port = head.ray_client_port.expect("a head has a client port");
    let d = dashd()
        .session_dir(&head.session())
        .toml(&format!(
            "[ray]\nmodules = \"on\"\ngcs_gone_secs = {GCS_GONE_SECS}\n"
        ))
        .arg("--ray-client-port")
        .arg(&ray_port.to_string())
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", &token())
        .start();
    let log = d.log();
    let line = log
        .lines()
        .find(|line| line.contains("the Python for Ray's modules"))
        .unwrap_or_else(|| panic!("no line names the Python:\n{log}"));
    let venv_bin = python.parent().expect("venv bin").display().to_string();
    assert!(
        line.contains(" INFO ")
            && line.contains(&format!("python={venv_bin}/python"))
            && line.contains("source=the dashboard agent's Python, from the raylet (pid "),
        "{line}"
    );
    let waiting = eventually(RAY_WAIT, || async {
        let m = module(&d, "ray_client_proxy").await;
        (m["state"] == "waiting").then_some(m)
    })
    .await;
    let Some(waiting) = waiting else {
        panic!("the client proxy is not waiting; log:\n{}", d.log());
    };
    let reason = waiting["reason"].as_str().unwrap_or_default();
    for expected in [
        format!(":{ray_port} is taken by pid "),
        "-m ray.util.client.server".to_owned(),
        "--mode=proxy".to_owned(),
        "ray start --ray-client-server-port=<another port>".to_owned(),
        "--ray-client-port".to_owned(),
    ] {
        assert!(reason.contains(&expected), "{expected} not in {reason}");
    }
    assert_eq!(waiting["restarts"], 0, "{waiting}");
    let said = d
        .log()
        .lines()
        .filter(|line| line.contains("module waiting"))
        .count();
    assert_eq!(said, 1, "{}", d.log());
}

/// Waits until module `name` is healthy with at least `incarnation`.
async fn wait_healthy(d: &Dashd, name: &str, incarnation: u64) {
    let healthy = eventually(RAY_WAIT, || async {
        let m = module(d, name).await;
        (m["state"] == "healthy" && m["incarnation"].as_u64() >= Some(incarnation)).then_some(())
    })
    .await;
    assert!(
        healthy.is_some(),
        "{name} not healthy at incarnation {incarnation}; log:\n{}",
        d.log()
    );
}
