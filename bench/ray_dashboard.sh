#!/usr/bin/env bash
# bench/ray_dashboard.sh: ray-dashd beside Ray's own dashboard, on one Ray
# head. Both serve the same nine Ray modules from the same Ray install; the
# script measures, in interleaved rounds (Ray, ray-dashd, Ray, ray-dashd,
# ...), start-up time, latency and requests/s of a few routes, and memory
# (PSS of the parent and of its whole process tree), and prints a Markdown
# table of medians with ray-dashd / Ray. See bench/README.md ("Ray's own
# dashboard") for what each number means and for the knobs below.
#
# Not part of the tests. Loopback only, private ports, its own temp dir;
# every process it starts is stopped by pid on exit.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")

# --- knobs --------------------------------------------------------------------
if [[ "${BENCH_QUICK:-0}" == 1 ]]; then
    : "${BENCH_DURATION:=1}" "${BENCH_WARMUP:=0.3}" "${BENCH_ROUNDS:=1}"
fi
ROUNDS=${BENCH_ROUNDS:-3}                 # Ray then ray-dashd, this many times; medians shown
DURATION=${BENCH_DURATION:-5}             # measured seconds per point
WARMUP=${BENCH_WARMUP:-1}                 # unmeasured seconds before each point
CONNS=${BENCH_HTTP_CONNS:-"1 16"}
# Routes: Ray's JobHead (/api/version, /api/jobs/) and NodeHead (/nodes).
read -r -a PATHS <<<"${BENCH_RAY_PATHS:-/api/version /api/jobs/ /nodes?view=summary}"
VENV=${BENCH_RAY_VENV:-$ROOT/target/test-venv}   # a venv with ray[default]==2.60.0
JOBS=${BENCH_RAY_JOBS:-1}                 # jobs submitted first, so /api/jobs/ lists something
MODULES=${BENCH_RAY_MODULES:-9}           # ray-dashd is ready when this many modules are healthy
DASHD_TOML=${BENCH_DASHD_TOML:-}          # extra lines for ray-dashd's config (after [ray])
DASHD_ENV=${BENCH_DASHD_ENV:-}            # extra NAME=VALUE words for ray-dashd's environment
BUILD=${BENCH_BUILD:-1}                   # 0: use the release binaries already built
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}
THREADS=${BENCH_LOADGEN_THREADS:-1}
TIMEOUT=180                               # bound on every wait for a start or a stop

BENCH_TAG=ray-bench
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

[[ -n "${EPOCHREALTIME:-}" ]] || die "needs bash 5 or later (for \$EPOCHREALTIME)"
LC_NUMERIC=C # $EPOCHREALTIME with a decimal point, whatever the locale

PY=$VENV/bin/python
[[ -x "$PY" && -x "$VENV/bin/ray" ]] || die "$VENV has no python and ray; run scripts/test once (it creates target/test-venv) or set BENCH_RAY_VENV"
RAY_VERSION=$("$PY" -c 'import ray; print(ray.__version__)') || die "$PY cannot import ray"
[[ "$BUILD" == 1 || "$BUILD" == 0 ]] || die "BENCH_BUILD must be 0 or 1"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS must be a positive integer"
[[ "$JOBS" =~ ^[0-9]+$ ]] || die "BENCH_RAY_JOBS must be a number"

# --- build ----------------------------------------------------------------------
if [[ "$BUILD" == 1 ]]; then
    log "cargo build --release --workspace"
    (cd "$ROOT" && cargo build --release --workspace) >&2
fi
DASHD_BIN=$ROOT/target/release/ray-dashd
LOADGEN=$ROOT/target/release/ray-dashd-bench
[[ -x "$DASHD_BIN" && -x "$LOADGEN" ]] || die "release binaries missing; run with BENCH_BUILD=1"

warn_if_busy

# --- scratch space and cleanup --------------------------------------------------------
# Short: Ray's and the modules' sockets live below it (AF_UNIX paths ≤ 107 bytes).
TMP=$(mktemp -d /tmp/rdr.XXXXXX)
RAY_TEMP=$TMP/ray
mkdir -p "$RAY_TEMP"
HEAD_PID=""   # `ray start --block`, leader of its own process group
DASH_PID=""   # the dashboard being measured (Ray's or ray-dashd), root of its tree

cleanup() {
    local status=$?
    stop_dashboard
    stop_head
    if [[ $status -ne 0 && -d "$TMP" ]]; then
        log "logs kept in $TMP (ray start: $TMP/head.log; ray-dashd: $TMP/dashd.*.log; Ray's dashboard: $TMP/ray-dashboard.*.log; Ray's own: $RAY_TEMP/session_latest/logs/)"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- ports ------------------------------------------------------------------------------
# 100 consecutive free ports below the kernel's ephemeral range (32768 and
# up), so that no outgoing connection takes one before Ray binds it. Workers
# take the upper half.
BASE=$("$PY" - <<'EOF'
import os, socket
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
start = (os.getpid() % 120) * 100
for i in range(120):
    base = 20000 + (start + i * 100) % 12000
    if all(free(p) for p in range(base, base + 100)):
        print(base)
        break
else:
    raise SystemExit("no block of 100 free ports in 20000-31999")
EOF
) || die "no free ports"
GCS_PORT=$BASE
RAY_DASH_PORT=$((BASE + 8))
DASHD_PORT=$((BASE + 9))
METRIC_PORT=$((BASE + 10))

# What every Ray process (and ray-dashd, which runs Ray's modules) needs:
# loopback-only addresses, the venv first on PATH, no usage reports.
RAY_ENV=(
    "PATH=$VENV/bin:$PATH"
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    RAY_USAGE_STATS_ENABLED=0
    "DASHBOARD_METRIC_PORT=$METRIC_PORT"
)

# --- the head, with Ray's own dashboard ----------------------------------------------------
log "starting a Ray $RAY_VERSION head (GCS 127.0.0.1:$GCS_PORT, dashboard :$RAY_DASH_PORT, temp dir $RAY_TEMP)"
HEAD_T0=$EPOCHREALTIME
# setsid: its own process group, so that the whole head can be stopped at once.
env "${RAY_ENV[@]}" setsid "$VENV/bin/ray" start --head --block \
    --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$RAY_DASH_PORT" \
    --disable-usage-stats --num-cpus=2 --node-ip-address=127.0.0.1 \
    --object-store-memory=100000000 \
    --port="$GCS_PORT" --temp-dir="$RAY_TEMP" \
    --node-manager-port=$((BASE + 1)) --object-manager-port=$((BASE + 2)) \
    --ray-client-server-port=$((BASE + 3)) --dashboard-agent-listen-port=$((BASE + 4)) \
    --dashboard-agent-grpc-port=$((BASE + 5)) --runtime-env-agent-port=$((BASE + 6)) \
    --metrics-export-port=$((BASE + 7)) \
    --min-worker-port=$((BASE + 50)) --max-worker-port=$((BASE + 99)) \
    >"$TMP/head.log" 2>&1 </dev/null &
HEAD_PID=$!
for ((i = 0; ; i++)); do
    grep -q "Ray runtime started" "$TMP/head.log" 2>/dev/null && break
    alive "$HEAD_PID" || die "ray start exited; see $TMP/head.log"
    ((i < TIMEOUT * 10)) || die "ray start did not report the runtime started within ${TIMEOUT} s"
    sleep 0.1
done
SESSION=$RAY_TEMP/session_latest
# Ray's dashboard is the child of `ray start` that runs dashboard.py.
found=$("$LOADGEN" find-descendant --pid "$HEAD_PID" --cmdline-contains "ray/dashboard/dashboard.py") \
    || die "no dashboard process below ray start (pid $HEAD_PID)"
ORIG_PID=$(sed -E 's/.*"pid":([0-9]+).*/\1/' <<<"$found")
[[ "$ORIG_PID" =~ ^[0-9]+$ ]] || die "no pid in $found"
log "Ray's dashboard (pid $ORIG_PID), started by ray start, is waiting for its modules"
PATH_ARGS=()
for p in "${PATHS[@]}"; do PATH_ARGS+=(--path "$p"); done
"$LOADGEN" startup --target "tcp:127.0.0.1:$RAY_DASH_PORT" "${PATH_ARGS[@]}" \
    --since "$HEAD_T0" --timeout "$TIMEOUT" >/dev/null || die "Ray's own dashboard never answered"

for ((j = 1; j <= JOBS; j++)); do
    log "submitting job $j of $JOBS through Ray's dashboard"
    env "${RAY_ENV[@]}" timeout "$TIMEOUT" "$VENV/bin/ray" job submit \
        --address "http://127.0.0.1:$RAY_DASH_PORT" -- python -c "print($j * 42)" \
        >"$TMP/job.$j.log" 2>&1 || die "job $j failed; see $TMP/job.$j.log"
done

# Every round starts Ray's dashboard the way `ray start` did, so that both
# dashboards' start-up is timed the same way (launch → ready) with the rest
# of the head already up: its command line, environment and working
# directory are kept, and the one `ray start` launched is stopped. (It exits
# with 15 on SIGTERM, which `ray start --block` takes as an expected exit.)
cp "/proc/$ORIG_PID/cmdline" "$TMP/ray-dashboard.argv"
cp "/proc/$ORIG_PID/environ" "$TMP/ray-dashboard.env"
RAY_CWD=$(readlink "/proc/$ORIG_PID/cwd")
mapfile -d '' -t RAY_DASH_ARGV <"$TMP/ray-dashboard.argv"
mapfile -d '' -t RAY_DASH_ENV <"$TMP/ray-dashboard.env"
DASH_PID=$ORIG_PID
stop_dashboard

# ray-dashd hosts Ray's modules only (not its own example and logs modules),
# so that both trees do the same job.
cat >"$TMP/dashd.toml" <<EOF
builtin_modules = false

[server]
host = "127.0.0.1"

[ray]
modules = "on"
python = "$PY"
# Ray's dashboard has no client proxy (Ray's own runs beside it, started by
# \`ray start\`): leave ray-dashd's out of this comparison.
client_port = 0
$DASHD_TOML
EOF

# --- measurements -------------------------------------------------------------------
mkdir -p "$RESULTS_DIR"
RAW=$RESULTS_DIR/ray_dashboard.jsonl
: >"$RAW"
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
ROUND=0

# record KIND SYSTEM PATH CONNS JSON: one tagged line of the raw results.
record() {
    local kind=$1 system=$2 path=$3 conns=$4 result=$5
    printf '{"kind":"%s","system":"%s","path":"%s","conns":%s,"round":%s,"result":%s}\n' \
        "$kind" "$system" "$path" "$conns" "$ROUND" "$result" >>"$RAW"
}

launch() { # system: starts it; sets DASH_PID, PORT and LAUNCHED_AT (the instant before the start)
    local system=$1 t0
    case $system in
        ray)
            PORT=$RAY_DASH_PORT
            t0=$EPOCHREALTIME
            (cd "$RAY_CWD" && exec setsid env -i "${RAY_DASH_ENV[@]}" "${RAY_DASH_ARGV[@]}") \
                >"$TMP/ray-dashboard.$ROUND.log" 2>&1 </dev/null &
            ;;
        dashd)
            PORT=$DASHD_PORT
            t0=$EPOCHREALTIME
            # shellcheck disable=SC2086 # DASHD_ENV is a list of NAME=VALUE words
            env "${RAY_ENV[@]}" $DASHD_ENV "$DASHD_BIN" --session-dir "$SESSION" \
                --port "$DASHD_PORT" --config "$TMP/dashd.toml" \
                >"$TMP/dashd.$ROUND.log" 2>&1 </dev/null &
            ;;
    esac
    DASH_PID=$!
    LAUNCHED_AT=$t0
}

measure() { # system
    local system=$1 name out c p modules_arg=() logfile
    if [[ $system == ray ]]; then
        name="Ray's dashboard"
        logfile=$TMP/ray-dashboard.$ROUND.log
    else
        name=ray-dashd
        logfile=$TMP/dashd.$ROUND.log
        modules_arg=(--modules "$MODULES")
    fi
    alive "$HEAD_PID" || die "the Ray head (pid $HEAD_PID) is gone; see $TMP/head.log"
    launch "$system"
    if ! out=$("$LOADGEN" startup --target "tcp:127.0.0.1:$PORT" "${PATH_ARGS[@]}" "${modules_arg[@]}" \
        --since "$LAUNCHED_AT" --timeout "$TIMEOUT"); then
        tail -n 30 "$logfile" >&2
        die "$name (pid $DASH_PID) did not get ready; see $logfile"
    fi
    record startup "$system" "" 0 "$out"
    log "round $ROUND: $name (pid $DASH_PID) ready: $out"
    out=$("$LOADGEN" tree-mem --pid "$DASH_PID") || die "cannot read the memory of pid $DASH_PID"
    record mem_ready "$system" "" 0 "$out"
    for p in "${PATHS[@]}"; do
        for c in $CONNS; do
            if out=$("$LOADGEN" --threads "$THREADS" http --target "tcp:127.0.0.1:$PORT" --path "$p" \
                --connections "$c" --duration "$DURATION" --warmup "$WARMUP" \
                --cpu-pids "$DASH_PID" --clk-tck "$CLK_TCK"); then
                record http "$system" "$p" "$c" "$out"
                log "round $ROUND: $name GET $p conns=$c: $out"
            else
                log "round $ROUND: $name GET $p conns=$c FAILED (see above); the table will show a gap"
            fi
        done
    done
    out=$("$LOADGEN" tree-mem --pid "$DASH_PID") || die "cannot read the memory of pid $DASH_PID"
    record mem_loaded "$system" "" 0 "$out"
    log "round $ROUND: $name memory after the load: $(sed -E 's/,"per_process".*/}/' <<<"$out")"
    stop_dashboard
    if [[ -n "$STOP_JSON" ]]; then
        record stop "$system" "" 0 "$STOP_JSON"
        log "round $ROUND: $name stopped: $STOP_JSON"
    fi
}

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    measure ray
    measure dashd
done
ROUND=$ROUNDS

# --- report ------------------------------------------------------------------------------
MODEL=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || echo unknown)
REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(cd "$ROOT" && git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " + uncommitted changes" || true)
{
    echo "# ray-dashd beside Ray's own dashboard"
    echo
    echo "- machine: nproc $(nproc), $MODEL, Linux $(uname -r); host CPU ${BUSY_BEFORE}% busy in the second before the run (other load skews every number)"
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'), ray-dashd at $REV$DIRTY, Ray $RAY_VERSION ($PY)"
    echo "- one Ray head (\`ray start --head --include-dashboard=true\`, private ports, its own temp dir), $JOBS job(s) submitted first; the two dashboards take turns on it, never both at once, $ROUNDS round(s) (Ray's, then ray-dashd); medians shown"
    echo "- Ray's dashboard: \`dashboard.py\`, relaunched each round with the command line, environment and working directory \`ray start\` gave it"
    echo "- ray-dashd: release build, \`[ray] modules = \"on\"\`, Ray's nine modules only (not its own example and logs modules, nor its Ray Client proxy: \`client_port = 0\`)${DASHD_TOML:+; extra config: $(tr '\n' ' ' <<<"$DASHD_TOML")}${DASHD_ENV:+; extra environment: $DASHD_ENV}"
    echo "- load: ray-dashd-bench, closed loop, HTTP/1.1 keep-alive, ${DURATION} s measured after ${WARMUP} s warm-up per point, connections: $CONNS"
    echo "- start-up: from the launch of the parent until every route in the table answers 200 and every module is ready (Ray's parent opens its port only once all its modules are ready; ray-dashd: \`/api/modules\` lists $MODULES healthy modules); polled every 20 ms"
    echo "- memory: PSS from \`/proc/<pid>/smaps_rollup\`; parent = the dashboard process; total = it and every process below it (Ray: its forkserver and module processes; ray-dashd: its module processes and helpers)"
    echo
    "$LOADGEN" ray-report --input "$RAW"
} | tee "$RESULTS_DIR/ray_dashboard.md"
