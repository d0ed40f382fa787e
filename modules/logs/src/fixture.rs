//! Test fixture: a log folder in a temp dir, with a folder beside it that
//! holds a secret no route may ever serve, and a thread that swaps a
//! sub-folder with a link to that folder while a test reads through it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use rustix::fs::{renameat_with, RenameFlags, CWD};
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

/// Content of `logs/sub/secret.txt` in [`Fixture::race`].
pub(crate) const INSIDE: &str = "inside\n";

/// Content of `outside/secret.txt` in [`Fixture::race`]: no answer may hold it.
pub(crate) const OUTSIDE: &str = "OUTSIDE\n";

/// A file only the outside folder has: a listing that names it went there.
pub(crate) const OUTSIDE_ONLY: &str = "outside-only.txt";

impl Fixture {
    /// Lays out the folder swap attack: `logs/sub/secret.txt` (a real
    /// folder), `logs/swap` (a link to `outside/`, which has its own
    /// `secret.txt` and [`OUTSIDE_ONLY`]), and starts a thread exchanging
    /// `sub` and `swap` as fast as it can.
    pub(crate) fn race(&self) -> Swapper {
        self.write("sub/secret.txt", INSIDE.as_bytes());
        fs::write(self.outside().join("secret.txt"), OUTSIDE).unwrap();
        fs::write(self.outside().join(OUTSIDE_ONLY), "").unwrap();
        std::os::unix::fs::symlink(self.outside(), self.logs().join("swap")).unwrap();
        Swapper::start(self.logs())
    }
}

/// A thread exchanging `<logs>/sub` and `<logs>/swap` atomically with
/// `renameat2(RENAME_EXCHANGE)` in a loop, so that `sub` is a real folder
/// one moment and a link leading out the next. Stopped and joined by
/// [`stop`](Self::stop), or on drop if a test fails first.
#[derive(Debug)]
pub(crate) struct Swapper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Swapper {
    fn start(logs: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (sub, swap) = (logs.join("sub"), logs.join("swap"));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut swaps = 0;
                while !stop.load(AtomicOrdering::Relaxed) {
                    renameat_with(CWD, &sub, CWD, &swap, RenameFlags::EXCHANGE)
                        .expect("renameat2(RENAME_EXCHANGE) of sub and swap");
                    swaps += 1;
                }
                swaps
            })
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread and returns how many exchanges it made.
    pub(crate) fn stop(mut self) -> u64 {
        self.stop.store(true, AtomicOrdering::Relaxed);
        let thread = self.thread.take().expect("joined only here or on drop");
        thread.join().expect("swapper thread panicked")
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, AtomicOrdering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A test already failing; its own panic says why.
            let _ = thread.join();
        }
    }
}
