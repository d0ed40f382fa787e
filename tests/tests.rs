//! Integration tests: the real `ray-dashd` binary, the test module behind
//! it, driven over loopback. `cargo build --workspace` must run first.

// Test helpers are `pub` for the sibling test modules, not for export.
#![allow(unreachable_pub)]

mod bins;
mod support;

mod cli;
mod client_proxy;
mod config;
mod deploy;
mod descendants;
mod descriptors;
mod file_pages;
mod fork_shim;
mod guard;
mod idle_clients;
mod install;
mod logging;
mod metrics;
mod module_connections;
mod off_runtime;
mod other_user;
mod proxy_http;
mod proxy_stream;
mod proxy_ws;
mod python_module;
mod ray_client;
mod ray_cluster;
mod ray_head;
mod ray_releases;
mod ray_scale;
mod ray_serving;
mod ray_setup;
mod ray_tls;
mod readme;
mod reload;
mod shared_answers;
mod shutdown;
mod sockets;
mod supervisor;
mod tls;
mod ui;
mod url_prefix;
