//! Logging: `tracing` to stderr and to `<session>/logs/dashboard.log`.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

use crate::error::StartupError;
use crate::session::Session;

/// Lines queued for the log file's writer thread. The queue is allocated
/// whole up front (the crate's default, 128k lines, costs 4 MiB of RSS);
/// when the disk falls this far behind, lines are dropped rather than the
/// server blocked.
const FILE_QUEUE_LINES: usize = 8 * 1024;

/// The filter when neither `RAY_DASHD_LOG` nor `RUST_LOG` is set.
const DEFAULT_FILTER: &str = "info";

/// Installs the global subscriber. Keep the guard alive until exit: it
/// flushes the file writer.
pub fn init(session: &Session) -> Result<WorkerGuard, StartupError> {
    let path = session.logs.join("dashboard.log");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|source| StartupError::Log { path, source })?;
    let (file_writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(FILE_QUEUE_LINES)
        .lossy(true)
        .finish(file);
    let filter = || {
        std::env::var("RAY_DASHD_LOG")
            .or_else(|_| std::env::var("RUST_LOG"))
            .ok()
            .and_then(|spec| EnvFilter::try_new(spec).ok())
            .unwrap_or_else(|| EnvFilter::new(DEFAULT_FILTER))
    };
    let stderr_is_tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::registry()
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(stderr_is_tty)
                .with_filter(filter()),
        )
        .with(
            fmt::layer()
                .with_writer(file_writer)
                .with_ansi(false)
                .with_filter(filter()),
        )
        .init();
    Ok(guard)
}
