use ray_proto::rpc::{Address, JobConfig, RuntimeEnvInfo};

use super::*;

fn driver(id: u8, submission: Option<&str>, namespace: &str, env: &str) -> JobTableData {
    let mut metadata = HashMap::new();
    if let Some(s) = submission {
        metadata.insert(SUBMISSION_ID_KEY.to_owned(), s.to_owned());
    }
    JobTableData {
        job_id: vec![id, 0, 0, 0],
        is_dead: id % 2 == 0,
        driver_pid: 4000 + i64::from(id),
        driver_address: Some(Address {
            ip_address: "10.0.0.1".to_owned(),
            ..Default::default()
        }),
        start_time: 1_000 + u64::from(id),
        end_time: 0,
        entrypoint: format!("python job{id}.py"),
        config: Some(JobConfig {
            ray_namespace: namespace.to_owned(),
            metadata,
            runtime_env_info: Some(RuntimeEnvInfo {
                serialized_runtime_env: env.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn record(id: &str, json: Value) -> Record {
    (id.to_owned(), Some(json.to_string().into_bytes()))
}

fn stored(status: &str, extra: Value) -> Value {
    let mut r = json!({
        "status": status, "entrypoint": "python x.py", "message": null,
        "error_type": null, "start_time": 5, "end_time": null, "metadata": {},
        "entrypoint_num_cpus": null, "entrypoint_num_gpus": null,
        "entrypoint_memory": null, "entrypoint_resources": null,
        "driver_agent_http_address": null, "driver_node_id": null,
        "driver_exit_code": null,
    });
    for (k, v) in extra.as_object().expect("object") {
        r[k] = v.clone();
    }
    r
}

#[test]
fn submitted_jobs_first_with_their_last_driver_then_drivers_by_id() {
    let drivers = vec![
        driver(3, None, "", "{}"),
        driver(2, Some("raysubmit_a"), "", "{}"),
        driver(1, None, "_ray_internal_dashboard", "{}"),
        driver(4, Some("raysubmit_a"), "", "{}"),
        driver(0, None, "", r#"{"env_vars": {"K": "v"}}"#),
    ];
    let records = [
        record("raysubmit_b", stored("PENDING", json!({}))),
        ("gone".to_owned(), None),
        record(
            "raysubmit_a",
            stored(
                "SUCCEEDED",
                json!({"message": "done", "runtime_env_json": "{\"pip\": [\"x\"]}"}),
            ),
        ),
    ];
    let list = list(drivers, &records, None).expect("list");
    let ids: Vec<(&str, &Value)> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|j| (j["type"].as_str().expect("type"), &j["job_id"]))
        .collect();
    assert_eq!(
        ids,
        [
            ("SUBMISSION", &Value::Null),
            ("SUBMISSION", &json!("04000000")),
            ("DRIVER", &json!("00000000")),
            ("DRIVER", &json!("03000000")),
        ]
    );
    let a = &list[1];
    assert_eq!(
        a["driver_info"],
        json!({"id": "04000000", "node_ip_address": "10.0.0.1", "pid": "4004"})
    );
    assert_eq!(a["runtime_env"], json!({"pip": ["x"]}));
    assert_eq!(a["message"], "done");
    let pending = &list[0];
    assert_eq!(pending["message"], "Job has not started yet.");
    assert_eq!(pending["driver_info"], Value::Null);
    assert_eq!(pending["submission_id"], "raysubmit_b");
    let d0 = &list[2];
    assert_eq!(
        (d0["status"].as_str(), d0["start_time"].as_u64()),
        (Some("SUCCEEDED"), Some(1000))
    );
    assert_eq!(d0["runtime_env"], json!({"env_vars": {"K": "v"}}));
    assert_eq!(list[3]["status"], "RUNNING");
    assert_eq!(d0.as_object().expect("object").len(), 15);
}

#[test]
fn a_pending_job_says_what_it_may_wait_for() {
    let records = [record(
        "s",
        stored(
            "PENDING",
            json!({"entrypoint_num_cpus": 2.0, "runtime_env_json": "{\"env_vars\": {}}"}),
        ),
    )];
    let list = list(Vec::new(), &records, None).expect("list");
    assert_eq!(
        list[0]["message"],
        "Job has not started yet. It may be waiting for resources (CPUs, GPUs, memory, \
         custom resources) to become available. It may be waiting for the runtime \
         environment to be set up."
    );
}

#[test]
fn secrets_are_masked_for_a_browser() {
    let drivers = vec![driver(
        1,
        None,
        "",
        r#"{"env_vars": {"TOKEN": "s3cret"}, "pip": ["a"]}"#,
    )];
    let records = [record(
        "s",
        stored(
            "RUNNING",
            json!({"runtime_env_json": "{\"env_vars\": {\"PW\": \"x\"}}"}),
        ),
    )];
    let redaction = Redaction {
        fields: vec!["env_vars".to_owned()],
        placeholder: "<redacted>".to_owned(),
    };
    let list = list(drivers, &records, Some(&redaction)).expect("list");
    assert_eq!(
        list[0]["runtime_env"],
        json!({"env_vars": {"PW": "<redacted>"}})
    );
    assert_eq!(
        list[1]["runtime_env"],
        json!({"env_vars": {"TOKEN": "<redacted>"}, "pip": ["a"]})
    );
}

#[test]
fn what_is_not_modelled_is_declined() {
    let declined = |drivers: Vec<JobTableData>, records: Vec<Record>| {
        list(drivers, &records, None).expect_err("declined")
    };
    declined(vec![driver(1, None, "", "")], vec![]);
    declined(
        vec![driver(
            1,
            None,
            "",
            r#"{"config": {"setup_timeout_seconds": 5}}"#,
        )],
        vec![],
    );
    declined(vec![driver(1, None, "", r#"{"pip": null}"#)], vec![]);
    declined(
        vec![],
        vec![record("s", stored("RUNNING", json!({"new_field": 1})))],
    );
    declined(vec![], vec![record("s", stored("LOST", json!({})))]);
    declined(
        vec![],
        vec![record("s", stored("RUNNING", json!({"start_time": "5"})))],
    );
    declined(
        vec![],
        vec![record(
            "s",
            stored("RUNNING", json!({"metadata": {"k": 1}})),
        )],
    );
    declined(vec![], vec![("s".to_owned(), Some(b"not json".to_vec()))]);
}
