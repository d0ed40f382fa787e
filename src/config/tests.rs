//! Unit tests of loading and validating the config.

use super::raw::line_column;
use super::ray_settings::{PythonSource, RayLaunch, RayModules, RayPython, RaySettings};
use super::*;
use clap::Parser;

fn cli(args: &[&str]) -> Cli {
    let mut argv = vec!["ray-dashd"];
    argv.extend_from_slice(args);
    Cli::parse_from(argv)
}

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml("test.toml", text, &cli(&[]))
}

#[test]
fn builtin_default_config_is_valid() {
    let config = Config::load(&cli(&[])).expect("default config");
    assert_eq!(config.port, 8265);
    assert_eq!(config.host, IpAddr::from([127, 0, 0, 1]));
    assert_eq!(config.session_dir, PathBuf::from("/tmp/ray/session_latest"));
    assert!(!config.modules.is_empty());
}

#[test]
fn command_line_overrides_file() {
    let text = "[server]\nport = 9000\nhost = \"0.0.0.0\"\n";
    let c = Config::from_toml("t.toml", text, &cli(&["--port", "9100"])).expect("valid");
    assert_eq!(c.port, 9100);
    assert_eq!(c.host, IpAddr::from([0, 0, 0, 0]));
}

#[test]
fn unknown_field_names_file_field_and_problem() {
    let err = load("[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nbogus = 1\n")
        .expect_err("unknown field");
    let msg = err.to_string();
    assert!(msg.contains("test.toml"), "{msg}");
    assert!(msg.contains("modules[0]"), "{msg}");
    assert!(msg.contains("unknown field `bogus`"), "{msg}");
}

#[test]
fn bad_route_type_is_named() {
    let text = "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n[[modules.routes]]\nmethod = \"GET\"\npath = \"/x\"\ntype = \"sse\"\n";
    let msg = load(text).expect_err("bad type").to_string();
    assert!(msg.contains("modules[0].routes[0].type"), "{msg}");
    assert!(msg.contains("sse"), "{msg}");
}

#[test]
fn bad_value_type_is_named() {
    let msg = load("[module_defaults]\nfailure_threshold = \"three\"\n")
        .expect_err("bad value")
        .to_string();
    assert!(msg.contains("module_defaults.failure_threshold"), "{msg}");
}

#[test]
fn duplicate_route_names_both_modules() {
    let text = r#"
[[modules]]
name = "first"
command = ["x"]
routes = [{ method = "GET", path = "/api/jobs/{id}", type = "http" }]
[[modules]]
name = "second"
command = ["y"]
routes = [{ method = "get", path = "/api/jobs/{job}", type = "http" }]
"#;
    let msg = load(text).expect_err("duplicate").to_string();
    assert!(
        msg.contains("\"first\"") && msg.contains("\"second\""),
        "{msg}"
    );
    assert!(msg.contains("modules[1].routes[0].path"), "{msg}");
}

#[test]
fn same_path_other_method_is_allowed() {
    let text = r#"
[[modules]]
name = "a"
command = ["x"]
routes = [{ method = "GET", path = "/api/jobs/", type = "http" }]
[[modules]]
name = "b"
command = ["y"]
routes = [{ method = "POST", path = "/api/jobs/", type = "http" }]
"#;
    assert_eq!(load(text).expect("valid").modules.len(), 2);
}

#[test]
fn module_may_not_claim_host_paths() {
    let text = "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/api/healthz\", type = \"http\" }]\n";
    let msg = load(text).expect_err("host path").to_string();
    assert!(msg.contains("ray-dashd (host)"), "{msg}");
}

/// A module route at each of the host's paths is refused, naming it.
#[test]
fn every_host_path_is_kept_from_module_routes() {
    for host_path in crate::routes::host::HOST_PATHS {
        let path = host_path.replace("{*path}", "x");
        let msg = load(&module_with_route("GET", &path))
            .expect_err(&path)
            .to_string();
        assert!(msg.contains(&format!("shadow {host_path},")), "{msg}");
    }
}

fn module_with_route(method: &str, path: &str) -> String {
    format!(
        "[[modules]]\nname = \"shadow\"\ncommand = [\"x\"]\nroutes = [{{ method = \"{method}\", path = \"{path}\", type = \"http\" }}]\n"
    )
}

#[test]
fn module_routes_may_not_shadow_host_paths_with_any_method_or_pattern() {
    let cases = [
        ("PUT", "/api/healthz", "/api/healthz"),
        ("DELETE", "/api/healthz", "/api/healthz"),
        ("GET", "/api/{x}", "/api/healthz"),
        ("POST", "/api/{x}", "/api/healthz"),
        ("GET", "/api/modules/{m}", "/api/modules/{name}"),
        ("GET", "/api/modules/logs", "/api/modules/{name}"),
        ("GET", "/api/{a}/{b}", "/api/modules/{name}"),
        (
            "PATCH",
            "/api/{a}/{b}/restart",
            "/api/modules/{name}/restart",
        ),
        ("GET", "/api/gcs_healthz", "/api/gcs_healthz"),
        ("GET", "/{page}", "/dashd"),
        ("GET", "/dashd/{file}", "/dashd/{*path}"),
        ("GET", "/static/js/{file}", "/static/{*path}"),
        ("GET", "/", "/"),
    ];
    for (method, path, host_path) in cases {
        let msg = load(&module_with_route(method, path))
            .expect_err(path)
            .to_string();
        assert!(msg.contains("test.toml"), "{msg}");
        assert!(msg.contains("modules[0].routes[0].path"), "{msg}");
        assert!(msg.contains("\"shadow\""), "{msg}");
        assert!(msg.contains(&format!("{method} {path} ")), "{msg}");
        assert!(msg.contains(&format!("shadow {host_path},")), "{msg}");
        assert!(msg.contains("ray-dashd (host)"), "{msg}");
    }
    for (method, path) in [
        ("GET", "/api/healthz/"),
        ("GET", "/api/healthz/{x}"),
        ("GET", "/api/modules/"),
        ("GET", "/api/{a}/{b}/{c}/{d}"),
        ("POST", "/api/{x}/{y}/stop"),
        ("GET", "/apis/healthz"),
        ("GET", "/dashd-logs"),
    ] {
        load(&module_with_route(method, path)).expect(path);
    }
}

/// Modules the host builds as values are checked as the file's are:
/// against the modules before them (names and routes) and the host's
/// paths, each error naming where they came from and the field.
#[test]
fn added_module_values_are_checked_like_the_files_modules() {
    let mut config = load(&module_with_route("GET", "/jobs/{job}")).expect("valid");
    let spec = |name: &str, path: &str| ModuleSpec {
        name: name.to_owned(),
        program: "p".to_owned(),
        args: Vec::new(),
        env: BTreeMap::new(),
        routes: vec![crate::routes::RouteSpec {
            method: http::Method::GET,
            path: path.to_owned(),
            kind: crate::routes::RouteKind::Http,
            cache: None,
            fallback: None,
        }],
        supervision: Supervision::default(),
        start: Default::default(),
    };
    for (module, problem) in [
        (
            spec("shadow", "/api/y"),
            "modules[0].name: \"shadow\" is already the name of an earlier module (a built-in one, or one of the config's)",
        ),
        (
            spec("other", "/jobs/{id}"),
            "modules[0].routes[0].path: GET /jobs/{id} is claimed by both \"shadow\" (/jobs/{job}) and \"other\"",
        ),
        (
            spec("other", "/api/healthz"),
            "modules[0].routes[0].path: GET /api/healthz of module \"other\" would shadow /api/healthz, which ray-dashd (host) serves itself",
        ),
        (spec("", "/api/y"), "modules[0].name: \"\" must match [A-Za-z0-9_-]+"),
        (spec("other", "api"), "modules[0].routes[0].path: \"api\" must start with '/'"),
    ] {
        let error = config
            .add_modules("<built>", vec![module])
            .expect_err(problem)
            .to_string();
        assert_eq!(error, format!("config <built>: {problem}"));
    }
    assert_eq!(config.modules.len(), 1);
    config
        .add_modules("<built>", vec![spec("other", "/api/y")])
        .expect("fits");
    assert_eq!(config.modules[1].name, "other");
}

/// Every route of Ray 2.60's dashboard modules but the GCS health check
/// (which `routes.py --omit` leaves out) fits beside the host's paths.
#[test]
fn ray_module_routes_do_not_shadow_host_paths() {
    let ray_routes = [
        ("GET", "/api/data/datasets/{job_id}"),
        ("GET", "/api/v0/cluster_events"),
        ("GET", "/events"),
        ("POST", "/report_events"),
        ("GET", "/api/component_activities"),
        ("GET", "/api/jobs/"),
        ("POST", "/api/jobs/"),
        ("DELETE", "/api/jobs/{job_or_submission_id}"),
        ("GET", "/api/jobs/{job_or_submission_id}/logs"),
        ("GET", "/api/jobs/{job_or_submission_id}/logs/tail"),
        ("POST", "/api/jobs/{job_or_submission_id}/stop"),
        ("GET", "/api/packages/{protocol}/{package_name}"),
        ("GET", "/api/version"),
        ("GET", "/api/grafana_health"),
        ("GET", "/logical/actors/{actor_id}"),
        ("GET", "/nodes"),
        ("GET", "/nodes/{node_id}"),
        ("GET", "/test/dump"),
        ("GET", "/api/cluster_status"),
        ("GET", "/api/prometheus/sd"),
        ("GET", "/memory_profile"),
        ("GET", "/worker/traceback"),
        ("GET", "/api/ray/version"),
        ("PUT", "/api/serve/applications/"),
        (
            "POST",
            "/api/v1/applications/{application_name}/deployments/{deployment_name}/scale",
        ),
        ("GET", "/api/v0/delay/{delay_s}"),
        ("GET", "/api/v0/logs/{media_type}"),
        ("POST", "/api/task_events/query"),
        ("GET", "/api/train/v2/runs/v1"),
    ];
    for (method, path) in ray_routes {
        load(&module_with_route(method, path)).expect(path);
    }
}

#[test]
fn zero_backoff_or_stable_after_is_refused() {
    let cases = [
        (
            "[module_defaults]\nbackoff_initial_secs = 0\n",
            "module_defaults.backoff_initial_secs",
        ),
        (
            "[module_defaults]\nbackoff_initial_secs = 0\nbackoff_max_secs = 0\n",
            "module_defaults.backoff_initial_secs",
        ),
        (
            "[module_defaults]\nbackoff_initial_secs = 0.0000000001\n",
            "module_defaults.backoff_initial_secs",
        ),
        (
            "[module_defaults]\nstable_after_secs = 0\n",
            "module_defaults.stable_after_secs",
        ),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nsupervision = { backoff_initial_secs = 0 }\n",
            "modules[0].supervision.backoff_initial_secs",
        ),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nsupervision = { stable_after_secs = 0.0 }\n",
            "modules[0].supervision.stable_after_secs",
        ),
    ];
    for (text, field) in cases {
        let msg = load(text).expect_err(text).to_string();
        assert!(msg.contains("test.toml"), "{msg}");
        assert!(msg.contains(field), "{field} not in {msg}");
        assert!(msg.contains("must be greater than zero"), "{msg}");
    }
    let text = "[module_defaults]\nbackoff_initial_secs = 0.01\nstable_after_secs = 0.01\n";
    load(text).expect("small but positive");
}

#[test]
fn syntax_error_names_file_line_and_column() {
    let msg = load("# ports\n[server]\nport = 80 80\n")
        .expect_err("syntax error")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: line 3, column 11: "),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
    assert!(
        msg.len() > "config test.toml: line 3, column 11: ".len(),
        "{msg}"
    );
    // A bad value names the field and the place too.
    let msg = load("[server]\nport = \"high\"\n")
        .expect_err("bad port")
        .to_string();
    assert!(
        msg.contains("server.port") && msg.contains("line 2, column 8"),
        "{msg}"
    );
    assert_eq!(line_column("ab\ncé\nd", 6), (2, 3));
    assert_eq!(line_column("ab\ncé\nd", 5), (2, 2));
    assert_eq!(line_column("ab\ncé\nd", 7), (3, 1));
    assert_eq!(line_column("x", 99), (1, 2));
}

#[test]
fn rejects_bad_names_patterns_and_settings() {
    let cases = [
        ("[[modules]]\nname = \"a b\"\ncommand = [\"x\"]\n", "modules[0].name"),
        ("[[modules]]\nname = \"a\"\ncommand = []\n", "modules[0].command"),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n",
            "modules[1].name",
        ),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/x/{id:\\\\d+}\", type = \"http\" }]\n",
            "modules[0].routes[0].path",
        ),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"POST\", path = \"/ws\", type = \"websocket\" }]\n",
            "modules[0].routes[0].method",
        ),
        ("[module_defaults]\nfailure_threshold = 0\n", "module_defaults.failure_threshold"),
        ("[module_defaults]\nhealth_timeout_secs = -1\n", "module_defaults.health_timeout_secs"),
        ("[server]\nmax_header_bytes = 100\n", "server.max_header_bytes"),
        ("[module_defaults]\nmemory_budget_mib = 0\n", "module_defaults.memory_budget_mib"),
        ("[module_defaults]\nbusy_max_secs = 0\n", "module_defaults.busy_max_secs"),
        ("[ray]\nmemory_budget_mib = 0\n", "ray.memory_budget_mib"),
        ("[ray]\ncache_secs = -1\n", "ray.cache_secs"),
        ("[module_defaults]\nnice = 20\n", "module_defaults.nice"),
        ("[module_defaults]\nnice = -1\n", "module_defaults.nice"),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"POST\", path = \"/x\", type = \"http\", cache_secs = 1 }]\n",
            "modules[0].routes[0].cache_secs",
        ),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/x\", type = \"stream\", cache_secs = 1 }]\n",
            "modules[0].routes[0].cache_secs",
        ),
        (
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/x\", type = \"http\", cache_secs = 0 }]\n",
            "modules[0].routes[0].cache_secs",
        ),
    ];
    for (text, field) in cases {
        let msg = load(text).expect_err(text).to_string();
        assert!(msg.contains(field), "{field} not in {msg}");
        assert!(msg.contains("test.toml"), "{msg}");
    }
}

#[test]
fn module_supervision_overrides_defaults() {
    let text = r#"
[module_defaults]
failure_threshold = 5
[[modules]]
name = "a"
command = ["x"]
supervision = { health_timeout_secs = 0.25 }
"#;
    let c = load(text).expect("valid");
    let s = &c.modules[0].supervision;
    assert_eq!(s.failure_threshold, 5);
    assert_eq!(s.health_timeout, Duration::from_millis(250));
    assert_eq!(s.health_interval, Duration::from_secs(1));
}

#[test]
fn busy_max_and_memory_budget_default_and_are_overridden_per_module() {
    let text = r#"
[module_defaults]
memory_budget_mib = 512
[[modules]]
name = "a"
command = ["x"]
[[modules]]
name = "b"
command = ["x"]
supervision = { busy_max_secs = 5, memory_budget_mib = 64 }
"#;
    let c = load(text).expect("valid");
    let (a, b) = (&c.modules[0].supervision, &c.modules[1].supervision);
    assert_eq!(a.busy_max, crate::config::DEFAULT_BUSY_MAX);
    assert_eq!(a.memory_budget, Some(512 << 20));
    assert_eq!(b.busy_max, Duration::from_secs(5));
    assert_eq!(b.memory_budget, Some(64 << 20));
    assert_eq!(load("").expect("valid").module_defaults.memory_budget, None);
    let ray = load("[ray]\nmemory_budget_mib = 2048\n")
        .expect("valid")
        .ray;
    assert_eq!(ray.memory_budget, Some(2048 << 20));
}

#[test]
fn route_cache_and_ray_cache_secs() {
    let text = "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/x\", type = \"http\", cache_secs = 1.5 }]\n";
    let c = load(text).expect("valid");
    assert_eq!(
        c.modules[0].routes[0].cache,
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        c.ray.cache,
        Some(crate::config::ray_settings::DEFAULT_CACHE)
    );
    assert_eq!(
        load("[ray]\ncache_secs = 0\n").expect("valid").ray.cache,
        None
    );
}

#[test]
fn connection_limits_default_and_are_overridden_per_module() {
    let c = load("[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n").expect("valid");
    let limits = c.modules[0].supervision.connection_limits();
    assert_eq!(limits.max_connections, DEFAULT_MAX_CONNECTIONS);
    assert_eq!(limits.max_queued, DEFAULT_MAX_QUEUED_REQUESTS);
    assert_eq!(limits.max_long_lived, DEFAULT_MAX_LONG_LIVED);
    let text = r#"
[module_defaults]
max_connections = 10
max_queued_requests = 0
max_long_lived_connections = 7
[[modules]]
name = "a"
command = ["x"]
[[modules]]
name = "b"
command = ["x"]
supervision = { max_connections = 2, max_long_lived_connections = 3 }
"#;
    let c = load(text).expect("valid");
    let a = c.modules[0].supervision.connection_limits();
    let b = c.modules[1].supervision.connection_limits();
    assert_eq!(
        (a.max_connections, a.max_queued, a.max_long_lived),
        (10, 0, 7)
    );
    assert_eq!(
        (b.max_connections, b.max_queued, b.max_long_lived),
        (2, 0, 3)
    );
}

#[test]
fn bad_connection_limits_name_file_field_and_problem() {
    let msg = load("[module_defaults]\nmax_connections = 0\n")
        .expect_err("zero")
        .to_string();
    assert_eq!(
        msg,
        "config test.toml: module_defaults.max_connections: must be at least 1"
    );
    let msg = load(
        "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nsupervision = { max_connections = 0 }\n",
    )
    .expect_err("zero")
    .to_string();
    assert_eq!(
        msg,
        "config test.toml: modules[0].supervision.max_connections: must be at least 1"
    );
    let msg = load("[module_defaults]\nmax_long_lived_connections = 0\n")
        .expect_err("zero")
        .to_string();
    assert_eq!(
        msg,
        "config test.toml: module_defaults.max_long_lived_connections: must be at least 1"
    );
    let msg = load("[module_defaults]\nmax_queued_requests = -1\n")
        .expect_err("negative")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: module_defaults.max_queued_requests: ")
            && msg.contains("line 2"),
        "{msg}"
    );
}

#[test]
fn added_modules_are_checked_against_the_files() {
    let mut c = load(
        "[[modules]]\nname = \"mine\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/api/jobs/\", type = \"http\" }]\n",
    )
    .expect("valid");
    let clash = "[[modules]]\nname = \"JobHead\"\ncommand = [\"py\"]\nroutes = [{ method = \"GET\", path = \"/api/jobs/\", type = \"http\" }]\n";
    let msg = c
        .add_modules_toml("<ray>", clash)
        .expect_err("clash")
        .to_string();
    assert!(
        msg.contains("<ray>") && msg.contains("\"mine\"") && msg.contains("\"JobHead\""),
        "{msg}"
    );
    let same_name = "[[modules]]\nname = \"mine\"\ncommand = [\"py\"]\n";
    assert!(c.add_modules_toml("<ray>", same_name).is_err());
    let fine = "[[modules]]\nname = \"NodeHead\"\ncommand = [\"py\"]\nroutes = [{ method = \"GET\", path = \"/nodes\", type = \"http\" }]\n";
    c.add_modules_toml("<ray>", fine).expect("added");
    assert_eq!(c.modules.len(), 2);
    assert_eq!(c.modules[1].supervision, c.module_defaults);
}

#[test]
fn ray_settings_default_to_auto_with_no_python_named() {
    let c = load("").expect("valid");
    assert_eq!(c.ray, RaySettings::default());
    assert_eq!(c.ray.python, None);
    let c = load("[ray]\nmodules = \"off\"\npython = \"/opt/py\"\n").expect("valid");
    assert_eq!(c.ray.modules, RayModules::Off);
    assert_eq!(
        c.ray.python,
        Some(RayPython {
            program: "/opt/py".to_owned(),
            source: PythonSource::ConfigFile("test.toml".to_owned()),
        })
    );
    assert_eq!(c.ray.launch, RayLaunch::Fork);
    let c = load("[ray]\nlaunch = \"standalone\"\n").expect("valid");
    assert_eq!(c.ray.launch, RayLaunch::Standalone);
    assert!(load("[ray]\nmodules = \"maybe\"\n").is_err());
    assert_eq!(c.ray.gcs_gone_after, Duration::from_secs(60));
    let c = load("[ray]\ngcs_gone_secs = 2.5\n").expect("valid");
    assert_eq!(c.ray.gcs_gone_after, Duration::from_millis(2500));
    assert!(load("[ray]\ngcs_gone_secs = 0\n").is_err());
    assert!(load("[ray]\nlaunch = \"spawn\"\n").is_err());
}

/// A route's `fallback` names another module of the config; only a `GET`
/// `http` route (one the host may send again) has one.
#[test]
fn route_fallbacks_are_checked() {
    let two = |route: &str| {
        format!(
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{route}]\n\
             [[modules]]\nname = \"b\"\ncommand = [\"y\"]\n"
        )
    };
    let c = load(&two(
        r#"{ method = "GET", path = "/a", type = "http", fallback = "b" }"#,
    ))
    .expect("valid");
    assert_eq!(c.modules[0].routes[0].fallback.as_deref(), Some("b"));
    let only_get = "only a GET http route can have a fallback";
    for (route, problem) in [
        (
            r#"{ method = "POST", path = "/a", type = "http", fallback = "b" }"#,
            only_get,
        ),
        (
            r#"{ method = "GET", path = "/a", type = "stream", fallback = "b" }"#,
            only_get,
        ),
        (
            r#"{ method = "GET", path = "/a", type = "http", fallback = "a" }"#,
            "names the route's own module",
        ),
        (
            r#"{ method = "GET", path = "/a", type = "http", fallback = "c" }"#,
            "\"c\" is no module",
        ),
    ] {
        let msg = load(&two(route)).expect_err(route).to_string();
        assert_eq!(
            msg,
            format!("config test.toml: modules[0].routes[0].fallback: {problem}")
        );
    }
}

/// `[ray] on_demand` names modules (Ray's five idle ones unless set; `[]`
/// none), each once; a module's `start` is at launch unless it says.
#[test]
fn modules_started_on_demand_are_named_and_checked() {
    let c = load("").expect("valid");
    assert_eq!(
        c.ray.on_demand,
        ["DataHead", "JobHead", "ServeHead", "StateHead", "TrainHead"]
    );
    assert!(c.modules.iter().all(|m| m.start == Start::AtLaunch));
    let c = load("[ray]\non_demand = []\n").expect("valid");
    assert!(c.ray.on_demand.is_empty());
    for (text, problem) in [
        (
            "[ray]\non_demand = [\"Serve Head\"]\n",
            "ray.on_demand[0]: \"Serve Head\" must match [A-Za-z0-9_-]+",
        ),
        (
            "[ray]\non_demand = [\"DataHead\", \"DataHead\"]\n",
            "ray.on_demand[1]: \"DataHead\" is named twice",
        ),
    ] {
        let msg = load(text).expect_err(text).to_string();
        assert_eq!(msg, format!("config test.toml: {problem}"));
    }
    let module = "[[modules]]\nname = \"m\"\ncommand = [\"x\"]\n";
    let c = load(&format!("{module}start = \"on_demand\"\n")).expect("valid");
    assert_eq!(c.modules[0].start, Start::OnDemand);
    let msg = load(&format!("{module}start = \"later\"\n"))
        .expect_err("unknown")
        .to_string();
    assert!(msg.contains("modules") && msg.contains("later"), "{msg}");
}

/// `--ray-python` (or its variable) wins over `[ray] python`, and an
/// empty name is refused naming the field.
#[test]
fn ray_python_flag_wins_over_the_file() {
    let text = "[ray]\npython = \"/opt/file-py\"\n";
    let c =
        Config::from_toml("t.toml", text, &cli(&["--ray-python", "/opt/flag-py"])).expect("valid");
    assert_eq!(
        c.ray.python,
        Some(RayPython {
            program: "/opt/flag-py".to_owned(),
            source: PythonSource::Flag,
        })
    );
    let mut from_env = cli(&["--ray-python", "/opt/env-py"]);
    from_env.ray_python_from_env = true;
    let c = Config::from_toml("t.toml", text, &from_env).expect("valid");
    assert_eq!(c.ray.python.map(|p| p.source), Some(PythonSource::Env));
    let msg = load("[ray]\npython = \"\"\n")
        .expect_err("empty")
        .to_string();
    assert_eq!(msg, "config test.toml: ray.python: must name a program");
}

fn names(c: &Config) -> Vec<&str> {
    c.modules.iter().map(|m| m.name.as_str()).collect()
}

/// A file laid over the built-in config keeps the built-in modules unless
/// it lists its own or says `builtin_modules = false`; `true` keeps both.
#[test]
fn a_file_keeps_the_builtin_modules_unless_it_lists_its_own() {
    let builtin = Config::builtin(&cli(&[])).expect("built-in");
    let builtin_names = names(&builtin);
    assert_eq!(builtin_names, ["example", "logs"]);
    let c = load("[ray]\npython = \"/opt/py\"\n").expect("valid");
    assert_eq!(names(&c), builtin_names);
    let c =
        load("[server]\nport = 9000\n[module_defaults]\nfailure_threshold = 7\n").expect("valid");
    assert_eq!((c.port, names(&c)), (9000, builtin_names.clone()));
    // The file's defaults apply to the built-in modules too.
    assert!(c
        .modules
        .iter()
        .all(|m| m.supervision.failure_threshold == 7));
    let mine = "[[modules]]\nname = \"mine\"\ncommand = [\"x\"]\n";
    assert_eq!(names(&load(mine).expect("valid")), ["mine"]);
    assert!(load("modules = []\n").expect("valid").modules.is_empty());
    assert!(load("builtin_modules = false\n")
        .expect("valid")
        .modules
        .is_empty());
    let both = format!("builtin_modules = true\n{mine}");
    assert_eq!(
        names(&load(&both).expect("valid")),
        ["example", "logs", "mine"]
    );
    let only_mine = format!("builtin_modules = false\n{mine}");
    assert_eq!(names(&load(&only_mine).expect("valid")), ["mine"]);
}

/// Beside the built-in modules, a module of the file is checked against
/// them, and its errors name the file and its own index.
#[test]
fn a_file_module_beside_the_builtin_ones_is_checked_against_them() {
    let text = "builtin_modules = true\n[[modules]]\nname = \"logs\"\ncommand = [\"x\"]\n";
    let msg = load(text).expect_err("same name").to_string();
    assert_eq!(
        msg,
        "config test.toml: modules[0].name: \"logs\" is already the name of an earlier module (a built-in one, or one of the config's)"
    );
    let text = "builtin_modules = true\n[[modules]]\nname = \"mine\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/api/example/hello\", type = \"http\" }]\n";
    let msg = load(text).expect_err("same route").to_string();
    assert!(
        msg.starts_with("config test.toml: modules[0].routes[0].path: ")
            && msg.contains("\"example\"")
            && msg.contains("\"mine\""),
        "{msg}"
    );
    let msg = load("builtin_modules = \"yes\"\n")
        .expect_err("not a bool")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: builtin_modules: ") && msg.contains("line 1"),
        "{msg}"
    );
}

/// What `--check-config` prints loads back to the same config, and prints
/// the same again.
#[test]
fn the_effective_config_loads_back_unchanged() {
    let texts = [
        "",
        "[ray]\npython = \"/opt/py\"\nlaunch = \"standalone\"\ngcs_gone_secs = 0.1\n",
        r#"
[server]
host = "::1"
port = 0
session_dir = "/tmp/élan/session"
max_header_bytes = 9000
http_response_timeout_secs = 1.000000001
shutdown_grace_secs = 0.3
client_send_timeout_secs = 2.5
client_body_timeout_secs = 7
worker_threads = 3
max_connections = 5000
cgroups = "off"
log_rotation_max_bytes = 1048576
log_rotation_backup_count = 0
allowed_hosts = ["Dash.Example.com"]
allowed_origins = ["HTTPS://Dash.Example.com:443"]
[module_defaults]
failure_threshold = 5
backoff_initial_secs = 0.1
max_queued_requests = 0
[ray]
modules = "off"
client_port = 0
on_demand = ["ServeHead"]
[[modules]]
name = "a"
start = "on_demand"
command = ["prog", "--flag", "with \"quotes\""]
env = { B = "2", A = "x=y" }
supervision = { health_timeout_secs = 0.25, failure_threshold = 5, max_connections = 2 }
routes = [
  { method = "get", path = "/api/a/{id}", type = "http", fallback = "b" },
  { method = "GET", path = "/api/a/{id}/ws", type = "websocket" },
]
[[modules]]
name = "b"
command = ["b"]
"#,
    ];
    for text in texts {
        let first = load(text).expect(text);
        let printed = first.to_toml();
        let again = Config::from_toml("printed.toml", &printed, &cli(&[]))
            .unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again.to_toml(), printed);
        // The configs agree where the text cannot show it: the typed values.
        let typed = |c: &Config| {
            let mut c = c.clone();
            c.ray.python = c.ray.python.map(|p| RayPython {
                source: PythonSource::Flag,
                ..p
            });
            format!("{c:?}")
        };
        assert_eq!(typed(&again), typed(&first), "{printed}");
    }
    let printed = load("").expect("valid").to_toml();
    assert!(printed.contains("builtin_modules = false"), "{printed}");
    assert!(printed.contains("name = \"logs\""), "{printed}");
}

/// The client idle timeouts default to nginx's 60 s, are read in
/// seconds, and 0 (which would cut every wait) is refused.
#[test]
fn client_idle_timeouts_default_to_60_s_and_refuse_0() {
    let c = load("").expect("valid");
    assert_eq!(c.server.client_send_timeout, Duration::from_secs(60));
    assert_eq!(c.server.client_body_timeout, Duration::from_secs(60));
    let c = load("[server]\nclient_send_timeout_secs = 2.5\nclient_body_timeout_secs = 7\n")
        .expect("valid");
    assert_eq!(c.server.client_send_timeout, Duration::from_millis(2500));
    assert_eq!(c.server.client_body_timeout, Duration::from_secs(7));
    for field in ["client_send_timeout_secs", "client_body_timeout_secs"] {
        let msg = load(&format!("[server]\n{field} = 0\n"))
            .expect_err(field)
            .to_string();
        assert_eq!(
            msg,
            format!("config test.toml: server.{field}: must be more than 0")
        );
    }
}

#[test]
fn client_connection_cap_is_derived_unless_set() {
    let c = load("").expect("valid");
    assert_eq!(c.server.max_connections, None);
    assert_eq!(c.server.cgroups, CgroupMode::Auto);
    let c = load("[server]\nmax_connections = 5000\ncgroups = \"off\"\n").expect("valid");
    assert_eq!(c.server.max_connections, Some(5000));
    assert_eq!(c.server.cgroups, CgroupMode::Off);
    let msg = load("[server]\nmax_connections = 0\n")
        .expect_err("zero")
        .to_string();
    assert_eq!(
        msg,
        "config test.toml: server.max_connections: must be at least 1"
    );
    let msg = load("[server]\nmax_connections = -5\n")
        .expect_err("negative")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: server.max_connections: ") && msg.contains("line 2"),
        "{msg}"
    );
    let msg = load("[server]\ncgroups = \"yes\"\n")
        .expect_err("bad mode")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: server.cgroups: ") && msg.contains("auto"),
        "{msg}"
    );
}

/// Log rotation defaults to Ray's (512 MiB, 5 backups); the file's keys
/// set it, and Ray's variables (here their flags) win over the file.
#[test]
fn log_rotation_defaults_to_rays_and_rays_variables_win() {
    let c = load("").expect("valid");
    assert_eq!(
        c.server.log_rotation,
        Rotation {
            max_bytes: 512 * 1024 * 1024,
            backup_count: 5
        }
    );
    let file = "[server]\nlog_rotation_max_bytes = 1000\nlog_rotation_backup_count = 2\n";
    let c = load(file).expect("valid");
    assert_eq!(
        (
            c.server.log_rotation.max_bytes,
            c.server.log_rotation.backup_count
        ),
        (1000, 2)
    );
    let over = cli(&[
        "--log-rotation-max-bytes",
        "0",
        "--log-rotation-backup-count",
        "9",
    ]);
    let c = Config::from_toml("test.toml", file, &over).expect("valid");
    assert_eq!(
        (
            c.server.log_rotation.max_bytes,
            c.server.log_rotation.backup_count
        ),
        (0, 9)
    );
    let msg = load("[server]\nlog_rotation_max_bytes = -1\n")
        .expect_err("negative")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: server.log_rotation_max_bytes: "),
        "{msg}"
    );
}

/// Bad `server.allowed_hosts` and `allowed_origins` entries are config
/// errors naming the file and the entry; an origin listed twice is kept once.
#[test]
fn bad_allowed_entries_are_config_errors_naming_file_and_field() {
    let cli = cli(&[]);
    for (text, field) in [
        (
            "[server]\nallowed_hosts = [\"ok.example\", \"a:1\"]\n",
            "server.allowed_hosts[1]",
        ),
        (
            "[server]\nallowed_origins = [\"*\"]\n",
            "server.allowed_origins[0]",
        ),
    ] {
        let error = Config::from_toml("t.toml", text, &cli)
            .expect_err(text)
            .to_string();
        assert!(
            error.starts_with(&format!("config t.toml: {field}: ")),
            "{error}"
        );
    }
    let config = Config::from_toml(
        "t.toml",
        "[server]\nallowed_origins = [\"https://a.example\", \"HTTPS://A.example:443\"]\n",
        &cli,
    )
    .expect("valid");
    assert_eq!(config.server.allowed_origins, ["https://a.example"]);
    assert!(config.server.allowed_hosts.is_empty());
}

/// The dashboard port's TLS needs both files, from any of the file, the
/// variables and the flags; one alone names the other's field.
#[test]
fn tls_needs_both_the_certificate_and_the_key() {
    let both = "[server]\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n";
    let tls = load(both).expect("valid").server.tls.expect("tls on");
    assert_eq!(tls.cert, PathBuf::from("/c.pem"));
    assert_eq!(tls.key, PathBuf::from("/k.pem"));
    let flags = Config::from_toml(
        "t.toml",
        both,
        &cli(&["--tls-cert", "/flag.pem", "--tls-key", "/flag.key"]),
    )
    .expect("valid");
    assert_eq!(
        flags.server.tls.expect("tls on").cert,
        PathBuf::from("/flag.pem")
    );
    assert!(load("").expect("valid").server.tls.is_none());
    let msg = load("[server]\ntls_cert = \"/c.pem\"\n")
        .expect_err("no key")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: server.tls_key: must be set with server.tls_cert"),
        "{msg}"
    );
    let msg = load("[server]\ntls_key = \"/k.pem\"\n")
        .expect_err("no cert")
        .to_string();
    assert!(
        msg.starts_with("config test.toml: server.tls_cert: must be set with server.tls_key"),
        "{msg}"
    );
}

/// Clean absolute paths are taken as the URL prefix, and the empty one
/// means `/`; anything else names `server.url_prefix`.
#[test]
fn url_prefix_is_a_clean_absolute_path() {
    for good in ["", "/ray", "/a.b/c-d_e~f/9"] {
        let text = format!("[server]\nurl_prefix = {good:?}\n");
        assert_eq!(load(&text).expect(good).server.url_prefix, good);
    }
    let msg = load("[server]\nurl_prefix = \"/ray/\"\n")
        .expect_err("trailing slash")
        .to_string();
    assert_eq!(
        msg,
        "config test.toml: server.url_prefix: \"/ray/\" must not end with '/' (leave it unset to serve at /)"
    );
}
