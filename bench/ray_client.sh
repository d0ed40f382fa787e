#!/usr/bin/env bash
# bench/ray_client.sh: ray-dashd's Ray Client proxy beside Ray's own
# proxier on the same private Ray head, in one run: connect time, task round
# trip, put/get MiB/s (and straight to a specific server), and the most
# concurrent clients each serves against fake specific servers. See
# bench/README.md, "Ray Client proxy", for what each number means and the
# knobs.
#
# Not part of the tests. Loopback only, private ports, a temp dir; every
# process it starts is stopped by its process group on exit.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")
BUILD=${BENCH_BUILD:-1}
RESULTS_DIR=${BENCH_RESULTS_DIR:-$BENCH_DIR/results}
PYTHON=${BENCH_RAY_PYTHON:-$ROOT/target/test-venv/bin/python}

BENCH_TAG=ray-client-bench
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

if [[ "$BUILD" == 1 ]]; then
    log "cargo build --release --workspace"
    (cd "$ROOT" && cargo build --release --workspace) >&2
fi

# The venv the real-Ray tests use (scripts/test makes it the same way).
if ! "$PYTHON" -c 'import ray; assert ray.__version__ == "2.60.0"' 2>/dev/null; then
    if [[ -n "${BENCH_RAY_PYTHON:-}" ]]; then
        log "error: $PYTHON has no ray==2.60.0"
        exit 1
    fi
    log "creating $ROOT/target/test-venv (ray[default]==2.60.0)"
    python3 -m venv "$ROOT/target/test-venv" >&2
    "$ROOT/target/test-venv/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/tests/requirements.txt" >&2
fi

exec "$PYTHON" "$BENCH_DIR/ray_client_bench.py" \
    --python "$PYTHON" --bin-dir "$ROOT/target/release" --results-dir "$RESULTS_DIR"
