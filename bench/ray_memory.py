"""Memory and start-up of Ray's nine dashboard modules under ray-dashd, per launch mode.

Run by bench/ray_memory.sh (which builds ray-dashd and the shim first):

    python bench/ray_memory.py --dashd target/release/ray-dashd [--rounds N]
                               [--modes fork,standalone] [--settle SECS]

With the Python that has ray==2.60.0 (it runs `ray` from the same folder). It
starts a private Ray head (loopback, private ports, a temp dir; stopped by
pid), then for each round and mode starts ray-dashd with `[ray] launch =
MODE`, waits for the nine modules to be healthy, lets them settle, sums the
PSS (/proc/<pid>/smaps_rollup) of every process ray-dashd started, kills
JobHead (SIGKILL) and times its replacement, and stops ray-dashd by pid.
Prints one Markdown table of medians; the raw rounds go to
bench/results/ray_memory.jsonl.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

RAY_MODULES = ["DataHead", "EventHead", "JobHead", "MetricsHead", "NodeHead",
               "ReportHead", "ServeHead", "StateHead", "TrainHead"]
WAIT_SECS = 180
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_block(n: int) -> int:
    """n consecutive free ports below the ephemeral range."""
    start = 20000 + (os.getpid() % 100) * 100
    for i in range(100):
        base = 20000 + (start - 20000 + i * 100) % 12000
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            for s in socks:
                s.close()
            return base
        except OSError:
            for s in socks:
                s.close()
    raise SystemExit("no block of free ports")


def ray_env(bin_dir: str) -> dict:
    env = dict(os.environ)
    env["PATH"] = bin_dir + ":" + env.get("PATH", "")
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["DASHBOARD_METRIC_PORT"] = str(free_port())
    return env


class Head:
    """`ray start --head --block` in its own process group, in a temp dir."""

    def __init__(self, bin_dir: str):
        self.temp = tempfile.mkdtemp(prefix="rdm")
        base = port_block(100)
        self.gcs = f"127.0.0.1:{base}"
        ports = iter(range(base + 1, base + 50))
        cmd = [os.path.join(bin_dir, "ray"), "start", "--head", "--block",
               "--include-dashboard=false", "--disable-usage-stats", "--num-cpus=2",
               "--node-ip-address=127.0.0.1", "--object-store-memory=100000000",
               f"--port={base}", f"--temp-dir={self.temp}"]
        for flag in ("node-manager-port", "object-manager-port", "ray-client-server-port",
                     "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                     "runtime-env-agent-port", "metrics-export-port"):
            cmd.append(f"--{flag}={next(ports)}")
        cmd += [f"--min-worker-port={base + 50}", f"--max-worker-port={base + 99}"]
        self.proc = subprocess.Popen(cmd, env=ray_env(bin_dir), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     process_group=0, text=True)
        deadline = time.monotonic() + WAIT_SECS
        for line in self.proc.stdout:
            if "Ray runtime started" in line:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("the Ray head did not start")
        else:
            self.stop()
            raise SystemExit("the Ray head exited before it started")
        # Keep draining its output so that it never blocks on a full pipe.
        import threading
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def session(self) -> str:
        return os.path.join(self.temp, "session_latest")

    def stop(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        # Whatever left the group still names the temp dir on its command line.
        for pid in pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.temp.encode() in f.read():
                        os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        subprocess.run(["rm", "-rf", self.temp], check=False)


def pids() -> list:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def parent_of(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(root: int) -> list:
    children = {}
    for pid in pids():
        children.setdefault(parent_of(pid), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def wait_healthy(base: str, names, at_least=None, deadline_secs=WAIT_SECS) -> list:
    deadline = time.monotonic() + deadline_secs
    while True:
        try:
            modules = get_json(base + "/api/modules")
            by_name = {m["name"]: m for m in modules}
            if all(by_name.get(n, {}).get("state") == "healthy" and
                   (at_least is None or by_name[n]["incarnation"] >= at_least)
                   for n in names):
                return modules
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"modules not healthy within {deadline_secs}s")
        time.sleep(0.02)


def one_run(args, head: Head, mode: str) -> dict:
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    # Ray's modules only: not ray-dashd's built-in example and logs modules;
    # all nine started at once (none on demand), as Ray starts them.
    cfg.write(f"builtin_modules = false\n[ray]\nmodules = \"on\"\npython = {json.dumps(args.python)}\n"
              f"launch = \"{mode}\"\non_demand = []\n")
    cfg.close()
    env = ray_env(os.path.dirname(args.python))
    env["RAY_DASHD_LOG"] = "warn"
    started_wall = time.time()
    started = time.monotonic()
    dashd = subprocess.Popen([args.dashd, "--session-dir", head.session(), "--port", str(port),
                              "--config", cfg.name], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        modules = wait_healthy(base, RAY_MODULES)
        ready = time.monotonic() - started
        ready_wall_ms = time.time() * 1000
        first_spawn = min(m["started_at_ms"] for m in modules
                          if m["name"] in RAY_MODULES or m["name"] == "RayZygote")
        time.sleep(args.settle)
        by_name = {m["name"]: m for m in get_json(base + "/api/modules")}
        zygote = by_name.get("RayZygote", {}).get("pid")
        shims, children, others = [], [], []
        module_pids = {by_name[n]["pid"] for n in RAY_MODULES}
        for pid in descendants(dashd.pid):
            line = cmdline(pid)
            if any(script in line for script in ("dashboard_kv.py", "head_facts.py", "routes.py")):
                continue  # ray-dashd's short-lived helpers
            if pid == zygote:
                continue
            if "fork-shim" in line:  # `ray-dashd fork-shim` or `ray-dashd-fork-shim`
                shims.append(pid)
            elif pid in module_pids or mode == "fork":
                children.append(pid)
            else:
                others.append(pid)
        result = {
            "mode": mode,
            "ready_s": round(ready, 3),
            "spawn_to_ready_s": round((ready_wall_ms - first_spawn) / 1000, 3),
            "modules_pss_kib": sum(pss_kib(p) for p in children),
            "modules": len(children),
            "shims_pss_kib": sum(pss_kib(p) for p in shims),
            "shims": len(shims),
            "zygote_pss_kib": pss_kib(zygote) if zygote else 0,
            "others_pss_kib": sum(pss_kib(p) for p in others),
            "dashd_pss_kib": pss_kib(dashd.pid),
        }
        result["total_pss_kib"] = (result["modules_pss_kib"] + result["shims_pss_kib"]
                                   + result["zygote_pss_kib"] + result["others_pss_kib"])
        # A restart: JobHead killed, time until it is healthy again.
        job = by_name["JobHead"]
        killed = time.monotonic()
        os.kill(job["pid"], signal.SIGKILL)
        wait_healthy(base, ["JobHead"], at_least=job["incarnation"] + 1, deadline_secs=60)
        result["jobhead_restart_s"] = round(time.monotonic() - killed, 3)
        return result
    finally:
        dashd.send_signal(signal.SIGTERM)
        try:
            dashd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dashd.kill()
            dashd.wait()
        os.unlink(cfg.name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dashd", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="fork,standalone")
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    args.python = os.path.abspath(args.python)
    head = Head(os.path.dirname(args.python))
    results = []
    try:
        for _ in range(args.rounds):
            for mode in args.modes.split(","):
                result = one_run(args, head, mode)
                print(json.dumps(result), file=sys.stderr, flush=True)
                results.append(result)
    finally:
        head.stop()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "ray_memory.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")

    def med(mode, key):
        return statistics.median(r[key] for r in results if r["mode"] == mode)

    mib = lambda kib: f"{kib / 1024:.0f}"  # noqa: E731
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Ray's nine dashboard modules under ray-dashd, medians of {args.rounds} rounds "
          f"({os.cpu_count()} cores, load average at the end {load})\n")
    print("| launch | total PSS MiB | module processes | shims | zygote | "
          "ray-dashd start → nine healthy s | first spawn → nine healthy s | "
          "JobHead SIGKILL → healthy s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        print(f"| {mode} | {mib(med(mode, 'total_pss_kib'))} | "
              f"{mib(med(mode, 'modules_pss_kib'))} ({int(med(mode, 'modules'))}) | "
              f"{mib(med(mode, 'shims_pss_kib'))} | {mib(med(mode, 'zygote_pss_kib'))} | "
              f"{med(mode, 'ready_s'):.2f} | {med(mode, 'spawn_to_ready_s'):.2f} | "
              f"{med(mode, 'jobhead_restart_s'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
