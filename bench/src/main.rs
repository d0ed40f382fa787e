//! `ray-dashd-bench`: the load generator behind `bench/run.sh`.
//!
//! Every measuring subcommand prints one JSON line on stdout; `run.sh` tags
//! those lines and `report` turns them into the Markdown table. The same
//! binary drives every column (a backend's Unix socket, ray-dashd, nginx),
//! so the client's own cost is identical in all of them. `ray_dashboard.sh`
//! uses it too, against Ray's own dashboard and ray-dashd on one Ray head,
//! with the process-tree subcommands (`find-descendant`, `tree-mem`,
//! `stop-tree`), `startup` and `ray-report`; `ray_scale.sh` with
//! `poll-mix`; `conn_scale.sh` with `idle-conns` and `ws-hold`.
//!
//! # Runtime
//!
//! The load tool shares the machine (2 cores on the reference box) with the
//! proxy and the backend, so every cycle it burns is taken from them. By
//! default it runs on a current-thread Tokio runtime: one core at most, no
//! cross-thread wake-ups, no work stealing. `--threads N` (N > 1) switches to
//! a multi-thread runtime for comparison. Measured on the 2-core reference
//! box (aiohttp backend, 4 s points): 1 thread gave 34.4k/34.8k req/s
//! direct at 16/64 connections and 19.6k/23.0k through ray-dashd, 2 threads
//! 31.5k/34.7k and 17.1k/21.6k, at more client CPU per request (11.3 vs
//! 9.7 µs): the second client thread only takes a core away from the
//! backend and the proxy. Hence one thread.

mod conns;
mod fake_raylets;
mod http_load;
mod killtest;
mod net;
mod parse_relay;
mod poll_mix;
mod procfs;
mod proctree;
mod ray_clients;
mod ray_report;
mod ray_rtt;
mod report;
mod startup;
mod stream;
mod tcp_relay;
mod ws;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::net::Target;

/// Load generator for ray-dashd's benchmark; see bench/README.md.
#[derive(Debug, Parser)]
#[command(name = "ray-dashd-bench", version, about)]
struct Cli {
    /// Runtime worker threads of the load tool; 1 is a current-thread runtime.
    #[arg(
        long,
        global = true,
        default_value_t = 1,
        env = "BENCH_LOADGEN_THREADS"
    )]
    threads: usize,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Closed-loop small GETs over keep-alive HTTP/1.1 connections:
    /// {rps, p50_us, p99_us, requests, errors, cpu_us_per_req}.
    Http(HttpArgs),
    /// One large streamed GET (best of --runs): {mib_per_s, bytes}.
    Stream(StreamArgs),
    /// Websocket echo, one message outstanding per connection:
    /// {msgs_per_s, p50_us, p99_us, messages, errors}.
    Ws(WsArgs),
    /// SIGKILL a module's process and time the first 200 through ray-dashd:
    /// {ms_to_200, new_incarnation, ...}.
    Killtest(KillArgs),
    /// Wait until ray-dashd reports a module healthy: {pid, incarnation}.
    WaitModule(WaitModuleArgs),
    /// Wait until `GET <path>` on a target answers 200.
    WaitHttp(WaitHttpArgs),
    /// Peak and current RSS of processes, summed: {vmhwm_kib, vmrss_kib}.
    Rss(RssArgs),
    /// Render the tagged results of a run as a Markdown table.
    Report(report::ReportArgs),
    /// Time from a launch until routes answer 200 (and, for ray-dashd, all
    /// modules are healthy): {ready_ms, routes_ms, paths_ms, modules_ms}.
    Startup(StartupArgs),
    /// The first descendant of a process whose command line contains a
    /// string: {pid, cmdline}.
    FindDescendant(FindDescendantArgs),
    /// PSS, RSS and USS of a process and of its whole tree, from
    /// `/proc/<pid>/smaps_rollup`: {parent_pss_kib, total_pss_kib, ...}.
    TreeMem(TreePidArgs),
    /// Stop a process and every process below it, by pid (SIGTERM to the
    /// root, then to the rest, then SIGKILL): {processes, ms, sigkilled}.
    StopTree(StopTreeArgs),
    /// Render the results of ray_dashboard.sh as a Markdown table.
    RayReport(ray_report::RayReportArgs),
    /// Ray clients connected one after another to a Ray Client proxy and
    /// kept connected, until one fails: {held, saturated, errors, ...}.
    RayClients(RayClientsArgs),
    /// Per-message cost of a Ray Client proxy hop, against fake servers:
    /// {datapath, unary, get_object: {median_us, p99_us, proxy_cpu_us_per_op}}.
    RayRtt(RayRttArgs),
    /// Ray's dashboard release mix polled by clients once a period, plus
    /// probes: per path {p50_ms, p95_ms, p99_ms, max_ms, requests, errors,
    /// bytes_median, ...}.
    PollMix(PollMixArgs),
    /// The node managers of ray_synth_cluster.py's synthetic nodes, a
    /// loopback port each (gRPC health, resource load, node stats), until
    /// SIGTERM: {nodes, connections, calls}.
    FakeRaylets(FakeRayletsArgs),
    /// A byte relay with no protocol (the floor of any proxy hop) from a
    /// loopback TCP port to a target, until SIGTERM: {connections, ...}.
    TcpRelay(TcpRelayArgs),
    /// An HTTP/1 relay that parses each head and forwards small GETs over
    /// pooled target connections (the floor of a purpose-built proxy
    /// path), until SIGTERM: {connections, requests, ...}.
    ParseRelay(TcpRelayArgs),
    /// N idle keep-alive HTTP/1.1 connections (one GET each) or websockets
    /// (one echo each) held at once, and the host's and modules' memory
    /// before, connected, used once and closed: {mem, per_connection, ...}.
    IdleConns(IdleConnsArgs),
    /// Probes and a request burst with nothing held, then with N websockets
    /// held, each echoing every period; all must echo at the end:
    /// {probes_before, probes_held, burst_before, burst_held, echo, ...}.
    WsHold(WsHoldArgs),
}

/// Where to send load, as `unix:/path/to.sock` or `tcp:127.0.0.1:PORT`.
#[derive(Debug, Args)]
struct TargetArgs {
    /// `unix:/path/to.sock` or `tcp:127.0.0.1:PORT` (loopback only).
    #[arg(long)]
    target: Target,
    /// The request path (with query, if any).
    #[arg(long)]
    path: String,
}

#[derive(Debug, Args)]
struct HttpArgs {
    #[command(flatten)]
    to: TargetArgs,
    /// Concurrent keep-alive connections, one request outstanding on each.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds of load before the measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    #[command(flatten)]
    cpu: CpuArgs,
    /// The backend's pid, whose CPU per request is reported as well.
    #[arg(long)]
    backend_pid: Option<u32>,
}

#[derive(Debug, Args)]
struct StreamArgs {
    #[command(flatten)]
    to: TargetArgs,
    /// Body size the response must have; a shorter one is an error.
    #[arg(long)]
    expect_bytes: Option<u64>,
    /// Transfers to make; the best (and all) are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[command(flatten)]
    cpu: CpuArgs,
}

/// Processes whose CPU time over the measurement is reported.
#[derive(Debug, Args)]
struct CpuArgs {
    /// Pids whose utime+stime over the measured window is reported per
    /// request, message or GiB (comma-separated; summed).
    #[arg(long, value_delimiter = ',')]
    cpu_pids: Vec<u32>,
    /// Kernel clock ticks per second (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
}

#[derive(Debug, Args)]
struct WsArgs {
    #[command(flatten)]
    to: TargetArgs,
    /// Concurrent websockets, one message outstanding on each.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds before the measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Bytes in each text message.
    #[arg(long, default_value_t = 32)]
    message_bytes: usize,
    #[command(flatten)]
    cpu: CpuArgs,
}

#[derive(Debug, Args)]
struct KillArgs {
    /// ray-dashd's address, `127.0.0.1:PORT`.
    #[arg(long)]
    dashd: std::net::SocketAddr,
    /// The module to kill.
    #[arg(long)]
    module: String,
    /// The route polled (through ray-dashd) until it answers 200.
    #[arg(long)]
    path: String,
    /// Milliseconds between two polls.
    #[arg(long, default_value_t = 10)]
    poll_ms: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
}

#[derive(Debug, Args)]
struct WaitModuleArgs {
    /// ray-dashd's address, `127.0.0.1:PORT`.
    #[arg(long)]
    dashd: std::net::SocketAddr,
    /// The module.
    #[arg(long)]
    module: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
}

#[derive(Debug, Args)]
struct WaitHttpArgs {
    #[command(flatten)]
    to: TargetArgs,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
}

#[derive(Debug, Args)]
struct RssArgs {
    /// Pids (comma-separated) whose VmHWM and VmRSS are summed.
    #[arg(long, value_delimiter = ',', required = true)]
    pids: Vec<u32>,
}

#[derive(Debug, Args)]
struct StartupArgs {
    /// ray-dashd or Ray's dashboard, `tcp:127.0.0.1:PORT`.
    #[arg(long)]
    target: Target,
    /// A route that must answer 200 (repeat the flag for more).
    #[arg(long = "path", required = true)]
    paths: Vec<String>,
    /// Also wait until ray-dashd's /api/modules lists at least this many
    /// modules, all healthy.
    #[arg(long)]
    modules: Option<usize>,
    /// The launch, in seconds since the Unix epoch (bash: $EPOCHREALTIME).
    #[arg(long)]
    since: f64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 180.0)]
    timeout: f64,
}

#[derive(Debug, Args)]
struct FindDescendantArgs {
    /// The process whose descendants are searched (itself excluded).
    #[arg(long)]
    pid: u32,
    /// A string the command line (arguments joined by spaces) must contain.
    #[arg(long)]
    cmdline_contains: String,
}

#[derive(Debug, Args)]
struct TreePidArgs {
    /// The root of the tree.
    #[arg(long)]
    pid: u32,
}

#[derive(Debug, Args)]
struct StopTreeArgs {
    /// The root of the tree.
    #[arg(long)]
    pid: u32,
    /// Seconds each step (SIGTERM to the root, SIGTERM to the rest, SIGKILL)
    /// waits for the processes to exit.
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
}

#[derive(Debug, Args)]
struct RayClientsArgs {
    /// The proxy's client port, `127.0.0.1:PORT`.
    #[arg(long)]
    target: std::net::SocketAddr,
    /// Stop after this many clients.
    #[arg(long, default_value_t = 500)]
    max: usize,
    /// Seconds a client may take to connect and make its call; a client
    /// that takes longer ends the ramp (the proxy is saturated).
    #[arg(long, default_value_t = 20.0)]
    timeout: f64,
    /// End the ramp after this many clients failed otherwise.
    #[arg(long, default_value_t = 5)]
    max_errors: usize,
    /// `reconnect_grace_period` sent in `init` (Ray's client sends 30).
    #[arg(long, default_value_t = 30)]
    grace: i32,
    /// Open a `Logstream` per client, as Ray's client does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    logstream: bool,
    /// The proxy's pid: its RSS and CPU time are reported.
    #[arg(long)]
    proxy_pid: Option<u32>,
    /// Kernel clock ticks per second (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    /// Prefix of the clients' `client_id`s.
    #[arg(long, default_value = "bench")]
    id_prefix: String,
}

#[derive(Debug, Args)]
struct RayRttArgs {
    /// A proxy's client port or a fake server's port, `127.0.0.1:PORT`.
    #[arg(long)]
    target: std::net::SocketAddr,
    /// Measured operations of each kind.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Unmeasured operations of each kind first.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// The proxy's pid: its CPU time per operation is reported.
    #[arg(long)]
    proxy_pid: Option<u32>,
    /// Kernel clock ticks per second (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    /// The client's `client_id`.
    #[arg(long, default_value = "bench-rtt")]
    id: String,
    /// Operations to time (comma-separated): datapath, unary, get_object.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "datapath,unary,get_object"
    )]
    kinds: Vec<String>,
}

#[derive(Debug, Args)]
struct PollMixArgs {
    /// The dashboard, `tcp:127.0.0.1:PORT`.
    #[arg(long)]
    target: Target,
    /// A path every client polls (repeat the flag for more).
    #[arg(long = "mix")]
    mix: Vec<String>,
    /// Clients polling the whole mix, each path on a poller of its own.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// A path polled as a prober does (repeat the flag for more).
    #[arg(long = "probe")]
    probes: Vec<String>,
    /// Seconds between the starts of two polls of one poller (a slower
    /// answer delays the next poll).
    #[arg(long, default_value_t = 1.0)]
    period: f64,
    /// Seconds during which polls start.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Seconds a mix request may take (Ray's release test: 30).
    #[arg(long, default_value_t = 30.0)]
    mix_timeout: f64,
    /// Seconds a probe may take.
    #[arg(long, default_value_t = 1.0)]
    probe_timeout: f64,
    /// `Accept-Encoding` of every request; empty: none.
    #[arg(long, default_value = "gzip, deflate, br, zstd")]
    accept_encoding: String,
    /// Report the CPU time of this process's whole tree over the run.
    #[arg(long)]
    cpu_tree: Option<u32>,
    /// Kernel clock ticks per second (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
}

#[derive(Debug, Args)]
struct FakeRayletsArgs {
    /// Hex lines: the GetNodeStats reply, then one GetResourceLoad reply per node.
    #[arg(long)]
    input: std::path::PathBuf,
    /// Where the nodes' ports go, as {"ports": [...]}, once all listen.
    #[arg(long)]
    ports_file: std::path::PathBuf,
    /// Ports no node may listen on (comma-separated): a Ray head's
    /// defaults, for one started beside the synthetic cluster.
    #[arg(long, value_delimiter = ',')]
    avoid_ports: Vec<u16>,
}

#[derive(Debug, Args)]
struct TcpRelayArgs {
    /// The loopback address to accept connections on, `127.0.0.1:PORT`.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Where each connection is relayed: `unix:/path/to.sock` or
    /// `tcp:127.0.0.1:PORT`.
    #[arg(long)]
    to: Target,
}

/// The processes whose memory `idle-conns` and `ws-hold` read.
#[derive(Debug, Args)]
struct ScaleProcs {
    /// ray-dashd's pid.
    #[arg(long)]
    host_pid: u32,
    /// The modules' pids (comma-separated), summed.
    #[arg(long, value_delimiter = ',')]
    module_pids: Vec<u32>,
    /// Connections opened (or websocket handshakes made) at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

#[derive(Debug, Args)]
struct IdleConnsArgs {
    /// ray-dashd, `tcp:127.0.0.1:PORT`.
    #[arg(long)]
    target: Target,
    /// `http`: keep-alive connections, one GET each; `ws`: websockets, one
    /// echo each.
    #[arg(long, value_enum)]
    kind: conns::Kind,
    /// The GET path (http) or a websocket path (ws; repeat the flag to
    /// spread them over several, used in turn).
    #[arg(long = "path", required = true)]
    paths: Vec<String>,
    /// Connections held at once.
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Seconds between a step and the memory reading after it. ray-dashd
    /// closes a keep-alive connection idle for 30 s, so keep it short.
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    #[command(flatten)]
    procs: ScaleProcs,
}

#[derive(Debug, Args)]
struct WsHoldArgs {
    /// ray-dashd, `tcp:127.0.0.1:PORT`.
    #[arg(long)]
    target: Target,
    /// A websocket echo path (repeat the flag for more; used in turn).
    #[arg(long = "ws-path", required = true)]
    ws_paths: Vec<String>,
    /// Websockets held at once.
    #[arg(long, default_value_t = 10_000)]
    websockets: usize,
    /// The path probed, on a new connection each time.
    #[arg(long, default_value = "/api/healthz")]
    probe_path: String,
    /// Milliseconds between two probes.
    #[arg(long, default_value_t = 20)]
    probe_ms: u64,
    /// Seconds of probes with nothing held.
    #[arg(long, default_value_t = 10.0)]
    baseline: f64,
    /// Seconds the websockets are held, echoing, and probed meanwhile.
    #[arg(long, default_value_t = 30.0)]
    hold: f64,
    /// Seconds between two echoes of one websocket.
    #[arg(long, default_value_t = 5.0)]
    echo_every: f64,
    /// The http route of the burst.
    #[arg(long)]
    burst_path: String,
    /// Requests of the burst, all at once, each on a new connection.
    #[arg(long, default_value_t = 400)]
    burst: usize,
    /// Kernel clock ticks per second (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    #[command(flatten)]
    procs: ScaleProcs,
}

fn secs(value: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{what} must be a non-negative number of seconds"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut builder = if cli.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(cli.threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ray-dashd-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ray-dashd-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<String> {
    let value = match command {
        Command::Http(a) => {
            http_load::run(http_load::Plan {
                target: a.to.target,
                path: a.to.path,
                connections: a.connections.max(1),
                duration: secs(a.duration, "--duration")?,
                warmup: secs(a.warmup, "--warmup")?,
                cpu_pids: a.cpu.cpu_pids,
                backend_pid: a.backend_pid,
                clk_tck: a.cpu.clk_tck,
            })
            .await?
        }
        Command::Stream(a) => {
            stream::run(
                &a.to.target,
                &a.to.path,
                a.expect_bytes,
                a.runs.max(1),
                &a.cpu.cpu_pids,
                a.cpu.clk_tck,
            )
            .await?
        }
        Command::Ws(a) => {
            ws::run(ws::Plan {
                target: a.to.target,
                path: a.to.path,
                connections: a.connections.max(1),
                duration: secs(a.duration, "--duration")?,
                warmup: secs(a.warmup, "--warmup")?,
                message_bytes: a.message_bytes.max(1),
                cpu_pids: a.cpu.cpu_pids,
                clk_tck: a.cpu.clk_tck,
            })
            .await?
        }
        Command::Killtest(a) => {
            killtest::run(killtest::Plan {
                dashd: a.dashd,
                module: a.module,
                path: a.path,
                poll: Duration::from_millis(a.poll_ms.max(1)),
                timeout: secs(a.timeout, "--timeout")?,
            })
            .await?
        }
        Command::WaitModule(a) => {
            killtest::wait_module(a.dashd, &a.module, secs(a.timeout, "--timeout")?).await?
        }
        Command::WaitHttp(a) => {
            killtest::wait_http(&a.to.target, &a.to.path, secs(a.timeout, "--timeout")?).await?
        }
        Command::Rss(a) => procfs::rss_json(&a.pids)?,
        Command::RayRtt(a) => {
            anyhow::ensure!(
                a.target.ip().is_loopback(),
                "--target must be a loopback address"
            );
            ray_rtt::run(ray_rtt::Plan {
                target: a.target,
                iterations: a.iterations.max(1),
                warmup: a.warmup,
                proxy_pid: a.proxy_pid,
                clk_tck: a.clk_tck,
                id: a.id,
                kinds: a.kinds,
            })
            .await?
        }
        Command::TcpRelay(a) => tcp_relay::run(a.listen, a.to).await?,
        Command::ParseRelay(a) => parse_relay::run(a.listen, a.to).await?,
        Command::IdleConns(a) => {
            conns::idle(conns::IdlePlan {
                target: a.target,
                kind: a.kind,
                paths: a.paths,
                connections: a.connections.max(1),
                concurrency: a.procs.concurrency.max(1),
                settle: secs(a.settle, "--settle")?,
                host_pid: a.procs.host_pid,
                module_pids: a.procs.module_pids,
            })
            .await?
        }
        Command::WsHold(a) => {
            conns::hold(conns::HoldPlan {
                target: a.target,
                ws_paths: a.ws_paths,
                websockets: a.websockets.max(1),
                concurrency: a.procs.concurrency.max(1),
                probe_path: a.probe_path,
                probe_every: Duration::from_millis(a.probe_ms.max(1)),
                baseline: secs(a.baseline, "--baseline")?,
                hold: secs(a.hold, "--hold")?,
                echo_every: secs(a.echo_every, "--echo-every")?.max(Duration::from_millis(10)),
                burst_path: a.burst_path,
                burst: a.burst,
                host_pid: a.procs.host_pid,
                module_pids: a.procs.module_pids,
                clk_tck: a.clk_tck,
            })
            .await?
        }
        Command::FakeRaylets(a) => {
            fake_raylets::run(&a.input, &a.ports_file, &a.avoid_ports).await?
        }
        Command::PollMix(a) => {
            poll_mix::run(poll_mix::Plan {
                target: a.target,
                mix: a.mix,
                clients: a.clients,
                probes: a.probes,
                period: secs(a.period, "--period")?.max(Duration::from_millis(1)),
                duration: secs(a.duration, "--duration")?,
                mix_timeout: secs(a.mix_timeout, "--mix-timeout")?,
                probe_timeout: secs(a.probe_timeout, "--probe-timeout")?,
                accept_encoding: a.accept_encoding,
                cpu_tree: a.cpu_tree,
                clk_tck: a.clk_tck,
            })
            .await?
        }
        Command::RayClients(a) => {
            anyhow::ensure!(
                a.target.ip().is_loopback(),
                "--target must be a loopback address"
            );
            ray_clients::run(ray_clients::Plan {
                target: a.target,
                max: a.max,
                timeout: secs(a.timeout, "--timeout")?,
                max_errors: a.max_errors.max(1),
                grace: a.grace,
                logstream: a.logstream,
                proxy_pid: a.proxy_pid,
                clk_tck: a.clk_tck,
                id_prefix: a.id_prefix,
            })
            .await?
        }
        Command::Report(a) => return report::render(&a),
        Command::Startup(a) => {
            startup::run(startup::Plan {
                target: a.target,
                paths: a.paths,
                modules: a.modules,
                since: a.since,
                timeout: secs(a.timeout, "--timeout")?,
            })
            .await?
        }
        Command::FindDescendant(a) => proctree::find_descendant(a.pid, &a.cmdline_contains)?,
        Command::TreeMem(a) => proctree::tree_mem(a.pid)?,
        Command::StopTree(a) => {
            let grace = secs(a.grace, "--grace")?;
            tokio::task::spawn_blocking(move || proctree::stop_tree(a.pid, grace)).await??
        }
        Command::RayReport(a) => return ray_report::render(&a),
    };
    Ok(value.to_string())
}
