"""A Ray client timed by bench/ray_client_bench.py: one connection, one JSON line.

usage: ray_client_driver.py --address HOST:PORT --mode connect|session [options]

  connect  ray.init("ray://ADDRESS") timed, then ray.shutdown() timed. With
           --clients-socket (a client proxy module's Unix socket), also
           whether the proxy had a spare server ready before the connect and
           whether the server this client got was started before the connect
           began (the spare was used).
  session  connect, then the median round trip of ray.get(f.remote()) of a
           trivial task (--rtt-warmup unmeasured, then --rtt measured), then
           --put-rounds of ray.put / ray.get of --object-mib MiB (one
           unmeasured round first). With --wait-spare (and --clients-socket),
           waits after connecting until the proxy's next spare server is up. With --proxy-pid, the proxy's CPU time
           (utime+stime of every thread, from /proc) over each phase.

Every wait is bounded (--deadline-s for the whole run, SIGALRM); a failure
prints {"ok": false, "error": ...} and exits 1.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import sys
import time
import traceback

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proxy_ticks(pid, kernel_only=False):
    """utime + stime (or stime alone) of every thread of pid, in clock ticks."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    stime = int(fields[12])  # field 15 of stat; utime is field 14
    return stime if kernel_only else int(fields[11]) + stime


def cpu_ms(pid, before):
    if pid is None or before is None:
        return None
    return (proxy_ticks(pid) - before) * 1000.0 / CLK_TCK


def process_start_boot_s(pid):
    """When pid started, in seconds since boot (CLOCK_BOOTTIME, to a clock tick)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19]) / CLK_TCK  # field 22


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def proxy_clients(path):
    """GET /api/client_proxy/clients from a client proxy module's socket."""
    conn = UnixHTTPConnection(path)
    try:
        conn.request("GET", "/api/client_proxy/clients")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"clients: HTTP {response.status}: {body[:200]!r}")
        return json.loads(body)
    finally:
        conn.close()


def stats_ms(samples_ns):
    ms = sorted(s / 1e6 for s in samples_ns)
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p10_ms": ms[len(ms) // 10],
        "p90_ms": ms[(len(ms) * 9) // 10],
        "mean_ms": statistics.fmean(ms),
        "min_ms": ms[0],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--mode", choices=["connect", "session"], required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--clients-socket")
    parser.add_argument("--proxy-pid", type=int)
    parser.add_argument("--wait-spare", action="store_true")
    parser.add_argument("--rtt", type=int, default=500)
    parser.add_argument("--rtt-warmup", type=int, default=50)
    parser.add_argument("--object-mib", type=int, default=64)
    parser.add_argument("--put-rounds", type=int, default=3)
    parser.add_argument("--deadline-s", type=int, default=300)
    args = parser.parse_args()
    out = {"label": args.label, "mode": args.mode, "address": args.address, "ok": False}

    def on_alarm(signum, frame):
        raise TimeoutError(f"the driver ran over --deadline-s={args.deadline_s}")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.deadline_s)
    try:
        run(args, out)
        out["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported, then exit 1
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-2000:]
    signal.alarm(0)
    print(json.dumps(out), flush=True)
    sys.exit(0 if out["ok"] else 1)


def run(args, out):
    import ray

    if args.clients_socket:
        out["spare_ready_before"] = bool(proxy_clients(args.clients_socket).get("spare_ready"))
    started_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    t0 = time.perf_counter()
    ray.init(f"ray://{args.address}", logging_level="warning")
    out["connect_s"] = time.perf_counter() - t0
    if args.clients_socket:
        listed = proxy_clients(args.clients_socket)["clients"]
        pids = [c["server_pid"] for c in listed if c.get("server_pid")]
        if len(pids) == 1:
            out["server_pid"] = pids[0]
            out["spare_used"] = process_start_boot_s(pids[0]) < started_boot
        else:
            out["clients_listed"] = len(listed)

    if args.mode == "session":
        if args.clients_socket and args.wait_spare:
            # The spare that replaces this client's must not start during
            # the measurement (its start costs the proxy some CPU).
            deadline = time.monotonic() + 120
            while not proxy_clients(args.clients_socket).get("spare_ready"):
                if time.monotonic() > deadline:
                    raise TimeoutError("no spare server within 120 s")
                time.sleep(0.1)
        session(args, out, ray)

    t0 = time.perf_counter()
    ray.shutdown()
    out["shutdown_s"] = time.perf_counter() - t0


def session(args, out, ray):
    @ray.remote
    def noop():
        return 0

    for _ in range(args.rtt_warmup):
        ray.get(noop.remote(), timeout=60)
    samples = []
    before = proxy_ticks(args.proxy_pid)
    before_sys = proxy_ticks(args.proxy_pid, kernel_only=True)
    for _ in range(args.rtt):
        t0 = time.perf_counter_ns()
        ray.get(noop.remote(), timeout=60)
        samples.append(time.perf_counter_ns() - t0)
    out["rtt"] = stats_ms(samples)
    rtt_cpu = cpu_ms(args.proxy_pid, before)
    if rtt_cpu is not None:
        out["proxy_cpu_us_per_rtt"] = rtt_cpu * 1000.0 / args.rtt
        sys_ms = (proxy_ticks(args.proxy_pid, kernel_only=True) - before_sys) * 1000.0 / CLK_TCK
        out["proxy_sys_us_per_rtt"] = sys_ms * 1000.0 / args.rtt

    size = args.object_mib << 20
    payload = os.urandom(size)
    put_s, get_s = [], []
    put_cpu = get_cpu = 0.0
    for i in range(args.put_rounds + 1):
        before = proxy_ticks(args.proxy_pid)
        t0 = time.perf_counter()
        ref = ray.put(payload)
        put_time = time.perf_counter() - t0
        put_ms = cpu_ms(args.proxy_pid, before)
        before = proxy_ticks(args.proxy_pid)
        t0 = time.perf_counter()
        back = ray.get(ref, timeout=120)
        get_time = time.perf_counter() - t0
        get_ms = cpu_ms(args.proxy_pid, before)
        if back != payload:
            raise AssertionError(f"the {args.object_mib} MiB object came back changed")
        del ref, back
        if i == 0:
            continue  # warm-up round
        put_s.append(put_time)
        get_s.append(get_time)
        if put_ms is not None:
            put_cpu += put_ms
            get_cpu += get_ms
    out["object_mib"] = args.object_mib
    out["put_mib_s"] = [args.object_mib / s for s in put_s]
    out["get_mib_s"] = [args.object_mib / s for s in get_s]
    if args.proxy_pid is not None:
        out["proxy_cpu_ms_per_put"] = put_cpu / args.put_rounds
        out["proxy_cpu_ms_per_get"] = get_cpu / args.put_rounds


main()
