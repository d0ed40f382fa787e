//! Against a real Ray head started with Ray's TLS on (`RAY_USE_TLS=1`, with a
//! CA and a server certificate for 127.0.0.1 and localhost made here, as
//! Ray's docs make them), the variables set for `ray start`, ray-dashd and
//! every Ray CLI and driver: ray-dashd reaches the GCS over mutual TLS,
//! hosts Ray's modules, `ray job submit` works through it, and
//! `ray.init("ray://…")` runs tasks through its client proxy, which takes
//! the client's TLS and dials its Ray client server with TLS.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

use crate::support::eventually;
use crate::support::ray::{
    all_ray_modules_up, authed, free_port, hosting, ray_module_healthy, ray_python,
    ray_state_answers_as_rays, run_driver, submit_six_times_seven, RayHead, RAY_WAIT,
};

/// Writes a CA (`ca.crt`) and a certificate it signed for 127.0.0.1 and
/// localhost (`server.crt`, `server.key`) into `dir`; Ray's TLS variables
/// naming them.
fn make_certs(dir: &Path) -> Vec<(&'static str, String)> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ray-dashd TLS test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA cert");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, "ray-internal");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &ca).expect("server cert");
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path.display().to_string()
    };
    vec![
        ("RAY_USE_TLS", "1".to_owned()),
        ("RAY_TLS_SERVER_CERT", write("server.crt", cert.pem())),
        (
            "RAY_TLS_SERVER_KEY",
            write("server.key", key.serialize_pem()),
        ),
        ("RAY_TLS_CA_CERT", write("ca.crt", ca.pem())),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_dashd_serves_a_tls_cluster() {
    let python = ray_python();
    let certs = tempfile::tempdir().expect("certs dir");
    let tls_env = make_certs(certs.path());
    let tls_pairs: Vec<(&str, &str)> = tls_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let head = RayHead::start_with_env(&python, &tls_pairs);

    let client_port = free_port();
    let mut builder = hosting(&head, &python, client_port, "");
    for (key, value) in &tls_pairs {
        builder = builder.env(key, value);
    }
    let d = builder.start();
    all_ray_modules_up(&d).await;

    // The host's own GCS connection: its check succeeds only over TLS.
    let gcs_alive = eventually(RAY_WAIT, || async {
        let response = authed().get(d.url("/api/gcs_healthz")).send().await.ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
    if gcs_alive.is_none() {
        let last = match authed().get(d.url("/api/gcs_healthz")).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(e) => format!("no answer (ray-dashd gone?): {e}"),
        };
        panic!(
            "the host's GCS check never succeeded: {last}\nlog:\n{}",
            d.log()
        );
    }

    ray_module_healthy(&d, &authed(), "ray_client_proxy").await;

    submit_six_times_seven(&head, &d, &d.url(""), &[]);

    // The client port speaks TLS only: plain gRPC never reaches a service.
    let address = format!("127.0.0.1:{client_port}");
    let plain = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .expect("uri")
        .connect_lazy();
    let refused = ray_proto::rpc::raylet_driver_client::RayletDriverClient::new(plain)
        .cluster_info(ray_proto::rpc::ClusterInfoRequest { r#type: 6 })
        .await
        .expect_err("plain gRPC to a TLS client port");
    assert_ne!(
        refused.code(),
        tonic::Code::Unauthenticated,
        "a plain call got past TLS: {refused:?}"
    );

    // A Ray client with Ray's TLS variables, through the proxy to its
    // server: a task, an actor, 12 MiB put/get, a task's print.
    let basics = run_driver(&head, &python, &address, "basics");
    assert_eq!(basics["task"], 42, "{basics}\nlog:\n{}", d.log());
    assert_eq!(basics["actor"], 2, "{basics}");
    assert_eq!(basics["put_get_equal"], true, "{basics}");
    assert_eq!(basics["print_seen"], true, "{basics}");

    // The Ray state module reads the job list over the GCS's TLS: the
    // list is JobHead's, none of it forwarded.
    let jobs = ray_state_answers_as_rays(&d).await;
    for kind in ["SUBMISSION", "DRIVER"] {
        assert!(jobs.iter().any(|j| j["type"] == kind), "{kind}: {jobs:?}");
    }
}
