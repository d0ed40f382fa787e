//! ray-dashd: the head-node web process of a Ray cluster.
//!
//! # Layout
//!
//! Layers, each using only those below it (`scripts/module-cycles src`
//! finds any two modules that reach each other):
//!
//! 1. [`error`], [`session`] (the session folder, its `sockets/` and
//!    `logs/`), [`logging`], [`shutdown`], [`cli`], [`builtin`] (the
//!    programs the binary carries besides the server), [`wheel`] (the
//!    Python environment the wheel installed the binary into) and
//!    [`descriptors`] (the open-file limit and the client connections it
//!    leaves room for), [`fault`] (faults tests inject), [`sched`] (the
//!    CPU time slices of the host's threads), [`allocator`] (glibc's
//!    malloc settings): the foundations (of which
//!    `cli` names `builtin`, `session` names `error` and `logging` names
//!    `session`).
//! 2. [`routes`]: what a module route is and the table that finds it, and
//!    the host's own routes, declared once ([`routes::host`]).
//!    [`metrics`]: the host's series and their text format (the proxy
//!    and the supervisor record into it).
//! 3. [`config`]: the command line and the TOML config (Ray's settings
//!    included), validated into typed values before anything binds or
//!    spawns.
//! 4. [`connection`]: HTTP/1.1 to a module incarnation's Unix socket,
//!    pooled.
//! 5. [`supervisor`]: one task per module; spawn, health-check, restart.
//! 6. [`proxy`] (forwarding module routes) and [`ray`] (Ray's own
//!    dashboard modules, and what Ray's dashboard parent serves itself:
//!    token auth, GCS check), side by side; then [`reload`] (a config's
//!    modules applied to the supervisor and the proxy's routes).
//! 7. [`server`]: the request guard, the host's own routes and UI, the
//!    accept loop.
//! 8. This file ([`launch`], [`run`]) and `main.rs`.

pub mod allocator;
pub mod builtin;
pub mod cli;
pub mod config;
pub mod connection;
pub mod descriptors;
pub mod error;
pub mod fault;
pub mod file_pages;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod ray;
pub mod reload;
pub mod routes;
pub mod sched;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod supervisor;
pub mod wheel;

/// The linker script `build.rs` writes from `link/ray-dashd.order`, for its
/// tests (the build script cannot have any).
#[cfg(test)]
#[path = "../link/script.rs"]
mod link_script;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::cli::Cli;
use crate::config::Config;
use crate::error::StartupError;
use crate::proxy::Proxy;
use crate::reload::{ReloadSource, Reloader};
use crate::server::AppState;
use crate::session::Session;
use crate::supervisor::Supervisor;

/// How long the exit waits for the modules' output to reach their files
/// once they have stopped: copying what a pipe holds takes microseconds;
/// only a pipe that a stray descendant keeps open takes the whole bound.
const OUTPUT_DRAIN: Duration = Duration::from_millis(500);

/// How long blocking helpers may hold up the exit once everything stopped.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// Extra time the modules get to stop, beyond their own stop grace.
const MODULE_STOP_SLACK: Duration = Duration::from_secs(2);

/// How long start-up may take before its file pages are let go anyway
/// (a module still starting then maps little more).
const STARTED_WITHIN: Duration = Duration::from_secs(60);

/// How often [`let_go_after_starts`] looks whether a module is starting.
const STARTED_POLL: Duration = Duration::from_millis(250);

/// Why a ray-dashd that started has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// SIGTERM or SIGINT.
    Signal,
    /// The Ray head whose modules it hosted went away (see [`ray::gcs`]).
    RayHeadGone,
}

impl Stopped {
    /// The process's exit code: 0 after a signal, 3 when the head is gone.
    pub fn exit_code(self) -> u8 {
        match self {
            Stopped::Signal => 0,
            Stopped::RayHeadGone => 3,
        }
    }
}

/// The client cap: `server.max_connections`, or what `nofile` open files
/// leave room for besides the modules' connections.
fn max_connections(config: &Config, nofile: u64) -> usize {
    let pools: Vec<usize> = config
        .modules
        .iter()
        .map(|m| m.supervision.max_connections)
        .collect();
    let long_lived = config.modules.iter().fold(0usize, |sum, m| {
        sum.saturating_add(m.supervision.max_long_lived)
    });
    let fits = descriptors::max_connections_for(nofile, &pools, long_lived);
    match config.server.max_connections {
        Some(set) if set > fits => {
            warn!(
                max_connections = set,
                fits,
                nofile,
                "server.max_connections is more than the open-file limit leaves room for; \
                 accepts may fail and module connections with them"
            );
            set
        }
        Some(set) => set,
        None => {
            if fits == descriptors::MIN_MAX_CONNECTIONS {
                warn!(
                    max_connections = fits,
                    nofile,
                    modules = pools.len(),
                    "the open-file limit leaves little room for clients; raise it (ulimit -n) \
                     or lower the modules' max_connections"
                );
            } else {
                info!(max_connections = fits, nofile, "client connections capped");
            }
            fits
        }
    }
}

/// Prepares the session, starts logging and the runtime, binds, and serves
/// until SIGTERM or SIGINT, or until the Ray head it serves is gone;
/// `config` was loaded from `cli`, which a reload reads again.
pub fn launch(cli: Cli, mut config: Config) -> Result<Stopped, StartupError> {
    // Before anything is prepared: a certificate that cannot be served is
    // a config error, and nothing should have started.
    let tls = match &config.server.tls {
        Some(files) => Some(Arc::new(server::tls::ServerTls::load(files)?)),
        None => None,
    };
    let session =
        Session::prepare(&config.session_dir)?.with_log_rotation(config.server.log_rotation);
    // Held until `launch` returns, after everything else stopped: its drop
    // flushes the last lines (the exit's reasons) to stderr and the file.
    let _log_guard = logging::init(&session);
    if allocator::map_large_blocks() {
        debug!(
            from = allocator::MAP_FROM,
            "large blocks are mapped on their own"
        );
    }
    if allocator::trim_periodically() {
        debug!(
            every_s = allocator::TRIM_EVERY.as_secs(),
            "the heap's free pages go back to the system periodically"
        );
    }
    let nofile = descriptors::raise_nofile_limit();
    // Before Ray's zygote (the first module) may start.
    supervisor::contain(config.server.cgroups);
    let mut builder = match config.server.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    // Its blocking pool (and the workers of a multi-threaded runtime) keep
    // the default time slice; see `sched`.
    let runtime = builder
        .enable_all()
        .on_thread_start(sched::default_slice)
        .build()
        .map_err(StartupError::Runtime)?;
    // What a reload reads again: the config as the command line names it,
    // and the modules hosted beyond it, added next.
    let file_modules = config.modules.len();
    // Ray's zygote, when it is started here already, is a tokio child.
    let ray::RayStart {
        head: ray_head,
        early,
        status: ray_status,
    } = {
        let _runtime = runtime.enter();
        ray::add_modules(&mut config, &session)?
    };
    // Token mode fails closed: Ray's own answer when its modules are
    // hosted (a release without token authentication ignores the mode, and
    // so does ray-dashd, with a warning); else the token found as Ray finds
    // it, and no start at all without one.
    let token = match &ray_head {
        Some(head) => head.parent.token.clone(),
        None => ray::auth::token_from_env(|name| std::env::var_os(name))?,
    };
    if ray_head.is_none() && token.is_some() {
        info!("RAY_AUTH_MODE=token: every request but the public ones must bear the token");
    }
    for module in &config.modules {
        Session::check_socket_path(&session.socket_path(&module.name))?;
    }
    let reload = ReloadSource::new(cli, file_modules, &config);
    // One thread serves everything: it asks for short time slices, so that
    // a probe waits less for a CPU on a busy head.
    if config.server.worker_threads == 1 {
        match sched::set_slice(Some(sched::SERVING_SLICE)) {
            Ok(()) => debug!(slice = ?sched::SERVING_SLICE, "serving thread's time slice set"),
            Err(error) => debug!(%error, "serving thread's time slice left at the default"),
        }
    }
    let served = runtime.block_on(async {
        let addr = SocketAddr::new(config.host, config.port);
        let listener = bind_listener(addr).map_err(|source| StartupError::Bind { addr, source })?;
        let signal = shutdown::signal().map_err(StartupError::Runtime)?;
        let (gone_tx, gone_rx) = tokio::sync::oneshot::channel();
        let mut ray_metrics = None;
        let parent = match &ray_head {
            Some(head) => {
                let bound = listener
                    .local_addr()
                    .map_err(|source| StartupError::Bind { addr, source })?;
                // Ray's dashboard metrics, on Ray's port, found as Ray's are.
                let head_ip = ray::gcs::head_ip(&head.gcs_address);
                let port = ray::metrics_port::port(|name| std::env::var(name).ok());
                let metrics_address = match ray::metrics_port::bind(head_ip, port).await {
                    Some(metrics_port) => {
                        let labels = metrics::ray_series::RayLabels {
                            version: head.parent.ray_version.clone(),
                            session_name: session_name(&session),
                        };
                        let series =
                            metrics::ray_series::RayMetrics::new(labels, head_ip.to_string());
                        let bound = metrics_port
                            .listener
                            .local_addr()
                            .map_or(port, |a| a.port());
                        ray_metrics = Some((metrics_port, Arc::new(series)));
                        Some(SocketAddr::new(head_ip, bound).to_string())
                    }
                    None => None,
                };
                let watcher = ray::watcher(head, bound, tls.is_some(), &config.server.url_prefix)?
                    .with_metrics_address(metrics_address);
                tokio::spawn(async move {
                    let _ = gone_tx.send(watcher.run().await);
                });
                Some(head.parent.clone())
            }
            None => None,
        };
        let mut stopped = Stopped::Signal;
        let shutdown = async {
            tokio::select! {
                () = signal => {}
                Ok(_gone) = gone_rx => {
                    info!("stopping: the Ray head is gone");
                    stopped = Stopped::RayHeadGone;
                }
            }
        };
        let prepared = Prepared {
            config,
            session,
            ray: parent,
            token,
            ray_status,
            early: early.into_iter().collect(),
            nofile,
            reload: Some(reload),
            tls,
            ray_metrics,
        };
        run(prepared, listener, shutdown).await;
        Ok(stopped)
    });
    // A blocking helper still running must not hold up the exit; the
    // modules are already stopped.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    // Their last words, still in the pipes, to their files.
    session::rotating::drain(OUTPUT_DRAIN);
    served
}

/// What start-up prepared for [`run`].
#[derive(Debug)]
pub struct Prepared {
    /// The config, Ray's modules included.
    pub config: Config,
    /// The session folder.
    pub session: Session,
    /// Ray's parent-side pages, when Ray's modules are hosted.
    pub ray: Option<ray::RayParent>,
    /// When given, only requests bearing it are served (token mode).
    pub token: Option<ray::auth::Token>,
    /// Whether Ray's modules are hosted, for the UI.
    pub ray_status: ray::RayStatus,
    /// Modules started already, for the supervisor to take over.
    pub early: Vec<supervisor::EarlyStart>,
    /// The open-file limit, which caps the clients served at once (unless
    /// `server.max_connections` says).
    pub nofile: u64,
    /// Where a reload (SIGHUP, `POST /api/reload`) reads the config again;
    /// `None`: no reload.
    pub reload: Option<ReloadSource>,
    /// The dashboard port's TLS (`server.tls_cert`), its files read again
    /// on SIGHUP; `None`: plain HTTP.
    pub tls: Option<Arc<server::tls::ServerTls>>,
    /// When Ray's modules are hosted and Ray's metrics port could be
    /// bound: that port, and Ray's dashboard series to serve there.
    pub ray_metrics: Option<(
        ray::metrics_port::MetricsPort,
        Arc<metrics::ray_series::RayMetrics>,
    )>,
}

/// The Ray session's name: its folder's (`session_<date>_<pid>`), through
/// the `session_latest` link.
fn session_name(session: &Session) -> String {
    let dir = std::fs::canonicalize(&session.dir).unwrap_or_else(|_| session.dir.clone());
    dir.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Once no module is starting, or [`STARTED_WITHIN`] after the start at the
/// latest, lets go of the file pages start-up mapped ([`file_pages`]), off
/// the runtime; then again each time the modules that started since (a
/// restart, a reload, one started on demand) are up, since starting one
/// maps the spawning code again.
async fn let_go_after_starts(supervisor: Arc<Supervisor>) {
    let starting = || {
        supervisor
            .modules()
            .iter()
            .any(|m| m.state() == supervisor::ModuleState::Starting)
    };
    let deadline = tokio::time::Instant::now() + STARTED_WITHIN;
    while tokio::time::Instant::now() < deadline && starting() {
        tokio::time::sleep(STARTED_POLL).await;
    }
    let mut first = true;
    loop {
        match tokio::task::spawn_blocking(file_pages::release).await {
            Ok(Ok(released)) if first => info!(
                mappings = released.mappings,
                released_kib = released.kib,
                "start-up's file pages let go"
            ),
            Ok(Ok(released)) => debug!(
                mappings = released.mappings,
                released_kib = released.kib,
                "file pages let go again after a module started"
            ),
            Ok(Err(error)) => debug!(%error, "file pages kept"),
            Err(error) => debug!(%error, "file pages kept"),
        }
        first = false;
        // A module starts, then is up (or failed) again.
        while !starting() {
            tokio::time::sleep(STARTED_POLL).await;
        }
        while starting() {
            tokio::time::sleep(STARTED_POLL).await;
        }
    }
}

/// Starts the modules (taking over those `prepared` has started) and
/// serves on `listener` until `shutdown` resolves, reloading the config on
/// SIGHUP; then drains the HTTP server, stops the modules and removes their
/// sockets.
pub async fn run(prepared: Prepared, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let Prepared {
        config,
        session,
        ray,
        token,
        ray_status,
        early,
        nofile,
        reload,
        tls,
        ray_metrics,
    } = prepared;
    let local = listener
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let metrics = match &ray_metrics {
        Some((_, ray)) => metrics::Metrics::new().with_ray(Arc::clone(ray)),
        None => metrics::Metrics::new(),
    };
    let metrics = Arc::new(metrics);
    let supervisor = Arc::new(Supervisor::start(&config.modules, &session, early, metrics));
    tokio::spawn(let_go_after_starts(Arc::clone(&supervisor)));
    let proxy = Arc::new(Proxy::new(supervisor.modules(), config.server.clone()));
    let metrics_stop = tokio_util::sync::CancellationToken::new();
    if let Some((port, ray)) = ray_metrics {
        let interval = ray::metrics_port::record_interval(|name| std::env::var(name).ok());
        ray::metrics_port::serve(
            port,
            ray,
            Arc::clone(&supervisor),
            interval,
            metrics_stop.clone(),
        );
    }
    let reloader = reload.map(|source| {
        Arc::new(Reloader::new(
            source,
            config.clone(),
            session.clone(),
            Arc::clone(&supervisor),
            Arc::clone(&proxy),
        ))
    });
    on_sighup(reloader.clone(), tls.clone());
    // The address actually bound decides whether Host is checked.
    let bound = listener.local_addr().map_or(config.host, |a| a.ip());
    let guard = server::guard::Guard::new(&config.server, bound, ray.is_some());
    let service = server::Dispatch::new(
        AppState {
            supervisor: Arc::clone(&supervisor),
            proxy,
            ray: ray.map(Arc::new),
            ray_status: Arc::new(ray_status),
            reloader,
            tls: tls.clone(),
        },
        guard,
        token,
        &config.server.url_prefix,
    );
    info!(
        addr = %local,
        session = %session.dir.display(),
        modules = config.modules.len(),
        "ray-dashd listening"
    );
    let max_connections = max_connections(&config, nofile);
    server::serve(
        listener,
        service,
        &config.server,
        max_connections,
        tls,
        shutdown,
    )
    .await;
    metrics_stop.cancel();

    let stop_budget = config
        .modules
        .iter()
        .map(|m| m.supervision.stop_grace)
        .max()
        .unwrap_or_default()
        + MODULE_STOP_SLACK;
    match tokio::time::timeout(stop_budget, supervisor.shutdown()).await {
        Ok(()) => info!("modules stopped"),
        Err(_) => warn!(
            budget_ms = stop_budget.as_millis() as u64,
            "modules did not stop in time"
        ),
    }
    supervisor.sweep().await;
}

/// Reloads the dashboard port's certificate and the config at every
/// SIGHUP, for the life of the runtime, all or nothing as `POST
/// /api/reload` does ([`server::reload_all`]). A reload that fails is
/// logged and changes nothing.
fn on_sighup(reloader: Option<Arc<Reloader>>, tls: Option<Arc<server::tls::ServerTls>>) {
    use tokio::signal::unix::{signal, SignalKind};
    if reloader.is_none() && tls.is_none() {
        return;
    }
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(error) => {
            warn!(%error, "cannot catch SIGHUP; reload with POST /api/reload instead");
            return;
        }
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            info!("SIGHUP: reloading the TLS certificate and the config");
            match server::reload_all(reloader.as_deref(), tls.as_ref()).await {
                Ok(report) => info!(%report, "SIGHUP: reloaded"),
                Err(error) => warn!(%error, "SIGHUP: reload refused; nothing changed"),
            }
        }
    });
}

/// The listen backlog of the dashboard port. tokio's `TcpListener::bind`
/// (mio) asks for 128: a burst of a few hundred connections, such as a
/// page's requests from many browsers at once, overflows it while the one
/// runtime thread serves, and each connection dropped there waits for its
/// client's SYN retransmit, 1 s later. The kernel caps it at
/// `net.core.somaxconn` (4096 by default since Linux 5.4).
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the dashboard port as `TcpListener::bind` does (`SO_REUSEADDR`),
/// with [`LISTEN_BACKLOG`].
fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
