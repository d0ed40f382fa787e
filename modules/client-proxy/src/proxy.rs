//! The proxy's state: its clients, each with the server it was given, the
//! warm spare server, and the policy of when a client's server goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ray_dashd_contract::LockExt;
use ray_proto::rpc::InitRequest;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::gcs::Gcs;
use crate::runtime_env::{self, EnvHint, RuntimeEnvError, RuntimeEnvs};
use crate::servers::{self, Launcher, ServerError, SpecificServer};

/// How the proxy behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The Python that has Ray (the servers' `py_executable`).
    pub python: String,
    /// Keep one server without a runtime env started ahead of need.
    pub warm_spare: bool,
    /// Longest wait for a client's server (its runtime env included).
    pub server_wait: Duration,
    /// Logstream: tries to find the client, and the pause between them.
    pub logstream_tries: u32,
    /// See `logstream_tries`.
    pub logstream_pause: Duration,
    /// Longest wait for a new client's first message.
    pub first_message_timeout: Duration,
    /// The cluster's token, when calls must carry it.
    pub token: Option<crate::auth::Token>,
}

/// Where a client's server is.
#[derive(Debug, Clone)]
pub enum Slot {
    /// Being started (its runtime env being created, or the process).
    Starting,
    /// Running.
    Ready(Arc<SpecificServer>),
    /// It could not be started; the words say why.
    Failed(String),
}

/// One client, from its first `Datapath` to its cleanup.
#[derive(Debug)]
pub struct Client {
    /// The `client_id` it named itself with.
    pub id: String,
    /// When it first connected.
    pub since: SystemTime,
    slot: watch::Sender<Slot>,
    state: Mutex<ClientState>,
}

#[derive(Debug, Default)]
struct ClientState {
    /// Generation of its newest `Datapath` stream.
    stream: u64,
    /// Whether its newest stream is a reconnection.
    reconnected: bool,
    /// Whether that stream is open.
    attached: bool,
    /// How long to keep it after its stream ends without a cleanup.
    grace: Duration,
    /// Whether its server confirmed a `connection_cleanup`.
    cleanup: bool,
}

impl Client {
    /// Its server, as things stand.
    pub fn slot(&self) -> Slot {
        self.slot.borrow().clone()
    }

    /// Waits up to `limit` for its server to be running.
    pub async fn server(&self, limit: Duration) -> Result<Arc<SpecificServer>, NoServer> {
        if let Slot::Ready(server) = &*self.slot.borrow() {
            return Ok(server.clone());
        }
        let mut slot = self.slot.subscribe();
        let waited =
            tokio::time::timeout(limit, slot.wait_for(|s| !matches!(s, Slot::Starting))).await;
        match waited {
            Err(_) => Err(NoServer::NotReadyWithin {
                client: self.id.clone(),
                limit,
            }),
            Ok(Err(_)) => Err(NoServer::ShuttingDown),
            Ok(Ok(slot)) => match &*slot {
                Slot::Ready(server) => Ok(server.clone()),
                Slot::Failed(why) => Err(NoServer::Failed(why.clone())),
                Slot::Starting => unreachable!("waited for a slot that is not Starting"),
            },
        }
    }

    /// Its server if running now.
    pub fn ready_server(&self) -> Option<Arc<SpecificServer>> {
        match &*self.slot.borrow() {
            Slot::Ready(server) if server.exit_status().is_none() => Some(server.clone()),
            _ => None,
        }
    }

    /// Marks the client's server as never to come, unless it has settled
    /// already.
    pub fn fail_if_starting(&self, why: &str) {
        self.slot.send_if_modified(|slot| match slot {
            Slot::Starting => {
                *slot = Slot::Failed(why.to_owned());
                true
            }
            _ => false,
        });
    }

    /// Records that its server confirmed a `connection_cleanup`.
    pub fn cleanup_confirmed(&self) {
        self.lock().cleanup = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClientState> {
        self.state.locked()
    }
}

/// A client as `/api/client_proxy/clients` shows it.
#[derive(Debug, Serialize)]
pub struct ClientView {
    /// Its `client_id`.
    pub id: String,
    /// Seconds since the Unix epoch of its first connection.
    pub connected_since: f64,
    /// Whether its data stream is open now.
    pub attached: bool,
    /// Whether its newest data stream is a reconnection.
    pub reconnected: bool,
    /// `starting`, `ready` or `failed`.
    pub server_state: &'static str,
    /// Its server's pid, once running.
    pub server_pid: Option<u32>,
    /// Its server's port, once running.
    pub server_port: Option<u16>,
    /// Why its server could not be had.
    pub error: Option<String>,
}

/// Why a client has no server to forward to.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NoServer {
    /// Its server was not running within the wait.
    #[error("the Ray client server of client {client} was not ready within {limit:?}")]
    NotReadyWithin {
        /// The client's `client_id`.
        client: String,
        /// The wait.
        limit: Duration,
    },
    /// The proxy is shutting down.
    #[error("the proxy is shutting down")]
    ShuttingDown,
    /// Its server could not be had: the words its slot keeps.
    #[error("{0}")]
    Failed(String),
}

/// Why a server could not be started for a client.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No port, or the server did not start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// Its runtime env could not be prepared.
    #[error(transparent)]
    RuntimeEnv(#[from] RuntimeEnvError),
    /// Its runtime env took longer than the wait for a server.
    #[error("creating the runtime env took over {0:?}")]
    RuntimeEnvTimeout(Duration),
    /// The task starting it panicked or was cancelled.
    #[error("starting the server failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Why a client could not be registered or found.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A new client named itself like one already here.
    #[error("client {0} is already connected")]
    Duplicate(String),
    /// A reconnecting client is gone (its grace period ran out).
    #[error("Attempted to reconnect a session that has already been cleaned up (client {0})")]
    Unknown(String),
}

/// The proxy.
#[derive(Debug)]
pub struct Proxy {
    /// Its settings.
    pub settings: Settings,
    /// Starts servers.
    pub launcher: Launcher,
    /// The GCS, when known.
    pub gcs: Option<Gcs>,
    envs: RuntimeEnvs,
    clients: Mutex<HashMap<String, Arc<Client>>>,
    spare: Mutex<Spare>,
    generation: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Spare {
    ready: Option<Arc<SpecificServer>>,
    starting: bool,
    failures: u32,
}

/// Spare starts that may fail in a row before warming pauses.
const SPARE_MAX_FAILURES: u32 = 3;
/// How long warming pauses then.
const SPARE_RETRY: Duration = Duration::from_secs(30);

impl Proxy {
    /// A proxy with no clients.
    pub fn new(
        settings: Settings,
        launcher: Launcher,
        gcs: Option<Gcs>,
        envs: RuntimeEnvs,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            settings,
            launcher,
            gcs,
            envs,
            clients: Mutex::new(HashMap::new()),
            spare: Mutex::new(Spare::default()),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Client>>> {
        self.clients.locked()
    }

    /// How many clients the proxy holds (connected or within their grace).
    pub fn num_clients(&self) -> usize {
        self.clients().len()
    }

    /// The client named `id`.
    pub fn client(&self, id: &str) -> Option<Arc<Client>> {
        self.clients().get(id).cloned()
    }

    /// Every client, for the HTTP view.
    pub fn views(&self) -> Vec<ClientView> {
        let clients: Vec<Arc<Client>> = self.clients().values().cloned().collect();
        let mut views: Vec<ClientView> = clients
            .iter()
            .map(|client| {
                let state = client.lock();
                let (server_state, server, error) = match client.slot() {
                    Slot::Starting => ("starting", None, None),
                    Slot::Ready(server) => ("ready", Some(server), None),
                    Slot::Failed(why) => ("failed", None, Some(why)),
                };
                ClientView {
                    id: client.id.clone(),
                    connected_since: client
                        .since
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()),
                    attached: state.attached,
                    reconnected: state.reconnected,
                    server_state,
                    server_pid: server.as_ref().map(|s| s.pid),
                    server_port: server.as_ref().map(|s| s.port),
                    error,
                }
            })
            .collect();
        views.sort_by(|a, b| a.connected_since.total_cmp(&b.connected_since));
        views
    }

    /// Whether a spare server is ready now.
    pub fn spare_ready(&self) -> bool {
        self.spare_pid().is_some()
    }

    /// The process id of the spare server, when one is ready.
    pub fn spare_pid(&self) -> Option<u32> {
        self.spare.locked().ready.as_ref().map(|server| server.pid)
    }

    /// Registers a new client; its server is `Starting` until [`Proxy::start_server`].
    /// Returns the client and the generation of its stream.
    pub fn attach_new(&self, id: &str) -> Result<(Arc<Client>, u64), ClientError> {
        let generation = self.next_generation();
        let mut clients = self.clients();
        if clients.contains_key(id) {
            return Err(ClientError::Duplicate(id.to_owned()));
        }
        let client = Arc::new(Client {
            id: id.to_owned(),
            since: SystemTime::now(),
            slot: watch::Sender::new(Slot::Starting),
            state: Mutex::new(ClientState {
                stream: generation,
                attached: true,
                ..Default::default()
            }),
        });
        clients.insert(id.to_owned(), client.clone());
        info!(
            client_id = id,
            clients = clients.len(),
            "Ray client connected"
        );
        Ok((client, generation))
    }

    /// Attaches a reconnecting client's new stream.
    pub fn attach_again(&self, id: &str) -> Result<(Arc<Client>, u64), ClientError> {
        let generation = self.next_generation();
        let client = self
            .client(id)
            .ok_or_else(|| ClientError::Unknown(id.to_owned()))?;
        {
            let mut state = client.lock();
            state.stream = generation;
            state.attached = true;
            state.reconnected = true;
        }
        info!(client_id = id, "Ray client reconnected");
        Ok((client, generation))
    }

    fn next_generation(&self) -> u64 {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }

    /// Gets `client` a server for its `init`: the warm spare when it needs
    /// no runtime env, else a new one in the env the agent creates.
    ///
    /// The work runs in a task of its own, so that a client that goes away
    /// meanwhile (its stream dropped, this future with it) cannot leave a
    /// port taken, a server running or its slot `Starting`: the task always
    /// settles the slot, and a server that comes up for a client already
    /// forgotten is stopped.
    pub async fn start_server(
        self: &Arc<Self>,
        client: &Arc<Client>,
        init: InitRequest,
    ) -> Result<Arc<SpecificServer>, StartError> {
        let (proxy, owner) = (self.clone(), client.clone());
        tokio::spawn(async move { proxy.settle_server(&owner, &init).await })
            .await
            .unwrap_or_else(|e| Err(StartError::Task(e)))
    }

    async fn settle_server(
        self: &Arc<Self>,
        client: &Arc<Client>,
        init: &InitRequest,
    ) -> Result<Arc<SpecificServer>, StartError> {
        client.lock().grace =
            Duration::from_secs(u64::try_from(init.reconnect_grace_period).unwrap_or(0));
        let result = self.server_for(init).await;
        match &result {
            Ok(server) => {
                let forgotten = {
                    let clients = self.clients();
                    client.slot.send_replace(Slot::Ready(server.clone()));
                    !clients
                        .get(&client.id)
                        .is_some_and(|current| Arc::ptr_eq(current, client))
                };
                if forgotten {
                    info!(client_id = %client.id, port = server.port, "Ray client gone before its server was ready; stopping the server");
                    let server = server.clone();
                    tokio::spawn(async move { server.stop().await });
                    self.refill_spare();
                    return result;
                }
                info!(client_id = %client.id, port = server.port, pid = server.pid, "Ray client server assigned");
                // A server that dies takes its client's slot with it.
                let (client, server) = (client.clone(), server.clone());
                tokio::spawn(async move {
                    server.exited().await;
                    let status = server.exit_status().unwrap_or_default();
                    client.slot.send_if_modified(|slot| match slot {
                        Slot::Ready(s) if Arc::ptr_eq(s, &server) => {
                            *slot = Slot::Failed(format!(
                                "its Ray client server (pid {}) exited: {status}",
                                server.pid
                            ));
                            true
                        }
                        _ => false,
                    });
                });
            }
            Err(why) => {
                warn!(client_id = %client.id, error = %why, "no Ray client server for client");
                client.slot.send_replace(Slot::Failed(why.to_string()));
            }
        }
        self.refill_spare();
        result
    }

    async fn server_for(
        self: &Arc<Self>,
        init: &InitRequest,
    ) -> Result<Arc<SpecificServer>, StartError> {
        if runtime_env::hint(init) == EnvHint::Empty {
            if let Some(server) = self.take_spare() {
                return Ok(server);
            }
        }
        let port = self.launcher.ports().take()?;
        let context =
            match tokio::time::timeout(self.settings.server_wait, self.envs.context(init, port))
                .await
            {
                Ok(Ok(context)) => context,
                Ok(Err(why)) => {
                    self.launcher.ports().give_back(port);
                    return Err(why.into());
                }
                Err(_) => {
                    self.launcher.ports().give_back(port);
                    return Err(StartError::RuntimeEnvTimeout(self.settings.server_wait));
                }
            };
        Ok(self.launch(port, &context, false).await?)
    }

    /// Starts a server, trying again on another port when another process
    /// took the port between the pool's check and the server's bind.
    async fn launch(
        &self,
        port: u16,
        context: &str,
        spare: bool,
    ) -> Result<Arc<SpecificServer>, ServerError> {
        match self.launcher.start(port, context, spare).await {
            Err(ServerError::Exited { port: lost, .. }) if !servers::bindable(lost) => {
                warn!(
                    port = lost,
                    "the port was taken by another process; starting on another"
                );
                let port = self.launcher.ports().take()?;
                self.launcher.start(port, context, spare).await
            }
            Err(ServerError::Shared { port: shared }) => {
                warn!(
                    port = shared,
                    "the port is shared with another process; starting on another"
                );
                let port = self.launcher.ports().take()?;
                self.launcher.start(port, context, spare).await
            }
            other => other,
        }
    }

    fn take_spare(&self) -> Option<Arc<SpecificServer>> {
        let mut spare = self.spare.locked();
        match spare.ready.take() {
            Some(server) if server.exit_status().is_none() => Some(server),
            _ => None,
        }
    }

    /// Starts a spare server when warming is on and there is none.
    pub fn refill_spare(self: &Arc<Self>) {
        if !self.settings.warm_spare {
            return;
        }
        {
            let mut spare = self.spare.locked();
            let alive = spare
                .ready
                .as_ref()
                .is_some_and(|s| s.exit_status().is_none());
            if alive || spare.starting || spare.failures >= SPARE_MAX_FAILURES {
                return;
            }
            spare.ready = None;
            spare.starting = true;
        }
        let proxy = self.clone();
        tokio::spawn(async move {
            let context = runtime_env::empty_context(&proxy.settings.python);
            let started = match proxy.launcher.ports().take() {
                Ok(port) => proxy.launch(port, &context, true).await,
                Err(e) => Err(e),
            };
            let mut spare = proxy.spare.locked();
            spare.starting = false;
            match started {
                Ok(server) => {
                    spare.failures = 0;
                    info!(
                        port = server.port,
                        pid = server.pid,
                        "spare Ray client server ready"
                    );
                    let watcher = (proxy.clone(), server.clone());
                    spare.ready = Some(server);
                    drop(spare);
                    // A spare that dies is replaced.
                    tokio::spawn(async move {
                        let (proxy, server) = watcher;
                        server.exited().await;
                        let was_spare = {
                            let mut spare = proxy.spare.locked();
                            let same = spare
                                .ready
                                .as_ref()
                                .is_some_and(|s| Arc::ptr_eq(s, &server));
                            if same {
                                spare.ready = None;
                                spare.failures += 1;
                            }
                            same
                        };
                        if was_spare {
                            warn!(
                                port = server.port,
                                "the spare Ray client server exited; starting another"
                            );
                            proxy.refill_spare();
                        }
                    });
                }
                Err(e) => {
                    spare.failures += 1;
                    warn!(error = %e, failures = spare.failures, "cannot start a spare Ray client server");
                    if spare.failures >= SPARE_MAX_FAILURES {
                        // Try again later (the head may be back by then).
                        drop(spare);
                        let proxy = proxy.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(SPARE_RETRY).await;
                            proxy.spare.locked().failures = 0;
                            proxy.refill_spare();
                        });
                    }
                }
            }
        });
    }

    /// Called when a client's `Datapath` stream of `generation` ends. Unless
    /// the client cleaned up, it gets its grace period to reconnect; then,
    /// unless a newer stream came, it is forgotten and its server stopped.
    pub fn detach(self: &Arc<Self>, client: Arc<Client>, generation: u64) {
        let (cleanup, grace) = {
            let mut state = client.lock();
            if state.stream != generation {
                return;
            }
            state.attached = false;
            // A client whose server could not be had has nothing to resume.
            let failed = matches!(client.slot(), Slot::Failed(_));
            (state.cleanup || failed, state.grace)
        };
        let proxy = self.clone();
        tokio::spawn(async move {
            if !cleanup {
                let server = client.ready_server();
                let server_gone = async {
                    match &server {
                        Some(server) => server.exited().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(grace) => {}
                    _ = server_gone => {}
                }
            }
            {
                let mut clients = proxy.clients();
                if client.lock().stream != generation {
                    return;
                }
                match clients.get(&client.id) {
                    Some(current) if Arc::ptr_eq(current, &client) => {
                        clients.remove(&client.id);
                    }
                    _ => return,
                }
                info!(client_id = %client.id, cleanup, clients = clients.len(), "Ray client gone");
            }
            if let Slot::Ready(server) = client.slot() {
                if cleanup {
                    // It was told to clean up: give it a moment to end itself.
                    let _ = tokio::time::timeout(Duration::from_secs(1), server.exited()).await;
                }
                server.stop().await;
            }
        });
    }

    /// Stops every server: the clients' and the spare.
    pub async fn stop_all(&self) {
        let mut servers: Vec<Arc<SpecificServer>> = self
            .clients()
            .values()
            .filter_map(|c| match c.slot() {
                Slot::Ready(s) => Some(s),
                _ => None,
            })
            .collect();
        if let Some(spare) = self.take_spare() {
            servers.push(spare);
        }
        futures_util::future::join_all(servers.iter().map(|s| s.stop())).await;
    }
}
