//! The deployment examples in `docs/deploy/` work as written: the systemd
//! units pass `systemd-analyze verify` and their command lines run against
//! this `ray-dashd` (`--check-config` on the config they use) and Ray's own
//! CLI (`ray start --help` knows every flag they give it); the KubeRay
//! manifest and Helm values fit KubeRay's RayCluster schema and chart; the
//! sidecar's start-up wait and readiness check do what the probes need of
//! them, against real processes; the image builds (ignored where no Docker
//! daemon can pull Ray's image).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use yaml_rust2::{Yaml, YamlLoader};

use crate::support::ray::ray_python;
use crate::support::{self, WAIT};

/// Where the examples are.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/deploy")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The config path the examples install their config at.
const INSTALLED_CONFIG: &str = "/etc/ray-dashd/ray-dashd.toml";

/// Where `docs/deploy/env` is installed, for both units.
const INSTALLED_ENV: &str = "/etc/ray-dashd/env";

/// Where the Dockerfile puts the sidecar's scripts (on the image's PATH).
const SCRIPT_DIR: &str = "/usr/local/bin/";

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

/// The value of a unit's `key=` line.
fn unit_value<'u>(unit: &'u str, key: &str) -> &'u str {
    let prefix = format!("{key}=");
    unit.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= line in\n{unit}"))
}

/// The words of a unit's `ExecStart=` line.
fn exec_start(unit: &str) -> Vec<String> {
    unit_value(unit, "ExecStart")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `text` with its commented-out options turned on: a line of `#` directly
/// followed by a setting (`#host = "0.0.0.0"`, `#RAY_AUTH_MODE=token`), as
/// the examples write the options they offer (prose comments start `# `).
fn options_on(text: &str) -> (String, usize) {
    let mut count = 0;
    let lines: Vec<&str> = text
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest)
                if rest.starts_with(|c: char| c.is_ascii_alphabetic()) && rest.contains('=') =>
            {
                count += 1;
                rest
            }
            _ => line,
        })
        .collect();
    (lines.join("\n") + "\n", count)
}

/// The systemd units: ray-dashd's command line loads the example config
/// (which hosts Ray's modules or fails, for `Restart=always` to retry), the
/// head's `ray start` takes every flag it is given, and both read the same
/// environment file.
#[test]
fn the_systemd_units_run_as_written() {
    let dashd_unit = read("ray-dashd.service");
    let dashd = exec_start(&dashd_unit);
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

    let head_unit = read("ray-head.service");
    let head = exec_start(&head_unit);
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

    // One environment (token authentication, TLS) for Ray and ray-dashd,
    // without a `-`: a missing file stops both rather than starting them
    // without it.
    for unit in [&dashd_unit, &head_unit] {
        assert_eq!(unit_value(unit, "EnvironmentFile"), INSTALLED_ENV);
    }
}

/// The settings the examples offer commented out are valid: ray-dashd's
/// config loads with them on (the client proxy and the dashboard on every
/// address, for other hosts), and the shared environment file names only
/// variables that ray-dashd documents as Ray's, in `NAME=value` lines.
#[test]
fn the_examples_offered_options_are_valid() {
    let (toml, count) = options_on(&read("ray-dashd.toml"));
    assert!(count >= 2, "ray-dashd.toml offers no options:\n{toml}");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ray-dashd.toml");
    std::fs::write(&config, &toml).expect("write config");
    let dashd = exec_start(&read("ray-dashd.service"));
    let printed = check_config(&dashd[1..], &config);
    assert!(printed.contains("host = \"0.0.0.0\""), "{printed}");
    assert!(printed.contains("allowed_hosts = ["), "{printed}");
    // The proxy binds the dashboard's address: its port is still there.
    assert!(printed.contains("\nclient_port = 10001\n"), "{printed}");

    let (env, count) = options_on(&read("env"));
    assert!(count >= 2, "env offers no settings:\n{env}");
    let ray_md = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ray.md");
    let ray_md = std::fs::read_to_string(ray_md).expect("docs/ray.md");
    let mut names = BTreeSet::new();
    for line in env.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not NAME=value: {line:?}"));
        assert!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
            "{line:?}"
        );
        assert!(!value.is_empty() && !value.contains(' '), "{line:?}");
        assert!(
            ray_md.contains(name),
            "docs/ray.md does not describe {name}"
        );
        names.insert(name.to_owned());
    }
    for name in [
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_USE_TLS",
        "RAY_TLS_SERVER_CERT",
        "RAY_TLS_SERVER_KEY",
        "RAY_TLS_CA_CERT",
    ] {
        assert!(names.contains(name), "env offers no {name}: {names:?}");
    }
}

/// `systemd-analyze verify` finds nothing to say about the units. They
/// name `/opt/ray/bin/…`, which is not installed here and which verify
/// requires to be executable: it checks temporary copies whose
/// `/opt/ray/bin/` is a folder of links to this build's `ray-dashd` and
/// the test venv's `ray`, nothing else changed. (verify exits 0 after
/// warnings such as an unknown key, so any output is a failure; a copy
/// with such mistakes shows that it does say them.)
#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    const OPT_BIN: &str = "/opt/ray/bin/";
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir bin");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ray-dashd"), bin.join("ray-dashd"))
        .expect("link ray-dashd");
    std::os::unix::fs::symlink(ray_python().with_file_name("ray"), bin.join("ray"))
        .expect("link ray");
    let units = ["ray-head.service", "ray-dashd.service"];
    let mut paths = Vec::new();
    for unit in units {
        let text = read(unit);
        assert!(text.contains(OPT_BIN), "{unit} names no {OPT_BIN}");
        let copy = dir.path().join(unit);
        std::fs::write(&copy, text.replace(OPT_BIN, &format!("{}/", bin.display())))
            .expect("write unit");
        paths.push(copy);
    }
    let verify = |paths: &[PathBuf]| -> (bool, String) {
        let out = Command::new("/usr/bin/systemd-analyze")
            .arg("verify")
            .arg("--man=no")
            .args(paths)
            .output()
            .expect("run /usr/bin/systemd-analyze (systemd's tools must be installed)");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    let (ok, said) = verify(&paths);
    assert!(
        ok && said.is_empty(),
        "systemd-analyze verify {units:?}:\n{said}"
    );

    let broken_dir = dir.path().join("broken");
    std::fs::create_dir(&broken_dir).expect("mkdir broken");
    let broken = broken_dir.join("ray-dashd.service");
    let text = std::fs::read_to_string(&paths[1]).expect("read copy");
    std::fs::write(
        &broken,
        text.replace("Restart=always", "Restart=sometimes\nKillModes=mixed"),
    )
    .expect("write broken unit");
    // Alone: beside ray-head.service's folder, the good copy of the same
    // name would be loaded in its place.
    let (_, said) = verify(&[broken]);
    assert!(
        said.contains("sometimes") && said.contains("KillModes"),
        "verify said nothing of the broken unit: {said:?}"
    );
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

fn load_yaml(name: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The only document of kind `kind` in `docs`.
fn of_kind<'d>(docs: &'d [Yaml], kind: &str) -> &'d Yaml {
    let mut found = docs.iter().filter(|d| d["kind"].as_str() == Some(kind));
    let doc = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "more than one {kind}");
    doc
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .unwrap_or_else(|| panic!("not a list: {y:?}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

/// The element of list `list` whose `name` is `name`.
fn named<'y>(list: &'y Yaml, name: &str) -> &'y Yaml {
    list.as_vec()
        .unwrap_or_else(|| panic!("not a list: {list:?}"))
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in {list:?}"))
}

/// The RayCluster of `raycluster.yaml` and the ConfigMap it mounts.
fn raycluster() -> (Yaml, Yaml) {
    let cluster = of_kind(&load_yaml("raycluster.yaml"), "RayCluster").clone();
    let config_map = of_kind(&load_yaml("ray-dashd-config.yaml"), "ConfigMap").clone();
    (cluster, config_map)
}

/// The KubeRay example: the sidecar is a native sidecar that waits for the
/// head and then runs ray-dashd on the ConfigMap's config, binding the
/// ports the head Service takes from the Ray container; its probes ask
/// what the scripts and ray-dashd answer; it shares `/tmp/ray` under
/// KubeRay's own volume name and gets Ray's token; the head's
/// `rayStartParams` are `ray start` flags.
#[test]
fn the_kuberay_head_runs_as_written() {
    let (cluster, config_map) = raycluster();
    let pod = &cluster["spec"]["headGroupSpec"]["template"]["spec"];
    let containers = &pod["containers"];
    // KubeRay takes the first container for Ray's (RayContainerIndex), and
    // its ports for the head Service and RayJob's submitter.
    let head = &containers[0];
    assert_eq!(head["name"].as_str(), Some("ray-head"));
    let sidecar = named(&pod["initContainers"], "ray-dashd");
    assert_eq!(
        sidecar["restartPolicy"].as_str(),
        Some("Always"),
        "a native sidecar"
    );

    // The config file is where the ConfigMap is mounted.
    let config_name = "ray-dashd.toml";
    let config_mount = sidecar["volumeMounts"]
        .as_vec()
        .expect("mounts")
        .iter()
        .find(|m| m["name"].as_str() == Some("ray-dashd-config"))
        .expect("the config mounted");
    assert_eq!(
        Path::new(config_mount["mountPath"].as_str().expect("a path")).join(config_name),
        Path::new(INSTALLED_CONFIG)
    );
    assert_eq!(
        named(&pod["volumes"], "ray-dashd-config")["configMap"]["name"].as_str(),
        config_map["metadata"]["name"].as_str()
    );
    let toml = config_map["data"][config_name]
        .as_str()
        .expect("the config in the ConfigMap");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join(config_name);
    std::fs::write(&config, toml).expect("write config");

    // wait-for-ray-head, then ray-dashd; both scripts on the image's PATH.
    let command = strings(&sidecar["command"]);
    assert_eq!(command, ["wait-for-ray-head", "--", "ray-dashd"]);
    let printed = check_config(&strings(&sidecar["args"]), &config);
    assert!(printed.contains("host = \"0.0.0.0\""), "{printed}");
    assert!(printed.contains("modules = \"on\""), "{printed}");
    let readiness = strings(&sidecar["readinessProbe"]["exec"]["command"]);
    let dockerfile = read("Dockerfile");
    for script in [command[0].as_str(), readiness[0].as_str()] {
        assert!(
            deploy_dir().join(script).is_file(),
            "no docs/deploy/{script}"
        );
        assert!(
            dockerfile.lines().any(|l| l.starts_with("COPY ")
                && l.split_whitespace().any(|w| w == script)
                && l.ends_with(SCRIPT_DIR)),
            "the Dockerfile does not install {script} in {SCRIPT_DIR}"
        );
    }

    // The ports: the head Service's are the Ray container's; ray-dashd
    // binds the dashboard's and the client's; Serve's and Ray's dashboard
    // metrics (which ray-dashd serves) stay.
    let port_of = |name: &str| {
        named(&head["ports"], name)["containerPort"]
            .as_i64()
            .unwrap_or_else(|| panic!("port {name} is not a number"))
    };
    assert!(
        printed.contains(&format!("\nport = {}\n", port_of("dashboard"))),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("\nclient_port = {}\n", port_of("client"))),
        "{printed}"
    );
    assert_eq!(port_of("serve"), 8000);
    assert_eq!(port_of("dash-metrics"), 44227);
    assert_eq!(port_of("gcs-server"), 6379);

    // Liveness: ray-dashd's own /api/healthz on the dashboard's port,
    // naming a loopback host (test below); readiness: the script (test
    // below).
    let live = &sidecar["livenessProbe"]["httpGet"];
    assert_eq!(live["path"].as_str(), Some("/api/healthz"));
    assert_eq!(live["port"].as_i64(), Some(port_of("dashboard")));
    assert_eq!(
        named(&live["httpHeaders"], "Host")["value"].as_str(),
        Some("localhost")
    );
    assert!(sidecar["readinessProbe"]["httpGet"].is_badvalue());

    // Resources of its own.
    for kind in ["requests", "limits"] {
        assert!(
            sidecar["resources"][kind]["memory"].as_str().is_some(),
            "no memory {kind}"
        );
    }

    // Both containers see the same /tmp/ray, KubeRay's ray-logs volume.
    for container in [head, sidecar] {
        let tmp = container["volumeMounts"]
            .as_vec()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"].as_str() == Some("/tmp/ray"))
            .unwrap_or_else(|| panic!("{container:?} does not mount /tmp/ray"));
        assert_eq!(tmp["name"].as_str(), Some("ray-logs"));
    }
    assert!(named(&pod["volumes"], "ray-logs")["emptyDir"]
        .as_hash()
        .is_some());

    // Ray's token, from the Secret KubeRay gives the Ray containers.
    let auth = &cluster["spec"]["authOptions"];
    assert_eq!(auth["mode"].as_str(), Some("token"));
    let env = &sidecar["env"];
    assert_eq!(named(env, "RAY_AUTH_MODE")["value"].as_str(), Some("token"));
    let secret = &named(env, "RAY_AUTH_TOKEN")["valueFrom"]["secretKeyRef"];
    assert_eq!(secret["name"].as_str(), auth["secretName"].as_str());
    // KubeRay's key (RAY_AUTH_TOKEN_SECRET_KEY).
    assert_eq!(secret["key"].as_str(), Some("auth_token"));

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

/// KubeRay's RayCluster schema (v1, KubeRay v1.7.0), vendored trimmed.
fn raycluster_schema() -> Yaml {
    let text = fixture("kuberay-raycluster-v1.7.0-schema.yaml");
    YamlLoader::load_from_str(&text)
        .expect("the schema is YAML")
        .remove(0)
}

/// The subschema at `path` of `schema`: names of properties, `[]` for the
/// items of an array.
fn subschema<'s>(schema: &'s Yaml, path: &str) -> &'s Yaml {
    path.split('.').fold(schema, |s, step| {
        let next = match step {
            "[]" => &s["items"],
            name => &s["properties"][name],
        };
        assert!(!next.is_badvalue(), "the schema has no {path} ({step})");
        next
    })
}

/// What is wrong with `value` under OpenAPI v3 `schema`, as the API server
/// checks a custom resource against its CRD's structural schema: types,
/// enums and required fields, and every field known (the API server drops
/// an unknown one, or refuses it with strict field validation: either way
/// a setting that does not do what it says). `path` names the value.
fn schema_errors(schema: &Yaml, value: &Yaml, path: &str, errors: &mut Vec<String>) {
    let flag = |key: &str| schema[key].as_bool() == Some(true);
    if flag("x-kubernetes-int-or-string") {
        if !matches!(value, Yaml::Integer(_) | Yaml::String(_)) {
            errors.push(format!(
                "{path}: {value:?} is neither an integer nor a string"
            ));
        }
        return;
    }
    if let Some(choices) = schema["enum"].as_vec() {
        if !choices.contains(value) {
            errors.push(format!("{path}: {value:?} is not one of {choices:?}"));
        }
    }
    match schema["type"].as_str() {
        Some("object") => {
            let Some(hash) = value.as_hash() else {
                errors.push(format!("{path}: {value:?} is not an object"));
                return;
            };
            for required in schema["required"].as_vec().into_iter().flatten() {
                if !hash.contains_key(required) {
                    errors.push(format!(
                        "{path}: {} is required",
                        required.as_str().unwrap_or("?")
                    ));
                }
            }
            for (key, field) in hash {
                let name = key.as_str().unwrap_or("?");
                let at = format!("{path}.{name}");
                let property = &schema["properties"][name];
                if !property.is_badvalue() {
                    schema_errors(property, field, &at, errors);
                } else if !schema["additionalProperties"].is_badvalue() {
                    schema_errors(&schema["additionalProperties"], field, &at, errors);
                } else if !flag("x-kubernetes-preserve-unknown-fields")
                    && !schema["properties"].is_badvalue()
                {
                    errors.push(format!("{at}: unknown field"));
                }
            }
        }
        Some("array") => match value.as_vec() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    schema_errors(&schema["items"], item, &format!("{path}[{i}]"), errors);
                }
            }
            None => errors.push(format!("{path}: {value:?} is not a list")),
        },
        Some("string") if value.as_str().is_none() => {
            errors.push(format!("{path}: {value:?} is not a string"));
        }
        Some("integer") if value.as_i64().is_none() => {
            errors.push(format!("{path}: {value:?} is not an integer"));
        }
        Some("number") if !matches!(value, Yaml::Integer(_) | Yaml::Real(_)) => {
            errors.push(format!("{path}: {value:?} is not a number"));
        }
        Some("boolean") if value.as_bool().is_none() => {
            errors.push(format!("{path}: {value:?} is not a boolean"));
        }
        _ => {}
    }
}

/// The errors of a RayCluster document.
fn raycluster_errors(schema: &Yaml, doc: &Yaml) -> Vec<String> {
    let mut errors = Vec::new();
    if doc["apiVersion"].as_str() != Some("ray.io/v1") {
        errors.push(format!("apiVersion {:?}", doc["apiVersion"]));
    }
    schema_errors(schema, doc, "", &mut errors);
    errors
}

/// `raycluster.yaml` fits KubeRay's RayCluster schema, the native sidecar's
/// fields included; so do the Helm values' pieces, each at the place of the
/// RayCluster the chart puts it. Mistakes in a copy are found: the check
/// can fail.
#[test]
fn the_kuberay_manifest_fits_the_raycluster_crd() {
    let schema = raycluster_schema();
    let (cluster, _) = raycluster();
    let errors = raycluster_errors(&schema, &cluster);
    assert!(errors.is_empty(), "raycluster.yaml: {errors:#?}");

    let values = &load_yaml("helm-values.yaml")[0];
    let template = "spec.headGroupSpec.template.spec";
    for (key, at) in [
        ("initContainers", format!("{template}.initContainers")),
        ("volumes", format!("{template}.volumes")),
        (
            "volumeMounts",
            format!("{template}.containers.[].volumeMounts"),
        ),
        ("ports", format!("{template}.containers.[].ports")),
        (
            "rayStartParams",
            "spec.headGroupSpec.rayStartParams".to_owned(),
        ),
    ] {
        let mut errors = Vec::new();
        schema_errors(
            subschema(&schema, &at),
            &values["head"][key],
            &format!("head.{key}"),
            &mut errors,
        );
        assert!(errors.is_empty(), "helm-values.yaml: {errors:#?}");
    }

    let text = read("raycluster.yaml");
    for (mistake, from, to) in [
        (
            "a misspelt field",
            "restartPolicy: Always",
            "restartpolicy: Always",
        ),
        (
            "a string for a number",
            "periodSeconds: 5",
            "periodSeconds: five",
        ),
        ("a value outside the enum", "mode: token", "mode: tokens"),
        (
            "a container without a name",
            "- name: ray-dashd",
            "- nam: ray-dashd",
        ),
    ] {
        assert!(text.contains(from), "{from:?} is gone from raycluster.yaml");
        let docs = YamlLoader::load_from_str(&text.replacen(from, to, 1)).expect("YAML");
        let errors = raycluster_errors(&schema, of_kind(&docs, "RayCluster"));
        assert!(!errors.is_empty(), "{mistake} passed");
    }
}

/// The Helm values give the ray-cluster chart's RayCluster the head of
/// `raycluster.yaml`: every value they set is one the chart's template
/// reads, and the sidecar, volumes, mounts, ports, `rayStartParams`,
/// image and Ray version are the same (the token goes to the Ray
/// containers through `common.containerEnv`, the chart having no
/// `authOptions`).
#[test]
fn the_helm_values_give_the_chart_the_same_head() {
    let template = fixture("kuberay-ray-cluster-chart-v1.7.0-template.yaml");
    let read_by_chart: BTreeSet<&str> = template
        .match_indices(".Values.")
        .map(|(at, _)| {
            let rest = &template[at + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches('.')
        })
        .collect();
    let values = &load_yaml("helm-values.yaml")[0];
    for (top, inner) in values.as_hash().expect("values") {
        let top = top.as_str().expect("a key");
        for key in inner.as_hash().expect("a table").keys() {
            let path = format!("Values.{top}.{}", key.as_str().expect("a key"));
            assert!(
                read_by_chart.contains(path.as_str()),
                "the chart does not read .{path}"
            );
        }
    }

    let (cluster, _) = raycluster();
    let pod = &cluster["spec"]["headGroupSpec"]["template"]["spec"];
    let head = &pod["containers"][0];
    let ours = &values["head"];
    assert_eq!(ours["initContainers"], pod["initContainers"]);
    assert_eq!(ours["volumes"], pod["volumes"]);
    assert_eq!(ours["volumeMounts"], head["volumeMounts"]);
    assert_eq!(ours["ports"], head["ports"]);
    assert_eq!(
        ours["rayStartParams"],
        cluster["spec"]["headGroupSpec"]["rayStartParams"]
    );
    assert_eq!(ours["rayVersion"], cluster["spec"]["rayVersion"]);
    assert_eq!(
        format!(
            "{}:{}",
            values["image"]["repository"].as_str().expect("repository"),
            values["image"]["tag"].as_str().expect("tag")
        ),
        head["image"].as_str().expect("image")
    );
    let sidecar = named(&pod["initContainers"], "ray-dashd");
    assert_eq!(values["common"]["containerEnv"], sidecar["env"]);
}

/// A process killed and reaped when dropped, whatever the test did.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `docs/deploy/wait-for-ray-head` with `sh` (POSIX sh: dash on
/// Debian) and `args`; its stderr, read as it comes.
fn wait_for_head(args: &[&str]) -> (Reaped, Arc<Mutex<String>>) {
    let mut child = Command::new("sh")
        .arg(deploy_dir().join("wait-for-ray-head"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sh wait-for-ray-head");
    let stderr = child.stderr.take().expect("piped stderr");
    let said = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&said);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let mut said = sink.lock().expect("lock");
            said.push_str(&line);
            said.push('\n');
        }
    });
    (Reaped(child), said)
}

/// Polls `done` every 20 ms until it holds, at most [`WAIT`]; `what` and
/// `said` name what was awaited when it does not.
fn until(what: &str, said: &Mutex<String>, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {WAIT:?}; the script said:\n{}",
            said.lock().expect("lock")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `text` to `path` whole (a rename), as the script must never read
/// half of it.
fn write_whole(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The sidecar's start-up wait, with a temporary folder for `/tmp/ray` and
/// a listener for the GCS: it waits while the session is missing, while
/// `ray_current_cluster` is, and while the GCS it names does not listen (a
/// file left by an earlier head), saying each once; when the GCS listens
/// it becomes the given command (same pid, arguments intact).
#[test]
fn the_sidecar_waits_for_the_head_then_execs_ray_dashd() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let ray_tmp = tmp.path().join("ray");
    std::fs::create_dir(&ray_tmp).expect("mkdir");
    let marker = tmp.path().join("exec");
    let command =
        "printf '%s\\n' \"$$\" \"$@\" > \"$0.tmp\" && mv \"$0.tmp\" \"$0\" && exec sleep 600";
    let (mut child, said) = wait_for_head(&[
        "--temp-dir",
        ray_tmp.to_str().expect("utf-8"),
        "--interval",
        "0.05",
        "--",
        "sh",
        "-c",
        command,
        marker.to_str().expect("utf-8"),
        "two words",
        "--flag",
    ]);
    let pid = child.0.id();
    let awaiting = |what: &str, needle: &str, child: &mut Reaped| {
        until(what, &said, || said.lock().expect("lock").contains(needle));
        assert!(child.0.try_wait().expect("try_wait").is_none(), "it exited");
        assert!(!marker.exists(), "it ran the command before {what}");
    };

    awaiting(
        "the wait for the session",
        "waiting for Ray's session",
        &mut child,
    );

    std::fs::create_dir(ray_tmp.join("session_2026-01-01_00-00-00_000000_1")).expect("mkdir");
    std::os::unix::fs::symlink(
        "session_2026-01-01_00-00-00_000000_1",
        ray_tmp.join("session_latest"),
    )
    .expect("link session_latest");
    awaiting(
        "the wait for the GCS's address",
        "waiting for the GCS's address",
        &mut child,
    );

    // An address nothing listens on: the previous head's file.
    let gone = TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone_addr = gone.local_addr().expect("addr");
    drop(gone);
    write_whole(&ray_tmp.join("ray_current_cluster"), &gone_addr.to_string());
    awaiting(
        "the wait for the GCS to listen",
        &format!("waiting for the GCS at {gone_addr} to listen"),
        &mut child,
    );

    let gcs = TcpListener::bind("127.0.0.1:0").expect("bind");
    let gcs_addr: SocketAddr = gcs.local_addr().expect("addr");
    write_whole(&ray_tmp.join("ray_current_cluster"), &gcs_addr.to_string());
    until("the command's start", &said, || marker.exists());
    let ran = std::fs::read_to_string(&marker).expect("read marker");
    assert_eq!(
        ran,
        format!("{pid}\ntwo words\n--flag\n"),
        "exec'd in place"
    );
    assert!(said
        .lock()
        .expect("lock")
        .contains(&format!("the Ray head is up (GCS {gcs_addr}); starting sh")));
    drop(child);
}

/// With `--timeout`, the wait gives up with status 1 and says why; without
/// a command it is a usage error (64).
#[test]
fn the_sidecar_wait_gives_up_after_its_timeout() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().to_str().expect("utf-8");
    let (mut child, said) = wait_for_head(&[
        "--temp-dir",
        dir,
        "--interval",
        "0.05",
        "--timeout",
        "1",
        "true",
    ]);
    let mut status = None;
    until("the give-up", &said, || {
        status = child.0.try_wait().expect("try_wait");
        status.is_some()
    });
    assert_eq!(status.and_then(|s| s.code()), Some(1));
    assert!(
        said.lock()
            .expect("lock")
            .contains("gave up after 1s waiting for Ray's session"),
        "{}",
        said.lock().expect("lock")
    );

    let out = Command::new("sh")
        .arg(deploy_dir().join("wait-for-ray-head"))
        .args(["--temp-dir", dir])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

/// Runs `docs/deploy/ray-dashd-ready` (with `python3`, as the image's
/// `#!/usr/bin/env python3` does) against `url`, with `token` as
/// `RAY_AUTH_TOKEN` and no other token to find; its status and output.
fn ready(url: &str, token: Option<&str>) -> (bool, String) {
    let home = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new("python3");
    command
        .arg(deploy_dir().join("ray-dashd-ready"))
        .arg(url)
        .env("HOME", home.path())
        .env_remove("RAY_AUTH_TOKEN")
        .env_remove("RAY_AUTH_TOKEN_PATH");
    if let Some(token) = token {
        command.env("RAY_AUTH_TOKEN", token);
    }
    let out = command.output().expect("run python3 ray-dashd-ready");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "ray-dashd-ready: {out:?}"
    );
    (out.status.success(), text)
}

/// The readiness check: not ready while ray-dashd is down, while Ray's
/// modules are not hosted, or while a module is not healthy (naming it);
/// ready once every module is healthy, in token mode too (with the token;
/// without it, not ready, and saying 401).
#[tokio::test]
async fn the_readiness_check_waits_for_every_module() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let (ok, said) = ready(&format!("http://{closed}"), None);
    assert!(!ok && said.starts_with("not ready:"), "{said}");

    let ray_off = "[ray]\nmodules = \"off\"\n";
    let token = "deploy-test-token";
    let host = support::dashd()
        .toml(ray_off)
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", token)
        .start();
    let url = format!("http://127.0.0.1:{}", host.addr().port());
    let became_ready = support::eventually(WAIT, || async {
        let (ok, said) = ready(&url, Some(token));
        ok.then_some(said)
    })
    .await;
    assert_eq!(
        became_ready.as_deref().map(str::trim),
        Some("ready"),
        "never ready; log:\n{}",
        host.log()
    );
    let modules = host
        .client()
        .get(host.url("/api/modules"))
        .send()
        .await
        .expect("GET /api/modules")
        .json::<serde_json::Value>()
        .await
        .expect("JSON");
    let modules = modules.as_array().expect("a list");
    assert!(!modules.is_empty());
    assert!(
        modules.iter().all(|m| m["state"] == "healthy"),
        "{modules:?}"
    );
    let (ok, said) = ready(&url, None);
    assert!(!ok && said.contains("401"), "without the token: {said}");

    // Ray's modules wanted but not hosted (no Ray head here).
    let no_head = support::dashd().start();
    let (ok, said) = ready(&format!("http://127.0.0.1:{}", no_head.addr().port()), None);
    assert!(!ok && said.contains("Ray's modules are no_head"), "{said}");

    // A module that never answers its health check.
    let stuck = support::dashd()
        .toml(ray_off)
        .module(support::command_module("stuck", &["sleep", "600"]))
        .start();
    let (ok, said) = ready(&format!("http://127.0.0.1:{}", stuck.addr().port()), None);
    assert!(!ok && said.contains("stuck is starting"), "{said}");
}

/// The sidecar's liveness probe as the kubelet sends it (`httpGet` with the
/// manifest's path and `Host` header), to a ray-dashd bound to all
/// addresses with `allowed_hosts` set and token mode on: answered, where
/// the kubelet's default `Host` (the pod's IP) is refused.
#[tokio::test]
async fn the_liveness_probe_survives_allowed_hosts() {
    let (cluster, _) = raycluster();
    let pod = &cluster["spec"]["headGroupSpec"]["template"]["spec"];
    let probe = &named(&pod["initContainers"], "ray-dashd")["livenessProbe"]["httpGet"];
    let path = probe["path"].as_str().expect("path");
    let host = named(&probe["httpHeaders"], "Host")["value"]
        .as_str()
        .expect("Host");
    let dashd = support::dashd()
        .server("host", "\"0.0.0.0\"")
        .server(
            "allowed_hosts",
            "[\"ray-dashd-example-head-svc.default.svc.cluster.local\"]",
        )
        .toml("[ray]\nmodules = \"off\"\n")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", "deploy-test-token")
        .start();
    let addr = SocketAddr::from(([127, 0, 0, 1], dashd.addr().port()));
    let get = |host: &str| {
        support::raw_exchange(
            addr,
            format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kube-probe/1.33\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    };
    let answer = get(host);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("success"), "{answer}");
    let answer = get(&format!("10.1.2.3:{}", addr.port()));
    assert!(answer.starts_with("HTTP/1.1 403"), "the pod's IP: {answer}");
}

/// The image: `docker build` of docs/deploy (with this checkout's wheel)
/// succeeds, and the image runs as uid 1000 with ray-dashd and
/// both scripts on PATH and no wheel left in /tmp. Run with `--ignored`
/// where a Docker daemon can pull rayproject/ray:2.60.0; without one, it
/// fails.
#[test]
#[ignore = "needs a Docker daemon that can pull rayproject/ray:2.60.0 (GBs, Docker Hub)"]
fn the_image_builds() {
    let docker = |args: &[&str]| -> Output {
        Command::new("docker")
            .args(args)
            .output()
            .expect("run docker")
    };
    let info = docker(&["info", "--format", "{{.ServerVersion}}"]);
    assert!(info.status.success(), "no Docker daemon: {info:?}");
    let context = tempfile::tempdir().expect("temp dir");
    for name in ["Dockerfile", "wait-for-ray-head", "ray-dashd-ready"] {
        std::fs::copy(deploy_dir().join(name), context.path().join(name)).expect("copy");
    }
    // The wheel of this checkout, as pip builds it (the dev profile: the
    // image is tested, not the build).
    let venv = crate::install::wheel_venv();
    let built = Command::new(venv.join("bin/pip"))
        .args(["wheel", "--no-deps", "--quiet", "-w"])
        .arg(context.path())
        .arg(env!("CARGO_MANIFEST_DIR"))
        .env("MATURIN_PEP517_ARGS", "--profile dev")
        .output()
        .expect("pip wheel");
    assert!(
        built.status.success(),
        "pip wheel: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let tag = format!("ray-dashd-deploy-test:{}", std::process::id());
    let built = docker(&["build", "-t", &tag, context.path().to_str().expect("utf-8")]);
    assert!(
        built.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = docker(&[
        "run",
        "--rm",
        &tag,
        "sh",
        "-c",
        "id -u; command -v ray-dashd wait-for-ray-head ray-dashd-ready; \
         ls /tmp | grep -c whl; ray-dashd --version",
    ]);
    let _ = docker(&["rmi", &tag]);
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "docker run: {ran:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"1000"), "{out}");
    assert!(lines.iter().any(|l| l.ends_with("/ray-dashd")), "{out}");
    assert!(lines.contains(&"/usr/local/bin/wait-for-ray-head"), "{out}");
    assert!(lines.contains(&"/usr/local/bin/ray-dashd-ready"), "{out}");
    assert!(lines.contains(&"0"), "a wheel left in /tmp: {out}");
    assert!(out.contains("ray-dashd "), "{out}");
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
