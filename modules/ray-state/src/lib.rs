//! The Ray state module: answers some of Ray's cluster-state routes from
//! the GCS itself, the same as Ray's own modules answer them, with Ray's
//! module behind it for what it declines. ray-dashd hosts it beside Ray's
//! modules and gives it their routes it serves (`[ray] native_routes`),
//! each with Ray's module as the route's `fallback`.
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
//! declines (421 with the contract's `x-ray-dashd-decline` and the
//! reason), and ray-dashd gives the request to Ray's module, so a client
//! gets Ray's answer either way.

pub mod cluster_status;
pub mod jobs;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, Request, StatusCode};
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
    /// A route to serve (once per route); what it declines, ray-dashd
    /// gives to Ray's module.
    #[arg(long = "serve", value_enum, required = true)]
    pub routes: Vec<Route>,
    /// A runtime env field whose values Ray masks in answers to a browser
    /// (once per field; none: this Ray masks nothing).
    #[arg(long = "redact-field")]
    pub redact_fields: Vec<String>,
    /// What replaces each masked value.
    #[arg(long, default_value = "<redacted>")]
    pub redact_placeholder: String,
}

/// The routes the module can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    /// `GET /api/jobs/`, JobHead's.
    Jobs,
    /// `GET /api/cluster_status`, ReportHead's.
    ClusterStatus,
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

/// What the handlers share.
#[derive(Debug)]
struct Shared {
    gcs: Gcs,
    /// `RAY_DASHBOARD_DEV=1`: Ray's envelope answers allow any origin.
    dev: bool,
    redaction: Option<jobs::Redaction>,
    /// By route, the last reason logged for a decline, and when: the same
    /// reason is logged again only after [`DECLINE_LOG_EVERY`] (a record
    /// that is always declined would otherwise log a line per refresh).
    last_decline: std::sync::Mutex<HashMap<&'static str, (String, std::time::Instant)>>,
}

/// How often the same reason for a decline is logged again.
const DECLINE_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Shared {
    /// Declines a request of `path`, whose answer then comes from Ray's
    /// module (see [`decline`]); logs `why`, unless that reason was logged
    /// within [`DECLINE_LOG_EVERY`].
    fn decline(&self, path: &'static str, why: &NotBuilt) -> Response {
        use ray_dashd_contract::LockExt;
        let reason = why.to_string();
        let now = std::time::Instant::now();
        {
            let mut last = self.last_decline.locked();
            let fresh = last.get(path).is_some_and(|(logged, at)| {
                *logged == reason && now.duration_since(*at) < DECLINE_LOG_EVERY
            });
            if !fresh {
                tracing::info!(path, reason = %reason, "answer left to Ray's module");
                last.insert(path, (reason.clone(), now));
            }
        }
        decline(&reason)
    }
}

/// The answer that declines a request: 421 with the contract's
/// `x-ray-dashd-decline` saying `why`. ray-dashd gives the request to the
/// route's fallback, Ray's module.
pub fn decline(why: &str) -> Response {
    use ray_dashd_contract::names::{DECLINE_HEADER, DECLINE_STATUS};
    let status = StatusCode::from_u16(DECLINE_STATUS).expect("UNWRAP: 421 is a status");
    // A reason that cannot be a header value (a line break, a byte past
    // ASCII) is not sent as one; the body has it whole.
    let value = HeaderValue::from_str(why).unwrap_or_else(|_| {
        HeaderValue::from_static("declined (its reason does not fit a header)")
    });
    (status, [(DECLINE_HEADER, value)], why.to_owned()).into_response()
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
        routes = ?args.routes,
        redacts = redaction.is_some(),
        "serving Ray's routes from the GCS"
    );
    let shared = Arc::new(Shared {
        gcs,
        dev: std::env::var("RAY_DASHBOARD_DEV").is_ok_and(|v| v == "1"),
        redaction,
        last_decline: Default::default(),
    });
    let mut router = Router::new();
    for route in &args.routes {
        router = match route {
            Route::Jobs => router.route(JOBS_PATH, get(list_jobs)),
            Route::ClusterStatus => router.route(CLUSTER_STATUS_PATH, get(get_cluster_status)),
        };
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

/// `GET /api/jobs/`: the list from the GCS, or declined (to JobHead).
async fn list_jobs(State(shared): State<Arc<Shared>>, request: Request<Body>) -> Response {
    let browser = ray_dashd_contract::browser::from_browser(|name| {
        request.headers().get(name).map(|v| v.as_bytes())
    });
    let redaction = shared.redaction.as_ref().filter(|_| browser);
    match build_jobs(&shared.gcs, redaction).await {
        Ok(body) => json_response(body),
        Err(why) => shared.decline(JOBS_PATH, &why),
    }
}

/// `GET /api/cluster_status`: from the GCS's KV, or declined (to
/// ReportHead; always for `format=1`, the text Ray's own code formats).
async fn get_cluster_status(State(shared): State<Arc<Shared>>, request: Request<Body>) -> Response {
    if !cluster_status::answers(request.uri().query()) {
        return decline("the text ray status prints is ReportHead's to format");
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
        Err(why) => shared.decline(CLUSTER_STATUS_PATH, &why),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A decline is what the host takes for one: 421 with the contract's
    /// header, whose value is the reason (or that it does not fit one).
    #[test]
    fn a_decline_is_421_with_the_reason() {
        use ray_dashd_contract::names::{DECLINE_HEADER, DECLINE_STATUS};
        let response = decline("the GCS: unavailable");
        assert_eq!(response.status().as_u16(), DECLINE_STATUS);
        assert_eq!(response.headers()[DECLINE_HEADER], "the GCS: unavailable");
        let response = decline("a key\nwith a newline");
        assert_eq!(
            response.headers()[DECLINE_HEADER],
            "declined (its reason does not fit a header)"
        );
    }
}
