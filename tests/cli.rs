//! The command line and config errors: one clear line and a non-zero exit.

use std::process::Command;

use crate::support::{check_config, check_config_text};

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
        .args(args)
        .output()
        .expect("run ray-dashd")
}

/// `--help` documents every flag.
#[test]
fn help_documents_flags() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--session-dir",
        "--host",
        "--port",
        "--config",
        "/tmp/ray/session_latest",
        "8265",
        "127.0.0.1",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help:\n{text}");
    }
}

/// An unknown field exits 64 naming the file, the field and the problem.
#[test]
fn bad_config_names_file_field_and_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[[modules]]\nname = \"x\"\ncommand = [\"true\"]\nhealth = 3\n",
    )
    .expect("write");
    let out = run(&[
        "--config",
        path.to_str().expect("utf8"),
        "--session-dir",
        dir.path().to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("modules[0]"), "{err}");
    assert!(err.contains("unknown field `health`"), "{err}");
}

/// A missing config file is named.
#[test]
fn missing_config_file_is_named() {
    let out = run(&["--config", "/nonexistent/dashd.toml"]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/dashd.toml") && err.contains("cannot read"),
        "{err}"
    );
}

/// The same method and path in two modules is refused, naming both.
#[test]
fn duplicate_route_names_both_modules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dup.toml");
    std::fs::write(
        &path,
        r#"
[[modules]]
name = "one"
command = ["true"]
routes = [{ method = "GET", path = "/api/x/{id}", type = "http" }]
[[modules]]
name = "two"
command = ["true"]
routes = [{ method = "GET", path = "/api/x/{other}", type = "stream" }]
"#,
    )
    .expect("write");
    let out = run(&["--config", path.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"one\"") && err.contains("\"two\""), "{err}");
}

/// A session folder so deep that a socket path would not fit is refused,
/// naming the path and the limit.
#[test]
fn too_long_socket_path_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let deep = dir.path().join("d".repeat(100));
    let out = run(&["--session-dir", deep.to_str().expect("utf8"), "--port", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("107") && err.contains("dash_example"), "{err}");
}

/// The built-in default config is valid.
#[test]
fn default_config_checks() {
    let out = check_config(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("example"));
}

/// An unknown flag is a bad command line: exit 64 (not clap's 2), with
/// clap's message naming the flag; `--version` still succeeds.
#[test]
fn unknown_flag_exits_64_naming_it() {
    let out = run(&["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--no-such-flag"), "{err}");
    let out = run(&["--port", "not-a-port"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not-a-port"));
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ray-dashd"));
}

/// A TOML syntax error names the file, the line and the column.
#[test]
fn config_syntax_error_names_file_line_and_column() {
    let out = check_config_text("syntax.toml", "[server]\nport = 80 80\n");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("syntax.toml") && err.contains("line 2, column 11"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// A zero restart backoff (which would restart a failing module in a hot
/// loop) is refused, naming the field.
#[test]
fn config_with_zero_backoff_is_refused() {
    let out = check_config_text("zero.toml", "[module_defaults]\nbackoff_initial_secs = 0\n");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("zero.toml") && err.contains("module_defaults.backoff_initial_secs"),
        "{err}"
    );
}

/// A module route that would answer the host's own health check, by
/// another method or through a parameter, is refused naming the module,
/// the route and the host path.
#[test]
fn config_route_shadowing_a_host_path_is_refused() {
    for (method, path) in [("PUT", "/api/healthz"), ("GET", "/api/{x}")] {
        let text = format!(
            "[[modules]]\nname = \"greedy\"\ncommand = [\"true\"]\nroutes = [{{ method = \"{method}\", path = \"{path}\", type = \"http\" }}]\n"
        );
        let out = check_config_text("shadow.toml", &text);
        assert_eq!(out.status.code(), Some(64));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("\"greedy\""), "{err}");
        assert!(err.contains(&format!("{method} {path}")), "{err}");
        assert!(err.contains("/api/healthz"), "{err}");
    }
}

/// `server.allowed_hosts` and `server.allowed_origins` are checked, shown in
/// their normal form by `--check-config`, and a bad entry exits 64 naming
/// the file, the entry and the problem.
#[test]
fn config_allow_lists_are_checked_and_shown() {
    let out = check_config_text(
        "allow.toml",
        "[server]\nallowed_hosts = [\"Dash.Example.com\"]\nallowed_origins = [\"HTTPS://Dash.Example.com:443\"]\n",
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains("allowed_hosts = ["), "{shown}");
    assert!(shown.contains("\"dash.example.com\""), "{shown}");
    assert!(shown.contains("\"https://dash.example.com\""), "{shown}");
    assert!(!shown.contains("Dash"), "{shown}");
    for (text, field, problem) in [
        (
            "[server]\nallowed_hosts = [\"dash.example.com:8265\"]\n",
            "server.allowed_hosts[0]",
            "every port is admitted",
        ),
        (
            "[server]\nallowed_origins = [\"*\"]\n",
            "server.allowed_origins[0]",
            "list each origin",
        ),
    ] {
        let out = check_config_text("allow.toml", text);
        assert_eq!(out.status.code(), Some(64));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("allow.toml"), "{err}");
        assert!(err.contains(&format!(": {field}: ")), "{err}");
        assert!(err.contains(problem), "{err}");
    }
}
