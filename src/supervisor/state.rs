//! What a module is doing now and what happened to it lately: the status the
//! module task writes and the proxy and `/api/modules` read.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::connection::ModulePool;

/// How many past events a module keeps for `/api/modules`.
const EVENT_HISTORY: usize = 32;

/// The life cycle of a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModuleState {
    /// Started on demand and not asked for yet: no process runs; the first
    /// request for one of its routes starts it.
    Dormant,
    /// A new incarnation is spawned and not yet answering `/api/healthz`.
    Starting,
    /// Alive, but not ready for a reason outside it (its `/api/healthz`
    /// answers 503 with `Retry-After`, such as a port another process
    /// holds): kept running, never restarted for it, checked every
    /// `health_interval`.
    Waiting,
    /// Ready and passing its health checks; requests are forwarded.
    Healthy,
    /// Failed (exited, hung or unhealthy) and being stopped.
    Unhealthy,
    /// Waiting out the restart delay after failures in a row.
    Backoff,
    /// Being stopped on request or at shutdown.
    Stopping,
    /// Stopped for good (the host is shutting down).
    Stopped,
}

impl ModuleState {
    /// The lowercase name used in responses and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleState::Dormant => "dormant",
            ModuleState::Starting => "starting",
            ModuleState::Waiting => "waiting",
            ModuleState::Healthy => "healthy",
            ModuleState::Unhealthy => "unhealthy",
            ModuleState::Backoff => "backoff",
            ModuleState::Stopping => "stopping",
            ModuleState::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for ModuleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Lets requests through to one healthy incarnation.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    /// The connection pool to this incarnation's socket.
    pub(crate) client: ModulePool,
    /// Cancelled when the incarnation fails: in-flight requests end at once.
    pub(crate) cancel: CancellationToken,
    /// The incarnation behind the gate.
    pub(crate) incarnation: u32,
}

/// One thing that happened to a module.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The incarnation it concerns.
    pub incarnation: u32,
    /// What happened: `dormant`, `woken`, `spawned`, `waiting`, `ready`,
    /// `busy`, `failed`, `restart`, `stopped`.
    pub kind: &'static str,
    /// Details, such as the failure's reason.
    pub detail: String,
}

/// Everything known about a module right now.
#[derive(Debug)]
pub(crate) struct Status {
    pub(crate) state: ModuleState,
    pub(crate) pid: Option<u32>,
    /// The current (or last) incarnation; `None` before the first spawn.
    pub(crate) incarnation: Option<u32>,
    /// Incarnations started after the first.
    pub(crate) restarts: u32,
    /// Failures since the module was last stable, which set the backoff.
    pub(crate) failures_in_row: u32,
    /// Failed health checks in a row of the current incarnation.
    pub(crate) failed_checks: u32,
    pub(crate) last_error: Option<String>,
    /// Why the incarnation is not ready yet, in its own words (its latest
    /// non-200 `/api/healthz` answer while starting or waiting).
    pub(crate) reason: Option<String>,
    pub(crate) started_at: Option<SystemTime>,
    pub(crate) ready_at: Option<SystemTime>,
    pub(crate) last_health_rtt: Option<Duration>,
    pub(crate) last_health_at: Option<SystemTime>,
    /// Since when the module has been busy: its health checks unanswered
    /// while its processes use CPU (see `usage::Miss`).
    pub(crate) busy_since: Option<SystemTime>,
    /// The resident memory of its processes at the last check, in bytes.
    pub(crate) memory_bytes: Option<u64>,
    /// While in backoff: when the next incarnation starts, and the delay
    /// chosen; while waiting, the delay is the module's own (its `Retry-After`).
    pub(crate) next_start_at: Option<SystemTime>,
    pub(crate) backoff: Option<Duration>,
    pub(crate) gate: Option<Gate>,
    pub(crate) events: VecDeque<Event>,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            state: ModuleState::Starting,
            pid: None,
            incarnation: None,
            restarts: 0,
            failures_in_row: 0,
            failed_checks: 0,
            last_error: None,
            reason: None,
            started_at: None,
            ready_at: None,
            last_health_rtt: None,
            last_health_at: None,
            busy_since: None,
            memory_bytes: None,
            next_start_at: None,
            backoff: None,
            gate: None,
            events: VecDeque::with_capacity(EVENT_HISTORY),
        }
    }
}

impl Status {
    pub(crate) fn record(&mut self, kind: &'static str, detail: impl Into<String>) {
        if self.events.len() == EVENT_HISTORY {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            at_ms: epoch_ms(SystemTime::now()),
            incarnation: self.incarnation.unwrap_or(0),
            kind,
            detail: detail.into(),
        });
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
