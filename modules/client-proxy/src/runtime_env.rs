//! The runtime env a client's server starts in.
//!
//! A client without a runtime_env gets the empty context at once (and can
//! take the warm spare server). Otherwise the pickled `JobConfig` of its
//! `init` is read by a small Python helper (`python/job_config.py`, run with
//! the Python that has Ray: only Python can unpickle it), and the env is
//! created by the head's runtime env agent (`/get_or_create_runtime_env`,
//! protobuf over HTTP, with retries), whose answer is the context the server
//! is started with.

use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use prost::Message;
use ray_proto::rpc::{
    GetOrCreateRuntimeEnvReply, GetOrCreateRuntimeEnvRequest, InitRequest, RuntimeEnvConfig,
};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::sync::OnceCell;
use tracing::{info, warn};

use crate::auth::Token;
use crate::gcs::Gcs;

const JOB_CONFIG_HELPER: &str = include_str!("../python/job_config.py");
/// Bound on the helper that reads the pickled JobConfig.
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// `AgentRpcStatus` values.
const AGENT_OK: i32 = 0;
const AGENT_FAILED: i32 = 1;
/// Attempts at the agent when it cannot be reached, and the first pause.
const AGENT_ATTEMPTS: u32 = 6;
const AGENT_FIRST_PAUSE: Duration = Duration::from_millis(500);

/// What the init's JSON kwargs say about the runtime env.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvHint {
    /// `runtime_env` is there and empty: nothing to prepare.
    Empty,
    /// There is one, or the kwargs do not say: read the JobConfig.
    Prepare,
}

/// Reads the hint from `ray_init_kwargs`. Ray's client always puts the
/// JobConfig's runtime_env there (before uploading working_dir, so a
/// non-empty one must still be read from the pickle, whose URIs are final).
pub fn hint(init: &InitRequest) -> EnvHint {
    let Ok(serde_json::Value::Object(kwargs)) = serde_json::from_str(&init.ray_init_kwargs) else {
        return EnvHint::Prepare;
    };
    match kwargs.get("runtime_env") {
        Some(serde_json::Value::Object(env)) if env.is_empty() => EnvHint::Empty,
        Some(serde_json::Value::Null) => EnvHint::Empty,
        _ => EnvHint::Prepare,
    }
}

/// The context of a server without a runtime env, as Ray writes it.
pub fn empty_context(python: &str) -> String {
    serde_json::json!({
        "command_prefix": [],
        "env_vars": {},
        "py_executable": python,
        "override_worker_entrypoint": null,
        "java_jars": [],
    })
    .to_string()
}

#[derive(Debug, Deserialize)]
struct HelperOutput {
    serialized_runtime_env: String,
    runtime_env_config: String,
}

/// Prepares runtime envs.
#[derive(Debug)]
pub struct RuntimeEnvs {
    python: String,
    gcs: Option<Gcs>,
    agent: OnceCell<String>,
    http: reqwest::Client,
    token: Option<Token>,
}

impl RuntimeEnvs {
    /// Uses `python` for the helper, and `agent` as the runtime env agent's
    /// URL (or asks `gcs` for the head's agent on first use).
    pub fn new(
        python: String,
        gcs: Option<Gcs>,
        agent: Option<String>,
        token: Option<Token>,
    ) -> RuntimeEnvs {
        let cell = OnceCell::new();
        if let Some(agent) = agent {
            let _ = cell.set(agent);
        }
        RuntimeEnvs {
            python,
            gcs,
            agent: cell,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(600))
                .build()
                .expect("UNWRAP: a plain HTTP client builds"),
            token,
        }
    }

    /// The context for a server on `port` whose client sent `init`.
    pub async fn context(&self, init: &InitRequest, port: u16) -> Result<String, String> {
        if hint(init) == EnvHint::Empty {
            return Ok(empty_context(&self.python));
        }
        let read = self.read_job_config(&init.job_config).await?;
        if read.serialized_runtime_env.is_empty() || read.serialized_runtime_env == "{}" {
            return Ok(empty_context(&self.python));
        }
        let config_bytes = base64::engine::general_purpose::STANDARD
            .decode(&read.runtime_env_config)
            .map_err(|e| format!("the JobConfig helper printed bad base64: {e}"))?;
        let config = RuntimeEnvConfig::decode(config_bytes.as_slice())
            .map_err(|e| format!("the JobConfig helper printed a bad RuntimeEnvConfig: {e}"))?;
        info!(port, runtime_env = %read.serialized_runtime_env, "creating the runtime env of a Ray client server");
        let request = GetOrCreateRuntimeEnvRequest {
            serialized_runtime_env: read.serialized_runtime_env,
            runtime_env_config: Some(config),
            job_id: format!("ray_client_server_{port}").into_bytes(),
            source_process: "client_server".into(),
        };
        self.create(request).await
    }

    async fn read_job_config(&self, pickled: &[u8]) -> Result<HelperOutput, String> {
        let mut child = Command::new(&self.python)
            .arg("-c")
            .arg(JOB_CONFIG_HELPER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {} to read the JobConfig: {e}", self.python))?;
        let mut stdin = child.stdin.take().expect("UNWRAP: stdin is piped");
        let pickled = pickled.to_vec();
        let feed = async move {
            stdin.write_all(&pickled).await?;
            stdin.shutdown().await
        };
        let run = async {
            let (fed, output) = tokio::join!(feed, child.wait_with_output());
            fed.map_err(|e| format!("cannot feed the JobConfig helper: {e}"))?;
            output.map_err(|e| format!("the JobConfig helper failed: {e}"))
        };
        let output = tokio::time::timeout(HELPER_TIMEOUT, run)
            .await
            .map_err(|_| format!("the JobConfig helper took over {HELPER_TIMEOUT:?}"))??;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().last().unwrap_or("");
            return Err(format!(
                "reading the client's JobConfig failed ({}): {last}",
                output.status
            ));
        }
        serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("the JobConfig helper printed bad JSON: {e}"))
    }

    async fn agent(&self) -> Result<&str, String> {
        self.agent
            .get_or_try_init(|| async {
                let gcs = self
                    .gcs
                    .as_ref()
                    .ok_or("no runtime env agent address and no GCS to ask for it")?;
                gcs.head_runtime_env_agent().await.map_err(|e| {
                    format!(
                        "cannot find the runtime env agent through the GCS: {}",
                        e.message()
                    )
                })
            })
            .await
            .map(String::as_str)
    }

    async fn create(&self, request: GetOrCreateRuntimeEnvRequest) -> Result<String, String> {
        let url = format!("{}/get_or_create_runtime_env", self.agent().await?);
        let body = request.encode_to_vec();
        let mut pause = AGENT_FIRST_PAUSE;
        let mut last_error = String::new();
        for attempt in 1..=AGENT_ATTEMPTS {
            let mut post = self
                .http
                .post(&url)
                .header(http::header::CONTENT_TYPE, "application/octet-stream")
                .body(body.clone());
            if let Some(token) = &self.token {
                post = post.header(http::header::AUTHORIZATION, token.bearer());
            }
            let sent = post.send().await;
            match sent {
                Ok(response) if response.status().is_success() => {
                    let bytes = response
                        .bytes()
                        .await
                        .map_err(|e| format!("reading the runtime env agent's answer: {e}"))?;
                    let reply = GetOrCreateRuntimeEnvReply::decode(bytes.as_ref())
                        .map_err(|e| format!("the runtime env agent answered bad protobuf: {e}"))?;
                    return match reply.status {
                        AGENT_OK => Ok(reply.serialized_runtime_env_context),
                        AGENT_FAILED => Err(format!(
                            "the runtime env could not be created:\n{}",
                            reply.error_message
                        )),
                        other => Err(format!(
                            "the runtime env agent answered unknown status {other}"
                        )),
                    };
                }
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    if status == http::StatusCode::UNAUTHORIZED
                        || status == http::StatusCode::FORBIDDEN
                    {
                        return Err(format!(
                            "the runtime env agent refused the request ({status}): {text}"
                        ));
                    }
                    last_error = format!("HTTP {status}: {text}");
                }
                Err(e) => last_error = e.to_string(),
            }
            if attempt < AGENT_ATTEMPTS {
                warn!(attempt, error = %last_error, "runtime env agent request failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        Err(format!(
            "the runtime env agent at {url} failed {AGENT_ATTEMPTS} times; last: {last_error}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(kwargs: &str) -> InitRequest {
        InitRequest {
            ray_init_kwargs: kwargs.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_an_empty_runtime_env_skips_the_job_config() {
        assert_eq!(
            hint(&init(r#"{"runtime_env": {}, "_skip_env_hook": true}"#)),
            EnvHint::Empty
        );
        assert_eq!(hint(&init(r#"{"runtime_env": null}"#)), EnvHint::Empty);
        assert_eq!(
            hint(&init(r#"{"runtime_env": {"env_vars": {"A": "1"}}}"#)),
            EnvHint::Prepare
        );
        assert_eq!(hint(&init(r#"{"_skip_env_hook": true}"#)), EnvHint::Prepare);
        assert_eq!(hint(&init("")), EnvHint::Prepare);
    }

    #[test]
    fn empty_context_is_what_ray_writes() {
        let context: serde_json::Value =
            serde_json::from_str(&empty_context("/usr/bin/python3")).unwrap();
        assert_eq!(
            context,
            serde_json::json!({"command_prefix": [], "env_vars": {}, "py_executable": "/usr/bin/python3",
                "override_worker_entrypoint": null, "java_jars": []})
        );
    }
}
