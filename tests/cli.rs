//! The command line and config errors: one clear line and a non-zero exit.

use std::process::Command;

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
    let out = run(&["--check-config"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("example"));
}
