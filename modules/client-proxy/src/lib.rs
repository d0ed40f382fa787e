//! The Ray Client proxy as a ray-dashd module.
//!
//! `ray.init("ray://head:10001")` clients connect to the gRPC port this
//! module listens on. Each new client gets a Ray client server process of
//! its own ("specific server", started as Ray starts it), and every call and
//! stream of the client is forwarded to that server as bytes. The module's
//! Unix socket serves the host's health check and
//! `GET /api/client_proxy/clients`.
//!
//! Layout: [`grpc`] serves Ray's three client services; [`proxy`] holds the
//! clients and decides when a server goes; [`servers`] starts, reaps and
//! stops servers and owns the port pool; [`runtime_env`] prepares a
//! client's runtime env; [`gcs`] makes the GCS calls the proxy makes itself;
//! [`wire`] reads the few messages the proxy must look into; [`incoming`]
//! takes the client port's connections (with Ray's TLS when it is on);
//! [`driver`] is the connection a server's `RayletDriver` calls take;
//! [`listeners`] tells who listens on a port; [`h2_settings`] are the
//! HTTP/2 settings of both sides.
//!
//! Ray's TLS (`RAY_USE_TLS` and the `RAY_TLS_*` files, read by
//! `ray-dashd-tls` as the host reads them) covers all three sides, as it
//! does Ray's proxier: clients connect with it, and the proxy dials the GCS
//! and its servers (which inherit the variables) with it.

pub mod args;
pub mod auth;
pub mod codec;
pub mod driver;
pub mod gcs;
pub mod grpc;
pub mod h2_settings;
pub mod http;
pub mod incoming;
pub mod listeners;
pub mod proxy;
pub mod runtime_env;
pub mod servers;
pub mod wire;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use ray_dashd_contract::{Backoff, LockExt};
use ray_dashd_sdk::ModuleEnv;
use ray_dashd_tls::RayTls;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::args::Args;
use crate::gcs::Gcs;
use crate::http::{HttpState, Listening};
use crate::proxy::{Proxy, Settings};
use crate::runtime_env::RuntimeEnvs;
use crate::servers::{Launcher, PidFile, PortPool, ServerCommand};

/// The pauses before another attempt to bind a client port that is taken
/// (or otherwise refused): 1 s first, doubling up to 30 s. A bind is one
/// system call, but a port held by Ray's own proxier stays held for the
/// life of the head: there is no point in asking every second for hours.
/// Once the port is free, the proxy listens within the cap.
const BIND_RETRIES: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// The entry point of both `ray-dashd client-proxy` and
/// `ray-dashd-client-proxy`: runs [`run`] on a runtime of one thread, until
/// SIGTERM or SIGINT.
pub fn main(args: Args) -> std::process::ExitCode {
    ray_dashd_sdk::init_tracing();
    // One thread: servers are tied to the proxy by a parent-death signal,
    // which the kernel ties to the thread that started them.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "client proxy failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the module until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let env = ModuleEnv::from_env()?;
    let shutdown = ray_dashd_sdk::shutdown_signal()?;

    let log_dir = args
        .log_dir
        .clone()
        .or_else(|| env.session_dir.as_ref().map(|s| s.join("logs")))
        .or_else(|| env.log_dir.clone())
        .with_context(|| {
            format!(
                "no --log-dir and no session folder ({}) for the servers' logs",
                ray_dashd_sdk::SESSION_DIR_VAR
            )
        })?;
    servers::check_log_dir(&log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;

    let gcs_address = match &args.gcs_address {
        Some(address) => Some(address.clone()),
        None => env.session_dir.as_deref().and_then(discover_gcs),
    };
    match &gcs_address {
        Some(address) => info!(gcs = %address, "using the GCS"),
        None => warn!("no GCS known (--gcs-address, or a Ray session): KV calls before a client's server exists will fail"),
    }
    let token = auth::token_from_env()?;
    if token.is_some() {
        info!("token authentication is on (RAY_AUTH_MODE=token)");
    }
    // The message is the whole story (variable, file, problem), one line.
    let tls = RayTls::from_env().map_err(|e| anyhow::Error::msg(e.to_string()))?;
    if let Some(tls) = &tls {
        info!(
            cert = %tls.cert_path().display(),
            ca = %tls.ca_path().display(),
            "Ray's TLS is on (RAY_USE_TLS): clients, the GCS and the servers are reached with it"
        );
    }
    // One line, as the TLS error's: the message names the cause.
    let gcs = gcs_address
        .as_deref()
        .map(|address| Gcs::new(address, token.as_ref(), tls.as_ref()))
        .transpose()
        .map_err(|e| anyhow::Error::msg(e.to_string()))?;

    let argv = if args.server_command.is_empty() {
        default_server_command(&args.python).await?
    } else {
        args.server_command.clone()
    };
    info!(command = ?argv, ports = %args.port_range, "Ray client servers");

    let pid_file =
        Arc::new(PidFile::new(env.session_dir.as_ref().map(|s| {
            s.join("sockets").join(format!("{}.servers", env.name))
        })));
    let leftovers = pid_file.stop_leftovers();
    if leftovers > 0 {
        warn!(
            count = leftovers,
            "stopped Ray client servers left by an earlier run"
        );
    }
    let launcher = Launcher::new(
        ServerCommand {
            argv,
            gcs_address: gcs_address.clone().unwrap_or_default(),
            log_dir,
            ready_timeout: args.server_ready_timeout,
            stop_grace: Duration::from_secs(2),
            ping: args.server_ping,
            tls: tls.clone(),
            own_listener: args.own_listener,
        },
        Arc::new(PortPool::from_source(&args.port_range)),
        pid_file,
    );
    let settings = Settings {
        python: args.python.clone(),
        warm_spare: args.warm_spare,
        server_wait: args.server_wait,
        logstream_tries: 5,
        logstream_pause: Duration::from_secs(2),
        first_message_timeout: Duration::from_secs(30),
        token: token.clone(),
    };
    let envs = RuntimeEnvs::new(
        args.python.clone(),
        gcs.clone(),
        args.runtime_env_agent_address.clone(),
        token,
    );
    let proxy = Proxy::new(settings, launcher, gcs, envs);

    let listening = Arc::new(Mutex::new(Listening::Starting));
    let stop = CancellationToken::new();
    let grpc_task = tokio::spawn(serve_grpc(
        proxy.clone(),
        format!("{}:{}", args.host, args.port),
        args.port,
        tls,
        listening.clone(),
        stop.clone(),
    ));

    let router = http::router(HttpState {
        proxy: proxy.clone(),
        listening,
    });
    let served = ray_dashd_sdk::serve_router_until(&env, router, shutdown).await;
    // The host allows a module a short grace before SIGKILL: stop the servers
    // first (all at once), then the client port.
    stop.cancel();
    proxy.stop_all().await;
    grpc_task.abort();
    served?;
    Ok(())
}

/// Binds the client port (trying again, with backoff, while another
/// process holds it) and serves Ray's client services there until `stop`.
/// The spare server is started once the port is bound: a proxy that
/// cannot listen has no client to give it to.
async fn serve_grpc(
    proxy: Arc<Proxy>,
    address: String,
    port: u16,
    tls: Option<RayTls>,
    listening: Arc<Mutex<Listening>>,
    stop: CancellationToken,
) {
    let set = |state: Listening| *listening.locked() = state;
    let mut retries = BIND_RETRIES;
    let mut told: Option<String> = None;
    let listener = loop {
        match tokio::net::TcpListener::bind(&address).await {
            Ok(listener) => break listener,
            Err(e) => {
                let retry = retries.next_delay();
                let why = if e.kind() == std::io::ErrorKind::AddrInUse {
                    port_taken(&address, port)
                } else {
                    format!("cannot listen on {address}: {e}")
                };
                // Said once (in the host's log too, through the health
                // check); each retry after that only at debug level.
                if told.as_deref() != Some(why.as_str()) {
                    warn!(%address, "{why}");
                    told = Some(why.clone());
                } else {
                    debug!(%address, retry_s = retry.as_secs(), error = %e, "the Ray client port is still not free");
                }
                set(Listening::Waiting {
                    why,
                    retry_after: retry,
                });
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    };
    let local: SocketAddr = match listener.local_addr() {
        Ok(local) => local,
        Err(e) => {
            set(Listening::Failed(format!(
                "cannot read the bound address: {e}"
            )));
            return;
        }
    };
    info!(address = %local, "Ray client proxy listening");
    set(Listening::On(local));
    proxy.refill_spare();
    let incoming = incoming::incoming(listener, tls);
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .initial_stream_window_size(Some(h2_settings::STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(h2_settings::CONNECTION_WINDOW_BYTES))
        .max_frame_size(Some(h2_settings::MAX_FRAME_BYTES))
        .add_service(grpc::DriverService::new(proxy.clone()))
        .add_service(grpc::DataService::new(proxy.clone()))
        .add_service(grpc::LogService::new(proxy))
        .serve_with_incoming_shutdown(incoming, stop.cancelled())
        .await;
    if let Err(e) = served {
        error!(error = %e, "the Ray client port stopped serving");
        set(Listening::Failed(format!("serving {local} failed: {e}")));
    }
}

/// Why the client port `address` cannot be bound, in one line: who holds it
/// (pid and command line, most often Ray's own proxier, `python -m
/// ray.util.client.server … --mode=proxy`) and the two ways out.
fn port_taken(address: &str, port: u16) -> String {
    let by = match listeners::holders(port) {
        Ok(holders) if !holders.is_empty() => {
            let more = match holders.len() - 1 {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            format!("pid {} ({}){more}", holders[0].pid, holders[0].command)
        }
        Ok(_) => "a process of another user".to_owned(),
        Err(e) => format!("another process (cannot tell which: {e})"),
    };
    format!(
        "the Ray client port {address} is taken by {by}; either start Ray with \
         `ray start --ray-client-server-port=<another port>` so that Ray's own proxier \
         listens there, or give ray-dashd's proxy another port with --ray-client-port \
         (or [ray] client_port); trying again with backoff"
    )
}

/// The GCS address of the head whose session folder is `session`: the
/// first line of `ray_current_cluster` in the folder above it (Ray's temp dir).
pub fn discover_gcs(session: &Path) -> Option<String> {
    let real = std::fs::canonicalize(session).ok()?;
    let text = std::fs::read_to_string(real.parent()?.join("ray_current_cluster")).ok()?;
    let address = text.lines().next()?.trim();
    (!address.is_empty()).then(|| address.to_owned())
}

/// `<python> <ray>/_private/workers/setup_worker.py -m ray.util.client.server`,
/// the way Ray starts a client server (setup_worker applies the runtime env
/// context before the server starts).
async fn default_server_command(python: &str) -> anyhow::Result<Vec<String>> {
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(python)
            .args([
                "-c",
                "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('ray').origin))",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{python} took over 30 s to say where Ray is"))?
    .with_context(|| format!("cannot run {python}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{python} cannot find the `ray` package ({}); pass --python or --server-command",
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    let ray_dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let setup_worker = ray_dir.join("_private/workers/setup_worker.py");
    anyhow::ensure!(
        setup_worker.is_file(),
        "{} is missing",
        setup_worker.display()
    );
    Ok(vec![
        python.to_owned(),
        setup_worker.display().to_string(),
        "-m".into(),
        "ray.util.client.server".into(),
    ])
}
