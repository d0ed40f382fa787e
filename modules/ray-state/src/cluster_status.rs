//! `GET /api/cluster_status` as Ray's ReportHead answers it (without
//! `format=1`): the autoscaler's three status keys from the GCS's internal
//! KV, in Ray's `{result, msg, data}` envelope, the keys of `data` (and of
//! every object in it) turned from snake case to camel case as Ray's
//! `to_google_style` turns them.
//!
//! `format=1` asks for the status as the text `ray status` prints, which
//! Ray's own code formats: left to ReportHead. So are keys that are not
//! ASCII (Python's title case is Unicode's) and keys that two of the
//! stored ones would both become.

use serde_json::{json, Map, Value};

/// The KV keys (no namespace) the autoscaler writes its status to: the
/// legacy text, the status as JSON, and its last error.
pub const LEGACY_KEY: &[u8] = b"__autoscaling_status_legacy";
pub const STATUS_KEY: &[u8] = b"__autoscaling_status";
pub const ERROR_KEY: &[u8] = b"__autoscaling_error";

/// Why an answer is left to ReportHead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Decline(String);

/// Whether a request with `query` (the URL's, undecoded) is one this
/// module answers: not `format=1`, and nothing percent- or plus-encoded
/// (which ReportHead would decode first).
pub fn answers(query: Option<&str>) -> bool {
    if query.is_some_and(|q| q.contains(['%', '+'])) {
        return false;
    }
    // ReportHead reads the first `format` value.
    let format = query.and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
            .find(|(name, _)| *name == "format")
            .map(|(_, value)| value)
    });
    format.is_none_or(|f| f != "1")
}

/// The answer for the three keys' values (`None`: not there).
pub fn answer(
    legacy: Option<&[u8]>,
    status: Option<&[u8]>,
    error: Option<&[u8]>,
) -> Result<Value, Decline> {
    let text = |what: &str, bytes: Option<&[u8]>| -> Result<Value, Decline> {
        match bytes.filter(|b| !b.is_empty()) {
            None => Ok(Value::Null),
            Some(b) => std::str::from_utf8(b)
                .map(|s| Value::String(s.to_owned()))
                .map_err(|_| Decline(format!("the autoscaler's {what} is not UTF-8"))),
        }
    };
    let cluster_status = match status.filter(|b| !b.is_empty()) {
        None => Value::Null,
        Some(bytes) => {
            let parsed: Value = serde_json::from_slice(bytes)
                .map_err(|e| Decline(format!("the autoscaler's status: {e}")))?;
            if truthy(&parsed) {
                parsed
            } else {
                Value::Null
            }
        }
    };
    let mut data = Map::new();
    data.insert(
        "autoscaling_status".to_owned(),
        text("legacy status", legacy)?,
    );
    data.insert("autoscaling_error".to_owned(), text("error", error)?);
    data.insert("cluster_status".to_owned(), cluster_status);
    Ok(json!({
        "result": true,
        "msg": "Got cluster status.",
        "data": google_style(data)?,
    }))
}

/// Python's truth of a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Ray's `to_google_style`: every key camel cased; objects inside
/// recursively, and objects directly in an array (not deeper).
fn google_style(object: Map<String, Value>) -> Result<Value, Decline> {
    let mut out = Map::new();
    for (key, value) in object {
        let value = match value {
            Value::Object(inner) => google_style(inner)?,
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .map(|item| match item {
                        Value::Object(inner) => google_style(inner),
                        other => Ok(other),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            other => other,
        };
        let camel = camel_case(&key)?;
        if out.insert(camel.clone(), value).is_some() {
            return Err(Decline(format!("two keys become {camel:?}")));
        }
    }
    Ok(Value::Object(out))
}

/// Ray's `to_camel_case`: the key split at `_`, the first part as it is,
/// each other part in Python's title case (a letter after a letter
/// lowercased, any other letter uppercased).
fn camel_case(key: &str) -> Result<String, Decline> {
    if !key.is_ascii() {
        return Err(Decline(format!("a key that is not ASCII: {key:?}")));
    }
    let mut parts = key.split('_');
    let mut out = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        let mut after_letter = false;
        for c in part.chars() {
            if c.is_ascii_alphabetic() {
                out.push(if after_letter {
                    c.to_ascii_lowercase()
                } else {
                    c.to_ascii_uppercase()
                });
                after_letter = true;
            } else {
                out.push(c);
                after_letter = false;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_camel_cased_as_python_title_cases_them() {
        for (snake, camel) in [
            ("object_store_memory", "objectStoreMemory"),
            ("node_ip", "nodeIp"),
            ("pending_GPU_nodes", "pendingGpuNodes"),
            ("accelerator_type:A100", "acceleratorType:A100"),
            ("abc_x1y2z", "abcX1Y2Z"),
            ("a__b", "aB"),
            ("_private", "Private"),
            ("node:127.0.0.1", "node:127.0.0.1"),
            ("CPU", "CPU"),
        ] {
            assert_eq!(camel_case(snake).expect("ascii"), camel, "{snake}");
        }
        assert!(camel_case("größe_x").is_err());
    }

    #[test]
    fn the_envelope_and_the_status_as_report_head_gives_them() {
        let status = br#"{"active_nodes": {"n1": {"idle_duration_ms": 5}}, "pending_launches": [{"instance_type": "a"}, [ {"deep_key": 1} ]]}"#;
        let answer = answer(Some(b"legacy text"), Some(status), None).expect("answer");
        assert_eq!(
            answer,
            json!({
                "result": true,
                "msg": "Got cluster status.",
                "data": {
                    "autoscalingStatus": "legacy text",
                    "autoscalingError": null,
                    "clusterStatus": {
                        "activeNodes": {"n1": {"idleDurationMs": 5}},
                        "pendingLaunches": [{"instanceType": "a"}, [{"deep_key": 1}]],
                    },
                },
            })
        );
        // An empty status is none; so is a missing one.
        let empty = super::answer(None, Some(b"{}"), Some(b"")).expect("answer");
        assert_eq!(empty["data"]["clusterStatus"], Value::Null);
        assert_eq!(empty["data"]["autoscalingError"], Value::Null);
    }

    #[test]
    fn what_ray_formats_or_reads_otherwise_is_declined() {
        assert!(answers(None));
        assert!(answers(Some("format=0")));
        assert!(answers(Some("x=1")));
        assert!(!answers(Some("format=1")));
        assert!(!answers(Some("a=b&format=1")));
        assert!(!answers(Some("format=%31")));
        assert!(super::answer(None, Some(br#"{"a_b": 1, "aB": 2}"#), None).is_err());
        assert!(super::answer(None, Some(b"not json"), None).is_err());
        assert!(super::answer(Some(b"\xff"), None, None).is_err());
    }
}
