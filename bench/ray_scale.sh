#!/usr/bin/env bash
# bench/ray_scale.sh NODES ACTORS TASKS JOBS: Ray's own dashboard and then
# ray-dashd on one synthetic big cluster (issue 24).
#
# Starts a real Ray head (private ports, its own temp dir), gives it the
# state of a big cluster with bench/ray_synth_cluster.py (NODES nodes in its
# GCS, ACTORS pending actors, TASKS finished tasks, JOBS finished jobs), then
# runs Ray's dashboard and ray-dashd one after the other on it, each under
# the same load for BENCH_DURATION seconds: Ray's release-test mix polled
# once a second by 1 + BENCH_CLIENTS clients, and two probes. Prints a
# Markdown table (latency per endpoint, errors, bytes, memory of each
# dashboard's process tree, ray-dashd's module restarts) and compares both
# dashboards' answers. See bench/README.md ("Big clusters").
#
# Not part of the tests. Loopback only; every wait is bounded; every
# process it starts is stopped by pid on exit.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")

BENCH_TAG=ray-scale
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
usage() { echo "usage: $0 NODES ACTORS TASKS JOBS   (e.g. $0 2000 10000 100000 1000)" >&2; exit 64; }

# --- arguments and knobs ------------------------------------------------------------
[[ $# -eq 4 ]] || usage
NODES=$1 ACTORS=$2 TASKS=$3 JOBS=$4
for n in "$NODES" "$ACTORS" "$TASKS" "$JOBS"; do [[ "$n" =~ ^[0-9]+$ ]] || usage; done

DURATION=${BENCH_DURATION:-60}            # seconds of load on each dashboard
CLIENTS=${BENCH_CLIENTS:-10}              # clients polling the mix besides the release test's one
SETTLE=${BENCH_SETTLE:-10}                # seconds between ready and the idle memory reading
VENV=${BENCH_RAY_VENV:-$ROOT/target/test-venv}
DASHD_BIN=${BENCH_DASHD_BIN:-$ROOT/target/release/ray-dashd}
LOADGEN=${BENCH_LOADGEN:-$ROOT/target/release/ray-dashd-bench}
BUILD=${BENCH_BUILD:-0}                   # 1: cargo build --release first
MODULES=${BENCH_RAY_MODULES:-9}           # ray-dashd is ready when this many modules are up (healthy, or dormant)
DASHD_TOML=${BENCH_DASHD_TOML:-}          # extra lines for ray-dashd's config (after [ray])
DASHD_ENV=${BENCH_DASHD_ENV:-}            # extra NAME=VALUE words for ray-dashd's environment
ORDER=${BENCH_ORDER:-"ray dashd"}         # which dashboard goes first; dashd2..dashd9: variants of ray-dashd
MIX_TIMEOUT=${BENCH_MIX_TIMEOUT:-30}      # a mix request's timeout (Ray's release test: 30 s)
PROBE_TIMEOUT=${BENCH_PROBE_TIMEOUT:-1}   # a probe's timeout
ACCEPT_ENCODING=${BENCH_ACCEPT_ENCODING-"gzip, deflate, br, zstd"}
SYNTH_TIMEOUT=${BENCH_SYNTH_TIMEOUT:-1800}
SYNTH_ARGS=${BENCH_SYNTH_ARGS:-}          # extra arguments for ray_synth_cluster.py
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}
KEEP=${BENCH_KEEP:-0}                     # 1: keep the temp dir (all logs)
PLACEMENT=${BENCH_PLACEMENT:-auto}        # pod, sessions, or auto (pod where a CPU cgroup can be made)
TIMEOUT=300                               # bound on every wait for a start or a stop

[[ -n "${EPOCHREALTIME:-}" ]] || die "needs bash 5 or later (for \$EPOCHREALTIME)"
LC_NUMERIC=C
[[ "$DURATION" =~ ^[0-9]+$ && "$DURATION" -ge 4 ]] || die "BENCH_DURATION must be a whole number of seconds, 4 or more"
[[ "$CLIENTS" =~ ^[0-9]+$ ]] || die "BENCH_CLIENTS must be a number"
[[ $PLACEMENT =~ ^(pod|sessions|auto)$ ]] || die "BENCH_PLACEMENT: pod, sessions or auto, not $PLACEMENT"
for s in $ORDER; do [[ $s =~ ^(ray|dashd[2-9]?)$ ]] || die "BENCH_ORDER: ray, dashd and dashd2..dashd9, not $s"; done

# A variant dashdN runs BENCH_DASHDN_BIN (default: BENCH_DASHD_BIN) with
# BENCH_DASHDN_ENV (default: BENCH_DASHD_ENV) and BENCH_DASHDN_TOML (more
# config lines, after BENCH_DASHD_TOML's), to compare two builds or
# settings on the same cluster in one run.
variant_bin() { local v="BENCH_${1^^}_BIN"; [[ $1 == dashd ]] && echo "$DASHD_BIN" || echo "${!v:-$DASHD_BIN}"; }
variant_env() { local v="BENCH_${1^^}_ENV"; [[ $1 == dashd ]] && echo "$DASHD_ENV" || echo "${!v-$DASHD_ENV}"; }
variant_toml() { local v="BENCH_${1^^}_TOML"; [[ $1 == dashd ]] || echo "${!v-}"; }

PY=$VENV/bin/python
[[ -x "$PY" && -x "$VENV/bin/ray" ]] || die "$VENV has no python and ray; run scripts/test once (it creates target/test-venv) or set BENCH_RAY_VENV"
RAY_VERSION=$("$PY" -c 'import ray; print(ray.__version__)') || die "$PY cannot import ray"

if [[ "$BUILD" == 1 ]]; then
    log "cargo build --release -p ray-dashd -p ray-dashd-bench"
    (cd "$ROOT" && cargo build --release -p ray-dashd -p ray-dashd-bench) >&2
fi
[[ -x "$LOADGEN" ]] || die "no load tool at $LOADGEN: BENCH_BUILD=1, or BENCH_LOADGEN=path/to/ray-dashd-bench"
for s in $ORDER; do
    [[ $s == ray || -x "$(variant_bin "$s")" ]] || die "no ray-dashd at $(variant_bin "$s") for $s: BENCH_BUILD=1, or BENCH_DASHD_BIN=path/to/ray-dashd"
done

steal_ticks() { # time the hypervisor ran something else on our vCPUs, all cores
    awk '/^cpu /{print $9}' /proc/stat
}
warn_if_busy

# --- scratch space and cleanup --------------------------------------------------------
# Short: Ray's and the modules' sockets live below it (AF_UNIX paths ≤ 107 bytes).
TMP=$(mktemp -d /tmp/rsc.XXXXXX)
RAY_TEMP=$TMP/ray
mkdir -p "$RAY_TEMP"
HEAD_PID=""   # `ray start --block`, leader of its own process group
SYNTH_PID=""  # ray_synth_cluster.py (its driver and fake raylets below it)
DASH_PID=""   # the dashboard being measured, root of its tree
LOAD_PID=""   # poll-mix
TRACE_PID=""  # cpu_trace.py beside it
WALK_RAY_PID=""  # Ray's dashboard beside ray-dashd during the UI walk

POD_CG=""     # the head's CPU cgroup, with BENCH_PLACEMENT=pod
PROBER_CG=""  # the load tool's, beside it

cleanup() {
    local status=$?
    stop_pid "$LOAD_PID" 5
    stop_pid "$TRACE_PID" 5
    stop_dashboard
    DASH_PID=$WALK_RAY_PID stop_dashboard
    # The script stops its driver and its fake raylets on SIGTERM.
    stop_pid "$SYNTH_PID" 30
    stop_head
    remove_pod
    if [[ ($status -ne 0 || "$KEEP" == 1) && -d "$TMP" ]]; then
        log "logs kept in $TMP (head: head.log; synthetic cluster: synth.log; dashboards: ray-dashboard.log, dashd.log; Ray's own: ray/session_latest/logs/)"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- placement: where the head's processes get their CPU -----------------------------------
# A KubeRay head pod is one cgroup: its processes share the pod's CPU by
# their nice values (the kernel's autogroup applies only in the root CPU
# cgroup). On a machine where everything runs in the root CPU cgroup with
# autogroup on, the CPU is shared between sessions first instead, and a
# process's nice ranks it only within its own session. `pod` puts the head
# (Ray, the synthetic cluster, each dashboard) in one new CPU cgroup, as a
# pod would be; the load tool, standing for a prober and for users outside
# the pod, stays out. `sessions` leaves everything in the cgroup the script
# runs in, each part in a session of its own (`setsid`), as a service
# manager without cgroups would start them.
make_pod() { # sets POD_CG and PROBER_CG to new CPU cgroups (v1 cpu controller, or v2 with cpu enabled); fails if they cannot be made
    local base
    base=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ {print $2; exit}' /proc/mounts)
    if [[ -z $base ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null \
        && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
        base=/sys/fs/cgroup
    fi
    [[ -n $base ]] && mkdir "$base/ray-scale-pod-$$" 2>/dev/null || return 1
    POD_CG=$base/ray-scale-pod-$$
    # The load tool measures: the kubelet that probes a head pod runs in a
    # cgroup of its own with CPU set aside for it, and the users polling
    # the mix sit at browsers elsewhere. Perf showed its threads runnable
    # for up to 288 ms behind the pod, which made every route's slowest
    # poll the tool's own wait; ten times the pod's weight keeps it out of
    # the numbers.
    if mkdir "$base/ray-scale-prober-$$" 2>/dev/null; then
        PROBER_CG=$base/ray-scale-prober-$$
        if [[ -e $PROBER_CG/cpu.shares ]]; then
            echo 10240 >"$PROBER_CG/cpu.shares" && return 0
        else
            echo 1000 >"$PROBER_CG/cpu.weight" && return 0
        fi
    fi
    remove_pod # neither is used: the placement is one or the other whole
    return 1
}
remove_cgroup() { # dir: removes it once every process has left it (they are stopped by then)
    local i
    for ((i = 0; i < 50; i++)); do
        rmdir "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    log "cannot remove $1: pids still in it: $(tr '\n' ' ' <"$1/cgroup.procs" 2>/dev/null)"
}
remove_pod() {
    [[ -z $POD_CG ]] || remove_cgroup "$POD_CG"
    [[ -z $PROBER_CG ]] || remove_cgroup "$PROBER_CG"
    POD_CG="" PROBER_CG=""
}
join_exec() { # cgroup command...: runs the command (exec) in the cgroup, when one is named
    local cg=$1
    shift
    if [[ -n $cg ]]; then
        echo "$BASHPID" >"$cg/cgroup.procs" || { log "cannot join $cg"; exit 1; }
    fi
    exec "$@"
}
in_pod() { join_exec "$POD_CG" "$@"; }
in_prober() { join_exec "$PROBER_CG" "$@"; }
case $PLACEMENT in
    pod) make_pod || die "BENCH_PLACEMENT=pod: cannot make a CPU cgroup (needs a writable cpu controller, v1 or v2); BENCH_PLACEMENT=sessions runs without one" ;;
    auto) make_pod || log "no CPU cgroup can be made here: the head's parts run in sessions of their own (BENCH_PLACEMENT=sessions)" ;;
esac
if [[ -n $POD_CG ]]; then
    PLACEMENT_NOTE="the head's processes (Ray, the synthetic cluster, the dashboard) in one CPU cgroup of their own, as in a pod ($POD_CG); the load tool and the CPU sampler in another, at ten times its weight, as a kubelet's"
else
    PLACEMENT_NOTE="every part in a session of its own in the script's CPU cgroup ($(awk -F: '$2 ~ /(^|,)cpu(,|$)/ || $1 == 0 {print $3; exit}' /proc/self/cgroup)); autogroup $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo unknown)"
fi

# --- ports ------------------------------------------------------------------------------
# 100 consecutive free ports below the kernel's ephemeral range, so that no
# outgoing connection takes one before Ray binds it. Workers take the upper half.
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
# ray-dashd takes Ray's dashboard's port in its turn, as it would in a real
# head: the agents report events to the dashboard port they were given.
DASHD_PORT=$RAY_DASH_PORT
METRIC_PORT=$((BASE + 10))

RAY_ENV=(
    "PATH=$VENV/bin:$PATH"
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    RAY_USAGE_STATS_ENABLED=0
    "DASHBOARD_METRIC_PORT=$METRIC_PORT"
)

# --- the head, with Ray's own dashboard ----------------------------------------------------
log "starting a Ray $RAY_VERSION head (GCS 127.0.0.1:$GCS_PORT, dashboard :$RAY_DASH_PORT, temp dir $TMP)"
HEAD_T0=$EPOCHREALTIME
(in_pod env "${RAY_ENV[@]}" setsid "$VENV/bin/ray" start --head --block \
    --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$RAY_DASH_PORT" \
    --disable-usage-stats --num-cpus=2 --node-ip-address=127.0.0.1 \
    --object-store-memory=200000000 \
    --port="$GCS_PORT" --temp-dir="$RAY_TEMP" \
    --node-manager-port=$((BASE + 1)) --object-manager-port=$((BASE + 2)) \
    --ray-client-server-port=$((BASE + 3)) --dashboard-agent-listen-port=$((BASE + 4)) \
    --dashboard-agent-grpc-port=$((BASE + 5)) --runtime-env-agent-port=$((BASE + 6)) \
    --metrics-export-port=$((BASE + 7)) \
    --min-worker-port=$((BASE + 50)) --max-worker-port=$((BASE + 99))) \
    >"$TMP/head.log" 2>&1 </dev/null &
HEAD_PID=$!
for ((i = 0; ; i++)); do
    grep -q "Ray runtime started" "$TMP/head.log" 2>/dev/null && break
    alive "$HEAD_PID" || die "ray start exited; see $TMP/head.log"
    ((i < TIMEOUT * 10)) || die "ray start did not report the runtime started within ${TIMEOUT} s"
    sleep 0.1
done
SESSION=$RAY_TEMP/session_latest
found=$("$LOADGEN" find-descendant --pid "$HEAD_PID" --cmdline-contains "ray/dashboard/dashboard.py") \
    || die "no dashboard process below ray start (pid $HEAD_PID)"
ORIG_PID=$(sed -E 's/.*"pid":([0-9]+).*/\1/' <<<"$found")
[[ "$ORIG_PID" =~ ^[0-9]+$ ]] || die "no pid in $found"
"$LOADGEN" startup --target "tcp:127.0.0.1:$RAY_DASH_PORT" --path /api/version \
    --since "$HEAD_T0" --timeout "$TIMEOUT" >/dev/null || die "Ray's own dashboard never answered"

# --- the synthetic cluster ----------------------------------------------------------------
# Ray's dashboard stays up meanwhile: the few real jobs go through its job API.
log "building the synthetic cluster: $NODES nodes, $ACTORS actors, $TASKS tasks, $JOBS jobs"
# The fake nodes' raylets: the load tool's fake-raylets (a port per node),
# or with BENCH_RUST_RAYLETS=0 the script's own Python server (one port).
RAYLETS_ARG=(--raylets-bin "$LOADGEN")
[[ "${BENCH_RUST_RAYLETS:-1}" == 1 ]] || RAYLETS_ARG=()
SYNTH_T0=$EPOCHREALTIME
: >"$TMP/synth.log"
# shellcheck disable=SC2086 # SYNTH_ARGS is a list of words
(in_pod env "${RAY_ENV[@]}" setsid "$PY" "$BENCH_DIR/ray_synth_cluster.py" \
    --gcs-address "127.0.0.1:$GCS_PORT" --nodes "$NODES" --actors "$ACTORS" \
    --tasks "$TASKS" --jobs "$JOBS" --dashboard-url "http://127.0.0.1:$RAY_DASH_PORT" \
    ${RAYLETS_ARG[@]+"${RAYLETS_ARG[@]}"} --server-log "$TMP/raylets.log" \
    --summary-file "$TMP/synth.json" --exit-with-parent $SYNTH_ARGS) \
    >"$TMP/synth.out" 2>>"$TMP/synth.log" </dev/null &
SYNTH_PID=$!
shown=0
for ((i = 0; ; i++)); do
    # Pass the script's progress on as it comes.
    total=$(wc -l <"$TMP/synth.log")
    if ((total > shown)); then
        sed -n "$((shown + 1)),${total}p" "$TMP/synth.log" | grep '^\[synth' >&2 || true
        shown=$total
    fi
    [[ -s "$TMP/synth.json" ]] && break
    alive "$SYNTH_PID" || { tail -n 30 "$TMP/synth.log" >&2; die "ray_synth_cluster.py exited; see $TMP/synth.log"; }
    ((i < SYNTH_TIMEOUT * 5)) || die "the synthetic cluster was not built within ${SYNTH_TIMEOUT} s"
    sleep 0.2
done
SYNTH_S=$(awk -v a="$SYNTH_T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}')
SYNTH_JSON=$(cat "$TMP/synth.json")
HEAD_NODE_ID=$(sed -E 's/.*"head_node_id": "([0-9a-f]+)".*/\1/' <<<"$SYNTH_JSON")
[[ "$HEAD_NODE_ID" =~ ^[0-9a-f]+$ ]] || die "no head_node_id in $TMP/synth.json"
# A node whose fake raylet missed the GCS's health checks is dead, and the
# cluster is no longer the one asked for.
read -r NODES_ALIVE NODES_REGISTERED < <("$PY" -c 'import json, sys
s = json.load(open(sys.argv[1])); print(s.get("nodes_alive", -1), s.get("nodes_registered", -1))' "$TMP/synth.json")
[[ "$NODES_ALIVE" == "$NODES_REGISTERED" ]] \
    || die "only $NODES_ALIVE of $NODES_REGISTERED synthetic nodes are alive once the cluster is built; see $TMP/synth.log and $TMP/raylets.log"
log "synthetic cluster built in ${SYNTH_S} s"

# Ray's release mix (release/.../dashboard_test): the logs route with the
# head's node id (the release test's bare /api/v0/logs answers 400 at once).
if [[ -n "${BENCH_MIX:-}" ]]; then
    read -r -a MIX <<<"$BENCH_MIX"
else
    MIX=(/logical/actors "/nodes?view=summary" / /api/cluster_status /events /api/jobs/
        "/api/v0/logs?node_id=$HEAD_NODE_ID" /api/prometheus_health)
fi
read -r -a PROBES <<<"${BENCH_PROBES:-/api/healthz /api/gcs_healthz}"

# Relaunch Ray's dashboard the way `ray start` did (same command line,
# environment, working directory) for its turn, as bench/ray_dashboard.sh does.
cp "/proc/$ORIG_PID/cmdline" "$TMP/ray-dashboard.argv"
cp "/proc/$ORIG_PID/environ" "$TMP/ray-dashboard.env"
RAY_CWD=$(readlink "/proc/$ORIG_PID/cwd")
mapfile -d '' -t RAY_DASH_ARGV <"$TMP/ray-dashboard.argv"
mapfile -d '' -t RAY_DASH_ENV <"$TMP/ray-dashboard.env"
DASH_PID=$ORIG_PID
stop_dashboard

for s in $ORDER; do
    [[ $s == ray ]] && continue
    cat >"$TMP/$s.toml" <<EOF
builtin_modules = false

[server]
host = "127.0.0.1"

[ray]
modules = "on"
python = "$PY"
client_port = 0
$DASHD_TOML
$(variant_toml "$s")
EOF
done

# --- measurements -------------------------------------------------------------------
mkdir -p "$RESULTS_DIR"
RAW=$RESULTS_DIR/ray_scale.jsonl
: >"$RAW"
printf '{"kind":"synth","seconds":%s,"result":%s}\n' "$SYNTH_S" "$SYNTH_JSON" >>"$RAW"
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

record() { # kind system json
    printf '{"kind":"%s","system":"%s","result":%s}\n' "$1" "$2" "$3" >>"$RAW"
}

modules_json() { # port: ray-dashd's /api/modules, as {name: restarts}
    "$PY" - "$1" <<'EOF'
import json, sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/modules", timeout=30) as r:
    mods = json.load(r)
print(json.dumps({m["name"]: {"restarts": m.get("restarts", 0), "state": m.get("state"),
                  "last_error": m.get("last_error")} for m in mods}))
EOF
}

error_lines() { # ERROR lines and tracebacks in the dashboards' logs so far (not the agent's)
    local f files=()
    for f in "$SESSION"/logs/dashboard*.log "$SESSION"/logs/dashboard*.err "$SESSION"/logs/ray-dashd*.log; do
        [[ -f "$f" && "$f" != */dashboard_agent* ]] && files+=("$f")
    done
    ((${#files[@]})) || { echo 0; return; }
    cat "${files[@]}" | grep -cE '[[:space:]]ERROR[[:space:]]|^Traceback' || true
}

MIX_ARGS=()
for p in "${MIX[@]}"; do MIX_ARGS+=(--mix "$p"); done
for p in "${PROBES[@]}"; do MIX_ARGS+=(--probe "$p"); done

launch() { # system: starts it in the background; sets DASH_PID, PORT, LOGFILE, LAUNCHED_AT
    local system=$1
    LAUNCHED_AT=$EPOCHREALTIME
    if [[ $system == ray ]]; then
        PORT=$RAY_DASH_PORT LOGFILE=$TMP/ray-dashboard.log
        (cd "$RAY_CWD" && in_pod setsid env -i "${RAY_DASH_ENV[@]}" "${RAY_DASH_ARGV[@]}") \
            >>"$LOGFILE" 2>&1 </dev/null &
    else
        PORT=$DASHD_PORT LOGFILE=$TMP/$system.log
        # shellcheck disable=SC2046 # the environment is a list of NAME=VALUE words
        (in_pod env "${RAY_ENV[@]}" $(variant_env "$system") setsid "$(variant_bin "$system")" \
            --session-dir "$SESSION" --port "$DASHD_PORT" --config "$TMP/$system.toml") \
            >>"$LOGFILE" 2>&1 </dev/null &
    fi
    DASH_PID=$!
}

wait_ready() { # system pid: prints startup's JSON once the dashboard answers
    local system=$1 pid=$2 port logfile modules_arg=() ready_paths=() p
    if [[ $system == ray ]]; then
        port=$RAY_DASH_PORT logfile=$TMP/ray-dashboard.log
    else
        port=$DASHD_PORT logfile=$TMP/$system.log
        modules_arg=(--modules "$MODULES")
    fi
    for p in "${MIX[@]}"; do [[ $p == /api/prometheus_health || $p == /api/v0/logs* ]] || ready_paths+=(--path "$p"); done
    ((${#ready_paths[@]})) || ready_paths=(--path /api/version)
    "$LOADGEN" startup --target "tcp:127.0.0.1:$port" "${ready_paths[@]}" "${modules_arg[@]}" \
        --since "$LAUNCHED_AT" --timeout "$TIMEOUT" &
    local waiter=$!
    # A dashboard that exited will not get ready: stop waiting for it then.
    while kill -0 "$waiter" 2>/dev/null; do
        if ! alive "$pid"; then
            kill "$waiter" 2>/dev/null || true
            wait "$waiter" 2>/dev/null || true
            tail -n 30 "$logfile" >&2
            die "$system (pid $pid) exited before it got ready; see $logfile"
        fi
        sleep 1
    done
    if ! wait "$waiter"; then
        tail -n 30 "$logfile" >&2
        die "$system (pid $pid) did not get ready; see $logfile"
    fi
}

RETRIED=()  # dashboards launched twice for the answers or the walk
start_idle() { # system: launches it for the answers or the walk and waits until it is ready
    launch "$1"
    # Once more if it does not get ready: Ray's dashboard gives up when one
    # of its modules takes 30 s to start, which a busy head can make it do.
    if ! (wait_ready "$1" "$DASH_PID" >/dev/null); then
        log "$1 did not get ready; launching it once more"
        RETRIED+=("$1")
        stop_dashboard
        launch "$1"
        wait_ready "$1" "$DASH_PID" >/dev/null
    fi
}

measure() { # system
    local system=$1 name out errors0 errors1 before after half
    if [[ $system == ray ]]; then name="Ray's dashboard"; elif [[ $system == dashd ]]; then name=ray-dashd; else name="ray-dashd ($system)"; fi
    alive "$HEAD_PID" || die "the Ray head (pid $HEAD_PID) is gone; see $TMP/head.log"
    alive "$SYNTH_PID" || die "ray_synth_cluster.py is gone; see $TMP/synth.log"
    errors0=$(error_lines)
    launch "$system"
    out=$(wait_ready "$system" "$DASH_PID")
    record startup "$system" "$out"
    log "$name (pid $DASH_PID) ready: $out; settling ${SETTLE} s"
    sleep "$SETTLE"
    out=$("$LOADGEN" tree-mem --pid "$DASH_PID") || die "cannot read the memory of pid $DASH_PID"
    record mem_idle "$system" "$out"
    if [[ $system == dashd* ]]; then
        record variant "$system" "$("$PY" -c 'import json, sys; print(json.dumps({"bin": sys.argv[1], "env": sys.argv[2], "toml": sys.argv[3]}))' \
            "$(variant_bin "$system")" "$(variant_env "$system")" "$(variant_toml "$system")")"
        before=$(modules_json "$PORT") || die "GET /api/modules failed"
        record modules_before "$system" "$before"
    fi
    log "$name: ${DURATION} s of load (mix × $((CLIENTS + 1)) clients, probes ${PROBES[*]})"
    (in_prober setsid "$LOADGEN" poll-mix --target "tcp:127.0.0.1:$PORT" "${MIX_ARGS[@]}" --clients $((CLIENTS + 1)) \
        --duration "$DURATION" --mix-timeout "$MIX_TIMEOUT" --probe-timeout "$PROBE_TIMEOUT" \
        --accept-encoding "$ACCEPT_ENCODING" --cpu-tree "$DASH_PID" --clk-tck "$CLK_TCK") \
        >"$TMP/load.$system.json" 2>"$TMP/load.$system.err" &
    LOAD_PID=$!
    (in_prober setsid "$PY" "$BENCH_DIR/cpu_trace.py" --out "$TMP/cpu.$system.jsonl" --duration "$DURATION" --tree "$DASH_PID") &
    TRACE_PID=$!
    steal0=$(steal_ticks)
    half=$((DURATION / 2))
    sleep "$half"
    out=$("$LOADGEN" tree-mem --pid "$DASH_PID") || die "cannot read the memory of pid $DASH_PID"
    record mem_mid "$system" "$out"
    wait "$LOAD_PID" || { cat "$TMP/load.$system.err" >&2; die "poll-mix failed on $name"; }
    LOAD_PID=""
    wait "$TRACE_PID" || log "the CPU trace of $name failed"
    TRACE_PID=""
    record steal "$system" "{\"steal_s\":$(awk -v a="$steal0" -v b="$(steal_ticks)" -v t="$CLK_TCK" 'BEGIN{printf "%.2f", (b - a) / t}')}"
    record load "$system" "$(cat "$TMP/load.$system.json")"
    # Who had the CPU, over the run and around the slowest poll of the mix.
    out=$("$PY" "$BENCH_DIR/cpu_trace.py" --summary "$TMP/cpu.$system.jsonl" --slowest-of "$TMP/load.$system.json") \
        && record cpu "$system" "$out" || log "no CPU trace summary for $name"
    out=$("$LOADGEN" tree-mem --pid "$DASH_PID") || die "cannot read the memory of pid $DASH_PID"
    record mem_after "$system" "$out"
    if [[ $system == dashd* ]]; then
        after=$(modules_json "$PORT") || die "GET /api/modules failed"
        record modules_after "$system" "$after"
    fi
    errors1=$(error_lines)
    record log_errors "$system" "{\"error_lines\":$((errors1 - errors0))}"
    stop_dashboard
    [[ -z "$STOP_JSON" ]] || record stop "$system" "$STOP_JSON"
    log "$name done"
}

for system in $ORDER; do
    measure "$system"
done

# --- answers -------------------------------------------------------------------------
# Each dashboard started again, alone, idle: Ray's, ray-dashd, Ray's again;
# each mix path fetched once from each. What differs between Ray's two
# answers (as far apart as Ray's and ray-dashd's) changes on its own and is
# reported as volatile.
ANSWERS="" NOISE=""
if [[ " $ORDER " == *" ray "* && " $ORDER " == *" dashd "* && "${BENCH_ANSWERS:-1}" == 1 ]]; then
    for side in ray dashd ray2; do
        system=${side%2}
        log "answers: $side"
        start_idle "$system"
        # Long enough for the head's agent to report to it (every few seconds).
        sleep "${BENCH_ANSWERS_SETTLE:-15}"
        "$PY" "$BENCH_DIR/compare_answers.py" --save "$TMP/answers.$side" \
            "http://127.0.0.1:$PORT" "${MIX[@]}" || log "saving the answers of $side failed"
        stop_dashboard
    done
    ANSWERS=$("$PY" "$BENCH_DIR/compare_answers.py" --dirs "$TMP/answers.ray" "$TMP/answers.dashd" \
        --noise "$TMP/answers.ray2" 2>&1) || true
    NOISE=$("$PY" "$BENCH_DIR/compare_answers.py" --dirs "$TMP/answers.ray" "$TMP/answers.ray2" 2>&1) || true
fi

# --- Ray's web UI, walked side by side ----------------------------------------------------
# Ray's dashboard on its port and ray-dashd on a port of the block, both up at
# once on the same cluster: tests/ui/ray_walk.mjs opens every page of Ray's
# web UI on both in headless Chromium and compares what they show. Ray's gets
# a session folder of its own (same name, its logs still in the head's):
# both put their modules' sockets at <session>/sockets/dash_<Module>, and on
# one folder the one started last would answer for both.
WALK="" WALK_STATUS=""
if [[ " $ORDER " == *" ray "* && " $ORDER " == *" dashd "* && "${BENCH_UI_WALK:-1}" == 1 ]]; then
    chromium=${RAY_DASHD_CHROMIUM:-/usr/bin/chromium}
    if ! command -v node >/dev/null || [[ ! -d "$ROOT/tests/ui/node_modules/playwright-core" || ! -x "$chromium" ]]; then
        WALK_STATUS="not run: it needs node, $chromium and tests/ui/node_modules (scripts/test sets them up; or npm ci --prefix tests/ui)"
        log "UI walk $WALK_STATUS"
    else
        shared_argv=("${RAY_DASH_ARGV[@]}")
        for i in "${!RAY_DASH_ARGV[@]}"; do
            if [[ ${RAY_DASH_ARGV[$i]} == --session-dir=* ]]; then
                own=$TMP/ray-own-session/$(basename "${RAY_DASH_ARGV[$i]#--session-dir=}")
                mkdir -p "$own"
                RAY_DASH_ARGV[i]=--session-dir=$own
            fi
        done
        start_idle ray
        RAY_DASH_ARGV=("${shared_argv[@]}")
        WALK_RAY_PID=$DASH_PID
        DASHD_PORT=$((BASE + 20))
        start_idle dashd
        sleep "${BENCH_ANSWERS_SETTLE:-15}"
        log "UI walk: Ray's dashboard :$RAY_DASH_PORT, ray-dashd :$DASHD_PORT"
        if WALK=$(RAY_DASHD_CHROMIUM=$chromium node "$ROOT/tests/ui/ray_walk.mjs" --shots "$TMP/walk" \
            "http://127.0.0.1:$RAY_DASH_PORT" "http://127.0.0.1:$DASHD_PORT" 2>&1); then
            WALK_STATUS="every page the same"
        else
            WALK_STATUS="pages differ (screenshots and page texts in $TMP/walk with BENCH_KEEP=1)"
        fi
        stop_dashboard
        DASH_PID=$WALK_RAY_PID WALK_RAY_PID=""
        stop_dashboard
        DASHD_PORT=$RAY_DASH_PORT
    fi
fi

# --- report ------------------------------------------------------------------------------
MODEL=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || echo unknown)
REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(cd "$ROOT" && git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " + uncommitted changes" || true)
{
    echo "# Ray's dashboard and ray-dashd on a synthetic big cluster"
    echo
    echo "- cluster: $NODES nodes, $ACTORS pending actors, $TASKS finished tasks, $JOBS finished jobs (bench/ray_synth_cluster.py, built in ${SYNTH_S} s) on one real Ray $RAY_VERSION head, \`--num-cpus=2\`"
    echo "- machine: nproc $(nproc), $MODEL, Linux $(uname -r); host CPU ${BUSY_BEFORE}% busy in the second before the run"
    echo "- placement: $PLACEMENT_NOTE"
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'), ray-dashd at $REV$DIRTY ($DASHD_BIN)${DASHD_TOML:+; extra config: $(tr '\n' ' ' <<<"$DASHD_TOML")}${DASHD_ENV:+; extra environment: $DASHD_ENV}"
    ((${#RETRIED[@]} == 0)) || echo "- launched a second time for the answers or the walk, the first not ready within ${TIMEOUT} s: ${RETRIED[*]} (see its log)"
    echo "- load, per dashboard, one after the other ($ORDER): ${DURATION} s; each mix path polled by $((CLIENTS + 1)) clients (Ray's release test's one + $CLIENTS), each once a second at most (the next poll when the answer is in and the second is over; timeout ${MIX_TIMEOUT} s), probes once a second (timeout ${PROBE_TIMEOUT} s, new connection each, on a thread of their own at nice -10 when run as root: a prober is not among the head's processes); Accept-Encoding: ${ACCEPT_ENCODING:-none}"
    echo
    "$PY" - "$RAW" "$ORDER" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault((r["kind"], r.get("system")), r["result"])

def ms(v):
    if v is None:
        return "—"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms"

def size(b):
    if b is None:
        return "—"
    return f"{b / 1048576:.1f} MiB" if b >= 1048576 else f"{b / 1024:.0f} KiB" if b >= 1024 else f"{b} B"

def errors(e):
    if e is None:
        return "—"
    if not e["errors"]:
        return "0"
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(e["error_kinds"].items()))
    return f"{e['errors']} ({kinds})"

loads = {s: {e["path"]: e for e in (by.get(("load", s)) or {}).get("endpoints", [])} for s in ("ray", "dashd")}
paths = list(dict.fromkeys([*loads["ray"], *loads["dashd"]]))
print("| endpoint | Ray p50 / p95 / p99 / max | ray-dashd p50 / p95 / p99 / max | p99 ray-dashd / Ray | requests Ray / ray-dashd | errors Ray | errors ray-dashd | bytes (median) Ray / ray-dashd |")
print("|---|---|---|---|---|---|---|---|")
for p in paths:
    r, d = loads["ray"].get(p), loads["dashd"].get(p)
    q = lambda e: " / ".join(ms(e.get(k)) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")) if e else "—"
    ratio = "—"
    # Only where both answered alike (Ray's 404 for /api/healthz is no answer).
    alike = r and d and (r["ok"] > 0) == (d["ok"] > 0) and r["ok"] + d["ok"] > 0 or (
        r and d and not r["ok"] and not d["ok"] and set(r["error_kinds"]) == set(d["error_kinds"]))
    if alike and r.get("p99_ms") and d.get("p99_ms") is not None:
        ratio = f"{d['p99_ms'] / r['p99_ms']:.2f}"
    reqs = f"{r['requests'] if r else '—'} / {d['requests'] if d else '—'}"
    b = f"{size(r.get('bytes_median')) if r else '—'} / {size(d.get('bytes_median')) if d else '—'}"
    tag = " (probe)" if (r or d or {}).get("kind") == "probe" else ""
    print(f"| `{p}`{tag} | {q(r)} | {q(d)} | {ratio} | {reqs} | {errors(r)} | {errors(d)} | {b} |")
print()
print("| memory of the whole process tree | Ray's dashboard | ray-dashd | ray-dashd / Ray |")
print("|---|---|---|---|")
for kind, label in (("mem_idle", "idle (ready + settle)"), ("mem_mid", "mid-run"), ("mem_after", "after the run")):
    for field, unit in (("total_pss_kib", "PSS"), ("total_rss_kib", "RSS")):
        r, d = ((by.get((kind, s)) or {}).get(field) for s in ("ray", "dashd"))
        ratio = f"{d / r:.2f}" if r and d else "—"
        f = lambda v: f"{v / 1024:.0f} MiB" if v else "—"
        print(f"| {unit}, {label} | {f(r)} | {f(d)} | {ratio} |")
procs = [(by.get(("mem_mid", s)) or {}).get("processes", "—") for s in ("ray", "dashd")]
print(f"| processes in the tree, mid-run | {procs[0]} | {procs[1]} | |")
print()
extra = []
for s, name in (("ray", "Ray's dashboard"), ("dashd", "ray-dashd")):
    st = by.get(("startup", s))
    ld = by.get(("load", s))
    le = by.get(("log_errors", s))
    sl = by.get(("steal", s))
    cpu = by.get(("cpu", s))
    probes = [e for e in (ld or {}).get("endpoints", []) if e.get("kind") == "probe"]
    slow = "; ".join(f"`{e['path']}` " + ", ".join(f"{x['ms']:.0f} ms at {x['at_s']:.1f} s" for x in e.get("slowest", [])[:3]) for e in probes)
    if st:
        extra.append(f"- {name}: ready {st.get('ready_ms', 0) / 1000:.1f} s after launch"
                     + (f"; CPU of its tree during the load {ld['tree_cpu_s']:.1f} s of {ld['seconds']:.0f} s" if ld and "tree_cpu_s" in ld else "")
                     + (f"; load tool CPU {ld['loadgen_cpu_s']:.1f} s" if ld else "")
                     + (f"; vCPU steal during the load {sl['steal_s']:.2f} s" if sl else "")
                     + (f"; ERROR lines / tracebacks in the dashboard modules' logs meanwhile: {le['error_lines']}" if le else "")
                     + (f"; slowest probes: {slow}" if slow else "")
                     + (f" (the probes' own thread at nice {ld['probe_nice']})" if ld and ld.get("probe_nice") is not None else ""))
    if cpu:
        around = cpu["around"]
        extra.append(f"  - the machine during {name}'s load: all CPUs busy {cpu['all_cpus_busy_share'] * 100:.0f}% of the time; CPU by program: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in cpu["cpu_s"].items())
                     + f". Around its slowest poll ({around['from_s']:.1f}–{around['to_s']:.1f} s, run queue up to {around['max_running']}): "
                     + ", ".join(f"{b['program']}{' (its tree)' if b['tree'] else ''} {b['ms']} ms" for b in around["busiest"][:6]))
b, a = by.get(("modules_before", "dashd")), by.get(("modules_after", "dashd"))
if b and a:
    restarts = {m: a[m]["restarts"] - b.get(m, {}).get("restarts", 0) for m in a}
    total = sum(restarts.values())
    detail = ", ".join(f"{m} {n} ({a[m].get('last_error') or 'no error recorded'})" for m, n in restarts.items() if n)
    extra.append(f"- ray-dashd module restarts during the load: {total}" + (f": {detail}" if detail else ""))
synth = by.get(("synth", None))
if synth:
    t = synth.get("timings", {})
    extra.append(
        "- synthetic cluster: {na} of {n} nodes alive, actors {a}, task events stored {te} (dropped {td}), jobs in the GCS {j}; "
        "phases: nodes {tn} s, jobs {tj} s, tasks {tt} s, actors {ta} s".format(
            na=synth.get("nodes_alive"), n=synth.get("nodes_registered"), a=synth.get("actor_states"),
            te=synth.get("task_events_stored"), td=synth.get("task_attempts_dropped"),
            j=synth.get("jobs_in_gcs"), tn=t.get("nodes_s"), tj=t.get("jobs_s"), tt=t.get("tasks_s"),
            ta=t.get("actors_s")))
print("\n".join(extra))
# Variants of ray-dashd measured in the same run (BENCH_ORDER's dashd2...).
variants = [v for v in sys.argv[2].split() if v.startswith("dashd")]
if len(variants) > 1:
    print()
    print("ray-dashd's variants on the same cluster, one after the other (" + "; ".join(
        f"{v}: {(by.get(('variant', v)) or {}).get('bin', '?')}, environment {(by.get(('variant', v)) or {}).get('env') or 'none'}, "
        f"config lines {' '.join((by.get(('variant', v)) or {}).get('toml', '').split()) or 'none'}" for v in variants) + "):")
    print()
    print("| p99 (max) | " + " | ".join(variants) + " |")
    print("|---|" + "---:|" * len(variants))
    vloads = {v: {e["path"]: e for e in (by.get(("load", v)) or {}).get("endpoints", [])} for v in variants}
    for p in paths:
        cells = [f"{ms(vloads[v][p].get('p99_ms'))} ({ms(vloads[v][p].get('max_ms'))})" if p in vloads[v] else "—" for v in variants]
        print(f"| `{p}` | " + " | ".join(cells) + " |")
    def row(label, get):
        print(f"| {label} | " + " | ".join(get(v) for v in variants) + " |")
    row("PSS mid-run", lambda v: f"{(by.get(('mem_mid', v)) or {}).get('total_pss_kib', 0) / 1024:.0f} MiB")
    row("PSS after", lambda v: f"{(by.get(('mem_after', v)) or {}).get('total_pss_kib', 0) / 1024:.0f} MiB")
    row("CPU of the tree", lambda v: f"{(by.get(('load', v)) or {}).get('tree_cpu_s', 0):.1f} s")
    row("errors", lambda v: str(sum(e["errors"] for p, e in vloads[v].items() if p != "/api/prometheus_health")))
    row("vCPU steal", lambda v: f"{(by.get(('steal', v)) or {}).get('steal_s', 0):.2f} s")
    row("all CPUs busy", lambda v: f"{((by.get(('cpu', v)) or {}).get('all_cpus_busy_share') or 0) * 100:.0f}% of the time")
EOF
    if [[ -n "$ANSWERS" ]]; then
        echo
        echo "Answers after the runs (each dashboard started again alone and idle: Ray's, ray-dashd, Ray's again), Ray's against ray-dashd's (JSON compared after parsing; time-varying fields left out, see bench/compare_answers.py):"
        echo
        sed 's/^/    /' <<<"$ANSWERS"
    fi
    if [[ -n "$WALK_STATUS" ]]; then
        echo
        echo "Ray's web UI in headless Chromium, Ray's dashboard and ray-dashd side by side on the same cluster, every page (tests/ui/ray_walk.mjs): $WALK_STATUS"
        [[ -z "$WALK" ]] || { echo; sed 's/^/    /' <<<"$WALK"; }
    fi
    if [[ -n "$NOISE" ]]; then
        echo
        echo "Ray's against itself, started again after ray-dashd (what the comparison cannot hold equal):"
        echo
        sed 's/^/    /' <<<"$NOISE"
    fi
} | tee "$RESULTS_DIR/ray_scale.md"

# The fake nodes must still be alive, or the second dashboard saw another cluster.
alive "$SYNTH_PID" || log "warning: ray_synth_cluster.py exited during the run; see $TMP/synth.log"
