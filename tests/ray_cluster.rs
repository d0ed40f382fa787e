//! A two-node cluster: a head and a second node joining it (`ray start
//! --address`, on this machine with ports and a temp dir of its own), Ray
//! 2.60.0 from `RAY_DASHD_TEST_RAY_PYTHON`. Through ray-dashd: `ray list
//! nodes` shows both, the node view Ray's UI draws lists both, the worker
//! node's log files are listed and one is opened (StateHead asks that
//! node's agent), and a job whose task is pinned to the worker node runs
//! and its logs, the task's print included, follow to the end.

use serde_json::Value;

use crate::support::eventually;
use crate::support::ray::{
    all_ray_modules_up, authed, free_port, hosting, ray_python, text, RayHead, RAY_WAIT,
};

/// A custom resource only the worker node has, to pin a task to it.
const WORKER_RESOURCE: &str = "dashd_worker_node";

async fn get_json(url: &str) -> Option<Value> {
    let response = authed().get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_is_seen_and_used_through_ray_dashd() {
    let python = ray_python();
    let head = RayHead::start_multi_node(&python);
    let resources = format!("--resources={{\"{WORKER_RESOURCE}\": 1}}");
    let worker = RayHead::join(&head, &python, &[&resources]);
    let d = hosting(&head, &python, free_port(), "").start();
    all_ray_modules_up(&d).await;
    let address = d.url("");

    // Both nodes alive, as the state API and the UI's node view see them.
    let nodes = eventually(RAY_WAIT, || async {
        let nodes = get_json(&d.url("/api/v0/nodes?detail=1")).await?;
        let list = nodes["data"]["result"]["result"].as_array()?.clone();
        let alive = list.iter().filter(|n| n["state"] == "ALIVE").count();
        (alive == 2).then_some(list)
    })
    .await
    .unwrap_or_else(|| panic!("two alive nodes never listed\nlog:\n{}", d.log()));
    let worker_id = nodes
        .iter()
        .find(|n| n["is_head_node"] == false)
        .and_then(|n| n["node_id"].as_str())
        .expect("the worker node's id")
        .to_owned();
    let listed = head.cli(&["list", "nodes", "--address", &address]);
    assert!(listed.status.success(), "{}", text(&listed));
    assert_eq!(
        text(&listed).matches("ALIVE").count(),
        2,
        "{}",
        text(&listed)
    );
    let summary = get_json(&d.url("/nodes?view=summary"))
        .await
        .expect("the UI's node summary");
    let drawn = summary["data"]["summary"].as_array().expect("summary list");
    // A polled route of Ray's, shared: the second of two GETs at once joins
    // the first, or is served the answer it left.
    let (a, b) = tokio::join!(
        authed().get(d.url("/nodes?view=summary")).send(),
        authed().get(d.url("/nodes?view=summary")).send()
    );
    let how = |r: &reqwest::Response| {
        r.headers()
            .get("x-dashd-shared")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (a, b) = (a.expect("GET /nodes"), b.expect("GET /nodes"));
    let ways = [how(&a), how(&b)];
    assert!(
        ways.iter().all(Option::is_some)
            && ways
                .iter()
                .any(|w| matches!(w.as_deref(), Some("joined" | "hit" | "stale"))),
        "/nodes?view=summary is not shared: {ways:?}"
    );
    assert_eq!(drawn.len(), 2, "{summary:#}");
    assert!(
        drawn
            .iter()
            .any(|n| n["raylet"]["nodeId"].as_str() == Some(worker_id.as_str())),
        "the worker node is not drawn: {summary:#}"
    );

    // The worker node's log files, listed and opened as the UI's log view
    // does: StateHead reaches the worker node's agent for them.
    let files = get_json(&d.url(&format!("/api/v0/logs?node_id={worker_id}")))
        .await
        .unwrap_or_else(|| panic!("no log listing of the worker node\nlog:\n{}", d.log()));
    assert!(
        files.to_string().contains("raylet.out"),
        "the worker node's raylet.out is not listed: {files:#}"
    );
    let raylet_out = std::fs::read_to_string(worker.session().join("logs/raylet.out"))
        .expect("the worker node's raylet.out");
    let first_line = raylet_out.lines().next().expect("a line").to_owned();
    let opened = authed()
        .get(d.url(&format!(
            "/api/v0/logs/file?node_id={worker_id}&filename=raylet.out&lines=-1"
        )))
        .send()
        .await
        .expect("open the worker's raylet.out");
    assert!(opened.status().is_success(), "{}", opened.status());
    let body = opened.text().await.expect("body");
    assert!(
        body.contains(&first_line),
        "the worker's raylet.out through ray-dashd lacks its first line {first_line:?}"
    );

    // A job whose task must run on the worker node; `ray job submit`
    // follows its logs, where the task's print shows up too.
    let script = format!(
        "import ray\nray.init()\n\
         @ray.remote(resources={{'{WORKER_RESOURCE}': 1}})\n\
         def where():\n    print('task says hello from the worker node', flush=True)\n    \
         return ray.get_runtime_context().get_node_id()\n\
         print('ran on', ray.get(where.remote()), flush=True)\n"
    );
    let submitted = head.cli(&[
        "job",
        "submit",
        "--address",
        &address,
        "--",
        "python",
        "-c",
        &script,
    ]);
    let out = text(&submitted);
    assert!(submitted.status.success(), "{out}\nlog:\n{}", d.log());
    assert!(out.contains(&format!("ran on {worker_id}")), "{out}");
    assert!(
        out.contains("task says hello from the worker node"),
        "{out}"
    );
    drop(worker);
}
