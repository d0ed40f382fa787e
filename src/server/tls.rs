//! HTTPS and WSS on the dashboard port: the certificate and key of
//! `server.tls_cert` and `server.tls_key`, served through a resolver whose
//! key a reload (SIGHUP) swaps, and the handshake each connection makes in
//! its own task (the accept loop never waits for one).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ray_dashd_tls::TlsError;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use crate::config::TlsFiles;

/// How long a client may take from connecting to the end of its TLS
/// handshake: a few round trips on any working network; longer only
/// holds a slot for a client that never speaks.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The settings that name the files, in errors.
const CERT_SETTING: &str = "server.tls_cert";
const KEY_SETTING: &str = "server.tls_key";

/// The one protocol served: HTTP/1.1, as on the plain port (a websocket
/// relay needs the connection to itself).
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The first byte of every TLS record that opens a handshake (RFC 8446
/// §5.1, `handshake(22)`); a client speaking plain HTTP sends a method's
/// first letter instead.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a client speaking plain HTTP to the TLS port is told, before the
/// connection closes.
const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
content-type: text/plain; charset=utf-8\r\n\
content-length: 43\r\n\
connection: close\r\n\
\r\n\
this port speaks HTTPS: use https:// here\r\n";

/// A certificate and key read again, not yet served.
#[derive(Debug)]
pub struct ReadCertificate(CertifiedKey);

/// The dashboard port's TLS: the acceptor, and the certificate it
/// presents, which [`ServerTls::serve`] replaces.
pub struct ServerTls {
    files: TlsFiles,
    current: Arc<Current>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The certificate and key presented to every client, whatever name it
/// asks for.
#[derive(Debug)]
struct Current(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

impl ServerTls {
    /// Loads `files`; the error names the file at fault.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let current = Arc::new(Current(ArcSwap::from_pointee(load(files)?)));
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("UNWRAP: ring supports rustls' default protocol versions")
                .with_no_client_auth()
                .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(ServerTls {
            files: files.clone(),
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Reads the files again, without serving them yet ([`ServerTls::serve`]),
    /// so that a reload can check everything before it changes anything. An
    /// error is logged.
    pub fn read_again(&self) -> Result<ReadCertificate, TlsError> {
        load(&self.files).map(ReadCertificate).map_err(|error| {
            warn!(%error, "TLS certificate not reloaded; the one in use is kept");
            error
        })
    }

    /// Presents `read` to the connections made from now on.
    pub fn serve(&self, read: ReadCertificate) {
        self.current.0.store(Arc::new(read.0));
        info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
    }

    /// The server handshake over `tcp` (wrapped by `wrap` once it is
    /// known to speak TLS), within [`HANDSHAKE_TIMEOUT`]. A client that
    /// speaks plain HTTP is answered 400 and the connection closed.
    pub(crate) async fn accept<IO>(
        &self,
        tcp: TcpStream,
        wrap: impl FnOnce(TcpStream) -> IO,
    ) -> io::Result<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let handshake = async {
            let mut first = [0u8; 1];
            if tcp.peek(&mut first).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if first[0] != TLS_HANDSHAKE_RECORD {
                let mut tcp = tcp;
                tcp.write_all(PLAIN_HTTP_ANSWER).await?;
                let _ = tcp.shutdown().await;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "plain HTTP on the HTTPS port",
                ));
            }
            self.acceptor.accept(wrap(tcp)).await
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
    }
}

fn load(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    ray_dashd_tls::load_certified_key((CERT_SETTING, &files.cert), (KEY_SETTING, &files.key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_http_answer_has_its_length() {
        let text = std::str::from_utf8(PLAIN_HTTP_ANSWER).expect("ascii");
        let (_, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
    }
}
