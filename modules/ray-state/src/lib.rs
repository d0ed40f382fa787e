//! The Ray state module: answers some of Ray's cluster-state routes from
//! the GCS itself, the same as Ray's own modules answer them, with Ray's
//! module behind it for what it declines. ray-dashd hosts it beside Ray's
//! modules and gives it their routes it serves (`[ray] native_routes`).
//!
//! Why: on a big cluster Ray's Python modules spend seconds of CPU on each
//! answer of a polled route (JobHead reads the job API's records one GCS
//! call at a time: a thousand calls for a thousand jobs), on a head whose
//! CPUs the GCS and the autoscaler already hold.
//!
//! Served: `GET /api/jobs/` ([`jobs`], JobHead's) and `GET
//! /api/cluster_status` ([`cluster_status`], ReportHead's). What the module
//! cannot build as Ray's does (a [`jobs::Decline`] or
//! [`cluster_status::Decline`]), or while the GCS does not answer, it
//! forwards to Ray's module ([`fallback`]), so a client gets Ray's answer
//! either way.

pub mod cluster_status;
pub mod fallback;
pub mod jobs;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use ray_dashd_client_proxy::gcs::Gcs;
use ray_dashd_sdk::ModuleEnv;
use ray_dashd_tls::RayTls;

/// The job list's path.
pub const JOBS_PATH: &str = "/api/jobs/";
/// The cluster status's path.
pub const CLUSTER_STATUS_PATH: &str = "/api/cluster_status";

/// Command line of the Ray state module.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "ray-dashd-ray-state", version)]
pub struct Args {
    /// The GCS (`host:port`).
    #[arg(long)]
    pub gcs_address: String,
    /// The socket of Ray's JobHead, which answers what this module
    /// declines.
    /// Without it, the module does not serve the job list.
    #[arg(long)]
    pub job_head_socket: Option<PathBuf>,
    /// The socket of Ray's ReportHead, which answers the cluster status
    /// this module declines. Without it, the module does not serve the
    /// cluster status.
    #[arg(long)]
    pub report_head_socket: Option<PathBuf>,
    /// A runtime env field whose values Ray masks in answers to a browser
    /// (once per field; none: this Ray masks nothing).
    #[arg(long = "redact-field")]
    pub redact_fields: Vec<String>,
    /// What replaces each masked value.
    #[arg(long, default_value = "<redacted>")]
    pub redact_placeholder: String,
}

/// Why the module cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The module contract's environment.
    #[error(transparent)]
    Sdk(#[from] ray_dashd_sdk::SdkError),
    /// Ray's TLS settings.
    #[error("Ray's TLS settings: {0}")]
    Tls(String),
    /// Ray's token.
    #[error("Ray's token: {0}")]
    Token(String),
    /// The GCS client.
    #[error(transparent)]
    Gcs(#[from] ray_dashd_client_proxy::gcs::GcsError),
}

/// What the handlers share. Each route's handler is also given the socket
/// of the Ray module behind it.
#[derive(Debug)]
struct Shared {
    gcs: Gcs,
    /// `RAY_DASHBOARD_DEV=1`: Ray's envelope answers allow any origin.
    dev: bool,
    redaction: Option<jobs::Redaction>,
    /// By route, the last reason logged for a forward, and when: the same
    /// reason is logged again only after [`FORWARD_LOG_EVERY`] (a record
    /// that is always declined would otherwise log a line per refresh).
    last_forward: std::sync::Mutex<HashMap<&'static str, (String, std::time::Instant)>>,
}

/// How often the same reason for a forward is logged again.
const FORWARD_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Shared {
    /// Logs why a route's answer goes to Ray's module, unless that reason
    /// was logged within [`FORWARD_LOG_EVERY`].
    fn log_forward(&self, path: &'static str, why: &NotBuilt) {
        use ray_dashd_contract::LockExt;
        let reason = why.to_string();
        let now = std::time::Instant::now();
        let mut last = self.last_forward.locked();
        let fresh = last.get(path).is_some_and(|(logged, at)| {
            *logged == reason && now.duration_since(*at) < FORWARD_LOG_EVERY
        });
        if !fresh {
            tracing::info!(path, reason = %reason, "answer left to Ray's module");
            last.insert(path, (reason, now));
        }
    }
}

/// Runs the module to its end; its exit status.
pub fn main(args: Args) -> ExitCode {
    ray_dashd_sdk::run_main("ray state module", serve(args))
}

async fn serve(args: Args) -> Result<(), StartupError> {
    let env = ModuleEnv::from_env()?;
    let tls = RayTls::from_env().map_err(|e| StartupError::Tls(e.to_string()))?;
    let token = ray_dashd_client_proxy::auth::token_from_env()
        .map_err(|e| StartupError::Token(e.to_string()))?;
    let gcs = Gcs::new(&args.gcs_address, token.as_ref(), tls.as_ref())?;
    let redaction = (!args.redact_fields.is_empty()).then(|| jobs::Redaction {
        fields: args.redact_fields.clone(),
        placeholder: args.redact_placeholder.clone(),
    });
    tracing::info!(
        gcs = %args.gcs_address,
        job_list = args.job_head_socket.is_some(),
        cluster_status = args.report_head_socket.is_some(),
        redacts = redaction.is_some(),
        "serving Ray's routes from the GCS"
    );
    let shared = Arc::new(Shared {
        gcs,
        dev: std::env::var("RAY_DASHBOARD_DEV").is_ok_and(|v| v == "1"),
        redaction,
        last_forward: Default::default(),
    });
    let mut router = Router::new();
    if let Some(job_head) = args.job_head_socket {
        let job_head = Arc::<Path>::from(job_head);
        router = router.route(
            JOBS_PATH,
            get(move |State(shared), request| list_jobs(shared, job_head, request)),
        );
    }
    if let Some(report_head) = args.report_head_socket {
        let report_head = Arc::<Path>::from(report_head);
        router = router.route(
            CLUSTER_STATUS_PATH,
            get(move |State(shared), request| get_cluster_status(shared, report_head, request)),
        );
    }
    let router = router.with_state(shared);
    let app = ray_dashd_sdk::with_healthz(router);
    ray_dashd_sdk::serve_router_until(&env, app, ray_dashd_sdk::shutdown_signal()?).await?;
    Ok(())
}

/// Why the module did not build an answer itself.
#[derive(Debug, thiserror::Error)]
enum NotBuilt {
    #[error("the GCS: {0}")]
    Gcs(#[from] tonic::Status),
    #[error("a job record's key is not UTF-8")]
    Key,
    #[error(transparent)]
    Declined(#[from] jobs::Decline),
    #[error(transparent)]
    StatusDeclined(#[from] cluster_status::Decline),
}

/// A JSON answer, with the type Ray's aiohttp gives it.
fn json_response(body: Vec<u8>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body,
    )
        .into_response()
}

/// `GET /api/jobs/`: the list from the GCS, or JobHead's (at `job_head`).
async fn list_jobs(shared: Arc<Shared>, job_head: Arc<Path>, request: Request<Body>) -> Response {
    let browser = ray_dashd_contract::browser::from_browser(|name| {
        request.headers().get(name).map(|v| v.as_bytes())
    });
    let redaction = shared.redaction.as_ref().filter(|_| browser);
    match build_jobs(&shared.gcs, redaction).await {
        Ok(body) => json_response(body),
        Err(why) => {
            shared.log_forward(JOBS_PATH, &why);
            fallback::forward(&job_head, request).await
        }
    }
}

/// `GET /api/cluster_status`: from the GCS's KV, or ReportHead's (at
/// `report_head`; always for `format=1`, the text Ray's own code formats).
async fn get_cluster_status(
    shared: Arc<Shared>,
    report_head: Arc<Path>,
    request: Request<Body>,
) -> Response {
    if !cluster_status::answers(request.uri().query()) {
        return fallback::forward(&report_head, request).await;
    }
    let gcs = &shared.gcs;
    let got = async {
        let (legacy, status, error) = tokio::try_join!(
            gcs.kv_get(Vec::new(), cluster_status::LEGACY_KEY.to_vec()),
            gcs.kv_get(Vec::new(), cluster_status::STATUS_KEY.to_vec()),
            gcs.kv_get(Vec::new(), cluster_status::ERROR_KEY.to_vec()),
        )?;
        Ok::<_, NotBuilt>(cluster_status::answer(
            legacy.as_deref(),
            status.as_deref(),
            error.as_deref(),
        )?)
    };
    match got.await {
        Ok(answer) => {
            let body = serde_json::to_vec(&answer).expect("UNWRAP: a JSON value serializes");
            let mut response = json_response(body);
            if shared.dev {
                response.headers_mut().insert(
                    header::ACCESS_CONTROL_ALLOW_ORIGIN,
                    header::HeaderValue::from_static("*"),
                );
            }
            response
        }
        Err(why) => {
            shared.log_forward(CLUSTER_STATUS_PATH, &why);
            fallback::forward(&report_head, request).await
        }
    }
}

async fn build_jobs(gcs: &Gcs, redaction: Option<&jobs::Redaction>) -> Result<Vec<u8>, NotBuilt> {
    let namespace = jobs::KV_NAMESPACE.to_vec();
    let (drivers, keys) = tokio::try_join!(
        gcs.all_jobs(),
        gcs.kv_keys(namespace.clone(), jobs::KV_PREFIX.as_bytes().to_vec()),
    )?;
    let mut ids = Vec::with_capacity(keys.len());
    for key in &keys {
        let id = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.strip_prefix(jobs::KV_PREFIX))
            .ok_or(NotBuilt::Key)?;
        ids.push(id.to_owned());
    }
    let mut values = if keys.is_empty() {
        Default::default()
    } else {
        gcs.kv_multi_get(namespace, keys.clone()).await?
    };
    let records: Vec<jobs::Record> = ids
        .into_iter()
        .zip(&keys)
        .map(|(id, key)| (id, values.remove(key)))
        .collect();
    let list = jobs::list(drivers, &records, redaction)?;
    Ok(serde_json::to_vec(&list).expect("UNWRAP: a JSON value serializes"))
}
