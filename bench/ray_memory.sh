#!/usr/bin/env bash
# bench/ray_memory.sh: memory (PSS) and start-up of Ray's nine dashboard
# modules under ray-dashd, forked from the zygote (`[ray] launch = "fork"`)
# against one standalone Python process each (`"standalone"`), on a private
# Ray head. See bench/ray_memory.py for what is measured; bench/README.md
# ("Ray's modules: memory and start-up") for the knobs and the numbers.
#
# Not part of the tests. Loopback only; the head and every ray-dashd are
# started in their own temp dir and stopped by pid.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")
PYTHON=${BENCH_RAY_PYTHON:-$ROOT/target/test-venv/bin/python}  # has ray[default]==2.60.0
ROUNDS=${BENCH_ROUNDS:-3}
MODES=${BENCH_RAY_MODES:-fork,standalone}
SETTLE=${BENCH_RAY_SETTLE:-10}     # seconds between all-healthy and the PSS reading
BUILD=${BENCH_BUILD:-1}            # 0: use the binaries already built

if [[ ! -x "$PYTHON" ]] || ! "$PYTHON" -c 'import ray' 2>/dev/null; then
    echo "[bench] $PYTHON has no Ray: run scripts/test once (it makes target/test-venv) or set BENCH_RAY_PYTHON" >&2
    exit 1
fi
if [[ "$BUILD" == 1 ]]; then
    (cd "$ROOT" && cargo build --release --locked -p ray-dashd)
fi
exec "$PYTHON" "$BENCH_DIR/ray_memory.py" --dashd "$ROOT/target/release/ray-dashd" \
    --python "$PYTHON" --rounds "$ROUNDS" --modes "$MODES" --settle "$SETTLE"
