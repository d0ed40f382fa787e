//! Config reload without a restart (SIGHUP, `POST /api/reload`): the
//! config is read again as at start-up; modules added are started, removed
//! ones stopped once their requests in flight have finished (within
//! `server.shutdown_grace_secs`), changed ones (command, environment,
//! routes, supervision) started again; unchanged ones, and their open
//! connections, are not touched. A config that fails validation changes
//! nothing.
//!
//! Only the modules change: the other settings (address, port, limits,
//! `[ray]`) were used to set the host up and are kept; a reload that
//! changes them says which, and they take effect at the next start. Ray's
//! modules and the Ray Client proxy, found at start-up, are kept as they
//! are, and checked against the new config's modules.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::cli::Cli;
use crate::config::{Config, ModuleSpec};
use crate::error::ConfigError;
use crate::proxy::Proxy;
use crate::session::Session;
use crate::supervisor::Supervisor;

/// Where a reload reads the config again from, and what start-up added to
/// it.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The command line (and environment) the host started with.
    cli: Cli,
    /// The modules added at start-up beyond the config: Ray's and the Ray
    /// Client proxy.
    hosted: Vec<ModuleSpec>,
}

impl ReloadSource {
    /// Reloads read the config as `cli` names it; the modules of `config`
    /// beyond those of the config file (and the built-in ones) are kept.
    pub fn new(cli: Cli, file_modules: usize, config: &Config) -> ReloadSource {
        ReloadSource {
            cli,
            hosted: config.modules[file_modules.min(config.modules.len())..].to_vec(),
        }
    }

    /// The config as it reads now, with the modules start-up added.
    fn read(&self) -> Result<Config, ConfigError> {
        let mut config = Config::load(&self.cli)?;
        if !self.hosted.is_empty() {
            config.add_modules(
                "<the modules hosted since start-up: Ray's>",
                self.hosted.clone(),
            )?;
        }
        Ok(config)
    }
}

/// What a reload did, by module name: `POST /api/reload`'s answer.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ReloadReport {
    /// Modules started.
    pub added: Vec<String>,
    /// Modules being stopped.
    pub removed: Vec<String>,
    /// Modules started again with their new settings.
    pub changed: Vec<String>,
    /// Modules left running as they were.
    pub unchanged: Vec<String>,
    /// Settings the new config changes that take effect only at the next
    /// start (`server.port`, `ray.python`, …).
    pub not_applied: Vec<String>,
}

/// Applies reloads, one at a time.
#[derive(Debug)]
pub struct Reloader {
    source: ReloadSource,
    session: Session,
    supervisor: Arc<Supervisor>,
    proxy: Arc<Proxy>,
    /// The config in effect; held for the whole of a reload, so that two
    /// reloads (a SIGHUP and a `POST`) never interleave. Not on any request
    /// path.
    running: Mutex<Config>,
}

impl Reloader {
    /// A reloader of the host running `config`.
    pub fn new(
        source: ReloadSource,
        config: Config,
        session: Session,
        supervisor: Arc<Supervisor>,
        proxy: Arc<Proxy>,
    ) -> Reloader {
        Reloader {
            source,
            session,
            supervisor,
            proxy,
            running: Mutex::new(config),
        }
    }

    /// Reads the config again and applies its modules. On an error, nothing
    /// changed.
    pub async fn reload(&self) -> Result<ReloadReport, ConfigError> {
        let mut running = self.running.lock().await;
        let source = self.source.clone();
        // Reading the file (and checking programs on PATH) blocks.
        let read = tokio::task::spawn_blocking(move || source.read())
            .await
            .unwrap_or_else(|e| {
                Err(ConfigError::Invalid {
                    file: "<reload>".to_owned(),
                    field: "(top level)".to_owned(),
                    problem: format!("the reload task failed: {e}"),
                })
            });
        let new = match read {
            Ok(new) => new,
            Err(error) => {
                warn!(%error, "reload refused; the running config is kept");
                return Err(error);
            }
        };
        for module in &new.modules {
            if let Err(error) = Session::check_socket_path(&self.session.socket_path(&module.name))
            {
                let error = ConfigError::Invalid {
                    file: "<reload>".to_owned(),
                    field: format!("module {}", module.name),
                    problem: error.to_string(),
                };
                warn!(%error, "reload refused; the running config is kept");
                return Err(error);
            }
        }
        let not_applied = not_applied(&running, &new);
        let applied = self.supervisor.apply(&new.modules);
        // From here on, new requests go to the new modules; those routed
        // already finish with the old ones.
        self.proxy.set_modules(self.supervisor.modules());
        let grace = running.server.shutdown_grace;
        for module in applied.retired {
            // In the background, tracked: shutdown waits for it.
            let supervisor = Arc::clone(&self.supervisor);
            self.supervisor.track(async move {
                supervisor.retire(&module, grace).await;
            });
        }
        let report = ReloadReport {
            added: applied.added,
            removed: applied.removed,
            changed: applied.changed,
            unchanged: applied.unchanged,
            not_applied,
        };
        info!(
            added = ?report.added,
            removed = ?report.removed,
            changed = ?report.changed,
            unchanged = report.unchanged.len(),
            "config reloaded"
        );
        if !report.not_applied.is_empty() {
            warn!(
                settings = ?report.not_applied,
                "these settings changed but take effect only when ray-dashd starts again"
            );
        }
        let mut kept = new;
        kept.server = running.server.clone();
        kept.ray = running.ray.clone();
        kept.host = running.host;
        kept.port = running.port;
        kept.session_dir = running.session_dir.clone();
        *running = kept;
        Ok(report)
    }
}

/// The settings other than modules that differ between `old` and `new`,
/// by their config names: they are not applied by a reload.
fn not_applied(old: &Config, new: &Config) -> Vec<String> {
    let mut changed = Vec::new();
    let mut check = |name: &str, differs: bool| {
        if differs {
            changed.push(name.to_owned());
        }
    };
    check("server.session_dir", old.session_dir != new.session_dir);
    check("server.host", old.host != new.host);
    check("server.port", old.port != new.port);
    // Compared whole, named by table: their fields are many.
    check(
        "[server]",
        format!("{:?}", old.server) != format!("{:?}", new.server),
    );
    check(
        "[ray]",
        format!("{:?}", old.ray) != format!("{:?}", new.ray),
    );
    // `[module_defaults]` is not listed: it reaches the modules that use
    // it, which are then changed modules.
    changed
}
