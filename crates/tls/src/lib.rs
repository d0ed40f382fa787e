//! Ray's TLS settings, read as Ray's own processes read them, for the gRPC
//! connections of the host (to the GCS) and of the client proxy (to the GCS,
//! from `ray://` clients, to its Ray client servers).
//!
//! With `RAY_USE_TLS` set to `1` or `true` (any case), Ray's gRPC speaks
//! mutual TLS: every process presents the one certificate and key named by
//! `RAY_TLS_SERVER_CERT` and `RAY_TLS_SERVER_KEY`, as a server and as a
//! client alike, and checks its peer against the CA in `RAY_TLS_CA_CERT`.
//! A server requires the client's certificate; a client checks the server's
//! against the host it dialled (an IP address or a name, no override), so a
//! head's certificate names its node IP (and `127.0.0.1`, which the client
//! proxy dials its servers on).
//!
//! One place for both processes: the host and the client proxy are separate
//! binaries that must agree on the variables, the file formats and what is
//! verified. [`RayTls`] holds the rustls configs; [`Connector`] and
//! [`connect`] dial with them (or in the clear when TLS is off), and
//! [`RayTls::accept`] serves with them. The PEM loading is shared with the
//! dashboard port's own certificate ([`load_certified_key`]).

mod stream;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

pub use stream::{connect, ClientIo, ClientStream, Connector};

/// A connection accepted with Ray's TLS.
pub type ServerTlsStream = tokio_rustls::server::TlsStream<TcpStream>;

/// Turns TLS on: `1` or `true`, in any case, as Ray reads it; anything else
/// (or unset) leaves it off.
pub const USE_TLS: &str = "RAY_USE_TLS";
/// The certificate chain (PEM) every process presents, server and client.
pub const SERVER_CERT: &str = "RAY_TLS_SERVER_CERT";
/// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of [`SERVER_CERT`].
pub const SERVER_KEY: &str = "RAY_TLS_SERVER_KEY";
/// The CA certificates (PEM) a peer's certificate must chain to.
pub const CA_CERT: &str = "RAY_TLS_CA_CERT";

/// The one protocol Ray's gRPC speaks; gRPC clients insist that the server
/// selects it.
const ALPN_H2: &[u8] = b"h2";

/// Why Ray's TLS settings cannot be used. Each message is one line naming
/// the variable, its file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// TLS is on but a file is not named.
    #[error("{USE_TLS} is on, but {var} is not set (Ray's TLS needs {SERVER_CERT}, {SERVER_KEY} and {CA_CERT})")]
    Unset {
        /// The variable missing.
        var: &'static str,
    },
    /// A file cannot be read.
    #[error("{var} ({}): cannot read: {source}", path.display())]
    Read {
        /// The variable naming it.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file is read but holds nothing usable.
    #[error("{var} ({}): {problem}", path.display())]
    Content {
        /// The variable naming it.
        var: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The key is not the certificate's.
    #[error("{key_var} ({}) is not the private key of the certificate in {cert_var} ({})", key.display(), cert.display())]
    KeyMismatch {
        /// The setting naming the key file.
        key_var: &'static str,
        /// The key file.
        key: PathBuf,
        /// The setting naming the certificate file.
        cert_var: &'static str,
        /// The certificate file.
        cert: PathBuf,
    },
    /// rustls refused the settings as a whole.
    #[error("Ray's TLS settings ({SERVER_CERT} {}, {CA_CERT} {}): {source}", cert.display(), ca.display())]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The CA file.
        ca: PathBuf,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
}

/// Ray's TLS, ready to dial and serve: the client and server configs made
/// from the three files. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RayTls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    /// The certificate file, for logs.
    cert: PathBuf,
    /// The CA file, for logs.
    ca: PathBuf,
}

impl RayTls {
    /// Ray's TLS from this process's environment: `None` when
    /// `RAY_USE_TLS` leaves it off.
    pub fn from_env() -> Result<Option<RayTls>, TlsError> {
        RayTls::from_lookup(|var| std::env::var(var).ok())
    }

    /// [`RayTls::from_env`] with the variables read through `lookup`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<RayTls>, TlsError> {
        if !is_on(lookup(USE_TLS).as_deref()) {
            return Ok(None);
        }
        let path = |var: &'static str| {
            lookup(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .ok_or(TlsError::Unset { var })
        };
        RayTls::from_files(&path(SERVER_CERT)?, &path(SERVER_KEY)?, &path(CA_CERT)?).map(Some)
    }

    /// Ray's TLS from the certificate chain, its key and the CA, all PEM.
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<RayTls, TlsError> {
        let chain = certificates(SERVER_CERT, cert)?;
        let private_key = private_key(SERVER_KEY, key)?;
        let roots = roots(ca)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config_error = |source| TlsError::Config {
            cert: cert.to_owned(),
            ca: ca.to_owned(),
            source,
        };
        // Checked once here, for an error that names both files.
        certified_key((SERVER_CERT, cert), (SERVER_KEY, key), &chain, &private_key)?;

        let mut client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), private_key.clone_key())
            .map_err(config_error)?;
        client.alpn_protocols = vec![ALPN_H2.to_vec()];

        // Ray's servers require a client certificate from the same CA
        // (gRPC's "request and require client certificate and verify").
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| config_error(rustls::Error::General(e.to_string())))?;
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, private_key)
            .map_err(config_error)?;
        server.alpn_protocols = vec![ALPN_H2.to_vec()];

        Ok(RayTls {
            client: Arc::new(client),
            server: Arc::new(server),
            cert: cert.to_owned(),
            ca: ca.to_owned(),
        })
    }

    /// The certificate file presented.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The CA file peers are checked against.
    pub fn ca_path(&self) -> &Path {
        &self.ca
    }

    /// The client side: presents the certificate, checks the server's
    /// against the CA and the host dialled, offers `h2`.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// The server side: presents the certificate, requires the client's and
    /// checks it against the CA, selects `h2`.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The client handshake over `tcp` with the server dialled as `host`
    /// (an IP address, bracketed or not, or a DNS name): the name the
    /// server's certificate must hold, as Ray's gRPC clients check it.
    pub async fn handshake(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = server_name(host)?;
        tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
    }

    /// The server handshake over an accepted `tcp`.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<ServerTlsStream> {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
            .accept(tcp)
            .await
    }
}

/// A certificate chain and its private key, both PEM (the key PKCS#8,
/// PKCS#1 or SEC1), loaded and checked to belong together: what a server
/// presents. Each of `cert` and `key` is the setting that names the file
/// (for errors) and the file.
pub fn load_certified_key(
    cert: (&'static str, &Path),
    key: (&'static str, &Path),
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert.0, cert.1)?;
    let private_key = private_key(key.0, key.1)?;
    certified_key(cert, key, &chain, &private_key)
}

/// `chain` with `private_key`, checked to be its key: rustls would
/// otherwise only say that "keys may not be consistent", naming no file.
fn certified_key(
    (cert_var, cert): (&'static str, &Path),
    (key_var, key): (&'static str, &Path),
    chain: &[CertificateDer<'static>],
    private_key: &PrivateKeyDer<'static>,
) -> Result<CertifiedKey, TlsError> {
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain.to_vec(), private_key.clone_key(), &provider).map_err(
        |e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
                key_var,
                key: key.to_owned(),
                cert_var,
                cert: cert.to_owned(),
            },
            other => TlsError::Content {
                var: key_var,
                path: key.to_owned(),
                problem: format!("not a private key rustls can use: {other}"),
            },
        },
    )
}

/// The URI scheme of a gRPC origin dialled with `tls`: `https` with TLS
/// (the `:scheme` gRPC's own TLS clients send), else `http`.
pub fn scheme(tls: Option<&RayTls>) -> &'static str {
    if tls.is_some() {
        "https"
    } else {
        "http"
    }
}

/// Whether a `RAY_USE_TLS` value turns TLS on, as Ray reads it.
fn is_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("1") || v.eq_ignore_ascii_case("true"))
}

/// The name a server's certificate must hold when dialled as `host`.
fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(bare.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is no name a TLS certificate can hold: {e}"),
        )
    })
}

fn read(var: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        var,
        path: path.to_owned(),
        source,
    })
}

fn content(var: &'static str, path: &Path, problem: String) -> TlsError {
    TlsError::Content {
        var,
        path: path.to_owned(),
        problem,
    }
}

/// What a PEM parse error says, readably.
fn pem_problem(e: &rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::MissingSectionEnd { end_marker } => {
            format!("bad PEM: no {:?} line", String::from_utf8_lossy(end_marker))
        }
        rustls_pki_types::pem::Error::IllegalSectionStart { line } => format!(
            "bad PEM: malformed BEGIN line {:?}",
            String::from_utf8_lossy(line)
        ),
        other => format!("bad PEM: {other}"),
    }
}

/// The `CERTIFICATE` blocks of the file `var` names, at least one.
fn certificates(var: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(var, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(var, path, pem_problem(&e)))?;
    if certs.is_empty() {
        return Err(content(
            var,
            path,
            "no PEM CERTIFICATE block in the file".to_owned(),
        ));
    }
    Ok(certs)
}

/// The first private key in the key file `var` names.
fn private_key(var: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(var, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => content(
            var,
            path,
            "no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block) in the file"
                .to_owned(),
        ),
        other => content(var, path, pem_problem(&other)),
    })
}

/// The CA certificates, each a trust anchor.
fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for (i, cert) in certificates(CA_CERT, path)?.into_iter().enumerate() {
        store.add(cert).map_err(|e| {
            content(
                CA_CERT,
                path,
                format!("certificate {} is not a usable CA certificate: {e}", i + 1),
            )
        })?;
    }
    Ok(store)
}

#[cfg(test)]
mod tests;
