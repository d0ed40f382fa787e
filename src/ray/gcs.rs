//! The head's GCS, as the host sees it: one gRPC connection over which a
//! background task checks every second that the GCS is alive (the cached
//! answer `/api/gcs_healthz` gives), learns the cluster id, writes the
//! dashboard's address to the GCS KV, and decides when the head is gone.
//!
//! Handlers only read the cached [`GcsStatus`]; nothing a request does waits
//! on the GCS, so a slow GCS or a blocked module cannot make a liveness probe
//! of the head time out (ray#63574).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ray_dashd_contract::LockExt;
use ray_dashd_tls::{Connector, RayTls};
use ray_proto::rpc::internal_kv_gcs_service_client::InternalKvGcsServiceClient;
use ray_proto::rpc::node_info_gcs_service_client::NodeInfoGcsServiceClient;
use ray_proto::rpc::{
    CheckAliveRequest, GcsStatus as ReplyStatus, GetClusterIdRequest, InternalKvPutRequest,
};
use tokio::time::{Instant, MissedTickBehavior};
use tonic::transport::{Channel, Endpoint};
use tracing::{error, info, warn};

use super::auth::Token;

/// Time between two checks: a probe sees the GCS as it was at most this
/// long ago (plus one check).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long one check may take before it counts as failed. Ray's ReportHead
/// gives each probe 0.1 s; a cached check can allow more without slowing
/// any probe, and a GCS on a loaded 2-core head sometimes needs it.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// A cached result older than this is not trusted: the checker itself is
/// stuck, so the host cannot vouch for the GCS.
pub const STALE_AFTER: Duration = Duration::from_secs(3);
/// How long one write of the dashboard's address may take.
const KV_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the address is written again: `ray start` writes its own
/// (dead) address at start, and a restarted GCS may have lost ours.
const KV_REFRESH: Duration = Duration::from_secs(60);
/// Wait before writing again after a failed write.
const KV_RETRY: Duration = Duration::from_secs(5);

/// The KV namespace and keys through which Ray's tools find the dashboard
/// (`ray logs`, the agents, task events; `webui:url` is what `ray.init()`
/// reports).
const KV_NAMESPACE: &[u8] = b"dashboard";
const KV_KEYS: [&[u8]; 2] = [b"dashboard", b"webui:url"];
/// Where Prometheus's discovery (`ray.util.metrics`' service discovery
/// writer) finds the dashboard's metrics port: Ray's dashboard head writes
/// it in no namespace (its `_setup_metrics`).
const METRICS_KV_KEY: &[u8] = b"DashboardMetricsAddress";

/// Why a GCS client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum GcsClientError {
    /// The address is no URI authority.
    #[error("GCS address {address:?}: {source}")]
    Address {
        /// The address given.
        address: String,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The token cannot go in a gRPC header.
    #[error("the auth token is not a valid gRPC metadata value")]
    Token,
}

/// A failed call to the GCS.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GcsError {
    message: String,
    /// The GCS answered but refused the call (a token it does not accept):
    /// it is alive, ray-dashd is misconfigured.
    refused: bool,
}

impl GcsError {
    fn timeout(limit: Duration) -> GcsError {
        GcsError {
            message: format!("no answer within {} ms", limit.as_millis()),
            refused: false,
        }
    }

    fn from_reply(what: &str, status: Option<ReplyStatus>) -> Result<(), GcsError> {
        match status {
            Some(s) if s.code != 0 => Err(GcsError {
                message: format!("{what}: GCS status {}: {}", s.code, s.message),
                refused: false,
            }),
            _ => Ok(()),
        }
    }
}

impl From<tonic::Status> for GcsError {
    fn from(status: tonic::Status) -> GcsError {
        let refused = matches!(
            status.code(),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        );
        let mut message = format!("{}: {}", status.code(), status.message());
        // Connection failures keep their cause (refused, unreachable) in the
        // source chain, whose links often repeat each other's text.
        let mut source = std::error::Error::source(&status);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            source = cause.source();
        }
        GcsError { message, refused }
    }
}

/// What the checker needs from the GCS; a trait so that tests can script it.
pub trait Gcs: Send + 'static {
    /// `NodeInfoGcsService.CheckAlive` with no node ids: is the GCS serving?
    fn check_alive(&mut self) -> impl Future<Output = Result<(), GcsError>> + Send;
    /// `NodeInfoGcsService.GetClusterId`: the cluster's id (28 bytes).
    fn cluster_id(&mut self) -> impl Future<Output = Result<Vec<u8>, GcsError>> + Send;
    /// `InternalKVGcsService.InternalKVPut`, overwriting.
    fn put(
        &mut self,
        namespace: &'static [u8],
        key: &'static [u8],
        value: Vec<u8>,
    ) -> impl Future<Output = Result<(), GcsError>> + Send;
}

/// The real GCS, over one lazily (re)connected HTTP/2 channel.
#[derive(Debug, Clone)]
pub struct GcsClient {
    nodes: NodeInfoGcsServiceClient<Channel>,
    kv: InternalKvGcsServiceClient<Channel>,
    /// `Bearer <token>` when the cluster uses token authentication; Ray's
    /// servers then refuse calls without it.
    bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl GcsClient {
    /// A client of the GCS at `address` (`host:port`), with Ray's TLS
    /// when `tls` is given (the GCS's certificate is checked against the
    /// address's host, as Ray's own clients check it); connects on first use.
    pub fn new(
        address: &str,
        token: Option<&Token>,
        tls: Option<&RayTls>,
    ) -> Result<GcsClient, GcsClientError> {
        let scheme = ray_dashd_tls::scheme(tls);
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|source| GcsClientError::Address {
                address: address.to_owned(),
                source,
            })?
            .connect_timeout(CHECK_TIMEOUT);
        let channel = endpoint.connect_with_connector_lazy(Connector::new(tls.cloned()));
        let bearer = match token {
            Some(token) => Some(token.bearer().parse().map_err(|_| GcsClientError::Token)?),
            None => None,
        };
        Ok(GcsClient {
            nodes: NodeInfoGcsServiceClient::new(channel.clone()),
            kv: InternalKvGcsServiceClient::new(channel),
            bearer,
        })
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        request
    }
}

impl Gcs for GcsClient {
    fn check_alive(&mut self) -> impl Future<Output = Result<(), GcsError>> + Send {
        let request = self.request(CheckAliveRequest { node_ids: vec![] }, CHECK_TIMEOUT);
        let mut nodes = self.nodes.clone();
        async move {
            let reply = nodes.check_alive(request).await?.into_inner();
            GcsError::from_reply("CheckAlive", reply.status)
        }
    }

    fn cluster_id(&mut self) -> impl Future<Output = Result<Vec<u8>, GcsError>> + Send {
        let request = self.request(GetClusterIdRequest {}, CHECK_TIMEOUT);
        let mut nodes = self.nodes.clone();
        async move {
            let reply = nodes.get_cluster_id(request).await?.into_inner();
            GcsError::from_reply("GetClusterId", reply.status)?;
            Ok(reply.cluster_id)
        }
    }

    fn put(
        &mut self,
        namespace: &'static [u8],
        key: &'static [u8],
        value: Vec<u8>,
    ) -> impl Future<Output = Result<(), GcsError>> + Send {
        let message = InternalKvPutRequest {
            key: key.to_vec(),
            value,
            overwrite: true,
            namespace: namespace.to_vec(),
        };
        let request = self.request(message, KV_TIMEOUT);
        let mut kv = self.kv.clone();
        async move {
            let reply = kv.internal_kv_put(request).await?.into_inner();
            GcsError::from_reply("InternalKVPut", reply.status)
        }
    }
}

// === GcsStatus ===

/// The latest check, shared by the checker (writer) and the handlers.
#[derive(Debug, Clone, Default)]
pub struct GcsStatus(Arc<Mutex<Health>>);

/// What the checker last learnt.
#[derive(Debug, Clone, Default)]
struct Health {
    /// When the latest check ended, and its outcome.
    last: Option<(Instant, Result<(), GcsError>)>,
    /// When a check last succeeded.
    last_alive: Option<Instant>,
    /// The cluster id, in hex, once the GCS has told it.
    cluster_id: Option<String>,
}

/// What `/api/gcs_healthz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// The latest check, recent enough, succeeded.
    Alive,
    /// Not known to be alive, and why.
    NotAlive(String),
}

impl GcsStatus {
    fn update(&self, f: impl FnOnce(&mut Health)) {
        let mut health = self.0.locked();
        f(&mut health);
    }

    /// The GCS's liveness as of the latest check.
    pub fn liveness(&self) -> Liveness {
        let health = self.0.locked().clone();
        let since = |at: Option<Instant>| match at {
            Some(at) => format!("last success {:.1} s ago", at.elapsed().as_secs_f64()),
            None => "no success yet".to_owned(),
        };
        match health.last {
            None => Liveness::NotAlive("the GCS has not been checked yet".to_owned()),
            Some((at, _)) if at.elapsed() > STALE_AFTER => Liveness::NotAlive(format!(
                "the latest GCS check is {:.1} s old ({})",
                at.elapsed().as_secs_f64(),
                since(health.last_alive)
            )),
            Some((_, Ok(()))) => Liveness::Alive,
            Some((at, Err(e))) => Liveness::NotAlive(format!(
                "{e} (checked {:.1} s ago, {})",
                at.elapsed().as_secs_f64(),
                since(health.last_alive)
            )),
        }
    }

    /// The cluster id in hex, once the GCS has answered.
    pub fn cluster_id(&self) -> Option<String> {
        self.0.locked().cluster_id.clone()
    }
}

#[cfg(test)]
impl GcsStatus {
    /// A successful check just now, of cluster `c0ffee`.
    pub(crate) fn record_alive_for_tests(&self) {
        let now = Instant::now();
        self.update(|h| {
            h.last = Some((now, Ok(())));
            h.last_alive = Some(now);
            h.cluster_id = Some("c0ffee".to_owned());
        });
    }
}

// === Watcher ===

/// Why ray-dashd stops serving the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// What was seen, for the log.
    pub reason: String,
}

/// The background checker: see the file's doc.
#[derive(Debug)]
pub struct Watcher<G> {
    gcs: G,
    /// The GCS's address, for messages.
    address: String,
    /// The dashboard's `host:port` to write to the GCS KV.
    advertise: String,
    /// How long the GCS may stay unreachable before the head counts as gone.
    gone_after: Duration,
    status: GcsStatus,
    /// The dashboard metrics port's `host:port`, when it is served.
    metrics_address: Option<String>,
}

impl<G: Gcs> Watcher<G> {
    /// A checker of `gcs` (at `address`) that publishes into `status`.
    pub fn new(
        gcs: G,
        address: String,
        advertise: String,
        gone_after: Duration,
        status: GcsStatus,
    ) -> Watcher<G> {
        Watcher {
            gcs,
            address,
            advertise,
            gone_after,
            status,
            metrics_address: None,
        }
    }

    /// Checks until the head is gone: the GCS unreachable for `gone_after`
    /// in a row (counted from start-up when it never answered), or another
    /// cluster answering at its address.
    pub async fn run(mut self) -> Gone {
        let started = Instant::now();
        let mut ticks = tokio::time::interval(CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut cluster: Option<Vec<u8>> = None;
        // Whether the previous check succeeded; after a failure the cluster
        // id is asked again (a new head may answer at the same address).
        let mut up = false;
        // The first failure after a success (or at start) is logged; the
        // rest of an outage is not, the status tells it.
        let mut quiet = false;
        let mut last_alive: Option<Instant> = None;
        let mut next_advertise = started;
        loop {
            ticks.tick().await;
            let mut checked = bounded(CHECK_TIMEOUT, self.gcs.check_alive()).await;
            if checked.is_ok() && !up {
                match bounded(CHECK_TIMEOUT, self.gcs.cluster_id()).await {
                    Ok(id) => match &cluster {
                        Some(known) if *known != id => {
                            let reason = format!(
                                "the GCS at {} now belongs to cluster {} (was {})",
                                self.address,
                                hex(&id),
                                hex(known)
                            );
                            return self.gone(reason);
                        }
                        Some(_) => info!(gcs = %self.address, "the GCS answers again"),
                        None => {
                            info!(gcs = %self.address, cluster_id = %hex(&id), "GCS reached");
                            self.status.update(|h| h.cluster_id = Some(hex(&id)));
                            cluster = Some(id);
                        }
                    },
                    Err(e) => checked = Err(e),
                }
            }
            let now = Instant::now();
            match checked {
                Ok(()) => {
                    if !up {
                        // Back after an outage: the GCS may have restarted.
                        next_advertise = now;
                    }
                    up = true;
                    quiet = false;
                    last_alive = Some(now);
                    self.status.update(|h| {
                        h.last = Some((now, Ok(())));
                        h.last_alive = Some(now);
                    });
                    if now >= next_advertise {
                        next_advertise = now + self.advertise_address().await;
                    }
                }
                Err(e) => {
                    if !quiet {
                        warn!(gcs = %self.address, error = %e, "GCS check failed");
                        quiet = true;
                    }
                    up = false;
                    if e.refused {
                        // It answered: alive, but it will not talk to us.
                        last_alive = Some(now);
                    }
                    let failed = e.clone();
                    self.status.update(|h| h.last = Some((now, Err(failed))));
                    let down_for = now - last_alive.unwrap_or(started);
                    if down_for >= self.gone_after {
                        let reason = format!(
                            "the GCS at {} has not answered for {} s: {e}",
                            self.address,
                            down_for.as_secs()
                        );
                        return self.gone(reason);
                    }
                }
            }
        }
    }

    fn gone(&self, reason: String) -> Gone {
        error!(gcs = %self.address, %reason, "the Ray head is gone");
        Gone { reason }
    }

    /// Writes `address` (`host:port`) as the dashboard metrics port's too.
    pub fn with_metrics_address(mut self, address: Option<String>) -> Watcher<G> {
        self.metrics_address = address;
        self
    }

    /// Writes the dashboard's address; returns when to write it again.
    async fn advertise_address(&mut self) -> Duration {
        for key in KV_KEYS {
            let value = self.advertise.clone().into_bytes();
            if let Err(e) = bounded(KV_TIMEOUT, self.gcs.put(KV_NAMESPACE, key, value)).await {
                warn!(
                    gcs = %self.address,
                    key = %String::from_utf8_lossy(key),
                    error = %e,
                    "cannot write the dashboard address to the GCS"
                );
                return KV_RETRY;
            }
        }
        if let Some(address) = &self.metrics_address {
            let value = address.clone().into_bytes();
            if let Err(e) = bounded(KV_TIMEOUT, self.gcs.put(b"", METRICS_KV_KEY, value)).await {
                warn!(
                    gcs = %self.address,
                    error = %e,
                    "cannot write the dashboard metrics address to the GCS"
                );
                return KV_RETRY;
            }
        }
        info!(address = %self.advertise, gcs = %self.address, "dashboard address written to the GCS");
        KV_REFRESH
    }
}

async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, GcsError>>,
) -> Result<T, GcsError> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(GcsError::timeout(limit)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The address to tell Ray's tools, for a dashboard bound to `bound`: that
/// address itself, or, when bound to all addresses (`0.0.0.0`, `::`), the
/// head's node IP as the cluster knows it, the host of the GCS address (Ray
/// puts its GCS on the head's node IP; Ray's own dashboard advertises that
/// IP the same way). A GCS host of the other address family, which the
/// bound socket does not serve, gives loopback instead.
pub fn advertised_address(bound: SocketAddr, gcs_address: &str) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let port = bound.port();
    let host = gcs_host(gcs_address);
    match (bound.ip(), host.parse::<IpAddr>()) {
        (_, Ok(ip)) if ip.is_unspecified() => {
            SocketAddr::new(loopback(bound.ip()), port).to_string()
        }
        // An IPv6 socket bound to `::` also serves IPv4 (Linux's default).
        (IpAddr::V6(_), Ok(ip)) => SocketAddr::new(ip, port).to_string(),
        (IpAddr::V4(_), Ok(ip @ IpAddr::V4(_))) => SocketAddr::new(ip, port).to_string(),
        (IpAddr::V4(_), Ok(IpAddr::V6(_))) => {
            SocketAddr::new(loopback(bound.ip()), port).to_string()
        }
        // A name: the cluster reaches the GCS by it, so the dashboard too.
        (_, Err(_)) if !host.is_empty() => format!("{host}:{port}"),
        (_, Err(_)) => SocketAddr::new(loopback(bound.ip()), port).to_string(),
    }
}

/// What the GCS keys hold for a dashboard bound to `bound` and served
/// under `url_prefix`: its [`advertised_address`] and the prefix, bare
/// (Ray's tools take that for `http://`) or, when it serves `https`, with
/// the scheme (which they all keep).
pub fn advertised_url(
    bound: SocketAddr,
    gcs_address: &str,
    https: bool,
    url_prefix: &str,
) -> String {
    let address = advertised_address(bound, gcs_address);
    let scheme = if https { "https://" } else { "" };
    format!("{scheme}{address}{url_prefix}")
}

fn loopback(family: IpAddr) -> IpAddr {
    match family {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// The head's IP, as the GCS address names it (loopback when it names a
/// host by name).
pub fn head_ip(gcs_address: &str) -> IpAddr {
    gcs_host(gcs_address)
        .parse()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The host part of `host:port` or `[v6]:port`.
fn gcs_host(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    address.rsplit_once(':').map_or(address, |(host, _)| host)
}

#[cfg(test)]
mod tests;
