//! Config layering and `--check-config`: a file is laid over the built-in
//! config, and the effective config printed as TOML loads back unchanged.

use crate::support::{check_config, check_config_text, client, dashd, eventually, WAIT};

/// The effective config of `text` (as file `name`), parsed.
fn effective(name: &str, text: &str) -> toml::Table {
    let out = check_config_text(name, text);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    printed
        .parse()
        .unwrap_or_else(|e| panic!("--check-config printed no TOML ({e}):\n{printed}"))
}

/// The names of the modules of an effective config.
fn module_names(config: &toml::Table) -> Vec<String> {
    config
        .get("modules")
        .and_then(toml::Value::as_array)
        .map(|modules| {
            modules
                .iter()
                .filter_map(|m| m.get("name")?.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A file that sets only `[ray] python` keeps the built-in modules: the
/// logs module runs and the UI's Logs page has its files.
#[tokio::test]
async fn a_file_without_modules_keeps_the_builtin_ones() {
    let config = effective("python.toml", "[ray]\npython = \"/opt/ray/bin/python\"\n");
    assert_eq!(module_names(&config), ["example", "logs"]);
    assert_eq!(
        config["ray"]["python"].as_str(),
        Some("/opt/ray/bin/python")
    );

    // `dashd()` writes only a `[server]` table here: no modules of its own.
    let d = dashd()
        .toml("[ray]\npython = \"/opt/ray/bin/python\"\nmodules = \"off\"\n")
        .start();
    let files = eventually(WAIT, || async {
        let response = client()
            .get(d.url("/api/dashd/logs/files"))
            .send()
            .await
            .ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
    assert!(
        files.is_some(),
        "the logs module never served its files\n{}",
        d.log()
    );
}

/// `[[modules]]` in the file replaces the built-in modules;
/// `builtin_modules = false` drops them; `true` keeps them beside the
/// file's own.
#[test]
fn file_modules_replace_the_builtin_ones_unless_told_otherwise() {
    let mine = "[[modules]]\nname = \"mine\"\ncommand = [\"true\"]\n";
    let config = effective("mine.toml", mine);
    assert_eq!(module_names(&config), ["mine"]);
    let config = effective("none.toml", "builtin_modules = false\n");
    assert!(module_names(&config).is_empty(), "{config:#?}");
    let config = effective("both.toml", &format!("builtin_modules = true\n{mine}"));
    assert_eq!(module_names(&config), ["example", "logs", "mine"]);
}

/// What `--check-config` prints, flags and file included, loads back as a
/// config file to the same effective config.
#[test]
fn check_config_output_loads_back_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("first.toml");
    std::fs::write(
        &path,
        r#"
builtin_modules = true

[server]
allowed_hosts = ["Dash.Example.com"]
shutdown_grace_secs = 2.5

[module_defaults]
failure_threshold = 4

[ray]
launch = "standalone"

[[modules]]
name = "mine"
command = ["prog", "--say", "a \"quoted\" word"]
env = { GREETING = "hello world" }
supervision = { health_timeout_secs = 0.3 }
routes = [{ method = "get", path = "/api/mine/{id}", type = "stream" }]
"#,
    )
    .expect("write config");
    let first = check_config(&[
        "--config",
        path.to_str().expect("utf8"),
        "--port",
        "9123",
        "--ray-python",
        "/opt/ray python/bin/python",
        "--session-dir",
        "/tmp/some session",
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let printed = String::from_utf8_lossy(&first.stdout).into_owned();
    for expected in [
        "port = 9123",
        "python = \"/opt/ray python/bin/python\"",
        "session_dir = \"/tmp/some session\"",
        "failure_threshold = 4",
        "name = \"logs\"",
        "name = \"mine\"",
        "allowed_hosts = [\"dash.example.com\"]",
    ] {
        assert!(printed.contains(expected), "{expected} not in:\n{printed}");
    }
    let again = dir.path().join("again.toml");
    std::fs::write(&again, &printed).expect("write printed config");
    let second = check_config(&["--config", again.to_str().expect("utf8")]);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&second.stdout), printed);
}
