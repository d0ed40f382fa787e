//! Logging: a stalled stderr costs log lines, never serving; log files that
//! another user replaced by links are refused, and nothing goes through them.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{client, dashd, eventually, kill, test_module, WAIT};

/// Requests sent while stderr is stalled. At debug level each logs two
/// lines of about 700 bytes (its padded URI is in the request span): about
/// 4 MiB in all, some 65 times what a pipe holds, and more lines than the
/// host queues for stderr, so some must be dropped.
const STALLED_REQUESTS: usize = 3000;
/// Padding of each request's URI.
const PAD: usize = 512;
/// How long one request may take while stderr is stalled: generous for a
/// loaded machine; a host blocked on its stderr never answers.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// Every this many requests, one goes to the module instead of the host.
const PROXIED_EVERY: usize = 100;

/// The `dropped=N` of the first notice of stderr's dropped lines in `log`.
fn stderr_dropped(log: &str) -> Option<u64> {
    let line = log
        .lines()
        .find(|l| l.contains("dropped log lines") && l.contains("writer=\"stderr\""))?;
    let rest = &line[line.find("dropped=")? + "dropped=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// With stderr on a pipe nobody reads, the host keeps answering its own
/// routes and the module's while it logs many times what the pipe holds.
/// `ray-dashd.log` says that stderr drops lines; once the pipe is read
/// again, stderr says so too. A SIGTERM then still gets the last lines out.
#[tokio::test]
async fn a_stalled_stderr_costs_log_lines_not_serving() {
    let mut d = dashd()
        .module(test_module("tm"))
        .env("RAY_DASHD_LOG", "debug")
        .stall_stderr()
        .start();
    d.healthy("tm", 0).await;
    let http = client();
    let health = d.url(&format!("/api/healthz?pad={}", "x".repeat(PAD)));
    let proxied = d.url("/test/echo");
    for i in 0..STALLED_REQUESTS {
        let url = if i % PROXIED_EVERY == 0 {
            &proxied
        } else {
            &health
        };
        let response = tokio::time::timeout(ANSWER_WITHIN, http.get(url).send())
            .await
            .unwrap_or_else(|_| {
                panic!("request {i} ({url:.60}) not answered within {ANSWER_WITHIN:?}: is the host blocked writing its stderr?")
            })
            .expect("request");
        assert_eq!(response.status(), 200, "request {i} ({url:.60})");
    }

    let log_file = d.session().join("logs/ray-dashd.log");
    let in_file = eventually(WAIT, || async {
        stderr_dropped(&std::fs::read_to_string(&log_file).ok()?)
    })
    .await;
    assert!(
        in_file.is_some_and(|n| n > 0),
        "ray-dashd.log does not report stderr's dropped lines"
    );

    d.resume_stderr();
    let on_stderr = eventually(WAIT, || async { stderr_dropped(&d.log()) }).await;
    assert!(
        on_stderr.is_some_and(|n| n > 0),
        "stderr does not report its dropped lines; it has:\n{:.2000}",
        d.log()
    );

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(WAIT).code(), Some(0));
    let last = eventually(WAIT, || async {
        d.log().contains("modules stopped").then_some(())
    })
    .await;
    assert!(
        last.is_some(),
        "the exit's last line is lost:\n{:.2000}",
        d.log()
    );
}

/// A session folder whose `logs/<name>` is a link to `outside`, which holds
/// a line that must never show up anywhere.
fn session_with_linked_log(tmp: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let session = tmp.join("s");
    std::fs::create_dir_all(session.join("logs")).expect("mkdir");
    let outside = tmp.join("outside.txt");
    std::fs::write(&outside, "SECRET of the host's user\n").expect("write");
    std::os::unix::fs::symlink(&outside, session.join("logs").join(name)).expect("link");
    (session, outside)
}

/// `logs/dashboard_<name>.err` is a link another user put there: the
/// module still starts and becomes healthy, its stderr goes nowhere, the
/// file the link names is unchanged, and the refusal is logged with the
/// path. After a crash, the failure report does not quote that file either.
#[tokio::test]
async fn a_linked_module_log_is_refused_and_the_module_still_runs() {
    let tmp = tempfile::Builder::new()
        .prefix("rd")
        .tempdir()
        .expect("tempdir");
    let (session, outside) = session_with_linked_log(tmp.path(), "dashboard_tm.err");
    let d = dashd()
        .module(test_module("tm"))
        .session_dir(&session)
        .start();
    let report = d.healthy("tm", 0).await;
    // The module wrote its stderr line before it answered.
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "SECRET of the host's user\n"
    );
    let out = std::fs::read_to_string(session.join("logs/dashboard_tm.out")).expect("out log");
    assert!(out.contains("test-module ready"), "{out}");
    let refused = eventually(WAIT, || async {
        let log = d.log();
        log.lines()
            .find(|l| {
                l.contains("module log file refused")
                    && l.contains("dashboard_tm.err")
                    && l.contains("symbolic link")
            })
            .map(str::to_owned)
    })
    .await;
    assert!(refused.is_some(), "no refusal logged:\n{}", d.log());

    kill(report["pid"].as_u64().expect("pid"), Signal::SIGKILL);
    d.healthy("tm", 1).await;
    let failed = eventually(WAIT, || async {
        d.log().contains("module failed").then_some(())
    })
    .await;
    assert!(failed.is_some(), "no failure report:\n{}", d.log());
    let host_log = std::fs::read_to_string(session.join("logs/ray-dashd.log")).expect("host log");
    let modules = client()
        .get(d.url("/api/modules"))
        .send()
        .await
        .expect("modules")
        .text()
        .await
        .expect("body");
    for (what, text) in [
        ("stderr", d.log()),
        ("ray-dashd.log", host_log),
        ("/api/modules", modules),
    ] {
        assert!(
            !text.contains("SECRET"),
            "{what} quotes the linked file:\n{text}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "SECRET of the host's user\n"
    );
}

/// `logs/ray-dashd.log` is a link: the host does not write through it,
/// logs to stderr only and says why there, and serves as usual.
#[tokio::test]
async fn a_linked_dashboard_log_is_refused() {
    let tmp = tempfile::Builder::new()
        .prefix("rd")
        .tempdir()
        .expect("tempdir");
    let (session, outside) = session_with_linked_log(tmp.path(), "ray-dashd.log");
    let d = dashd()
        .module(test_module("tm"))
        .session_dir(&session)
        .start();
    d.healthy("tm", 0).await;
    let log = d.log();
    let warning = log
        .lines()
        .find(|l| l.contains("not writing ray-dashd.log"))
        .unwrap_or_else(|| panic!("no warning about ray-dashd.log:\n{log}"));
    assert!(
        warning.contains("WARN")
            && warning.contains("logs/ray-dashd.log")
            && warning.contains("symbolic link"),
        "{warning}"
    );
    assert!(log.contains("ray-dashd listening"), "{log}");
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "SECRET of the host's user\n"
    );
}
