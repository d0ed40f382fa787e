//! The essentials on a Ray release other than the reference one (2.60.0):
//! the Python named by `RAY_DASHD_TEST_OTHER_RAY_PYTHON` (scripts/test gives
//! it the oldest supported release, 2.45.0; `scripts/ray-matrix` any list of
//! releases). On a real head started by that release: every module Ray
//! loads is hosted and healthy, `ray job submit` follows its job's logs to
//! the end (the websocket route) and logs under Ray's own file name,
//! `ray list nodes` answers, and
//! `ray.init("ray://…")` with a `runtime_env` runs a task through the client
//! proxy (its runtime env agent found through the GCS).

use std::path::PathBuf;

use crate::support::ray::{
    all_ray_modules_up, authed, free_port, hosting, on_demand_modules_start_when_asked,
    ray_module_healthy, ray_python, ray_state_answers_as_rays, run_driver, text, RayHead,
};

/// The other release's Python. Missing, the test fails: a skipped run must
/// not pass for one that ran.
fn other_ray_python() -> PathBuf {
    std::env::var_os("RAY_DASHD_TEST_OTHER_RAY_PYTHON")
        .map(PathBuf::from)
        .expect("RAY_DASHD_TEST_OTHER_RAY_PYTHON must name a Python with another Ray release (scripts/test sets it)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ray_release_is_hosted() {
    let python = other_ray_python();
    let head = RayHead::start(&python);
    let client_port = free_port();
    let d = hosting(&head, &python, client_port, "").start();
    all_ray_modules_up(&d).await;
    on_demand_modules_start_when_asked(&d).await;
    let address = d.url("");

    // `ray job submit` waits for the job, tailing its logs over JobHead's
    // websocket route until it ends.
    let submitted = head.cli(&[
        "job",
        "submit",
        "--address",
        &address,
        "--",
        "python",
        "-c",
        "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.5)",
    ]);
    let out = text(&submitted);
    assert!(submitted.status.success(), "{out}\nlog:\n{}", d.log());
    for i in 0..3 {
        assert!(out.contains(&format!("tick {i}")), "{out}");
    }
    assert!(out.contains("succeeded"), "{out}");

    // JobHead logs under Ray's own name for it, rotated by its own handler;
    // its stderr file holds only what it prints outside its logging.
    let logs = head.session().join("logs");
    let job_log = std::fs::read_to_string(logs.join("dashboard_JobHead.log"))
        .expect("dashboard_JobHead.log, Ray's name for JobHead's log");
    assert!(
        job_log.contains("INFO"),
        "JobHead's log holds no records:\n{job_log}"
    );
    let job_err = std::fs::read_to_string(logs.join("dashboard_JobHead.err")).unwrap_or_default();
    assert!(
        !job_err.contains("\tINFO "),
        "JobHead's logging went to its stderr file:\n{job_err}"
    );

    let nodes = head.cli(&["list", "nodes", "--address", &address]);
    assert!(nodes.status.success(), "{}", text(&nodes));
    assert!(text(&nodes).contains("ALIVE"), "{}", text(&nodes));

    // A runtime env makes the proxy ask the head's runtime env agent, which
    // it finds through the GCS's node table.
    ray_module_healthy(&d, &authed(), "ray_client_proxy").await;
    let env_vars = run_driver(
        &head,
        &python,
        &format!("127.0.0.1:{client_port}"),
        "env_vars",
    );
    assert_eq!(env_vars["env_var"], "through-the-proxy", "{env_vars}");

    // The job list from the GCS (the Ray state module) is Ray's: the
    // submitted job, and the client's driver.
    let jobs = ray_state_answers_as_rays(&d).await;
    for kind in ["SUBMISSION", "DRIVER"] {
        assert!(jobs.iter().any(|j| j["type"] == kind), "{kind}: {jobs:?}");
    }
}

/// The release checks of `modules/ray/dashd_ray.py`, run against the
/// installed Ray with its version string changed: a release before 2.45 is
/// refused with one line saying why, one newer than the newest tested runs
/// (its internals pass) with one warning naming it, and the tested range
/// runs without a word.
#[test]
fn ray_releases_are_judged_by_what_they_contain() {
    let python = ray_python();
    let launcher = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("modules/ray");
    let judge = |version: &str| {
        let script = format!(
            "import ray\nray.__version__ = {version:?}\nimport dashd_ray\n\
             try:\n    print('warning:', dashd_ray.RayInternals().warning)\n\
             except dashd_ray.IncompatibleRay as e:\n    print('refused:', e)\n"
        );
        let output = std::process::Command::new(&python)
            .arg("-c")
            .arg(script)
            .env("PYTHONPATH", &launcher)
            .env_remove("RAY_DASHD_RAY_ANY_VERSION")
            .output()
            .expect("python");
        assert!(output.status.success(), "{}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let old = judge("2.44.0");
    assert!(
        old.starts_with("refused:") && old.contains("2.44.0") && old.contains("2.45.0"),
        "{old}"
    );
    assert_eq!(old.lines().count(), 1, "{old}");
    for tested in ["2.45.0", "2.52.1", "2.60.0", "2.60.3"] {
        assert_eq!(judge(tested), "warning: None", "{tested}");
    }
    let newer = judge("2.61.0rc1");
    assert!(
        newer.starts_with("warning: Ray 2.61.0rc1 is newer than 2.60.x"),
        "{newer}"
    );
}
