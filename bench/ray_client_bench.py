"""ray-dashd's Ray Client proxy beside Ray's own proxier, in one run.

Started by bench/ray_client.sh (which builds the release binaries first); see
bench/README.md, "Ray Client proxy", for what each number means. Everything
runs on loopback, on private ports, in a temp dir; every process started
here is stopped by its process group on exit.

1. A private Ray head: `ray start --head --block` with Ray's own proxier on
   a private --ray-client-server-port.
2. ray-dashd on that head's session (`[ray] modules = "off"`) with two
   client proxy modules against the same GCS: `rcp` (the default, with a warm
   spare server) and `rcp_cold` (`--warm-spare false`, so every client waits
   for its server to start, as with Ray's proxier).
3. Rounds (interleaved, the order rotating each round) of a session
   (connect, task round trips, put/get) through ours, through Ray's
   proxier, and straight to a specific server started for that session.
4. Connects, interleaved: ours with its spare ready, ours cold, Ray's.
5. Against fake specific servers (ours standalone with --server-command
   ray-dashd-fake-client-server; Ray's proxier run by
   bench/ray_proxier_fake.py with the same fake servers; one fake server
   alone as the baseline): the cost of one message and one call through
   each (`ray-dashd-bench ray-rtt`, rounds interleaved), then the most
   concurrent clients each serves (`ray-dashd-bench ray-clients`).
6. The raw results (one JSON object a line) and a Markdown table.
"""

import argparse
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)


def log(message):
    print(f"[ray-client-bench] {message}", file=sys.stderr, flush=True)


# --- processes ------------------------------------------------------------------


class Group:
    """A process started in its own process group, stopped by group."""

    def __init__(self, name, argv, env, log_path, cwd=None):
        self.name = name
        self.log_path = log_path
        self.log_file = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        self.pid = self.proc.pid
        self.stopped = False

    def alive(self):
        return self.proc.poll() is None

    def stop(self, grace_s=15.0):
        """SIGTERM the leader (each of ours stops what it started), wait up
        to grace_s, then SIGKILL whatever is left in the group."""
        if self.stopped:
            return
        self.stopped = True
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log(f"{self.name} (pid {self.pid}) ignored SIGTERM for {grace_s}s; SIGKILL")
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log(f"{self.name} (pid {self.pid}) still there after SIGKILL")
        self.log_file.close()


STARTED = []


def start(name, argv, env, log_path, cwd=None):
    group = Group(name, argv, env, log_path, cwd)
    STARTED.append(group)
    return group


def pids_mentioning(path):
    """Processes whose command line names path (our temp dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def descendants(pid):
    """Every process below pid, from /proc/*/task/*/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def wait_for(what, predicate, timeout_s, interval_s=0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s}s for {what}")
        time.sleep(interval_s)


def tcp_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def port_free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_block(n, low, high, skip=()):
    """n consecutive free ports in [low, high), outside the ranges in skip."""
    start = low + (os.getpid() % 50) * 100
    for i in range((high - low) // 100):
        base = low + (start - low + i * 100) % (high - low - n)
        if any(base < b and a < base + n for a, b in skip):
            continue
        if all(port_free(p) for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no {n} free consecutive ports in {low}-{high}")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def unix_get(path, url):
    conn = UnixHTTPConnection(path)
    try:
        conn.request("GET", url)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def unix_json(path, url):
    status, body = unix_get(path, url)
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {body[:300]!r}")
    return json.loads(body)


def proc_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# --- the run ----------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env_int = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
    parser.add_argument("--python", required=True, help="the Python with ray==2.60.0")
    parser.add_argument("--bin-dir", required=True, help="the release binaries")
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--rounds", type=int, default=env_int("BENCH_RAY_ROUNDS", 3))
    parser.add_argument("--connects", type=int, default=env_int("BENCH_RAY_CONNECTS", 5))
    parser.add_argument("--rtt", type=int, default=env_int("BENCH_RAY_RTT", 500))
    parser.add_argument("--object-mib", type=int, default=env_int("BENCH_RAY_OBJECT_MIB", 64))
    parser.add_argument("--put-rounds", type=int, default=env_int("BENCH_RAY_PUT_ROUNDS", 3))
    parser.add_argument("--max-clients", type=int, default=env_int("BENCH_RAY_MAX_CLIENTS", 500))
    parser.add_argument("--hop-iterations", type=int, default=env_int("BENCH_RAY_HOP_ITERATIONS", 2000))
    parser.add_argument("--max-errors", type=int, default=env_int("BENCH_RAY_MAX_ERRORS", 100))
    parser.add_argument(
        "--client-timeout", type=float, default=float(os.environ.get("BENCH_RAY_CLIENT_TIMEOUT", 20))
    )
    parser.add_argument("--skip", default=os.environ.get("BENCH_RAY_SKIP", ""),
                        help="comma-separated parts to skip: sessions, connects, hops, clients, "
                             "relay (the bare-relay sessions)")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    os.makedirs(args.results_dir, exist_ok=True)
    raw_path = os.path.join(args.results_dir, "ray_client.jsonl")
    raw = open(raw_path, "w")

    def record(kind, target, result, **tags):
        line = {"kind": kind, "target": target, **tags, "result": result}
        raw.write(json.dumps(line) + "\n")
        raw.flush()

    tmp = tempfile.mkdtemp(prefix="rcb")
    ok = False
    try:
        run(args, skip, tmp, record)
        ok = True
    finally:
        for group in reversed(STARTED):
            group.stop()
        for pid in pids_mentioning(tmp):
            log(f"pid {pid} outlived its group and still names {tmp}; SIGKILL")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raw.close()
        if ok and os.environ.get("BENCH_RAY_KEEP") != "1":
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"logs kept in {tmp}")
    table = report(raw_path, args)
    md_path = os.path.join(args.results_dir, "ray_client.md")
    with open(md_path, "w") as f:
        f.write(table)
    print(table)
    log(f"raw results: {raw_path}; table: {md_path}")


def ray_env(python):
    bin_dir = os.path.dirname(python)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def run(args, skip, tmp, record):
    python = args.python
    env = ray_env(python)
    ray_bin = os.path.join(os.path.dirname(python), "ray")
    proxy_bin = os.path.join(args.bin_dir, "ray-dashd-client-proxy")
    fake_bin = os.path.join(args.bin_dir, "ray-dashd-fake-client-server")
    dashd_bin = os.path.join(args.bin_dir, "ray-dashd")
    loadgen = os.path.join(args.bin_dir, "ray-dashd-bench")
    for b in (proxy_bin, fake_bin, dashd_bin, loadgen):
        if not os.access(b, os.X_OK):
            raise RuntimeError(f"{b} is missing; build with cargo build --release --workspace")

    # Ports: the head's block below 23000; Ray's proxier takes its servers
    # from 23000-23999 (fixed), so ours and the fakes stay clear of that.
    rays_servers = (23000, 24000)
    head = free_block(100, 20000, 23000)
    gcs_port = head
    rays_port = head + 3  # Ray's proxier (ray start --ray-client-server-port)
    ours_port, cold_port, dashd_port = head + 8, head + 9, head + 10
    direct_ports = iter(range(head + 20, head + 50))
    relay_port = head + 15  # the bare relay in front of a direct server
    ours_servers = free_block(100, 24000, 32000)
    cold_servers = free_block(100, 24000, 32000, skip=[(ours_servers, ours_servers + 100)])
    n_fake = args.max_clients + 50
    taken = [(ours_servers, ours_servers + 100), (cold_servers, cold_servers + 100)]
    fake_ours = free_block(n_fake, 24000, 32000, skip=taken)
    taken.append((fake_ours, fake_ours + n_fake))
    fake_rays = free_block(n_fake, 24000, 32000, skip=taken)
    fake_client_ports = (head + 11, head + 12)
    gcs = f"127.0.0.1:{gcs_port}"
    temp_dir = os.path.join(tmp, "ray")
    os.makedirs(temp_dir)

    # 1. The head, with Ray's proxier on rays_port.
    head_log = os.path.join(tmp, "ray-start.log")
    env_head = dict(env, DASHBOARD_METRIC_PORT=str(head + 13))
    log(f"starting a Ray head (GCS {gcs}, Ray's proxier on {rays_port}, temp dir {temp_dir})")
    ray_head = start(
        "ray head",
        [
            ray_bin, "start", "--head", "--block", "--include-dashboard=false",
            "--disable-usage-stats", "--num-cpus=2", "--node-ip-address=127.0.0.1",
            "--object-store-memory=1000000000",
            f"--port={gcs_port}", f"--temp-dir={temp_dir}",
            f"--node-manager-port={head + 1}", f"--object-manager-port={head + 2}",
            f"--ray-client-server-port={rays_port}",
            f"--dashboard-agent-listen-port={head + 4}", f"--dashboard-agent-grpc-port={head + 5}",
            f"--runtime-env-agent-port={head + 6}", f"--metrics-export-port={head + 7}",
            f"--min-worker-port={head + 50}", f"--max-worker-port={head + 99}",
        ],
        env_head,
        head_log,
    )

    def head_started():
        if not ray_head.alive():
            raise RuntimeError(f"ray start exited; see {head_log}")
        with open(head_log, errors="replace") as f:
            return "Ray runtime started" in f.read()

    wait_for("the Ray head", head_started, 180, 0.5)
    wait_for("Ray's proxier", lambda: tcp_open(rays_port), 120, 0.2)
    session = os.path.join(temp_dir, "session_latest")
    rays_proxier = wait_for(
        "Ray's proxier process",
        lambda: next(
            (p for p in descendants(ray_head.pid)
             if b"--mode=proxy" in cmdline(p) and f"--port={rays_port}".encode() in cmdline(p)),
            None,
        ),
        60,
    )
    log(f"Ray head up; Ray's proxier pid {rays_proxier}")

    # 2. ray-dashd with our proxy, warm and cold, on the same head.
    config = os.path.join(tmp, "dashd.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
host = "127.0.0.1"

[ray]
modules = "off"

[[modules]]
name = "rcp"
command = ["{proxy_bin}", "--ray-client-port", "{ours_port}", "--gcs-address", "{gcs}",
           "--python", "{python}", "--port-range", "{ours_servers}-{ours_servers + 99}"]
routes = [{{ method = "GET", path = "/api/client_proxy/clients", type = "http" }}]

[[modules]]
name = "rcp_cold"
command = ["{proxy_bin}", "--ray-client-port", "{cold_port}", "--gcs-address", "{gcs}",
           "--python", "{python}", "--port-range", "{cold_servers}-{cold_servers + 99}",
           "--warm-spare", "false"]
""")
    dashd = start(
        "ray-dashd",
        [dashd_bin, "--session-dir", session, "--port", str(dashd_port), "--config", config],
        env,
        os.path.join(tmp, "dashd.log"),
    )
    real_session = os.path.realpath(session)
    ours_socket = os.path.join(real_session, "sockets", "dash_rcp")
    cold_socket = os.path.join(real_session, "sockets", "dash_rcp_cold")

    def modules():
        with urllib.request.urlopen(f"http://127.0.0.1:{dashd_port}/api/modules", timeout=5) as r:
            return {m["name"]: m for m in json.load(r)}

    def healthy():
        if not dashd.alive():
            raise RuntimeError(f"ray-dashd exited; see {tmp}/dashd.log")
        try:
            m = modules()
        except OSError:
            return None
        if all(m.get(n, {}).get("state") == "healthy" for n in ("rcp", "rcp_cold")):
            return m
        return None

    m = wait_for("the proxy modules healthy", healthy, 60, 0.2)
    ours_pid, cold_pid = m["rcp"]["pid"], m["rcp_cold"]["pid"]
    log(f"ray-dashd pid {dashd.pid}: rcp pid {ours_pid} on {ours_port}, rcp_cold pid {cold_pid} on {cold_port}")

    def spare_ready():
        return unix_json(ours_socket, "/api/client_proxy/clients").get("spare_ready")

    def no_clients(socket_path):
        view = unix_json(socket_path, "/api/client_proxy/clients")
        return view.get("num_clients") == 0

    def driver(label, address, mode, extra=(), deadline_s=300):
        argv = [python, os.path.join(BENCH_DIR, "ray_client_driver.py"), "--address", address,
                "--mode", mode, "--label", label, "--deadline-s", str(deadline_s), *extra]
        try:
            done = subprocess.run(argv, env=env, capture_output=True, timeout=deadline_s + 60,
                                  process_group=0)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"the driver did not finish in {deadline_s + 60}s"}
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            result = {"ok": False, "error": "no JSON from the driver",
                      "stderr": done.stderr.decode(errors="replace")[-2000:]}
        if not result.get("ok"):
            log(f"{label} {mode} failed: {result.get('error')}")
        return result

    setup_worker = subprocess.run(
        [python, "-c", "import importlib.util, os; print(os.path.join(os.path.dirname("
         "importlib.util.find_spec('ray').origin), '_private', 'workers', 'setup_worker.py'))"],
        env=env, capture_output=True, check=True, timeout=120,
    ).stdout.decode().strip()

    def start_direct():
        port = next(direct_ports)
        # The context Ray gives a server without a runtime env.
        context = json.dumps({"command_prefix": [], "env_vars": {}, "py_executable": python,
                              "override_worker_entrypoint": None, "java_jars": []})
        group = start(
            f"direct server {port}",
            [python, setup_worker, "-m", "ray.util.client.server", f"--address={gcs}",
             "--host=127.0.0.1", f"--port={port}", "--mode=specific-server", "--language=PYTHON",
             f"--serialized-runtime-env-context={context}"],
            env,
            os.path.join(tmp, f"direct_{port}.log"),
        )
        wait_for(f"the direct server on {port}",
                 lambda: tcp_open(port) or (not group.alive() and _raise(f"direct server exited; see {group.log_path}")),
                 120, 0.1)
        return group, port

    session_extra = ["--rtt", str(args.rtt), "--object-mib", str(args.object_mib),
                     "--put-rounds", str(args.put_rounds)]

    # The head's first driver pays for starting its workers: an unmeasured
    # session straight to a server, so that no column pays for it.
    if not {"sessions", "connects"} <= skip:
        group, port = start_direct()
        result = driver("warm-up", f"127.0.0.1:{port}", "session",
                        ["--rtt", "50", "--object-mib", "8", "--put-rounds", "1"])
        group.stop(grace_s=5)
        log(f"warm-up session: {summary(result)}")

    def start_relay(port):
        # No HTTP/2 in it: the floor of any proxy hop (bench/README.md).
        group = start(f"bare relay to {port}",
                      [loadgen, "tcp-relay", "--listen", f"127.0.0.1:{relay_port}",
                       "--to", f"tcp:127.0.0.1:{port}"],
                      env, os.path.join(tmp, f"relay_{port}.log"))
        wait_for("the bare relay",
                 lambda: tcp_open(relay_port) or (not group.alive() and _raise(f"relay exited; see {group.log_path}")),
                 30, 0.05)
        return group

    # 3. Sessions, interleaved.
    if "sessions" not in skip:
        order = ["ours", "rays", "direct"] + ([] if "relay" in skip else ["relay"])
        for r in range(args.rounds):
            for target in order[r % len(order):] + order[:r % len(order)]:
                # A session whose server could not be started (Ray's proxier
                # loses some spawns) is tried again, up to 3 times in all.
                for attempt in range(1, 4):
                    if target == "ours":
                        wait_for("our spare server", spare_ready, 120, 0.2)
                        result = driver("ours", f"127.0.0.1:{ours_port}", "session",
                                        [*session_extra, "--proxy-pid", str(ours_pid),
                                         "--clients-socket", ours_socket, "--wait-spare"])
                    elif target == "rays":
                        result = driver("rays", f"127.0.0.1:{rays_port}", "session",
                                        [*session_extra, "--proxy-pid", str(rays_proxier)])
                    elif target == "relay":
                        group, port = start_direct()
                        relay = start_relay(port)
                        result = driver("relay", f"127.0.0.1:{relay_port}", "session",
                                        [*session_extra, "--proxy-pid", str(relay.pid)])
                        relay.stop(grace_s=5)
                        group.stop(grace_s=5)
                    else:
                        group, port = start_direct()
                        result = driver("direct", f"127.0.0.1:{port}", "session", session_extra)
                        group.stop(grace_s=5)
                    record("session", target, result, round=r + 1, attempt=attempt)
                    log(f"round {r + 1}: session {target}: {summary(result)}")
                    if result.get("ok"):
                        break

    # 4. Connects, interleaved.
    if "connects" not in skip:
        for i in range(args.connects):
            for target in ["ours", "ours_cold", "rays"]:
                if target == "ours":
                    wait_for("our spare server", spare_ready, 120, 0.2)
                    wait_for("our clients gone", lambda: no_clients(ours_socket), 60, 0.2)
                    result = driver("ours", f"127.0.0.1:{ours_port}", "connect",
                                    ["--clients-socket", ours_socket])
                elif target == "ours_cold":
                    wait_for("our cold clients gone", lambda: no_clients(cold_socket), 60, 0.2)
                    result = driver("ours_cold", f"127.0.0.1:{cold_port}", "connect",
                                    ["--clients-socket", cold_socket])
                else:
                    result = driver("rays", f"127.0.0.1:{rays_port}", "connect")
                record("connect", target, result, round=i + 1)
                log(f"connect {i + 1} {target}: {summary(result)}")

    # 5. Against fake specific servers: the cost of one hop per message,
    # then the most concurrent clients.
    if not {"hops", "clients"} <= skip:
        clk_tck = os.sysconf("SC_CLK_TCK")

        # Ours, standalone, with the module environment the host would give it.
        fake_session = os.path.join(tmp, "f")
        os.makedirs(os.path.join(fake_session, "sockets"), mode=0o700)
        os.makedirs(os.path.join(fake_session, "logs"))
        socket_path = os.path.join(fake_session, "sockets", "dash_fcp")
        ours_env = dict(env, RAY_DASHD_SOCKET=socket_path, RAY_DASHD_MODULE="fcp",
                        RAY_DASHD_INCARNATION="0", RAY_DASHD_SESSION_DIR=fake_session,
                        RAY_DASHD_LOG_DIR=os.path.join(fake_session, "logs"))
        proxy = start(
            "our proxy (fake servers)",
            [proxy_bin, "--ray-client-port", str(fake_client_ports[0]), "--server-command", fake_bin,
             "--port-range", f"{fake_ours}-{fake_ours + n_fake - 1}", "--gcs-address", gcs],
            ours_env,
            os.path.join(tmp, "fake_ours.log"),
        )
        # Ray's proxier, with the same fake servers (bench/ray_proxier_fake.py).
        rays_env = dict(env, BENCH_FAKE_SERVER=fake_bin,
                        BENCH_FAKE_PORTS=f"{fake_rays}-{fake_rays + n_fake - 1}")
        proxier = start(
            "Ray's proxier (fake servers)",
            [python, os.path.join(BENCH_DIR, "ray_proxier_fake.py"), f"--address={gcs}",
             "--host=127.0.0.1", f"--port={fake_client_ports[1]}", "--mode=proxy"],
            rays_env,
            os.path.join(tmp, "fake_rays.log"),
        )
        # A fake server of our own, for the no-proxy baseline.
        fake_direct_port = head + 14
        fake_direct = start("fake server", [fake_bin, f"--port={fake_direct_port}"], env,
                            os.path.join(tmp, "fake_direct.log"))

        def ours_up():
            if not proxy.alive():
                raise RuntimeError(f"our proxy exited; see {proxy.log_path}")
            try:
                return unix_get(socket_path, "/api/healthz")[0] == 200
            except OSError:
                return False

        wait_for("our proxy (fake servers)", ours_up, 60, 0.1)
        wait_for("Ray's proxier (fake servers)",
                 lambda: tcp_open(fake_client_ports[1])
                 or (not proxier.alive() and _raise(f"Ray's proxier exited; see {proxier.log_path}")),
                 120, 0.1)
        wait_for("the fake server", lambda: tcp_open(fake_direct_port), 30, 0.05)
        hop_targets = {"ours": (fake_client_ports[0], proxy.pid),
                       "rays": (fake_client_ports[1], proxier.pid),
                       "direct": (fake_direct_port, None)}

        if "hops" not in skip:
            order = ["ours", "rays", "direct"]
            for r in range(args.rounds):
                for target in order[r % 3:] + order[:r % 3]:
                    port, pid = hop_targets[target]
                    for attempt in range(1, 4):  # Ray's proxier loses some spawns
                        argv = [loadgen, "ray-rtt", "--target", f"127.0.0.1:{port}",
                                "--iterations", str(args.hop_iterations), "--clk-tck", str(clk_tck),
                                "--id", f"hop-{target}-{r}-{attempt}"]
                        if pid:
                            argv += ["--proxy-pid", str(pid)]
                        out = subprocess.run(argv, capture_output=True, timeout=600)
                        if out.returncode == 0:
                            result = json.loads(out.stdout.decode().strip().splitlines()[-1])
                        else:
                            result = {"error": out.stderr.decode(errors="replace")[-1000:]}
                        record("hop", target, result, round=r + 1, attempt=attempt)
                        log(f"round {r + 1}: hop {target}: " + json.dumps(
                            {k: round(v["median_us"], 1) for k, v in result.items()
                             if isinstance(v, dict) and "median_us" in v} or result))
                        if "error" not in result:
                            break

        def ramp(label, port, pid):
            out = subprocess.run(
                [loadgen, "ray-clients", "--target", f"127.0.0.1:{port}",
                 "--max", str(args.max_clients), "--timeout", str(args.client_timeout),
                 "--max-errors", str(args.max_errors),
                 "--proxy-pid", str(pid), "--clk-tck", str(clk_tck), "--id-prefix", label],
                capture_output=True, timeout=args.max_clients * (args.client_timeout + 5) + 120,
            )
            if out.returncode != 0:
                return {"error": out.stderr.decode(errors="replace")[-2000:]}
            return json.loads(out.stdout.decode().strip().splitlines()[-1])

        if "clients" not in skip:
            result = ramp("ours", fake_client_ports[0], proxy.pid)
            result["servers_running"] = len(descendants(proxy.pid))
            record("clients", "ours", result)
            log(f"concurrent clients, ours: {summary(result)}")
            proxy.stop()
            result = ramp("rays", fake_client_ports[1], proxier.pid)
            result["servers_running"] = len(descendants(proxier.pid))
            result["threads"] = len(os.listdir(f"/proc/{proxier.pid}/task"))
            record("clients", "rays", result)
            log(f"concurrent clients, Ray's: {summary(result)}")
        proxier.stop()
        proxy.stop()
        fake_direct.stop()

    # Machine and versions, for the report.
    record("meta", "", {
        "ray": subprocess.run([python, "-c", "import ray; print(ray.__version__)"], env=env,
                              capture_output=True, timeout=120).stdout.decode().strip(),
        "python": platform.python_version(),
    })


def _raise(message):
    raise RuntimeError(message)


def summary(result):
    keys = ("ok", "connect_s", "spare_used", "held", "saturated", "errors", "error")
    parts = {k: result[k] for k in keys if k in result}
    if "rtt" in result:
        parts["rtt_median_ms"] = round(result["rtt"]["median_ms"], 3)
    for k in ("put_mib_s", "get_mib_s"):
        if k in result:
            parts[k] = [round(v, 1) for v in result[k]]
    return json.dumps(parts)


# --- the report -------------------------------------------------------------------


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(raw_path, args):
    lines = [json.loads(l) for l in open(raw_path)]
    sessions = {t: [l["result"] for l in lines if l["kind"] == "session" and l["target"] == t
                    and l["result"].get("ok")] for t in ("ours", "rays", "direct", "relay")}
    connects = {t: [l["result"] for l in lines if l["kind"] == "connect" and l["target"] == t]
                for t in ("ours", "ours_cold", "rays")}
    clients = {l["target"]: l["result"] for l in lines if l["kind"] == "clients"}
    hops = {t: [l["result"] for l in lines if l["kind"] == "hop" and l["target"] == t
                and "error" not in l["result"]] for t in ("ours", "rays", "direct")}

    def hop(target, kind, key):
        return median([r[kind][key] for r in hops[target] if kind in r])
    meta = next((l["result"] for l in lines if l["kind"] == "meta"), {})

    def sess(target, f):
        return median([f(r) for r in sessions[target]])

    def conn(target):
        ok = [r for r in connects[target] if r.get("ok")]
        return median([r["connect_s"] for r in ok]), len(ok), len(connects[target])

    def fmt(v, unit="", digits=2):
        if v is None:
            return "n/a"
        return f"{v:,.{digits}f}{unit}"

    def ratio(a, b):
        return f"{a / b:.2f}×" if a is not None and b else "n/a"

    rtt = {t: sess(t, lambda r: r["rtt"]["median_ms"]) for t in sessions}
    rtt90 = {t: sess(t, lambda r: r["rtt"]["p90_ms"]) for t in sessions}
    put = {t: sess(t, lambda r: statistics.median(r["put_mib_s"])) for t in sessions}
    get = {t: sess(t, lambda r: statistics.median(r["get_mib_s"])) for t in sessions}
    cpu_rtt = {t: sess(t, lambda r: r.get("proxy_cpu_us_per_rtt")) for t in ("ours", "rays", "relay")}
    sys_rtt = {t: sess(t, lambda r: r.get("proxy_sys_us_per_rtt")) for t in ("ours", "rays", "relay")}
    cpu_put = {t: sess(t, lambda r: r.get("proxy_cpu_ms_per_put")) for t in ("ours", "rays")}
    cpu_get = {t: sess(t, lambda r: r.get("proxy_cpu_ms_per_get")) for t in ("ours", "rays")}
    sess_connect = {t: sess(t, lambda r: r["connect_s"]) for t in sessions}
    c_ours, n_ours, of_ours = conn("ours")
    c_cold, n_cold, of_cold = conn("ours_cold")
    c_rays, n_rays, of_rays = conn("rays")
    spare_used = sum(1 for r in connects["ours"] if r.get("spare_used"))
    added_us = (rtt["ours"] - rtt["direct"]) * 1000 if rtt["ours"] and rtt["direct"] else None
    added_rays_us = (rtt["rays"] - rtt["direct"]) * 1000 if rtt["rays"] and rtt["direct"] else None
    added_relay_us = (rtt["relay"] - rtt["direct"]) * 1000 if rtt["relay"] and rtt["direct"] else None
    mib = args.object_mib

    def held(t):
        r = clients.get(t)
        return r.get("held") if r else None

    def kib(t):
        r = clients.get(t)
        return r.get("proxy_kib_per_client") if r else None

    rows = [
        "| metric | ours (ray-dashd) | Ray's proxier | direct | ours / Ray's | ours / direct | target |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| connect, spare ready (`ray.init` s, median of {n_ours}/{of_ours} ok; spare used {spare_used}×) "
        f"| {fmt(c_ours, ' s')} | {fmt(c_rays, ' s')} | {fmt(sess_connect['direct'], ' s')} "
        f"| {ratio(c_ours, c_rays)} | {ratio(c_ours, sess_connect['direct'])} | < 1 s |",
        f"| connect, no spare (`--warm-spare false`; {n_cold}/{of_cold} ok; Ray's {n_rays}/{of_rays} ok) "
        f"| {fmt(c_cold, ' s')} | {fmt(c_rays, ' s')} | | {ratio(c_cold, c_rays)} | | faster than Ray's |",
        f"| task round trip, median | {fmt(rtt['ours'], ' ms', 3)} | {fmt(rtt['rays'], ' ms', 3)} "
        f"| {fmt(rtt['direct'], ' ms', 3)} | {ratio(rtt['ours'], rtt['rays'])} | {ratio(rtt['ours'], rtt['direct'])} "
        f"| +< 0.3 ms over direct |",
        f"| task round trip, p90 | {fmt(rtt90['ours'], ' ms', 3)} | {fmt(rtt90['rays'], ' ms', 3)} "
        f"| {fmt(rtt90['direct'], ' ms', 3)} | {ratio(rtt90['ours'], rtt90['rays'])} "
        f"| {ratio(rtt90['ours'], rtt90['direct'])} | |",
        f"| added to the round trip (median − direct's) | {fmt(added_us, ' µs', 0)} | {fmt(added_rays_us, ' µs', 0)} "
        f"| | | | < 300 µs |",
        f"| put {mib} MiB | {fmt(put['ours'], ' MiB/s', 1)} | {fmt(put['rays'], ' MiB/s', 1)} "
        f"| {fmt(put['direct'], ' MiB/s', 1)} | {ratio(put['ours'], put['rays'])} | {ratio(put['ours'], put['direct'])} "
        f"| ≥ 0.95× direct |",
        f"| get {mib} MiB | {fmt(get['ours'], ' MiB/s', 1)} | {fmt(get['rays'], ' MiB/s', 1)} "
        f"| {fmt(get['direct'], ' MiB/s', 1)} | {ratio(get['ours'], get['rays'])} | {ratio(get['ours'], get['direct'])} "
        f"| ≥ 0.95× direct |",
        f"| proxy CPU per task round trip (of it in the kernel) | {fmt(cpu_rtt['ours'], ' µs', 0)} "
        f"({fmt(sys_rtt['ours'], ' µs', 0)}) | {fmt(cpu_rtt['rays'], ' µs', 0)} ({fmt(sys_rtt['rays'], ' µs', 0)}) "
        f"| | {ratio(cpu_rtt['ours'], cpu_rtt['rays'])} | | |",
        f"| proxy CPU per {mib} MiB put / get | {fmt(cpu_put['ours'], '', 0)} / {fmt(cpu_get['ours'], ' ms', 0)} "
        f"| {fmt(cpu_put['rays'], '', 0)} / {fmt(cpu_get['rays'], ' ms', 0)} | | | | |",
        *[f"| {what} (fake servers), median | {fmt(hop('ours', k, 'median_us'), ' µs', 0)} "
          f"| {fmt(hop('rays', k, 'median_us'), ' µs', 0)} | {fmt(hop('direct', k, 'median_us'), ' µs', 0)} "
          f"| {ratio(hop('ours', k, 'median_us'), hop('rays', k, 'median_us'))} "
          f"| {ratio(hop('ours', k, 'median_us'), hop('direct', k, 'median_us'))} | |"
          for k, what in (("datapath", "`Datapath` message and answer"), ("unary", "unary call (`ClusterInfo`)"),
                          ("get_object", "`GetObject` call (3 chunks)"))],
        *[f"| {what} (fake servers), p99 | {fmt(hop('ours', k, 'p99_us'), ' µs', 0)} "
          f"| {fmt(hop('rays', k, 'p99_us'), ' µs', 0)} | {fmt(hop('direct', k, 'p99_us'), ' µs', 0)} "
          f"| {ratio(hop('ours', k, 'p99_us'), hop('rays', k, 'p99_us'))} "
          f"| {ratio(hop('ours', k, 'p99_us'), hop('direct', k, 'p99_us'))} | |"
          for k, what in (("datapath", "`Datapath` message and answer"), ("unary", "unary call"),
                          ("get_object", "`GetObject` call"))],
        "| proxy CPU per `Datapath` message / unary call / `GetObject` call (fake servers) "
        f"| {fmt(hop('ours', 'datapath', 'proxy_cpu_us_per_op'), '', 0)} / "
        f"{fmt(hop('ours', 'unary', 'proxy_cpu_us_per_op'), '', 0)} / "
        f"{fmt(hop('ours', 'get_object', 'proxy_cpu_us_per_op'), ' µs', 0)} "
        f"| {fmt(hop('rays', 'datapath', 'proxy_cpu_us_per_op'), '', 0)} / "
        f"{fmt(hop('rays', 'unary', 'proxy_cpu_us_per_op'), '', 0)} / "
        f"{fmt(hop('rays', 'get_object', 'proxy_cpu_us_per_op'), ' µs', 0)} | | "
        f"{ratio(hop('ours', 'unary', 'proxy_cpu_us_per_op'), hop('rays', 'unary', 'proxy_cpu_us_per_op'))} (unary) | | |",
        f"| concurrent clients held (fake servers, ramp to {args.max_clients}) | {fmt(held('ours'), '', 0)} "
        f"| {fmt(held('rays'), '', 0)} | | {ratio(held('ours'), held('rays'))} | | ≥ 500 |",
        f"| proxy RSS per client held | {fmt(kib('ours'), ' KiB', 0)} | {fmt(kib('rays'), ' KiB', 0)} | | | | flat |",
    ]
    notes = []
    for t, name in (("ours", "ours"), ("rays", "Ray's")):
        r = clients.get(t)
        if not r:
            continue
        if "error" in r and "held" not in r:
            notes.append(f"- concurrent clients, {name}: the load tool failed: {r['error'][-300:]}")
            continue
        why = ("reached the ramp's end" if r.get("reached_max")
               else f"client {r['saturated']['client']} did not finish within {r['saturated']['timeout_s']:.0f} s"
               if r.get("saturated") else f"{r.get('errors')} clients failed")
        notes.append(
            f"- concurrent clients, {name}: {r['held']} held ({why}); {r.get('answered_after')} of them answered "
            f"one more call afterwards; per-client connect p50 {fmt(r.get('connect_ms_p50'), ' ms', 1)}, "
            f"p99 {fmt(r.get('connect_ms_p99'), ' ms', 1)}; {r.get('errors')} errors"
            + (f" (first: {r['first_errors'][0]['stage']}: {r['first_errors'][0]['error'][:160]})"
               if r.get("first_errors") else "")
            + (f"; proxy threads at the end: {r['threads']}" if "threads" in r else "")
        )
    def last_line(text):
        text = (text or "").strip().splitlines()
        return text[-1][:200] if text else "?"

    failed = [f"{l['kind']} {l['target']} {l.get('round')}: {last_line(l['result'].get('error'))}"
              for l in lines if l["kind"] in ("session", "connect") and not l["result"].get("ok")]
    if failed:
        notes.append(f"- {len(failed)} failed connections (sessions were tried again): " + "; ".join(failed[:10]))
    header = [
        "# Ray Client proxy benchmark",
        "",
        f"- machine: nproc {os.cpu_count()}, {cpu_model()}, Linux {platform.release()}; "
        f"Ray {meta.get('ray', '?')}, Python {meta.get('python', '?')}",
        f"- when: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, ray-dashd at {git_rev()}",
        f"- {args.rounds} interleaved round(s) of sessions (connect, {args.rtt} round trips of "
        f"`ray.get(f.remote())` after 50 unmeasured, {args.put_rounds} × `ray.put`/`ray.get` of {mib} MiB "
        f"after one unmeasured), medians over rounds; {args.connects} connects per column; one Ray head for all "
        f"(ours through ray-dashd, Ray's proxier from `ray start`, direct = a specific server started for the session)",
        "",
    ]
    floor = []
    if sessions["relay"]:
        gap_us = (rtt["ours"] - rtt["relay"]) * 1000 if rtt["ours"] and rtt["relay"] else None
        floor = [
            "",
            "The floor of any proxy hop: a bare relay (`ray-dashd-bench tcp-relay`: bytes copied both ways, "
            "no HTTP/2, so no routing and no per-client servers) in front of a server started as direct's, "
            f"in the same rounds ({len(sessions['relay'])} sessions):",
            "",
            "| metric | ours (ray-dashd) | bare relay | direct | ours / relay |",
            "|---|---:|---:|---:|---:|",
            f"| task round trip, median | {fmt(rtt['ours'], ' ms', 3)} | {fmt(rtt['relay'], ' ms', 3)} "
            f"| {fmt(rtt['direct'], ' ms', 3)} | {ratio(rtt['ours'], rtt['relay'])} |",
            f"| added to the round trip (median − direct's) | {fmt(added_us, ' µs', 0)} "
            f"| {fmt(added_relay_us, ' µs', 0)} | | ours − relay: {fmt(gap_us, ' µs', 0)} |",
            f"| put {mib} MiB | {fmt(put['ours'], ' MiB/s', 1)} | {fmt(put['relay'], ' MiB/s', 1)} "
            f"| {fmt(put['direct'], ' MiB/s', 1)} | {ratio(put['ours'], put['relay'])} |",
            f"| get {mib} MiB | {fmt(get['ours'], ' MiB/s', 1)} | {fmt(get['relay'], ' MiB/s', 1)} "
            f"| {fmt(get['direct'], ' MiB/s', 1)} | {ratio(get['ours'], get['relay'])} |",
            f"| proxy CPU per task round trip (of it in the kernel) | {fmt(cpu_rtt['ours'], ' µs', 0)} "
            f"({fmt(sys_rtt['ours'], ' µs', 0)}) | {fmt(cpu_rtt['relay'], ' µs', 0)} ({fmt(sys_rtt['relay'], ' µs', 0)}) "
            f"| | {ratio(cpu_rtt['ours'], cpu_rtt['relay'])} |",
        ]
    return "\n".join(header + rows + floor + [""] + notes) + "\n"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def git_rev():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              timeout=10).stdout.decode().strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


if __name__ == "__main__":
    main()
