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
    let out = || std::fs::read_to_string(session.join("logs/dashboard_tm.out")).unwrap_or_default();
    let ready = eventually(WAIT, || async {
        out().contains("test-module ready").then_some(())
    });
    assert!(ready.await.is_some(), "{}", out());
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
    d.logged("module failed").await;
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

/// The size Ray's `RAY_ROTATION_MAX_BYTES` is set to in the rotation test.
const ROTATE_AT: u64 = 16 * 1024;
/// The lines the module prints: 100 bytes each, some 12 files' worth.
const PRINTED_LINES: usize = 2000;

/// The numbered lines (`line 000042 …`) in `text`.
fn line_numbers(text: &str) -> Vec<usize> {
    text.lines()
        .filter_map(|l| l.strip_prefix("line ")?.get(..6)?.parse().ok())
        .collect()
}

/// With Ray's `RAY_ROTATION_MAX_BYTES` and `RAY_ROTATION_BACKUP_COUNT`
/// set, a module's `.out` rotates as Ray's files do (`.out.1`, `.out.2`,
/// none beyond the count, none past the size), keeping its newest lines in
/// order and with no gap, while the module runs on.
#[tokio::test]
async fn module_output_rotates_by_size_as_rays_files_do() {
    let d = dashd()
        .module(test_module("tm"))
        .env("RAY_DASHD_LOG", "debug")
        .env("RAY_ROTATION_MAX_BYTES", &ROTATE_AT.to_string())
        .env("RAY_ROTATION_BACKUP_COUNT", "2")
        .start();
    d.healthy("tm", 0).await;
    let http = client();
    for stream in ["out", "err"] {
        let printed = http
            .post(d.url(&format!(
                "/test/print?lines={PRINTED_LINES}&stream={stream}"
            )))
            .send()
            .await
            .expect("print");
        assert_eq!(printed.status(), 200, "{stream}");
    }
    let logs = d.session().join("logs");
    let read = |name: &str| std::fs::read_to_string(logs.join(name)).unwrap_or_default();
    for stream in ["out", "err"] {
        let name = format!("dashboard_tm.{stream}");
        // Everything printed has reached the files when the last line has.
        let last = format!("line {:06}", PRINTED_LINES - 1);
        eventually(WAIT, || async { read(&name).contains(&last).then_some(()) })
            .await
            .unwrap_or_else(|| panic!("{name} never got the last line: {}", read(&name)));
        let files = [name.clone(), format!("{name}.1"), format!("{name}.2")];
        for file in &files {
            let size = std::fs::metadata(logs.join(file))
                .unwrap_or_else(|e| panic!("{file}: {e}"))
                .len();
            assert!(size <= ROTATE_AT, "{file} has {size} bytes");
        }
        assert!(
            !logs.join(format!("{name}.3")).exists(),
            "more backups than RAY_ROTATION_BACKUP_COUNT"
        );
        // Oldest to newest: .2, .1, then the file; consecutive to the end.
        let numbers: Vec<usize> = files
            .iter()
            .rev()
            .flat_map(|f| line_numbers(&read(f)))
            .collect();
        assert_eq!(numbers.last(), Some(&(PRINTED_LINES - 1)), "{name}");
        let first = numbers[0];
        assert!(first > 0, "{name}: nothing was rotated away");
        assert_eq!(
            numbers,
            (first..PRINTED_LINES).collect::<Vec<_>>(),
            "{name}: the kept lines have a gap or are out of order"
        );
    }
    d.healthy("tm", 0).await;
}

/// `ray-dashd.log` rotates as the modules' output does: with a size of
/// 1 KiB, start-up and one restart of a module log more than that.
#[tokio::test]
async fn the_host_log_rotates_by_size() {
    const SMALL: u64 = 1024;
    let d = dashd()
        .module(test_module("tm"))
        .env("RAY_ROTATION_MAX_BYTES", &SMALL.to_string())
        .env("RAY_ROTATION_BACKUP_COUNT", "1")
        .start();
    d.healthy("tm", 0).await;
    let _ = client().post(d.url("/test/crash")).send().await;
    d.healthy("tm", 1).await;
    let logs = d.session().join("logs");
    let size = |name: &str| {
        std::fs::metadata(logs.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .len()
    };
    let rotated = eventually(WAIT, || async {
        logs.join("ray-dashd.log.1").exists().then_some(())
    })
    .await;
    assert!(rotated.is_some(), "ray-dashd.log was never rotated");
    for name in ["ray-dashd.log", "ray-dashd.log.1"] {
        assert!(size(name) <= SMALL, "{name} has {} bytes", size(name));
    }
    assert!(!logs.join("ray-dashd.log.2").exists(), "one backup only");
}
