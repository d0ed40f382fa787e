#!/usr/bin/env bash
# bench/run.sh: ray-dashd's benchmark. Drives the same backend module
# directly over its Unix socket, through ray-dashd, and (where installed)
# through nginx, with one load generator (target/release/ray-dashd-bench),
# and prints a Markdown table of each as a ratio to direct. See
# bench/README.md for what each number means and for the knobs below.
#
# Not part of the tests. Loopback only; every process it starts is stopped
# by pid on exit.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")

# --- knobs --------------------------------------------------------------------
if [[ "${BENCH_QUICK:-0}" == 1 ]]; then
    : "${BENCH_DURATION:=1}" "${BENCH_WARMUP:=0.3}" "${BENCH_STREAM_RUNS:=1}"
fi
DURATION=${BENCH_DURATION:-5}            # measured seconds per point
WARMUP=${BENCH_WARMUP:-1}                # unmeasured seconds before each point
HTTP_CONNS=${BENCH_HTTP_CONNS:-"1 16 64"}
WS_CONNS=${BENCH_WS_CONNS:-"1 8"}
STREAM_BYTES=${BENCH_STREAM_BYTES:-1073741824}
STREAM_RUNS=${BENCH_STREAM_RUNS:-3}
BACKEND=${BENCH_BACKEND:-aiohttp}        # aiohttp | rust
NGINX_MODE=${BENCH_NGINX:-auto}          # auto (use or try to install) | off
NGINX_WORKERS=${BENCH_NGINX_WORKERS:-auto}
RELAY_MODE=${BENCH_RELAY:-on}            # on: a bare byte relay column (the floor of any proxy hop) | off
BUILD=${BENCH_BUILD:-1}                  # 0: use the binaries already built
PYTHON=${BENCH_PYTHON:-python3}
ROUNDS=${BENCH_ROUNDS:-1}                # repeat every point this often (interleaved); the table shows medians
THREADS=${BENCH_LOADGEN_THREADS:-1}
DASHD_WORKERS=${BENCH_DASHD_WORKERS:-}    # ray-dashd's runtime threads ([server] worker_threads); empty: its default (1)
DASHD_ENV=${BENCH_DASHD_ENV:-}            # extra NAME=VALUE words for ray-dashd's environment, e.g. MALLOC_ARENA_MAX=2
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}
PIN=${BENCH_PIN:-}                       # a CPU list (taskset -c): every process of the run kept on it; empty: the kernel places them

BENCH_TAG=bench
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

case "$BACKEND" in aiohttp | rust) ;; *) die "BENCH_BACKEND must be aiohttp or rust" ;; esac

# --- build ----------------------------------------------------------------------
if [[ "$BUILD" == 1 ]]; then
    # ray-dashd alone first, as its users build it, so that the binary
    # measured is theirs: built in one command with other packages, its
    # dependencies may get other features unified in, its functions other
    # names, and the link order then finds fewer of them.
    packages=(-p ray-dashd-bench)
    [[ "$BACKEND" == rust ]] && packages+=(-p ray-dashd-test-module)
    log "cargo build --release -p ray-dashd; cargo build --release ${packages[*]}"
    (cd "$ROOT" && cargo build --release -p ray-dashd && cargo build --release "${packages[@]}") >&2
fi
DASHD_BIN=${BENCH_DASHD_BIN:-$ROOT/target/release/ray-dashd}   # another build of ray-dashd, for A/B runs
LOADGEN=$ROOT/target/release/ray-dashd-bench
TEST_MODULE=$ROOT/target/release/ray-dashd-test-module
[[ -x "$DASHD_BIN" && -x "$LOADGEN" ]] || die "release binaries missing; run with BENCH_BUILD=1"
[[ "$BACKEND" != rust || -x "$TEST_MODULE" ]] || die "$TEST_MODULE missing"

# --- backend ----------------------------------------------------------------------
VENV=$BENCH_DIR/.venv
if [[ "$BACKEND" == aiohttp ]]; then
    if ! "$VENV/bin/python" -c 'import aiohttp' 2>/dev/null; then
        log "creating $VENV with aiohttp"
        "$PYTHON" -m venv "$VENV" >&2
        "$VENV/bin/pip" install --quiet aiohttp >&2
    fi
    BACKEND_CMD="[\"$VENV/bin/python\", \"$BENCH_DIR/aiohttp_backend.py\"]"
    SMALL_PATH=/bench/small
    STREAM_PATH="/bench/stream?bytes=$STREAM_BYTES"
    WS_PATH=/bench/ws
    ROUTES=$(cat <<'EOF'
routes = [
  { method = "GET", path = "/bench/small", type = "http" },
  { method = "GET", path = "/bench/stream", type = "stream" },
  { method = "GET", path = "/bench/ws", type = "websocket" },
]
EOF
)
    BACKEND_DESC="aiohttp $("$VENV/bin/python" -c 'import aiohttp; print(aiohttp.__version__)') on $("$VENV/bin/python" -c 'import platform; print(platform.python_implementation(), platform.python_version())')"
else
    (( STREAM_BYTES % 65536 == 0 )) || die "BENCH_STREAM_BYTES must be a multiple of 65536 for the rust backend"
    BACKEND_CMD="[\"$TEST_MODULE\"]"
    SMALL_PATH=/test/echo
    STREAM_PATH="/test/stream?chunks=$((STREAM_BYTES / 65536))&size=65536&delay_ms=0"
    WS_PATH=/test/ws/echo
    ROUTES=$(cat <<'EOF'
routes = [
  { method = "GET", path = "/test/echo", type = "http" },
  { method = "GET", path = "/test/stream", type = "stream" },
  { method = "GET", path = "/test/ws/echo", type = "websocket" },
]
EOF
)
    BACKEND_DESC="ray-dashd-test-module (Rust, axum, current-thread runtime)"
fi

# --- nginx (optional) -----------------------------------------------------------
NGINX_BIN=""
if [[ "$NGINX_MODE" != off ]]; then
    if ! command -v nginx >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "nginx missing; trying apt-get install nginx-light (or nginx)"
        export DEBIAN_FRONTEND=noninteractive
        timeout 300 apt-get install -y nginx-light >&2 \
            || { timeout 300 apt-get update >&2 && timeout 300 apt-get install -y nginx-light >&2; } \
            || timeout 300 apt-get install -y nginx >&2 \
            || log "could not install nginx; carrying on without it"
    fi
    NGINX_BIN=$(command -v nginx || true)
    [[ -n "$NGINX_BIN" ]] || log "nginx not available: its columns will say n/a"
fi

warn_if_busy

# --- scratch space and cleanup --------------------------------------------------------
# Short, so that <session>/sockets/dash_bench stays far below 107 bytes.
TMP=$(mktemp -d /tmp/rdb.XXXXXX)
SESSION=$TMP/s
SOCKET=$SESSION/sockets/dash_bench
DASHD_PID=""
NGINX_PID=""
RELAY_PID=""

cleanup() {
    local status=$?
    stop_pid "$NGINX_PID" 10 nginx
    stop_pid "$RELAY_PID" 10 tcp-relay
    stop_pid "$DASHD_PID" 10 ray-dashd
    if [[ $status -ne 0 && -d "$TMP" ]]; then
        log "logs kept in $TMP (ray-dashd: $TMP/dashd.log, module: $SESSION/logs/)"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

mkdir -p "$RESULTS_DIR"

# --- ray-dashd ----------------------------------------------------------------------
DASHD_PORT=$(free_port)
cat >"$TMP/dashd.toml" <<EOF
[server]
host = "127.0.0.1"
${DASHD_WORKERS:+worker_threads = $DASHD_WORKERS}

[[modules]]
name = "bench"
command = $BACKEND_CMD
$ROUTES
EOF
log "starting ray-dashd on 127.0.0.1:$DASHD_PORT (session $SESSION)"
# shellcheck disable=SC2086 # DASHD_ENV is a list of NAME=VALUE words
env $DASHD_ENV \
    "$DASHD_BIN" --session-dir "$SESSION" --port "$DASHD_PORT" --config "$TMP/dashd.toml" \
    >"$TMP/dashd.log" 2>&1 &
DASHD_PID=$!
ready=$("$LOADGEN" wait-module --dashd "127.0.0.1:$DASHD_PORT" --module bench --timeout 60) \
    || die "module bench never became healthy; see $TMP/dashd.log"
BACKEND_PID=$(sed -E 's/.*"pid":([0-9]+).*/\1/' <<<"$ready")
[[ "$BACKEND_PID" =~ ^[0-9]+$ ]] || die "no backend pid in $ready"
log "ray-dashd pid $DASHD_PID; module bench (pid $BACKEND_PID) healthy on $SOCKET"

# --- nginx ------------------------------------------------------------------------------
NGINX_DESC="not installed"
NGINX_PIDS=""
if [[ -n "$NGINX_BIN" ]]; then
    NGINX_PORT=$(free_port)
    mkdir -p "$TMP/nginx"
    user_line=""
    [[ "$(id -u)" == 0 ]] && user_line="user root root;" # workers must reach the 0700 sockets dir
    cat >"$TMP/nginx/nginx.conf" <<EOF
$user_line
worker_processes $NGINX_WORKERS;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    # ray-dashd never closes a keep-alive connection after N requests;
    # nginx's default (1000) would add reconnects to its column.
    keepalive_requests 1000000;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    # proxy_pass http://unix:$SOCKET: cannot keep connections alive; an
    # upstream block with the same unix: server can.
    upstream bench_backend {
        server unix:$SOCKET;
        keepalive 128;
        keepalive_requests 1000000;
    }
    map \$http_upgrade \$connection_upgrade {
        default upgrade;
        ''      close;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location = ${WS_PATH} {
            proxy_pass http://bench_backend;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_read_timeout 3600s;
        }
        location = ${STREAM_PATH%%\?*} {
            proxy_pass http://bench_backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            # Read the backend's 64 KiB chunks whole (the default is one page).
            proxy_buffer_size 64k;
            proxy_buffers 4 64k;
            proxy_busy_buffers_size 128k;
        }
        location / {
            proxy_pass http://bench_backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
    cp "$TMP/nginx/nginx.conf" "$RESULTS_DIR/nginx.conf"
    if "$NGINX_BIN" -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx/nginx.conf" >&2; then
        for ((i = 0; i < 100; i++)); do
            [[ -s "$TMP/nginx/nginx.pid" ]] && break
            sleep 0.05
        done
        NGINX_PID=$(cat "$TMP/nginx/nginx.pid" 2>/dev/null || true)
    fi
    if [[ -n "$NGINX_PID" ]] && "$LOADGEN" wait-http --target "tcp:127.0.0.1:$NGINX_PORT" --path "$SMALL_PATH" --timeout 20 >/dev/null; then
        workers=$(cat "/proc/$NGINX_PID/task/$NGINX_PID/children" 2>/dev/null || pgrep -P "$NGINX_PID" || true)
        NGINX_PIDS=$(echo "$NGINX_PID" $workers | tr -s ' \n' ',' | sed 's/,$//')
        n_workers=$(echo $workers | wc -w)
        NGINX_DESC="$("$NGINX_BIN" -v 2>&1 | sed 's/.*version: //'), worker_processes $NGINX_WORKERS ($n_workers workers), upstream keepalive 128, keepalive_requests 1000000, stream location proxy_buffering off + proxy_buffer_size 64k (config: $RESULTS_DIR/nginx.conf)"
        log "nginx pid $NGINX_PID (processes $NGINX_PIDS) on 127.0.0.1:$NGINX_PORT"
    else
        log "nginx did not start; see $TMP/nginx/error.log; carrying on without it"
        stop_pid "$NGINX_PID" 10 nginx
        NGINX_PID=""
        NGINX_DESC="failed to start"
    fi
fi

# --- bare relay (optional) ------------------------------------------------------------
# No HTTP in it: each connection is copied byte for byte to a connection of
# its own on the backend's socket (ray-dashd-bench tcp-relay). It cannot
# route, pool, limit or check health; it shows what one more process and one
# more pair of sockets on the path cost on this machine, which no proxy avoids.
RELAY_DESC="off (BENCH_RELAY=off)"
if [[ "$RELAY_MODE" != off ]]; then
    RELAY_PORT=$(free_port)
    "$LOADGEN" tcp-relay --listen "127.0.0.1:$RELAY_PORT" --to "unix:$SOCKET" >"$TMP/relay.json" 2>"$TMP/relay.log" &
    RELAY_PID=$!
    if "$LOADGEN" wait-http --target "tcp:127.0.0.1:$RELAY_PORT" --path "$SMALL_PATH" --timeout 20 >/dev/null; then
        RELAY_DESC="ray-dashd-bench tcp-relay (Tokio copy_bidirectional, 256 KiB buffers, current-thread runtime, one backend connection per client connection)"
        log "bare relay pid $RELAY_PID on 127.0.0.1:$RELAY_PORT"
    else
        log "the bare relay did not start; see $TMP/relay.log; carrying on without it"
        stop_pid "$RELAY_PID" 10 tcp-relay
        RELAY_PID=""
        RELAY_DESC="failed to start"
    fi
fi

# --- placement --------------------------------------------------------------------------
# With BENCH_PIN, the load generator, the backend and every proxy run on
# the CPUs named, all their threads (and the backend ray-dashd starts
# again in the kill test inherits it): the kernel no longer chooses which
# of them share a CPU, which on a VM whose idle CPUs halt decides the
# one-connection rows (docs/benchmarks.md, session 26).
LOADGEN_RUN=("$LOADGEN")
PLACEMENT="the kernel's"
if [[ -n "$PIN" ]]; then
    for pid in $DASHD_PID $BACKEND_PID ${NGINX_PIDS//,/ } $RELAY_PID; do
        taskset -a -p -c "$PIN" "$pid" >/dev/null || die "taskset -a -p -c $PIN $pid failed"
    done
    LOADGEN_RUN=(taskset -c "$PIN" "$LOADGEN")
    PLACEMENT="every process pinned to CPU(s) $PIN (BENCH_PIN)"
    log "placement: $PLACEMENT"
fi

# --- measurements -------------------------------------------------------------------
RAW=$RESULTS_DIR/latest.jsonl
: >"$RAW"
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

targets=(direct dashd)
[[ -n "$NGINX_PID" ]] && targets+=(nginx)
[[ -n "$RELAY_PID" ]] && targets+=(relay)
target_addr() {
    case $1 in
        direct) echo "unix:$SOCKET" ;;
        dashd) echo "tcp:127.0.0.1:$DASHD_PORT" ;;
        nginx) echo "tcp:127.0.0.1:$NGINX_PORT" ;;
        relay) echo "tcp:127.0.0.1:$RELAY_PORT" ;;
    esac
}
cpu_pids() {
    case $1 in
        dashd) echo "$DASHD_PID" ;;
        nginx) echo "$NGINX_PIDS" ;;
        relay) echo "$RELAY_PID" ;;
    esac
}
# record KIND TARGET CONNS -- COMMAND...: runs a loadgen command and tags its JSON line.
ROUND=1
record() {
    local kind=$1 target=$2 conns=$3 out
    shift 4
    if out=$("${LOADGEN_RUN[@]}" --threads "$THREADS" "$@"); then
        printf '{"kind":"%s","target":"%s","conns":%s,"round":%s,"result":%s}\n' "$kind" "$target" "$conns" "$ROUND" "$out" >>"$RAW"
        log "round $ROUND: $kind $target conns=$conns: $out"
    else
        log "$kind $target conns=$conns FAILED (see above); the table will show a gap"
    fi
}

# The targets in round R: as listed in odd rounds, reversed in even ones,
# so that over each pair of rounds every column takes the same mean place
# in time (a drift of the host's speed over a round then weighs on each
# alike), and ray-dashd and nginx each run right after the other once.
round_order() {
    local n=${#targets[@]} i
    for ((i = 0; i < n; i++)); do
        if ((ROUND % 2)); then printf '%s\n' "${targets[i]}"; else printf '%s\n' "${targets[n - 1 - i]}"; fi
    done
}

record rss_start dashd 0 -- rss --pids "$DASHD_PID"
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    mapfile -t order < <(round_order)
    for c in $HTTP_CONNS; do
        for t in "${order[@]}"; do
            cpu=$(cpu_pids "$t")
            record http "$t" "$c" -- http --target "$(target_addr "$t")" --path "$SMALL_PATH" \
                --connections "$c" --duration "$DURATION" --warmup "$WARMUP" \
                ${cpu:+--cpu-pids "$cpu"} --backend-pid "$BACKEND_PID" --clk-tck "$CLK_TCK"
        done
    done
    if ((ROUND == 1)); then record rss_http dashd 0 -- rss --pids "$DASHD_PID"; fi
    for t in "${order[@]}"; do
        cpu=$(cpu_pids "$t")
        record stream "$t" 1 -- stream --target "$(target_addr "$t")" --path "$STREAM_PATH" \
            --expect-bytes "$STREAM_BYTES" --runs "$STREAM_RUNS" ${cpu:+--cpu-pids "$cpu"} --clk-tck "$CLK_TCK"
    done
    if ((ROUND == 1)); then record rss_stream dashd 0 -- rss --pids "$DASHD_PID"; fi
    for c in $WS_CONNS; do
        for t in "${order[@]}"; do
            cpu=$(cpu_pids "$t")
            record ws "$t" "$c" -- ws --target "$(target_addr "$t")" --path "$WS_PATH" \
                --connections "$c" --duration "$DURATION" --warmup "$WARMUP" \
                ${cpu:+--cpu-pids "$cpu"} --clk-tck "$CLK_TCK"
        done
    done
done
ROUND=$ROUNDS
# Peaks over the whole run (VmHWM is the process's high-water mark).
record rss dashd 0 -- rss --pids "$DASHD_PID"
if [[ -n "$NGINX_PID" ]]; then record rss nginx 0 -- rss --pids "$NGINX_PIDS"; fi
# Last: it replaces the backend process the other columns used.
record kill dashd 0 -- killtest --dashd "127.0.0.1:$DASHD_PORT" --module bench --path "$SMALL_PATH" --poll-ms 10

# --- report ------------------------------------------------------------------------------
MODEL=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || echo unknown)
REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ "$THREADS" -le 1 ]]; then runtime="current-thread runtime"; else runtime="$THREADS-thread runtime"; fi
{
    echo "# ray-dashd benchmark"
    echo
    echo "- machine: nproc $(nproc), $MODEL, Linux $(uname -r)"
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'), ray-dashd at $REV (working tree as built); host CPU ${BUSY_BEFORE}% busy in the second before the run (other load skews every column)"
    echo "- backend: $BACKEND_DESC; routes $SMALL_PATH (http), ${STREAM_PATH%%\?*} (stream), $WS_PATH (websocket)"
    echo "- load: ray-dashd-bench ($runtime), $ROUNDS round(s) of every point, interleaved, the targets' order reversed every other round (medians shown), closed loop, HTTP/1.1 keep-alive, ${DURATION} s measured after ${WARMUP} s warm-up per point; stream: $((STREAM_BYTES / 1048576)) MiB × $STREAM_RUNS runs (best); websocket: 32-byte text, one outstanding per connection"
    echo "- placement: $PLACEMENT"
    echo "- ray-dashd: runtime threads ${DASHD_WORKERS:-1 (its default)}, log level ${RAY_DASHD_LOG:-${RUST_LOG:-info (default)}}${DASHD_ENV:+, extra environment: $DASHD_ENV}"
    echo "- link order (peak RSS depends on it): $("$ROOT/scripts/symbol-order" --check "$DASHD_BIN" 2>&1 || echo "not checked")"
    echo "- nginx: $NGINX_DESC"
    echo "- bare relay: $RELAY_DESC"
    echo "- direct = the backend's own Unix socket; proxy CPU = utime+stime of the proxy process(es) in the measured window ÷ requests; RSS = VmHWM (nginx: summed over master and workers)"
    echo
    "$LOADGEN" report --input "$RAW"
} | tee "$RESULTS_DIR/latest.md"
