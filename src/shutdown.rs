//! The shutdown signal: SIGTERM or SIGINT, whichever comes first.

use tokio::signal::unix::{signal as unix_signal, SignalKind};

/// Resolves when SIGTERM or SIGINT arrives, and logs which. The handlers are
/// installed when this is called, not when it is first polled.
pub fn signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let mut term = unix_signal(SignalKind::terminate())?;
    let mut int = unix_signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    })
}
