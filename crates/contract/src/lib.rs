//! What ray-dashd (the host), its modules, its helper processes and the
//! bench agree on, and the small policies they share (a retry's backoff, a
//! poisoned lock), written once: a small crate of plain functions, without
//! an async runtime, that every side can depend on without pulling in
//! another's.
//!
//! # Layout
//!
//! - [`names`]: the module contract's names: the environment variables the
//!   host starts a module with, its health path and its socket's name.
//! - [`child`]: the set-up of a child process a process owns (its own
//!   process group, killed by the kernel when its parent dies).
//! - [`proc`]: reading `/proc`: a process's `stat` line, the pids, command
//!   lines and `status` values.
//! - [`token`]: the cluster's token, compared in constant time.
//! - [`backoff`]: the one retry delay, doubling up to a cap.
//! - [`browser`]: Ray's signs that a request comes from a browser.
//! - [`lock`]: the one policy for a poisoned lock (take the data anyway).

pub mod backoff;
pub mod browser;
pub mod child;
pub mod lock;
pub mod names;
pub mod proc;
pub mod token;

pub use backoff::Backoff;
pub use lock::{LockExt, RwLockExt};
pub use token::Token;
