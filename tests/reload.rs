//! Config reload without a restart: SIGHUP and `POST /api/reload` read the
//! config again; added modules start, removed ones stop once their requests
//! in flight are done, changed ones start again, unchanged ones (and their
//! open connections) are untouched, and a bad config changes nothing.

use futures_util::{SinkExt, StreamExt};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::support::{
    client, dashd, eventually, process_gone, test_module, Dashd, ModuleDef, WAIT,
};

/// Module `a`: the echo and websocket routes of the test module.
fn module_a() -> ModuleDef {
    test_module("a").routes(&[
        ("GET", "/test/echo", "http"),
        ("GET", "/test/ws/echo", "websocket"),
    ])
}

/// Module `b`: the slow and info routes of the test module.
fn module_b() -> ModuleDef {
    test_module("b").routes(&[("GET", "/test/slow", "http"), ("GET", "/test/info", "http")])
}

/// Writes the config of `modules` where `d` reads its config.
fn write_config(d: &Dashd, modules: Vec<ModuleDef>) {
    let builder = modules.into_iter().fold(dashd(), |b, m| b.module(m));
    std::fs::write(d.config_path(), builder.config_text()).expect("write the config");
}

/// `POST /api/reload`: its status and JSON body.
async fn reload(d: &Dashd) -> (u16, Value) {
    let response = client()
        .post(d.url("/api/reload"))
        .send()
        .await
        .expect("POST /api/reload");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

fn names(report: &Value, key: &str) -> Vec<String> {
    report[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {report}"))
        .iter()
        .map(|v| v.as_str().expect("a name").to_owned())
        .collect()
}

/// What the module serving `/test/info` says of itself.
async fn info(d: &Dashd) -> Value {
    client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("info json")
}

fn pid(report: &Value) -> u64 {
    report["pid"].as_u64().expect("a pid")
}

/// A module added to the config starts on reload, and an unchanged one
/// keeps its process and an open websocket, which still echoes after.
#[tokio::test]
async fn a_reload_starts_added_modules_and_leaves_the_others_alone() {
    let d = dashd().module(module_a()).start();
    let a = d.healthy("a", 0).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("websocket to a");
    let no_b = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info");
    assert_eq!(no_b.status(), 404);

    write_config(&d, vec![module_a(), module_b()]);
    let (status, report) = reload(&d).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(names(&report, "added"), ["b"], "{report}");
    assert_eq!(names(&report, "unchanged"), ["a"], "{report}");
    assert!(names(&report, "removed").is_empty(), "{report}");
    d.healthy("b", 0).await;
    let info = info(&d).await;
    assert_eq!(info["module"], "b", "{info}");

    assert_eq!(pid(&d.module("a").await), pid(&a), "a was restarted");
    ws.send(Message::text("still there")).await.expect("send");
    let echoed = tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("an echo in time")
        .expect("an open websocket")
        .expect("a message");
    assert_eq!(echoed, Message::text("still there"));
}

/// A module removed from the config stops on SIGHUP: its routes answer 404
/// at once, a request it was serving still completes, then its process
/// and socket are gone.
#[tokio::test]
async fn sighup_stops_removed_modules_after_their_requests() {
    let d = dashd().module(module_a()).module(module_b()).start();
    d.healthy("a", 0).await;
    let b = d.healthy("b", 0).await;
    let slow = tokio::spawn({
        let url = d.url("/test/slow?ms=1500");
        async move {
            let response = client().get(url).send().await.expect("slow answer");
            (
                response.status().as_u16(),
                response.text().await.unwrap_or_default(),
            )
        }
    });
    // In flight: a connection of b's is in use.
    let in_use = eventually(WAIT, || async {
        let c = &d.module("b").await["connections"];
        (c["open"].as_u64() > c["idle"].as_u64()).then_some(())
    })
    .await;
    assert!(in_use.is_some(), "the slow request never reached b");

    write_config(&d, vec![module_a()]);
    d.signal(Signal::SIGHUP);
    let gone = eventually(WAIT, || async {
        let status = client()
            .get(d.url("/test/info"))
            .send()
            .await
            .expect("info")
            .status();
        (status == 404).then_some(())
    })
    .await;
    assert!(gone.is_some(), "b's route still served:\n{}", d.log());
    let (status, body) = tokio::time::timeout(WAIT, slow)
        .await
        .expect("the slow request ended")
        .expect("join");
    assert_eq!((status, body.as_str()), (200, "slow done"));
    let stopped = eventually(WAIT, || async {
        process_gone(pid(&b) as u32).then_some(())
    })
    .await;
    assert!(stopped.is_some(), "b's process still runs");
    let socket = d.socket_path("b");
    let removed = eventually(WAIT, || async { (!socket.exists()).then_some(()) }).await;
    assert!(removed.is_some(), "b's socket is still there");
    let modules: Value = client()
        .get(d.url("/api/modules"))
        .send()
        .await
        .expect("modules")
        .json()
        .await
        .expect("json");
    let listed: Vec<&str> = modules
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| m["name"].as_str().expect("name"))
        .collect();
    assert_eq!(listed, ["a"]);
    d.logged("config reloaded").await;
}

/// A module whose settings changed is started again with them, in a new
/// process; the report says it changed.
#[tokio::test]
async fn a_changed_module_starts_again_with_its_new_settings() {
    let d = dashd().module(module_a()).module(module_b()).start();
    d.healthy("a", 0).await;
    let b = d.healthy("b", 0).await;
    write_config(
        &d,
        vec![module_a(), module_b().env("RAY_DASHD_TEST_SETTING", "new")],
    );
    let (status, report) = reload(&d).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(names(&report, "changed"), ["b"], "{report}");
    assert_eq!(names(&report, "unchanged"), ["a"], "{report}");
    let restarted = eventually(WAIT, || async {
        let now = d.module("b").await;
        (now["state"] == "healthy" && now["pid"] != b["pid"]).then_some(now)
    })
    .await;
    assert!(restarted.is_some(), "b not restarted:\n{}", d.log());
    let info = info(&d).await;
    assert_eq!(info["env"]["RAY_DASHD_TEST_SETTING"], "new", "{info}");
}

/// A config that fails validation is refused whole: 400 naming the file
/// and the problem, and every module runs on as it was.
#[tokio::test]
async fn a_bad_config_is_refused_and_changes_nothing() {
    let d = dashd().module(module_a()).start();
    let a = d.healthy("a", 0).await;
    let path = d.config_path();
    let good = std::fs::read_to_string(&path).expect("config");
    std::fs::write(
        &path,
        format!("{good}\n[[modules]]\nname = \"bad name\"\ncommand = [\"x\"]\n"),
    )
    .expect("write");
    let (status, answer) = reload(&d).await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["message"].as_str().expect("a message");
    assert!(
        message.contains(&path.display().to_string()) && message.contains("modules[1].name"),
        "{message}"
    );
    // SIGHUP with the same file: logged, nothing changes either.
    d.signal(Signal::SIGHUP);
    d.logged("reload refused").await;
    let now = d.healthy("a", 0).await;
    assert_eq!(pid(&now), pid(&a));
    assert_eq!(now["restarts"], 0);
}

/// A page of another origin cannot make the host reload.
#[tokio::test]
async fn a_reload_from_another_origin_is_refused() {
    let d = dashd().module(module_a()).start();
    d.healthy("a", 0).await;
    let refused = client()
        .post(d.url("/api/reload"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 403);
    let allowed = client()
        .post(d.url("/api/reload"))
        .header("origin", format!("http://{}", d.addr()))
        .send()
        .await
        .expect("answer");
    assert_eq!(allowed.status(), 200);
}

/// A module removed and added back while its old process is still
/// finishing a request: the new one starts only once the old one has
/// stopped (they share a socket path), and then serves.
#[tokio::test]
async fn a_module_added_back_while_stopping_waits_for_its_old_self() {
    let d = dashd().module(module_a()).module(module_b()).start();
    d.healthy("a", 0).await;
    let old = d.healthy("b", 0).await;
    let slow = tokio::spawn({
        let url = d.url("/test/slow?ms=1000");
        async move {
            client()
                .get(url)
                .send()
                .await
                .expect("slow")
                .status()
                .as_u16()
        }
    });
    let in_use = eventually(WAIT, || async {
        let c = &d.module("b").await["connections"];
        (c["open"].as_u64() > c["idle"].as_u64()).then_some(())
    })
    .await;
    assert!(in_use.is_some(), "the slow request never reached b");
    write_config(&d, vec![module_a()]);
    assert_eq!(names(&reload(&d).await.1, "removed"), ["b"]);
    write_config(&d, vec![module_a(), module_b()]);
    assert_eq!(names(&reload(&d).await.1, "added"), ["b"]);
    assert_eq!(slow.await.expect("join"), 200);
    let new = eventually(WAIT, || async {
        let b = d.module("b").await;
        (b["state"] == "healthy" && b["pid"] != old["pid"]).then_some(b)
    })
    .await;
    assert!(new.is_some(), "b did not come back:\n{}", d.log());
    // Once the old b is gone (and has cleaned up after itself), the new b
    // still has its socket and serves.
    let gone = eventually(WAIT, || async {
        process_gone(pid(&old) as u32).then_some(())
    });
    assert!(gone.await.is_some(), "the old b still runs");
    let info = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info");
    assert_eq!(info.status(), 200);
    assert!(d.socket_path("b").exists());
}
