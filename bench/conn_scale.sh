#!/usr/bin/env bash
# bench/conn_scale.sh: connections at scale through one ray-dashd host.
#
#   http  10,000 idle keep-alive HTTP/1.1 client connections (one GET each):
#         the host's memory before and after, KiB per connection.
#   ws    10,000 idle websockets (one echo each) over 10 aiohttp modules:
#         the host's and the modules' memory before and after.
#   hold  10,000 websockets held, each echoing every 5 s: /api/healthz
#         p50/p99 (a new connection per probe) and a 400-request burst to
#         an http route, first with nothing held, then while they are held;
#         every websocket must echo once more at the end.
#
# Each part gets a fresh host (freed memory that malloc keeps would hide
# the next part's cost). See bench/README.md ("Connections at scale") for
# the knobs and what each number means.
#
# Descriptors: 10,000 websockets take 20,000 descriptors in the host (the
# client's socket and the module's) and 1,000 in each module, more than a
# hard RLIMIT_NOFILE of 20,000 leaves. The script raises the hard and soft
# limit of the processes it starts (ray-dashd, whose modules inherit it, and
# the load tool) to BENCH_NOFILE (200,000) in a subshell (`ulimit -Hn`),
# which needs CAP_SYS_RESOURCE (root outside a container that drops it);
# the shell's own limits are untouched. Where the hard limit cannot be
# raised, the script keeps it, and the websocket parts hold as many as it
# leaves room for (BENCH_WS_CONNS=auto), which it says. The host's
# `server.max_connections` is set to what the run needs, as the cap derived
# from the limit reserves descriptors for every module's pool and
# websockets that these runs do not use.
#
# Not part of the tests. Loopback only; every process it starts is stopped by
# pid on exit (ray-dashd stops its modules).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")

# --- knobs --------------------------------------------------------------------
PARTS=${BENCH_PARTS:-"http ws hold"}
MODULES=${BENCH_MODULES:-10}
CONNS=${BENCH_CONNS:-10000}              # idle keep-alive clients (http)
WS_CONNS=${BENCH_WS_CONNS:-auto}         # idle websockets (ws) and websockets held (hold); auto: 10,000 or what the open-file limit allows
CONCURRENCY=${BENCH_CONCURRENCY:-64}     # connections opened at once
SETTLE=${BENCH_SETTLE:-2}                # seconds between a step and the memory reading after it
BASELINE=${BENCH_BASELINE:-10}           # seconds of probes before anything is held
HOLD=${BENCH_HOLD:-30}                   # seconds the websockets are held and probed
ECHO_EVERY=${BENCH_ECHO_EVERY:-5}        # seconds between two echoes of one held websocket
PROBE_MS=${BENCH_PROBE_MS:-20}           # milliseconds between two /api/healthz probes
BURST=${BENCH_BURST:-400}
NOFILE=${BENCH_NOFILE:-200000}
BUILD=${BENCH_BUILD:-0}                  # 1: cargo build --release first
DASHD_ENV=${BENCH_DASHD_ENV:-}            # extra NAME=VALUE words for ray-dashd's environment
DASHD_TOML=${BENCH_DASHD_TOML:-}          # extra lines for ray-dashd's [server] table
DASHD_WRAP=${BENCH_DASHD_WRAP:-}          # words run before ray-dashd, e.g. "heaptrack -o /tmp/ht" (memory is read from ray-dashd below it)
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

BENCH_TAG=conn-scale
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

# --- build and binaries ----------------------------------------------------------
if [[ "$BUILD" == 1 ]]; then
    log "cargo build --release -p ray-dashd -p ray-dashd-bench"
    (cd "$ROOT" && cargo build --release -p ray-dashd -p ray-dashd-bench) >&2
fi
DASHD_BIN=${BENCH_DASHD_BIN:-$TARGET_DIR/release/ray-dashd}
LOADGEN=${BENCH_LOADGEN:-$TARGET_DIR/release/ray-dashd-bench}
[[ -x "$DASHD_BIN" && -x "$LOADGEN" ]] || die "no $DASHD_BIN or $LOADGEN; run with BENCH_BUILD=1"

# --- Python with aiohttp for the modules ---------------------------------------------
PY=${BENCH_PYTHON:-}
if [[ -z "$PY" ]]; then
    for candidate in "$ROOT/target/test-venv/bin/python" "$BENCH_DIR/.venv/bin/python"; do
        if [[ -x "$candidate" ]] && "$candidate" -c 'import aiohttp' 2>/dev/null; then
            PY=$candidate
            break
        fi
    done
fi
if [[ -z "$PY" ]]; then
    log "creating $BENCH_DIR/.venv with aiohttp"
    python3 -m venv "$BENCH_DIR/.venv" >&2
    "$BENCH_DIR/.venv/bin/pip" install --quiet aiohttp >&2
    PY=$BENCH_DIR/.venv/bin/python
fi

# --- descriptors ------------------------------------------------------------------
if ! (ulimit -Hn "$NOFILE" && ulimit -Sn "$NOFILE") 2>/dev/null; then
    hard=$(ulimit -Hn)
    [[ "$hard" == unlimited ]] && hard=1048576
    log "warning: cannot raise the hard open-file limit to $NOFILE (no CAP_SYS_RESOURCE); keeping $hard"
    NOFILE=$hard
fi
# Each websocket takes two of the host's descriptors; keep 1,000 for the
# host itself, the modules' pools and the probes, besides the burst.
if [[ "$WS_CONNS" == auto ]]; then
    WS_CONNS=$(( (NOFILE - 1000 - BURST) / 2 / (MODULES * 10) * MODULES * 10 ))
    (( WS_CONNS > 10000 )) && WS_CONNS=10000
    (( WS_CONNS < 10000 )) && log "warning: RLIMIT_NOFILE $NOFILE leaves room for $WS_CONNS websockets, not 10,000"
fi
(( CONNS + 1000 <= NOFILE )) || die "RLIMIT_NOFILE $NOFILE is too low for $CONNS clients"
MAX_CLIENTS=$(( (CONNS > WS_CONNS ? CONNS : WS_CONNS) + BURST + 200 ))
with_nofile() { # cmd...: exec'd with soft and hard RLIMIT_NOFILE at $NOFILE; call it in a subshell
    ulimit -Hn "$NOFILE" && ulimit -Sn "$NOFILE" && exec "$@"
}

# --- scratch space and cleanup --------------------------------------------------------
TMP=$(mktemp -d /tmp/rdc.XXXXXX)
DASHD_PID=""

WRAP_PID=""
dashd_below() { # pid: the descendant of pid that runs $DASHD_BIN (a wrapper's child), if any
    local want queue=("$1") p c
    want=$(readlink -f "$DASHD_BIN")
    while ((${#queue[@]})); do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do
            if [[ "$(readlink -f /proc/"$c"/exe 2>/dev/null)" == "$want" ]]; then
                echo "$c"
                return
            fi
            queue+=("$c")
        done
    done
}
stop_dashd() { # SIGTERM, SIGKILL after 30 s (it stops its modules first)
    local i
    if [[ -n "$WRAP_PID" && -z "$DASHD_PID" ]]; then # ray-dashd below the wrapper, else the wrapper
        DASHD_PID=$(dashd_below "$WRAP_PID")
        [[ -n "$DASHD_PID" ]] || DASHD_PID=$WRAP_PID
    fi
    [[ -n "$DASHD_PID" ]] || return 0
    if alive "$DASHD_PID"; then
        kill -TERM "$DASHD_PID" 2>/dev/null || true
        for ((i = 0; i < 300; i++)); do
            alive "$DASHD_PID" || break
            sleep 0.1
        done
        if alive "$DASHD_PID"; then
            log "ray-dashd (pid $DASHD_PID) ignored SIGTERM; sending SIGKILL"
            kill -KILL "$DASHD_PID" 2>/dev/null || true
        fi
    fi
    if [[ -n "$WRAP_PID" ]]; then
        for ((i = 0; i < 600; i++)); do # the wrapper may write its report first
            alive "$WRAP_PID" || break
            sleep 0.1
        done
        alive "$WRAP_PID" && kill -KILL "$WRAP_PID" 2>/dev/null
        wait "$WRAP_PID" 2>/dev/null || true
    fi
    wait "$DASHD_PID" 2>/dev/null || true
    DASHD_PID=""
    WRAP_PID=""
}

cleanup() {
    local status=$?
    stop_dashd
    if [[ $status -ne 0 && -d "$TMP" ]]; then
        log "logs kept in $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- the host ------------------------------------------------------------------------
{
    printf '[server]\nhost = "127.0.0.1"\nmax_connections = %d\n%s\n' "$MAX_CLIENTS" "$DASHD_TOML"
    for ((m = 0; m < MODULES; m++)); do
        cat <<EOF

[[modules]]
name = "bench$m"
command = ["$PY", "$BENCH_DIR/aiohttp_backend.py", "--prefix", "/bench$m"]
routes = [
  { method = "GET", path = "/bench$m/small", type = "http" },
  { method = "GET", path = "/bench$m/ws", type = "websocket" },
]
EOF
    done
} >"$TMP/dashd.toml"

MODULE_PIDS=""
start_dashd() { # part
    local port ready pid m
    port=$(free_port)
    rm -rf "$TMP/s"
    # shellcheck disable=SC2086 # DASHD_ENV and DASHD_WRAP are lists of words
    (with_nofile env $DASHD_ENV $DASHD_WRAP "$DASHD_BIN" --session-dir "$TMP/s" --port "$port" \
        --config "$TMP/dashd.toml") >"$TMP/dashd-$1.log" 2>&1 &
    DASHD_PID=$! # the subshell, which execs ray-dashd (or the wrapper)
    DASHD_ADDR=127.0.0.1:$port
    if [[ -n "$DASHD_WRAP" ]]; then
        WRAP_PID=$DASHD_PID
        DASHD_PID=""
        for ((m = 0; m < 300; m++)); do
            DASHD_PID=$(dashd_below "$WRAP_PID")
            [[ -n "$DASHD_PID" ]] && break
            sleep 0.1
        done
        [[ -n "$DASHD_PID" ]] || die "no ray-dashd below $DASHD_WRAP (pid $WRAP_PID)"
    fi
    MODULE_PIDS=""
    for ((m = 0; m < MODULES; m++)); do
        ready=$("$LOADGEN" wait-module --dashd "$DASHD_ADDR" --module "bench$m" --timeout 120) \
            || die "module bench$m never became healthy; see $TMP/dashd-$1.log"
        pid=$(sed -E 's/.*"pid":([0-9]+).*/\1/' <<<"$ready")
        [[ "$pid" =~ ^[0-9]+$ ]] || die "no pid in $ready"
        MODULE_PIDS+=${MODULE_PIDS:+,}$pid
    done
    log "$1: ray-dashd pid $DASHD_PID on $DASHD_ADDR (RLIMIT_NOFILE $NOFILE), modules $MODULE_PIDS"
}

mkdir -p "$RESULTS_DIR"
JSONL=$RESULTS_DIR/conn_scale.jsonl
: >"$JSONL"
# What was measured: the binary, and the checkout's commit (the binary's own
# only when it was built from this checkout as it is).
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
record() { # part json
    "$PY" -c 'import json,sys; d=json.loads(sys.argv[2]); d.update(part=sys.argv[1], checkout=sys.argv[3], dashd_bin=sys.argv[4], nofile=int(sys.argv[5])); print(json.dumps(d))' \
        "$1" "$2" "$COMMIT" "$DASHD_BIN" "$NOFILE" >>"$JSONL"
}

ws_paths=()
for ((m = 0; m < MODULES; m++)); do ws_paths+=(--ws-path "/bench$m/ws"); done

for part in $PARTS; do
    start_dashd "$part"
    common=(--target "tcp:$DASHD_ADDR" --host-pid "$DASHD_PID" --module-pids "$MODULE_PIDS"
        --concurrency "$CONCURRENCY")
    case "$part" in
        http)
            log "http: $CONNS idle keep-alive connections, one GET /bench0/small each"
            out=$(with_nofile "$LOADGEN" idle-conns "${common[@]}" --kind http \
                --path /bench0/small --connections "$CONNS" --settle "$SETTLE")
            ;;
        ws)
            log "ws: $WS_CONNS idle websockets over $MODULES modules, one echo each"
            out=$(with_nofile "$LOADGEN" idle-conns "${common[@]}" --kind ws \
                "${ws_paths[@]/--ws-path/--path}" --connections "$WS_CONNS" --settle "$SETTLE")
            ;;
        hold)
            log "hold: ${BASELINE}s of probes, then $WS_CONNS websockets held ${HOLD}s, echoing every ${ECHO_EVERY}s"
            out=$(with_nofile "$LOADGEN" ws-hold "${common[@]}" "${ws_paths[@]}" \
                --websockets "$WS_CONNS" --baseline "$BASELINE" --hold "$HOLD" \
                --echo-every "$ECHO_EVERY" --probe-ms "$PROBE_MS" \
                --burst-path /bench0/small --burst "$BURST" --clk-tck "$(getconf CLK_TCK)")
            ;;
        *) die "unknown part $part (http, ws, hold)" ;;
    esac
    record "$part" "$out"
    stop_dashd
done

# --- summary ------------------------------------------------------------------------
"$PY" - "$JSONL" <<'EOF' | tee "$RESULTS_DIR/conn_scale.md"
import json, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
def mib(kib): return f"{kib / 1024:.1f} MiB"
for r in rows:
    part = r["part"]
    if part in ("http", "ws"):
        what = "idle keep-alive connections" if part == "http" else "idle websockets"
        m, p = r["mem"], r["per_connection"]
        print(f"### {r['held']:,} {what} ({r['dashd_bin']}, checkout at {r['checkout']})\n")
        print("| reading | host RSS | host RssAnon | host PSS | modules RSS (sum) |")
        print("|---|---:|---:|---:|---:|")
        for k, label in (("before", "before"), ("connected", "connected, nothing sent"),
                         ("used", "after one " + ("GET" if part == "http" else "echo") + " each, idle"),
                         ("closed", "after closing them")):
            h, mo = m[k]["host"], m[k]["modules"]
            print(f"| {label} | {mib(h['vmrss_kib'])} | {mib(h['rssanon_kib'])} | {mib(h['pss_kib'])} | {mib(mo['vmrss_kib'])} |")
        print()
        print("| KiB per connection | host RSS | host RssAnon | host PSS | modules RSS |")
        print("|---|---:|---:|---:|---:|")
        for k in ("connected", "used"):
            h, mo = p[k]["host"], p[k]["modules"]
            print(f"| {k} | {h['vmrss_kib']:.2f} | {h['rssanon_kib']:.2f} | {h['pss_kib']:.2f} | {mo['vmrss_kib']:.2f} |")
        first = r.get("first_request") or r.get("first_echo")
        second = r.get("second_request") or r.get("second_echo")
        print(f"\nopen: {r['open']}; first use: {first}; second use (still open): {second}\n")
    elif part == "hold":
        print(f"### {r['opened']:,} websockets held ({r['dashd_bin']}, checkout at {r['checkout']}, RLIMIT_NOFILE {r['nofile']})\n")
        print(f"opened in {r['open_s']:.1f} s ({r['open']}); long_lived per module: {r['long_lived_after_open']}\n")
        print("| | nothing held | websockets held |")
        print("|---|---:|---:|")
        b, h = r["probes_before"], r["probes_held"]
        print(f"| {r['probe_path']} p50 / p99 / max ms (new connection each) | {b['p50_us']/1e3:.2f} / {b['p99_us']/1e3:.2f} / {b['max_us']/1e3:.1f} | {h['p50_us']/1e3:.2f} / {h['p99_us']/1e3:.2f} / {h['max_us']/1e3:.1f} |")
        print(f"| probes (outcomes) | {b['samples']} {b['outcomes']['counts']} | {h['samples']} {h['outcomes']['counts']} |")
        b, h = r["burst_before"], r["burst_held"]
        print(f"| burst of {b['requests']} to {r['burst_path']}: outcomes | {b['outcomes']['counts']} | {h['outcomes']['counts']} |")
        print(f"| connections the listen queue dropped during the burst (ListenOverflows) | {b.get('listen_overflows', 'n/a')} | {h.get('listen_overflows', 'n/a')} |")
        print(f"| burst p50 / p99 ms, all done in | {b['p50_us']/1e3:.1f} / {b['p99_us']/1e3:.1f}, {b['seconds']:.2f} s | {h['p50_us']/1e3:.1f} / {h['p99_us']/1e3:.1f}, {h['seconds']:.2f} s |")
        e = r["echo"]
        print(f"\necho while held: {e['echoes']:,} echoes ({e['per_s']:.0f}/s), p50 {e['p50_us']/1e3:.2f} ms, p99 {e['p99_us']/1e3:.2f} ms; "
              f"broken websockets: {r['broken']}; final echo ok: {r['final_echo_ok']:,} of {r['opened']:,}; "
              f"host CPU during the hold: {r['host_cpu_s_during_hold']:.1f} s of {r['hold_s']:.0f} s")
        ph = r["per_websocket"]["held"]
        print(f"memory held: host RSS {mib(r['mem']['held']['host']['vmrss_kib'])} ({ph['host']['vmrss_kib']:.2f} KiB per websocket, RssAnon {ph['host']['rssanon_kib']:.2f}), "
              f"modules RSS {mib(r['mem']['held']['modules']['vmrss_kib'])} ({ph['modules']['vmrss_kib']:.2f} KiB per websocket)\n")
EOF
log "results: $JSONL and $RESULTS_DIR/conn_scale.md"
