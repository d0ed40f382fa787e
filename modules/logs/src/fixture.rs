//! Test fixture: a log folder in a temp dir, with a folder beside it that
//! holds a secret no route may ever serve.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::{router, LogDir};

/// Bound on every wait for something the server should do.
pub(crate) const WAIT: Duration = Duration::from_secs(5);

/// Content of `outside/secret`.
pub(crate) const SECRET: &str = "top secret\n";

/// `<tmp>/logs` as the log folder and `<tmp>/outside/secret` beside it.
#[derive(Debug)]
pub(crate) struct Fixture {
    /// Owns the temp dir.
    pub(crate) tmp: tempfile::TempDir,
    /// The log folder.
    pub(crate) dir: LogDir,
    /// The token the router's live tails end on.
    pub(crate) shutdown: CancellationToken,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("logs")).unwrap();
        fs::create_dir(tmp.path().join("outside")).unwrap();
        fs::write(tmp.path().join("outside/secret"), SECRET).unwrap();
        let dir = LogDir::new(&tmp.path().join("logs")).unwrap();
        Self {
            tmp,
            dir,
            shutdown: CancellationToken::new(),
        }
    }

    pub(crate) fn logs(&self) -> &Path {
        self.dir.root()
    }

    pub(crate) fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    /// Creates (or replaces) `name` in the log folder, with its folders.
    pub(crate) fn write(&self, name: &str, content: &[u8]) {
        let path = self.logs().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    /// Appends to `name`, as a logger would.
    pub(crate) fn append(&self, name: &str, content: &str) {
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(self.logs().join(name))
            .unwrap();
        file.write_all(content.as_bytes()).unwrap();
    }

    pub(crate) fn router(&self) -> Router {
        router(self.dir.clone(), self.shutdown.clone())
    }
}

/// Percent-encodes `name` for a query string.
pub(crate) fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
