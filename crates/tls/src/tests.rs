//! Reading Ray's TLS settings, and mutual TLS over loopback with certs made
//! here (a CA and a server cert for 127.0.0.1 and localhost, as Ray's docs
//! make them).

use std::collections::HashMap;
use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A CA, and certs it signed, written to a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "ray-dashd test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A cert for `names` signed by the CA, as `<stem>.crt` and `<stem>.key`.
    fn leaf(&self, stem: &str, names: &[&str]) {
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{stem}.crt")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{stem}.key")), key.serialize_pem()).unwrap();
    }

    fn env(&self, stem: &str) -> HashMap<&'static str, String> {
        let p = |name: String| self.path(&name).display().to_string();
        HashMap::from([
            (USE_TLS, "1".to_owned()),
            (SERVER_CERT, p(format!("{stem}.crt"))),
            (SERVER_KEY, p(format!("{stem}.key"))),
            (CA_CERT, p("ca.crt".to_owned())),
        ])
    }

    fn tls(&self, stem: &str) -> RayTls {
        let env = self.env(stem);
        RayTls::from_lookup(|v| env.get(v).cloned())
            .unwrap()
            .expect("TLS on")
    }
}

fn load(env: &HashMap<&'static str, String>) -> Result<Option<RayTls>, TlsError> {
    RayTls::from_lookup(|v| env.get(v).cloned())
}

#[test]
fn tls_is_on_only_for_one_or_true_as_ray_reads_it() {
    let pki = Pki::new();
    pki.leaf("server", &["127.0.0.1", "localhost"]);
    let mut env = pki.env("server");
    for off in ["0", "false", "yes", "", "on"] {
        env.insert(USE_TLS, off.to_owned());
        assert!(load(&env).unwrap().is_none(), "{off:?} turned TLS on");
    }
    env.remove(USE_TLS);
    assert!(load(&env).unwrap().is_none());
    for on in ["1", "true", "TRUE", "True"] {
        env.insert(USE_TLS, on.to_owned());
        assert!(load(&env).unwrap().is_some(), "{on:?} left TLS off");
    }
}

#[test]
fn errors_name_the_variable_the_file_and_the_problem() {
    let pki = Pki::new();
    pki.leaf("server", &["127.0.0.1"]);
    pki.leaf("other", &["127.0.0.1"]);
    let message = |env: &HashMap<&'static str, String>| {
        let e = load(env).expect_err("refused").to_string();
        assert!(!e.contains('\n'), "more than one line: {e}");
        e
    };

    let mut env = pki.env("server");
    env.remove(CA_CERT);
    let e = message(&env);
    assert!(e.contains("RAY_TLS_CA_CERT is not set"), "{e}");

    let mut env = pki.env("server");
    let missing = pki.path("missing.crt").display().to_string();
    env.insert(SERVER_CERT, missing.clone());
    let e = message(&env);
    assert!(
        e.starts_with(&format!("RAY_TLS_SERVER_CERT ({missing}): cannot read:")),
        "{e}"
    );

    std::fs::write(pki.path("empty.pem"), "just words\n").unwrap();
    std::fs::write(
        pki.path("broken.pem"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n",
    )
    .unwrap();
    let mut env = pki.env("server");
    env.insert(CA_CERT, pki.path("empty.pem").display().to_string());
    let e = message(&env);
    assert!(
        e.starts_with("RAY_TLS_CA_CERT (") && e.contains("empty.pem): no PEM CERTIFICATE block"),
        "{e}"
    );
    let mut env = pki.env("server");
    env.insert(SERVER_CERT, pki.path("broken.pem").display().to_string());
    let e = message(&env);
    assert!(
        e.starts_with("RAY_TLS_SERVER_CERT (") && e.contains("broken.pem): bad PEM"),
        "{e}"
    );
    let mut env = pki.env("server");
    env.insert(SERVER_KEY, pki.path("server.crt").display().to_string());
    let e = message(&env);
    assert!(
        e.starts_with("RAY_TLS_SERVER_KEY (") && e.contains("no PEM private key"),
        "{e}"
    );

    let mut env = pki.env("server");
    env.insert(SERVER_KEY, pki.path("other.key").display().to_string());
    let e = message(&env);
    assert!(
        e.contains("other.key) is not the private key of the certificate in RAY_TLS_SERVER_CERT (")
            && e.contains("server.crt)"),
        "{e}"
    );
}

/// Serves one TLS connection on loopback that echoes a byte; the server's
/// handshake result comes back through the join handle.
async fn echo_server(tls: RayTls) -> (u16, tokio::task::JoinHandle<std::io::Result<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut stream = tls.accept(tcp).await?;
        let alpn = stream
            .get_ref()
            .1
            .alpn_protocol()
            .unwrap_or_default()
            .to_vec();
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await?;
        stream.write_all(&byte).await?;
        stream.flush().await?;
        Ok(alpn)
    });
    (port, task)
}

#[tokio::test]
async fn both_sides_present_and_check_the_certificate() {
    let pki = Pki::new();
    pki.leaf("server", &["127.0.0.1", "localhost"]);
    let tls = pki.tls("server");
    for host in ["127.0.0.1", "localhost"] {
        let (port, server) = echo_server(tls.clone()).await;
        let mut stream = connect(Some(&tls), host, port).await.expect(host);
        stream.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x");
        let alpn = server.await.unwrap().expect("server side");
        assert_eq!(alpn, b"h2", "gRPC needs h2 selected");
    }
}

#[tokio::test]
async fn the_server_certificate_must_name_the_host_dialled() {
    let pki = Pki::new();
    pki.leaf("named", &["localhost"]);
    let tls = pki.tls("named");
    let (port, _server) = echo_server(tls.clone()).await;
    let e = connect(Some(&tls), "127.0.0.1", port)
        .await
        .expect_err("a cert without 127.0.0.1 is refused for 127.0.0.1");
    let e = e.to_string();
    assert!(
        e.contains(&format!("TLS handshake with 127.0.0.1:{port}"))
            && e.contains("not valid for name \"127.0.0.1\""),
        "{e}"
    );
}

#[tokio::test]
async fn a_client_without_a_certificate_or_from_another_ca_is_refused() {
    let pki = Pki::new();
    pki.leaf("server", &["127.0.0.1"]);
    let tls = pki.tls("server");

    // A client that checks the server but presents nothing.
    let mut roots = RootCertStore::empty();
    for cert in certificates(CA_CERT, &pki.path("ca.crt")).unwrap() {
        roots.add(cert).unwrap();
    }
    let mut anonymous =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    anonymous.alpn_protocols = vec![b"h2".to_vec()];
    let (port, server) = echo_server(tls.clone()).await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    // TLS 1.3: the client may finish before the server refuses; either side
    // fails, and the server never serves it.
    if let Ok(mut stream) = tokio_rustls::TlsConnector::from(Arc::new(anonymous))
        .connect(name, tcp)
        .await
    {
        let _ = stream.write_all(b"x").await;
        let mut byte = [0u8; 1];
        assert!(stream.read_exact(&mut byte).await.is_err());
    }
    let refused = server.await.unwrap().expect_err("no client certificate");
    assert!(refused.to_string().contains("certificate"), "{refused}");

    // A client whose certificate another CA signed.
    let stranger = Pki::new();
    stranger.leaf("server", &["127.0.0.1"]);
    let mut env = stranger.env("server");
    // It trusts our CA, so only the server's check can refuse it.
    env.insert(CA_CERT, pki.path("ca.crt").display().to_string());
    let outsider = load(&env).unwrap().unwrap();
    let (port, server) = echo_server(tls).await;
    if let Ok(mut stream) = connect(Some(&outsider), "127.0.0.1", port).await {
        let _ = stream.write_all(b"x").await;
        let mut byte = [0u8; 1];
        assert!(stream.read_exact(&mut byte).await.is_err());
    }
    let refused = server.await.unwrap().expect_err("another CA's client");
    assert!(
        refused.to_string().contains("invalid peer certificate"),
        "{refused}"
    );
}
