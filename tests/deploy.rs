//! The deployment examples in `docs/deploy/` work as written: the systemd
//! units' and the KubeRay head's command lines are run against this
//! `ray-dashd` (`--check-config` on the config they use) and Ray's own CLI
//! (`ray start --help` knows every flag they give it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use yaml_rust2::{Yaml, YamlLoader};

use crate::ray_head::ray_python;

/// Where the examples are.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/deploy")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The config path the examples install their config at.
const INSTALLED_CONFIG: &str = "/etc/ray-dashd/ray-dashd.toml";

/// Runs this `ray-dashd` with `args` (a command line of an example, its
/// program left out) and `--check-config`, the installed config replaced by
/// `config`; its printed config.
fn check_config(args: &[String], config: &Path) -> String {
    let args: Vec<String> = args
        .iter()
        .map(|a| match a.as_str() {
            INSTALLED_CONFIG => config.display().to_string(),
            _ => a.clone(),
        })
        .collect();
    assert!(
        args.iter().any(|a| a == &config.display().to_string()),
        "the command line names no {INSTALLED_CONFIG}: {args:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
        .args(&args)
        .arg("--check-config")
        .output()
        .expect("run ray-dashd --check-config");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ray-dashd {args:?} --check-config: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `ray start --help`, from the venv with Ray.
fn ray_start_help() -> String {
    let ray = ray_python().with_file_name("ray");
    let out: Output = Command::new(&ray)
        .args(["start", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", ray.display()));
    assert!(out.status.success(), "ray start --help: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that `ray start` knows flag `--name`.
fn assert_ray_start_flag(help: &str, name: &str) {
    let flag = format!("--{name}");
    assert!(
        help.split(|c: char| c.is_whitespace() || c == ',' || c == '=')
            .any(|word| word == flag),
        "`ray start` has no {flag}"
    );
}

/// The words of a unit's `ExecStart=` line.
fn exec_start(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart= line");
    line.split_whitespace().map(str::to_owned).collect()
}

/// The systemd units: ray-dashd's command line loads the example config
/// (which hosts Ray's modules or fails, for `Restart=always` to retry), and
/// the head's `ray start` takes every flag it is given.
#[test]
fn the_systemd_units_run_as_written() {
    let dashd = exec_start(&read("ray-dashd.service"));
    assert!(dashd[0].ends_with("/ray-dashd"), "{dashd:?}");
    let printed = check_config(&dashd[1..], &deploy_dir().join("ray-dashd.toml"));
    assert!(printed.contains("modules = \"on\""), "{printed}");
    assert!(
        printed.contains("session_dir = \"/tmp/ray/session_latest\""),
        "{printed}"
    );
    assert!(
        printed.contains("name = \"logs\""),
        "built-in modules kept: {printed}"
    );

    let head = exec_start(&read("ray-head.service"));
    assert_eq!(head[1..3], ["start", "--head"], "{head:?}");
    assert!(
        head.iter().any(|a| a == "--include-dashboard=false"),
        "{head:?}"
    );
    let help = ray_start_help();
    for arg in &head[2..] {
        let name = arg.trim_start_matches("--");
        assert_ray_start_flag(&help, name.split('=').next().expect("a name"));
    }
    // Ray's proxier moved off the port ray-dashd's proxy takes, to one
    // Ray accepts.
    assert_client_server_port_moved(&head);
}

/// Ray's default worker ports (`--min-worker-port`, `--max-worker-port`):
/// `ray start` refuses a component port among them ("worker_ports is
/// trying to use a port number 10002 that is used by other components").
const RAY_WORKER_PORTS: std::ops::RangeInclusive<u16> = 10002..=19999;

/// `args` (a `ray start` command line) move Ray's proxier off 10001, to a
/// port `ray start` takes.
fn assert_client_server_port_moved(args: &[String]) {
    let port: u16 = args
        .iter()
        .find_map(|a| a.strip_prefix("--ray-client-server-port="))
        .unwrap_or_else(|| panic!("Ray's proxier is not moved: {args:?}"))
        .parse()
        .expect("a port number");
    assert_client_server_port_allowed(port);
}

/// Ray's proxier's port: not ray-dashd's, nor one of Ray's worker ports.
fn assert_client_server_port_allowed(port: u16) {
    assert_ne!(port, 10001, "Ray's proxier on ours");
    assert!(
        !RAY_WORKER_PORTS.contains(&port),
        "{port} is one of Ray's default worker ports ({RAY_WORKER_PORTS:?}): ray start refuses it"
    );
}

/// The KubeRay example: the sidecar's command line loads the ConfigMap's
/// config from where the ConfigMap is mounted, binds the ports the head
/// Service names, and the head's `rayStartParams` are `ray start` flags.
#[test]
fn the_kuberay_head_runs_as_written() {
    let docs = YamlLoader::load_from_str(&read("raycluster.yaml")).expect("valid YAML");
    let of_kind = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let config_map = of_kind("ConfigMap");
    let cluster = of_kind("RayCluster");
    let strings = |y: &Yaml| -> Vec<String> {
        y.as_vec()
            .unwrap_or_else(|| panic!("not a list: {y:?}"))
            .iter()
            .map(|s| s.as_str().expect("a string").to_owned())
            .collect()
    };
    let pod = &cluster["spec"]["headGroupSpec"]["template"]["spec"];
    let containers = pod["containers"].as_vec().expect("containers");
    let sidecar = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("ray-dashd"))
        .expect("a ray-dashd container");

    // The config file is where the ConfigMap is mounted.
    let config_name = "ray-dashd.toml";
    let mounted = sidecar["volumeMounts"]
        .as_vec()
        .expect("mounts")
        .iter()
        .find(|m| m["name"].as_str() == Some("ray-dashd-config"))
        .and_then(|m| m["mountPath"].as_str())
        .expect("the config mounted");
    assert_eq!(
        Path::new(mounted).join(config_name),
        Path::new(INSTALLED_CONFIG)
    );
    let toml = config_map["data"][config_name]
        .as_str()
        .expect("the config in the ConfigMap");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join(config_name);
    std::fs::write(&config, toml).expect("write config");

    let command = strings(&sidecar["command"]);
    assert_eq!(command, ["ray-dashd"]);
    let printed = check_config(&strings(&sidecar["args"]), &config);
    assert!(printed.contains("host = \"0.0.0.0\""), "{printed}");
    assert!(printed.contains("modules = \"on\""), "{printed}");

    // The ports the head's container names are the ones ray-dashd binds.
    let port_of = |name: &str| {
        containers
            .iter()
            .flat_map(|c| c["ports"].as_vec().into_iter().flatten())
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_i64())
            .unwrap_or_else(|| panic!("no port {name}"))
    };
    assert!(
        printed.contains(&format!("\nport = {}\n", port_of("dashboard"))),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("\nclient_port = {}\n", port_of("client"))),
        "{printed}"
    );
    let probe = &sidecar["readinessProbe"]["httpGet"];
    assert_eq!(probe["path"].as_str(), Some("/api/healthz"));
    assert_eq!(probe["port"].as_i64(), Some(port_of("dashboard")));

    // Both containers see the same /tmp/ray.
    for container in containers {
        let tmp = container["volumeMounts"]
            .as_vec()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"].as_str() == Some("/tmp/ray"));
        assert!(tmp.is_some(), "{container:?} does not mount /tmp/ray");
    }

    let help = ray_start_help();
    let params = cluster["spec"]["headGroupSpec"]["rayStartParams"]
        .as_hash()
        .expect("rayStartParams");
    for (key, value) in params {
        assert_ray_start_flag(&help, key.as_str().expect("a flag name"));
        if key.as_str() == Some("ray-client-server-port") {
            let port = value.as_str().expect("a port, as a string");
            assert_client_server_port_allowed(port.parse().expect("a port number"));
        }
    }
    assert_eq!(
        params[&Yaml::from_str("include-dashboard")].as_str(),
        Some("false")
    );
}

/// The README's Ray recipe (the `sh` block under "With Ray"): `ray start`
/// and `ray job submit` take every flag it gives them, and ray-dashd's
/// command line loads. (tests/install.rs runs the same steps for real, on
/// private ports.)
#[test]
fn the_readme_ray_recipe_runs_as_written() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## With Ray\n")
        .nth(1)
        .expect("a With Ray section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("an sh block in With Ray");
    let lines: Vec<Vec<String>> = block
        .lines()
        .map(|l| {
            l.split('#')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(|w| w.trim_end_matches('&').to_owned())
                .filter(|w| !w.is_empty())
                .collect()
        })
        .collect();
    let find = |program: &str, sub: &str| {
        lines
            .iter()
            .find(|l| l[0].ends_with(program) && l.get(1).map(String::as_str) == Some(sub))
            .unwrap_or_else(|| panic!("no `{program} {sub}` in the recipe:\n{block}"))
    };
    let help = ray_start_help();
    let start = find("/ray", "start");
    for arg in start.iter().skip(2) {
        let name = arg.trim_start_matches("--");
        assert_ray_start_flag(&help, name.split('=').next().expect("a name"));
    }
    assert_client_server_port_moved(start);
    let dashd = lines
        .iter()
        .find(|l| l[0].ends_with("/ray-dashd"))
        .expect("a ray-dashd line");
    let out = Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
        .args(&dashd[1..])
        .arg("--check-config")
        .output()
        .expect("ray-dashd --check-config");
    assert!(out.status.success(), "{dashd:?}: {out:?}");
    let submit = find("/ray", "job");
    let ray = ray_python().with_file_name("ray");
    let out = Command::new(&ray)
        .args(["job", "submit", "--help"])
        .output()
        .expect("ray job submit --help");
    let submit_help = String::from_utf8_lossy(&out.stdout);
    for arg in submit.iter().skip(3).take_while(|a| *a != "--") {
        if arg.starts_with("--") {
            assert!(
                submit_help.contains(arg.as_str()),
                "`ray job submit` has no {arg}"
            );
        }
    }
}
