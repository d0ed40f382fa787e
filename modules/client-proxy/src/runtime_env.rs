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
use ray_dashd_contract::Backoff;
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
/// Attempts at the agent when it cannot be reached.
const AGENT_ATTEMPTS: u32 = 6;
/// The pauses between those attempts: 500 ms first, doubling; the fifth and
/// last is 8 s.
const AGENT_PAUSES: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(8));

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

/// Why a client's runtime env could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeEnvError {
    /// The helper that reads the JobConfig could not be started.
    #[error("cannot run {python} to read the JobConfig: {source}")]
    RunHelper {
        /// The Python.
        python: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The pickled JobConfig could not be written to the helper.
    #[error("cannot feed the JobConfig helper: {0}")]
    FeedHelper(#[source] std::io::Error),
    /// Waiting for the helper failed.
    #[error("the JobConfig helper failed: {0}")]
    WaitHelper(#[source] std::io::Error),
    /// The helper did not finish in time.
    #[error("the JobConfig helper took over {0:?}")]
    HelperTimeout(Duration),
    /// The helper failed: the last line of its stderr.
    #[error("reading the client's JobConfig failed ({status}): {last_line}")]
    HelperFailed {
        /// How it ended.
        status: std::process::ExitStatus,
        /// The last line of its stderr.
        last_line: String,
    },
    /// The helper printed something else than its JSON.
    #[error("the JobConfig helper printed bad JSON: {0}")]
    HelperJson(#[source] serde_json::Error),
    /// The helper's `RuntimeEnvConfig` is not base64.
    #[error("the JobConfig helper printed bad base64: {0}")]
    HelperBase64(#[source] base64::DecodeError),
    /// The helper's `RuntimeEnvConfig` is not one.
    #[error("the JobConfig helper printed a bad RuntimeEnvConfig: {0}")]
    HelperConfig(#[source] prost::DecodeError),
    /// No agent was named and there is no GCS to ask.
    #[error("no runtime env agent address and no GCS to ask for it")]
    NoAgent,
    /// The GCS did not say where the head's agent is.
    #[error("cannot find the runtime env agent through the GCS: {}", .0.message())]
    FindAgent(tonic::Status),
    /// The agent refused the request (the token, say).
    #[error("the runtime env agent refused the request ({status}): {text}")]
    AgentRefused {
        /// Its status.
        status: http::StatusCode,
        /// Its answer's text.
        text: String,
    },
    /// The agent's answer could not be read.
    #[error("reading the runtime env agent's answer: {0}")]
    AgentAnswer(#[source] reqwest::Error),
    /// The agent's answer is not its protobuf.
    #[error("the runtime env agent answered bad protobuf: {0}")]
    AgentProtobuf(#[source] prost::DecodeError),
    /// The agent could not create the env: its words.
    #[error("the runtime env could not be created:\n{0}")]
    NotCreated(String),
    /// The agent answered a status it has no such value for.
    #[error("the runtime env agent answered unknown status {0}")]
    AgentStatus(i32),
    /// Every attempt at the agent failed.
    #[error("the runtime env agent at {url} failed {attempts} times; last: {last}")]
    AgentFailed {
        /// The agent's URL.
        url: String,
        /// The attempts made.
        attempts: u32,
        /// What the last one got.
        last: String,
    },
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
    pub async fn context(&self, init: &InitRequest, port: u16) -> Result<String, RuntimeEnvError> {
        if hint(init) == EnvHint::Empty {
            return Ok(empty_context(&self.python));
        }
        let read = self.read_job_config(&init.job_config).await?;
        if read.serialized_runtime_env.is_empty() || read.serialized_runtime_env == "{}" {
            return Ok(empty_context(&self.python));
        }
        let config_bytes = base64::engine::general_purpose::STANDARD
            .decode(&read.runtime_env_config)
            .map_err(RuntimeEnvError::HelperBase64)?;
        let config = RuntimeEnvConfig::decode(config_bytes.as_slice())
            .map_err(RuntimeEnvError::HelperConfig)?;
        info!(port, runtime_env = %read.serialized_runtime_env, "creating the runtime env of a Ray client server");
        let request = GetOrCreateRuntimeEnvRequest {
            serialized_runtime_env: read.serialized_runtime_env,
            runtime_env_config: Some(config),
            job_id: format!("ray_client_server_{port}").into_bytes(),
            source_process: "client_server".into(),
        };
        self.create(request).await
    }

    async fn read_job_config(&self, pickled: &[u8]) -> Result<HelperOutput, RuntimeEnvError> {
        let mut child = Command::new(&self.python)
            .arg("-c")
            .arg(JOB_CONFIG_HELPER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| RuntimeEnvError::RunHelper {
                python: self.python.clone(),
                source,
            })?;
        let mut stdin = child.stdin.take().expect("UNWRAP: stdin is piped");
        let pickled = pickled.to_vec();
        let feed = async move {
            stdin.write_all(&pickled).await?;
            stdin.shutdown().await
        };
        let run = async {
            let (fed, output) = tokio::join!(feed, child.wait_with_output());
            fed.map_err(RuntimeEnvError::FeedHelper)?;
            output.map_err(RuntimeEnvError::WaitHelper)
        };
        let output = tokio::time::timeout(HELPER_TIMEOUT, run)
            .await
            .map_err(|_| RuntimeEnvError::HelperTimeout(HELPER_TIMEOUT))??;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(RuntimeEnvError::HelperFailed {
                status: output.status,
                last_line: stderr.lines().last().unwrap_or("").to_owned(),
            });
        }
        serde_json::from_slice(&output.stdout).map_err(RuntimeEnvError::HelperJson)
    }

    async fn agent(&self) -> Result<&str, RuntimeEnvError> {
        self.agent
            .get_or_try_init(|| async {
                let gcs = self.gcs.as_ref().ok_or(RuntimeEnvError::NoAgent)?;
                gcs.head_runtime_env_agent()
                    .await
                    .map_err(RuntimeEnvError::FindAgent)
            })
            .await
            .map(String::as_str)
    }

    async fn create(
        &self,
        request: GetOrCreateRuntimeEnvRequest,
    ) -> Result<String, RuntimeEnvError> {
        let url = format!("{}/get_or_create_runtime_env", self.agent().await?);
        let body = request.encode_to_vec();
        let mut pauses = AGENT_PAUSES;
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
                        .map_err(RuntimeEnvError::AgentAnswer)?;
                    let reply = GetOrCreateRuntimeEnvReply::decode(bytes.as_ref())
                        .map_err(RuntimeEnvError::AgentProtobuf)?;
                    return match reply.status {
                        AGENT_OK => Ok(reply.serialized_runtime_env_context),
                        AGENT_FAILED => Err(RuntimeEnvError::NotCreated(reply.error_message)),
                        other => Err(RuntimeEnvError::AgentStatus(other)),
                    };
                }
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    if status == http::StatusCode::UNAUTHORIZED
                        || status == http::StatusCode::FORBIDDEN
                    {
                        return Err(RuntimeEnvError::AgentRefused { status, text });
                    }
                    last_error = format!("HTTP {status}: {text}");
                }
                Err(e) => last_error = e.to_string(),
            }
            if attempt < AGENT_ATTEMPTS {
                warn!(attempt, error = %last_error, "runtime env agent request failed; retrying");
                tokio::time::sleep(pauses.next_delay()).await;
            }
        }
        Err(RuntimeEnvError::AgentFailed {
            url,
            attempts: AGENT_ATTEMPTS,
            last: last_error,
        })
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
