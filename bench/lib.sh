# bench/lib.sh: what the benchmark scripts share. Sourced, not run:
#
#   BENCH_TAG=ray-scale; source "$BENCH_DIR/lib.sh"
#
# log/die (prefixed with BENCH_TAG), alive, stop_pid, cpu_busy_pct and
# warn_if_busy; for the scripts that run a Ray head, stop_dashboard (needs
# LOADGEN and DASH_PID) and stop_head (needs HEAD_PID and TMP).

log() { printf '[%s] %s\n' "$BENCH_TAG" "$*" >&2; }
die() { log "error: $*"; exit 1; }

alive() { # pid: running (a zombie, dead but not yet reaped, is not)
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

cpu_busy_pct() { # CPU busy over one second, all cores, in percent
    local a b
    a=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    sleep 1
    b=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN{split(a,x," "); split(b,y," "); t=y[2]-x[2]; p=0; if (t > 0) p=100*(y[1]-x[1])/t; printf("%.0f", p)}'
}

# Anything else busy on the host skews every column: sets BUSY_BEFORE, and
# says so in the log.
warn_if_busy() {
    BUSY_BEFORE=$(cpu_busy_pct)
    ((BUSY_BEFORE < 10)) || log "warning: the host was ${BUSY_BEFORE}% busy before the run; results will be skewed"
}

stop_pid() { # pid grace_s [name]: SIGTERM, then SIGKILL after grace_s (said when named); reaped
    local pid=$1 grace=$2 name=${3:-} i
    [[ -n "$pid" ]] || return 0
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < grace * 10; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            [[ -z "$name" ]] || log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
}

STOP_JSON=""
stop_dashboard() { # stops $DASH_PID and every process below it; stop-tree's JSON in STOP_JSON
    STOP_JSON=""
    [[ -n "$DASH_PID" ]] || return 0
    STOP_JSON=$("$LOADGEN" stop-tree --pid "$DASH_PID" --grace 10) || log "stop-tree $DASH_PID failed"
    wait "$DASH_PID" 2>/dev/null || true
    DASH_PID=""
}

stop_head() { # stops `ray start --block` ($HEAD_PID) and what it started
    local i p
    [[ -n "$HEAD_PID" ]] || return 0
    # `ray start --block` stops everything it started on SIGTERM.
    kill -TERM "$HEAD_PID" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
        alive "$HEAD_PID" || break
        sleep 0.1
    done
    kill -KILL -- "-$HEAD_PID" 2>/dev/null || true
    wait "$HEAD_PID" 2>/dev/null || true
    HEAD_PID=""
    # Whatever left the group (workers re-parented, daemons) still names our
    # temp dir in its command line.
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [[ "$p" != "$$" ]] || continue
        if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF "$TMP/"; then
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
}
