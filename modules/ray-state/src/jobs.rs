//! `GET /api/jobs/` as Ray's JobHead answers it (its `list_jobs`), built
//! from the GCS's job table and the job API's records in the GCS's
//! internal KV: three GCS calls where JobHead makes one per submitted job.
//!
//! The list holds the submitted jobs first, in the order the KV lists their
//! keys, each with the last driver that ran it; then the jobs of drivers
//! started by hand, by job id. Where a record holds something this builder
//! does not model exactly as Ray's code treats it (a field it does not
//! know, a value of another type, a runtime env that Ray's releases read
//! differently), it declines ([`Decline`]) and the caller asks JobHead.

use std::collections::HashMap;

use ray_proto::rpc::{JobConfig, JobTableData};
use serde_json::{json, Map, Value};

/// The KV namespace of the job API's records.
pub const KV_NAMESPACE: &[u8] = b"job";
/// The prefix of a record's key; the submission id follows it.
pub const KV_PREFIX: &str = "_ray_internal_job_info_";
/// Jobs in a namespace with this prefix are Ray's own, never listed.
const INTERNAL_NAMESPACE_PREFIX: &str = "_ray_internal_";
/// The driver metadata key naming the submission a driver runs.
const SUBMISSION_ID_KEY: &str = "job_submission_id";
/// The fields of a job API record (Ray's `JobInfo`), as stored.
const RECORD_FIELDS: [&str; 15] = [
    "status",
    "entrypoint",
    "message",
    "error_type",
    "start_time",
    "end_time",
    "metadata",
    "runtime_env_json",
    "entrypoint_num_cpus",
    "entrypoint_num_gpus",
    "entrypoint_memory",
    "entrypoint_resources",
    "driver_agent_http_address",
    "driver_node_id",
    "driver_exit_code",
];
/// Runtime env keys that Ray's releases turn into something else when they
/// read a driver's runtime env (renamed, or made an object of a class), or
/// that its reading refuses.
const RUNTIME_ENV_DECLINED: [&str; 4] = ["nsight", "rocprof_sys", "config", "_validate"];

/// Why a list is left to Ray's own module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Decline(String);

fn decline<T>(why: impl Into<String>) -> Result<T, Decline> {
    Err(Decline(why.into()))
}

/// How Ray masks runtime-env secrets for a browser: the runtime env's
/// fields whose values are secrets, and what replaces each value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redaction {
    /// The fields (Ray 2.60: `env_vars`).
    pub fields: Vec<String>,
    /// The mask (Ray 2.60: `<redacted>`).
    pub placeholder: String,
}

/// A job API record from the KV: its submission id and, if its key still
/// had one when read, its value.
pub type Record = (String, Option<Vec<u8>>);

/// The list as JobHead answers it, for `drivers` (the GCS's job table) and
/// `records` (in the KV's key order); secrets masked by `redaction` when
/// given (a browser asks, and this Ray masks).
pub fn list(
    mut drivers: Vec<JobTableData>,
    records: &[Record],
    redaction: Option<&Redaction>,
) -> Result<Value, Decline> {
    drivers.sort_by_cached_key(|d| hex(&d.job_id));
    let mut driver_jobs = Vec::new();
    let mut last_driver: HashMap<String, Value> = HashMap::new();
    let no_config = JobConfig::default();
    for driver in &drivers {
        let config = driver.config.as_ref().unwrap_or(&no_config);
        if config.ray_namespace.starts_with(INTERNAL_NAMESPACE_PREFIX) {
            continue;
        }
        let job_id = hex(&driver.job_id);
        let info = json!({
            "id": job_id,
            "node_ip_address": driver.driver_address.as_ref().map_or("", |a| a.ip_address.as_str()),
            "pid": driver.driver_pid.to_string(),
        });
        match config.metadata.get(SUBMISSION_ID_KEY) {
            Some(submission) if !submission.is_empty() => {
                last_driver.insert(submission.clone(), info);
            }
            _ => {
                let serialized = config
                    .runtime_env_info
                    .as_ref()
                    .map_or("", |r| r.serialized_runtime_env.as_str());
                let metadata: Map<String, Value> = config
                    .metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                driver_jobs.push(details(Details {
                    kind: "DRIVER",
                    job_id: Value::String(job_id),
                    submission_id: Value::Null,
                    driver_info: info,
                    status: if driver.is_dead {
                        "SUCCEEDED"
                    } else {
                        "RUNNING"
                    },
                    entrypoint: driver.entrypoint.clone(),
                    message: Value::Null,
                    error_type: Value::Null,
                    start_time: json!(driver.start_time),
                    end_time: json!(driver.end_time),
                    metadata: Value::Object(metadata),
                    runtime_env: driver_runtime_env(serialized)?,
                    driver_agent_http_address: Value::Null,
                    driver_node_id: Value::Null,
                    driver_exit_code: Value::Null,
                }));
            }
        }
    }
    let mut jobs = Vec::with_capacity(records.len() + driver_jobs.len());
    for (submission_id, value) in records {
        let Some(value) = value else { continue };
        let driver = last_driver.get(submission_id);
        jobs.push(submitted(submission_id, value, driver)?);
    }
    jobs.extend(driver_jobs);
    if let Some(redaction) = redaction {
        for job in &mut jobs {
            redact(&mut job["runtime_env"], redaction);
        }
    }
    Ok(Value::Array(jobs))
}

/// One entry of the list, its fields in Ray's order.
struct Details {
    kind: &'static str,
    job_id: Value,
    submission_id: Value,
    driver_info: Value,
    status: &'static str,
    entrypoint: String,
    message: Value,
    error_type: Value,
    start_time: Value,
    end_time: Value,
    metadata: Value,
    runtime_env: Value,
    driver_agent_http_address: Value,
    driver_node_id: Value,
    driver_exit_code: Value,
}

fn details(d: Details) -> Value {
    json!({
        "type": d.kind,
        "job_id": d.job_id,
        "submission_id": d.submission_id,
        "driver_info": d.driver_info,
        "status": d.status,
        "entrypoint": d.entrypoint,
        "message": d.message,
        "error_type": d.error_type,
        "start_time": d.start_time,
        "end_time": d.end_time,
        "metadata": d.metadata,
        "runtime_env": d.runtime_env,
        "driver_agent_http_address": d.driver_agent_http_address,
        "driver_node_id": d.driver_node_id,
        "driver_exit_code": d.driver_exit_code,
    })
}

/// A driver's runtime env as Ray reads it back (no validation) and lists
/// it: the stored object, as it is, for the keys read the same way by
/// every release.
fn driver_runtime_env(serialized: &str) -> Result<Value, Decline> {
    let Ok(Value::Object(env)) = serde_json::from_str::<Value>(serialized) else {
        return decline(format!(
            "a driver's runtime env is no JSON object: {serialized:?}"
        ));
    };
    for (key, value) in &env {
        if RUNTIME_ENV_DECLINED.contains(&key.as_str()) {
            return decline(format!("a driver's runtime env has {key:?}"));
        }
        if value.is_null() {
            return decline(format!("a driver's runtime env has {key:?} null"));
        }
    }
    Ok(Value::Object(env))
}

/// The entry of a submitted job from its record, with `driver` (its last
/// driver's info) when one ran it.
fn submitted(submission_id: &str, value: &[u8], driver: Option<&Value>) -> Result<Value, Decline> {
    let Ok(Value::Object(mut record)) = serde_json::from_slice::<Value>(value) else {
        return decline(format!("the record of {submission_id} is no JSON object"));
    };
    if let Some(field) = record.keys().find(|k| !RECORD_FIELDS.contains(&k.as_str())) {
        return decline(format!("the record of {submission_id} has {field:?}"));
    }
    let mut take = |field: &str| record.remove(field).unwrap_or(Value::Null);
    let status = match take("status").as_str() {
        Some("PENDING") => "PENDING",
        Some("RUNNING") => "RUNNING",
        Some("STOPPED") => "STOPPED",
        Some("SUCCEEDED") => "SUCCEEDED",
        Some("FAILED") => "FAILED",
        other => return decline(format!("{submission_id}: status {other:?}")),
    };
    let Value::String(entrypoint) = take("entrypoint") else {
        return decline(format!("{submission_id}: entrypoint is no string"));
    };
    let message = take("message");
    let error_type = take("error_type");
    let start_time = take("start_time");
    let end_time = take("end_time");
    let metadata = take("metadata");
    let runtime_env = match take("runtime_env_json") {
        Value::Null => Value::Null,
        Value::String(text) => match serde_json::from_str::<Value>(&text) {
            Ok(env @ (Value::Object(_) | Value::Null)) => env,
            _ => return decline(format!("{submission_id}: runtime env is no JSON object")),
        },
        _ => return decline(format!("{submission_id}: runtime_env_json is no string")),
    };
    let driver_agent_http_address = take("driver_agent_http_address");
    let driver_node_id = take("driver_node_id");
    let driver_exit_code = take("driver_exit_code");
    let resources = [
        take("entrypoint_num_cpus"),
        take("entrypoint_num_gpus"),
        take("entrypoint_memory"),
    ];
    let custom_resources = take("entrypoint_resources");

    let optional_string = |v: &Value| v.is_null() || v.is_string();
    let optional_int = |v: &Value| v.is_null() || v.is_i64() || v.is_u64();
    let string_map = |v: &Value| {
        v.is_null()
            || v.as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
    };
    let checks = [
        ("message", optional_string(&message)),
        ("error_type", optional_string(&error_type)),
        ("start_time", optional_int(&start_time)),
        ("end_time", optional_int(&end_time)),
        ("metadata", string_map(&metadata)),
        (
            "driver_agent_http_address",
            optional_string(&driver_agent_http_address),
        ),
        ("driver_node_id", optional_string(&driver_node_id)),
        ("driver_exit_code", optional_int(&driver_exit_code)),
        (
            "entrypoint resources",
            resources.iter().all(|r| r.is_null() || r.is_number())
                && (custom_resources.is_null() || custom_resources.is_object()),
        ),
    ];
    if let Some((field, _)) = checks.iter().find(|(_, ok)| !ok) {
        return decline(format!("{submission_id}: {field} of another type"));
    }
    let message = if message.is_null() {
        Value::String(default_message(
            status,
            &resources,
            &custom_resources,
            &runtime_env,
        ))
    } else {
        message
    };
    Ok(details(Details {
        kind: "SUBMISSION",
        job_id: driver.map_or(Value::Null, |d| d["id"].clone()),
        submission_id: Value::String(submission_id.to_owned()),
        driver_info: driver.cloned().unwrap_or(Value::Null),
        status,
        entrypoint,
        message,
        error_type,
        start_time,
        end_time,
        metadata,
        runtime_env,
        driver_agent_http_address,
        driver_node_id,
        driver_exit_code,
    }))
}

/// The message Ray's record gives a job whose stored message is null.
fn default_message(
    status: &str,
    resources: &[Value; 3],
    custom_resources: &Value,
    runtime_env: &Value,
) -> String {
    match status {
        "PENDING" => {
            let mut message = "Job has not started yet.".to_owned();
            let asks = resources
                .iter()
                .any(|r| r.as_f64().is_some_and(|n| n > 0.0))
                || custom_resources.as_object().is_some_and(|m| !m.is_empty());
            if asks {
                message.push_str(
                    " It may be waiting for resources (CPUs, GPUs, memory, custom \
                     resources) to become available.",
                );
            }
            if runtime_env.as_object().is_some_and(|m| !m.is_empty()) {
                message.push_str(" It may be waiting for the runtime environment to be set up.");
            }
            message
        }
        "RUNNING" => "Job is currently running.".to_owned(),
        "STOPPED" => "Job was intentionally stopped.".to_owned(),
        "SUCCEEDED" => "Job finished successfully.".to_owned(),
        _ => "Job failed.".to_owned(),
    }
}

/// Masks the secret fields of `runtime_env` as Ray does: each value of a
/// secret field that is an object becomes the placeholder.
fn redact(runtime_env: &mut Value, redaction: &Redaction) {
    let Some(env) = runtime_env.as_object_mut() else {
        return;
    };
    for field in &redaction.fields {
        if let Some(Value::Object(secrets)) = env.get_mut(field) {
            for value in secrets.values_mut() {
                *value = Value::String(redaction.placeholder.clone());
            }
        }
    }
}

/// Lowercase hex of `bytes`, as Ray's ids print.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests;
