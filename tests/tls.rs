//! HTTPS and WSS on the dashboard port (`--tls-cert`, `--tls-key`): the
//! host's API, module routes and websockets over TLS with a certificate of
//! a CA made here, plain HTTP told to use HTTPS, a key that is not the
//! certificate's refused at start, and a new certificate served after
//! SIGHUP. With Ray's CLI: `ray_serving.rs`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Message;

use crate::support::ray::{ray_python, text, RayHead, RAY_WAIT};
use crate::support::{dashd, eventually, raw_exchange, test_module, Dashd, WAIT};

/// A CA, and what it signs.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub(crate) pem: String,
}

impl Ca {
    pub(crate) fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "ray-dashd dashboard TLS test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("CA cert");
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    /// A certificate for 127.0.0.1 and localhost named `name`, and its key,
    /// written to `dir` as `cert.pem` and `key.pem`; the certificate's DER.
    pub(crate) fn issue(&self, dir: &Path, name: &str) -> Vec<u8> {
        let key = KeyPair::generate().expect("key");
        let cert = self.sign(name, &key);
        std::fs::write(dir.join("cert.pem"), cert.pem()).expect("write cert");
        std::fs::write(dir.join("key.pem"), key.serialize_pem()).expect("write key");
        cert.der().to_vec()
    }

    fn sign(&self, name: &str, key: &KeyPair) -> rcgen::Certificate {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.signed_by(key, &self.issuer).expect("cert")
    }
}

pub(crate) fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// ray-dashd with the test module, serving HTTPS with `dir`'s files.
fn https_dashd(ca: &Ca, dir: &Path) -> Dashd {
    dashd()
        .module(test_module("tm"))
        .arg("--tls-cert")
        .arg(&path(dir, "cert.pem"))
        .arg("--tls-key")
        .arg(&path(dir, "key.pem"))
        .https(&ca.pem)
        .start()
}

/// A TLS connection to `addr` trusting only `ca`, offering h2 and
/// HTTP/1.1.
async fn connect_tls(addr: SocketAddr, ca: &Ca) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA cert");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").expect("server name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// The certificate the server presents now.
async fn served_cert(addr: SocketAddr, ca: &Ca) -> Vec<u8> {
    let tls = connect_tls(addr, ca).await.expect("TLS handshake");
    let (_, session) = tls.get_ref();
    session.peer_certificates().expect("a certificate")[0].to_vec()
}

/// The host's API and a module's route answer over HTTPS, with HTTP/1.1
/// chosen by ALPN; a client speaking plain HTTP to the port is told to use
/// HTTPS and the connection closed.
#[tokio::test]
async fn https_serves_the_api_and_module_routes() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    ca.issue(dir.path(), "dashboard");
    let d = https_dashd(&ca, dir.path());
    d.healthy("tm", 0).await;

    let health = d
        .client()
        .get(d.url("/api/healthz"))
        .send()
        .await
        .expect("HTTPS GET /api/healthz");
    assert_eq!(health.status(), 200);
    let echo = d
        .client()
        .get(d.url("/test/echo?x=1"))
        .send()
        .await
        .expect("HTTPS GET of a module route");
    assert_eq!(echo.status(), 200);
    assert!(echo.text().await.expect("body").contains("x=1"));

    let tls = connect_tls(d.addr(), &ca).await.expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));

    let plain = raw_exchange(
        d.addr(),
        b"GET /api/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert!(plain.starts_with("HTTP/1.1 400 "), "{plain}");
    assert!(plain.contains("use https://"), "{plain}");
}

/// A module's websocket route works over WSS: messages go to the module
/// and come back.
#[tokio::test]
async fn wss_reaches_a_module_websocket() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    ca.issue(dir.path(), "dashboard");
    let d = https_dashd(&ca, dir.path());
    d.healthy("tm", 0).await;
    let tls = connect_tls(d.addr(), &ca).await.expect("TLS handshake");
    let url = format!("wss://{}/test/ws/echo", d.addr());
    let (mut ws, response) = tokio_tungstenite::client_async(url, tls)
        .await
        .expect("websocket handshake over TLS");
    assert_eq!(response.status(), 101);
    for i in 0..3 {
        let text = format!("over tls {i}");
        ws.send(Message::Text(text.clone().into()))
            .await
            .expect("send");
        let back = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("echo in time")
            .expect("open")
            .expect("message");
        assert_eq!(back, Message::Text(text.into()));
    }
    ws.close(None).await.expect("close");
}

/// Over `server.max_connections`, a connection makes its TLS handshake
/// and is answered `/api/healthz`, and 503 for anything else, as in the
/// clear.
#[tokio::test]
async fn connections_over_the_cap_make_their_handshake_for_healthz() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    ca.issue(dir.path(), "dashboard");
    let d = dashd()
        .module(test_module("tm"))
        .server("max_connections", "1")
        .server("tls_cert", &format!("{:?}", path(dir.path(), "cert.pem")))
        .server("tls_key", &format!("{:?}", path(dir.path(), "key.pem")))
        .https(&ca.pem)
        .start();
    d.healthy("tm", 0).await;
    // The one slot is this idle connection's once the fixture's own
    // connections have closed; until then it may be one over the cap.
    let held = eventually(WAIT, || async {
        let held = connect_tls(d.addr(), &ca).await.ok()?;
        let response = d.client().get(d.url("/test/echo")).send().await.ok()?;
        (response.status() == 503).then_some(held)
    })
    .await;
    assert!(held.is_some(), "never over the cap; log:\n{}", d.log());
    let health = d
        .client()
        .get(d.url("/api/healthz"))
        .send()
        .await
        .expect("HTTPS GET /api/healthz over the cap");
    assert_eq!(health.status(), 200);
}

/// ray-dashd started with `args` (and a fresh session folder), which is
/// expected to exit at once: its exit code and stderr.
fn start_failing(args: &[&str]) -> (Option<i32>, String) {
    let session = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
        .arg("--session-dir")
        .arg(session.path())
        .args(["--port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ray-dashd");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "ray-dashd did not exit: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A key that is not the certificate's stops the start with exit 64 and
/// one line naming both files; so does a certificate file that is not
/// PEM, and a certificate without a key.
#[test]
fn unusable_certificates_refuse_to_start() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    ca.issue(dir.path(), "dashboard");
    let other = KeyPair::generate().expect("key");
    std::fs::write(dir.path().join("other.key"), other.serialize_pem()).expect("write");
    let (cert, key) = (path(dir.path(), "cert.pem"), path(dir.path(), "other.key"));

    let (code, stderr) = start_failing(&["--tls-cert", &cert, "--tls-key", &key]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(
        stderr,
        format!("ray-dashd: server.tls_key ({key}) is not the private key of the certificate in server.tls_cert ({cert})\n")
    );

    std::fs::write(dir.path().join("bad.pem"), "not a certificate\n").expect("write");
    let bad = path(dir.path(), "bad.pem");
    let (code, stderr) = start_failing(&["--tls-cert", &bad, "--tls-key", &key]);
    assert_eq!(code, Some(64), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("server.tls_cert ({bad})")),
        "{stderr}"
    );

    let (code, stderr) = start_failing(&["--tls-cert", &cert]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains(": server.tls_key: must be set with server.tls_cert"),
        "{stderr}"
    );
}

/// After SIGHUP the port presents the certificate now in the files; a
/// broken one after that is logged and the one in use kept.
#[tokio::test]
async fn sighup_serves_the_new_certificate() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let first = ca.issue(dir.path(), "first");
    let d = https_dashd(&ca, dir.path());
    assert_eq!(served_cert(d.addr(), &ca).await, first);

    let second = ca.issue(dir.path(), "second");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let served = eventually(WAIT, || async {
        (served_cert(d.addr(), &ca).await == second).then_some(())
    })
    .await;
    assert!(
        served.is_some(),
        "the new certificate is not served; log:\n{}",
        d.log()
    );

    std::fs::write(dir.path().join("cert.pem"), "broken\n").expect("write");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let logged = eventually(WAIT, || async {
        d.log()
            .contains("TLS certificate not reloaded")
            .then_some(())
    })
    .await;
    assert!(logged.is_some(), "no warning; log:\n{}", d.log());
    assert_eq!(served_cert(d.addr(), &ca).await, second);
    let health = d
        .client()
        .get(d.url("/api/healthz"))
        .send()
        .await
        .expect("HTTPS GET /api/healthz");
    assert_eq!(health.status(), 200);
}

/// SIGHUP is all or nothing, as `POST /api/reload` is: with a certificate
/// that does not load, a changed config is not applied either; once the
/// pair loads again, the next SIGHUP applies both.
#[tokio::test]
async fn sighup_with_a_bad_certificate_changes_nothing() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let first = ca.issue(dir.path(), "first");
    let d = https_dashd(&ca, dir.path());
    let before = d.healthy("tm", 0).await;

    // The module changed (its environment), and the certificate broken.
    let changed = dashd().module(test_module("tm").env("RELOADED", "1"));
    std::fs::write(d.config_path(), changed.config_text()).expect("write the config");
    std::fs::write(dir.path().join("cert.pem"), "broken\n").expect("write");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.logged("SIGHUP: reload refused").await;
    let after = d.module("tm").await;
    assert_eq!(after["incarnation"], before["incarnation"], "{after:#}");
    assert_eq!(after["pid"], before["pid"], "{after:#}");
    assert_eq!(served_cert(d.addr(), &ca).await, first);

    let second = ca.issue(dir.path(), "second");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let restarted = eventually(WAIT, || async {
        let now = d.module("tm").await;
        (now["state"] == "healthy" && now["pid"] != before["pid"]).then_some(())
    })
    .await;
    assert!(restarted.is_some(), "tm not restarted; log:\n{}", d.log());
    assert_eq!(served_cert(d.addr(), &ca).await, second);
}

/// What Ray's tools read from the GCS key `dashboard` of `head` once `d`
/// has written it (read with Ray's own client, by `dashboard_kv.py`).
pub(crate) async fn dashboard_key(head: &RayHead, d: &Dashd) -> String {
    let written = eventually(RAY_WAIT, || async {
        d.log()
            .contains("dashboard address written to the GCS")
            .then_some(())
    })
    .await;
    assert!(written.is_some(), "no address written; log:\n{}", d.log());
    let script = d.session().join("ray_dashd").join("dashboard_kv.py");
    let mut command = Command::new(ray_python());
    command.arg(&script).arg(&head.gcs);
    head.env(&mut command);
    let out = command.output().expect("run dashboard_kv.py");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `POST /api/reload` does what SIGHUP does for the certificate too; a
/// certificate that does not load is 400 and changes nothing.
#[tokio::test]
async fn a_reload_request_serves_the_new_certificate() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let first = ca.issue(dir.path(), "first");
    let d = https_dashd(&ca, dir.path());
    assert_eq!(served_cert(d.addr(), &ca).await, first);

    let second = ca.issue(dir.path(), "second");
    let reloaded = d
        .client()
        .post(d.url("/api/reload"))
        .send()
        .await
        .expect("POST /api/reload");
    assert_eq!(reloaded.status(), 200);
    let report: serde_json::Value = reloaded.json().await.expect("JSON");
    assert_eq!(report["tls_certificate"], "reloaded", "{report}");
    assert_eq!(served_cert(d.addr(), &ca).await, second);

    std::fs::write(dir.path().join("cert.pem"), "broken\n").expect("write");
    let refused = d
        .client()
        .post(d.url("/api/reload"))
        .send()
        .await
        .expect("POST /api/reload");
    assert_eq!(refused.status(), 400);
    let body = refused.text().await.expect("body");
    assert!(body.contains("Bad Certificate"), "{body}");
    assert_eq!(served_cert(d.addr(), &ca).await, second);
}
