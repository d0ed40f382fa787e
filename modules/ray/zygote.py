"""Preload once, fork per module: a "zygote" for Python dashboard modules.

Usage (a ray-dashd module of its own, with no routes):

    python zygote.py --app launcher.py [--report FILE [--report-arg ARG]...] [TARGET...]

It imports the app file and calls its `preload(targets)` once: for Ray,
`launcher.py` imports Ray, aiohttp and the module classes named by the
targets (`JobHead=ray.dashboard.modules.job.job_head`, ...; none: every
module Ray would load) and checks Ray's internals. With --report, it then
writes what the app's `report(args)` returns (for Ray: the `[[modules]]`
config of the preloaded modules, routes and all) to FILE, atomically, so
that ray-dashd learns the route table from the process that has just
imported it instead of importing Ray twice. It then waits for
`ray-dashd-fork-shim` processes (one per supervised module) on the Unix
socket `$RAY_DASHD_SOCKET.fork`, and for each request forks a child that runs
`app.run_forked(name)`: the module, on the pages the zygote already holds, so
the children share them (copy-on-write).

Fork safety: the zygote forks only from a single-threaded process that has
imported code and started nothing: no thread, no event loop, no gRPC channel
(gRPC in Python is not fork-safe once a channel exists, and
GRPC_ENABLE_FORK_SUPPORT is off by default). Before every fork it checks that
it still has exactly one thread and refuses (the shim then starts the module
standalone) if not. Everything a module connects to, it connects to after the
fork, in the child.

The protocol (SOCK_SEQPACKET, one JSON object per message, same user only):

  shim -> zygote  {"v": 1, "module": NAME, "env": {...}, "cwd": DIR, "pgid": N}
                  with four descriptors (SCM_RIGHTS): the shim's stdin,
                  stdout, stderr and a "lifeline" socket whose other end only
                  the shim holds.
  zygote -> shim  {"pid": N} once forked, or {"error": TEXT} (the shim then
                  runs the module standalone);
                  {"exit": CODE} when the child ends (CODE < 0: killed by
                  signal -CODE).

The child joins the shim's process group (so ray-dashd's signals to the
group reach it), takes the shim's stdio, environment and folder, and kills
itself (SIGKILL) the moment its lifeline reads end-of-file, that is when the
shim is gone, however it died. A child whose zygote dies keeps running.

A request whose environment differs from the zygote's in anything but the
RAY_DASHD_* variables is refused: the preloaded code read its settings from
the zygote's environment at import time, so the child would not be what a
standalone start gives.

The zygote answers `GET /api/healthz` on `$RAY_DASHD_SOCKET` once the
preload is done (ray-dashd counts it ready then). It binds the fork socket
first, before importing anything heavy, so that shims started at the same
time can connect and wait for it instead of giving up.
"""

import gc
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time

PROTOCOL = 1
# Bounds on a request: its JSON (the shim's environment is most of it) and
# its descriptors.
MAX_REQUEST_BYTES = 1 << 20
REQUEST_FDS = 4
# A health connection that has not sent its request head within this long
# is dropped, and so is a head longer than this.
HEALTH_IDLE_SECS = 5.0
MAX_HEAD_BYTES = 8192
# Environment that may differ between the zygote and a module: the module
# contract's variables and the launcher's own settings, all read after the fork.
PRIVATE_ENV_PREFIX = "RAY_DASHD_"

EXIT_BAD_USAGE = 64


def say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp}\tzygote: {message}", file=sys.stderr, flush=True)


def thread_count() -> int:
    """Threads of this process as the kernel sees them (C threads included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def bind(path: str, kind: int) -> socket.socket:
    """A non-blocking listening Unix socket at `path`, replacing a stale one."""
    sock = socket.socket(socket.AF_UNIX, kind)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def load_app(path: str):
    """Imports the app file (its folder goes first on sys.path, as for a script)."""
    import importlib.util

    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    app = importlib.util.module_from_spec(spec)
    sys.modules[name] = app
    spec.loader.exec_module(app)
    for hook in ("preload", "run_forked"):
        if not callable(getattr(app, hook, None)):
            raise ImportError(f"{path} has no {hook}()")
    return app


# Objects that fill the free blocks of the allocator's partly used pools;
# never touched again.
_fillers = []


def fill_free_blocks() -> int:
    """Fills the free blocks of CPython's partly used small-object pools.

    A forked child's first allocations of each size go to those blocks,
    which share pages with the zygote's live objects: every child would copy
    those pages. Filled, the children allocate from pools of their own and
    the pages stay shared (about 1 MiB less per Ray module child, measured).
    Reads the pool statistics CPython prints (sys._debugmallocstats, to the
    C-level stderr); on another Python, or if the format differs, fills
    nothing. Returns the bytes filled.
    """
    stats = getattr(sys, "_debugmallocstats", None)
    if stats is None:
        return 0
    import tempfile

    with tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    empty_bytes = sys.getsizeof(b"")
    filled = 0
    # The table's rows: class, block size, pools, blocks in use, free blocks.
    for line in text.splitlines():
        row = line.split()
        if len(row) != 5 or not all(cell.isdigit() for cell in row):
            continue
        size, free = int(row[1]), int(row[4])
        if size == sys.getsizeof(object()):
            _fillers.extend(object() for _ in range(free))
        elif size == sys.getsizeof(1 << 40):
            _fillers.extend((1 << 40) + i for i in range(free))
        elif size > empty_bytes:
            _fillers.extend(bytes(size - empty_bytes) for _ in range(free))
        else:
            continue
        filled += size * free
    return filled


class Request(Exception):
    """A request the zygote refuses; the text goes back to the shim."""


class Child:
    """The fork job handed back to main() in a forked child."""

    def __init__(self, app, name: str, lifeline: int):
        self.app = app
        self.name = name
        self.lifeline = lifeline

    def run(self) -> None:
        watch_lifeline(self.lifeline)
        self.app.run_forked(self.name)


def watch_lifeline(fd: int) -> None:
    """Kill this process the moment the shim's end of `fd` is gone.

    A thread, not an event-loop reader: it works however busy or blocked the
    module's loop is. The shim never writes, so any read returning means the
    shim closed its end (it died) or something went badly wrong.
    """

    def wait() -> None:
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    os.set_inheritable(fd, False)
    threading.Thread(target=wait, name="ray-dashd-lifeline", daemon=True).start()


def join_cgroup(cgroup) -> None:
    """Moves this process into the cgroup v2 folder `cgroup`, if given."""
    if not cgroup:
        return
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            # "0" is the writer itself.
            procs.write("0")
    except OSError as exc:
        say(f"cannot join cgroup {cgroup}: {exc}; ray-dashd finds this module's processes through /proc")


def public_env(env) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(PRIVATE_ENV_PREFIX)}


class Zygote:
    def __init__(self, app, names, fork_sock, health_sock, env_before: dict):
        """`env_before` is the environment as it was before the preload."""
        self.app = app
        self.names = set(names)
        self.fork_sock = fork_sock
        self.health_sock = health_sock
        self.selector = selectors.DefaultSelector()
        # Connected shims: socket -> pid of its child (None before the fork).
        self.shims = {}
        # Forked children not reaped yet: pid -> the shim's socket (None when
        # the shim is gone).
        self.children = {}
        # Health connections: socket -> (opened at, bytes so far).
        self.health = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        # What a module's environment must match (the preload may have
        # changed ours, as `import ray` does: those changes are what a child
        # gets on top of the shim's environment, as a standalone start would).
        self.env = public_env(env_before)
        self.preload_set = {k: v for k, v in os.environ.items() if env_before.get(k) != v}
        self.preload_unset = [k for k in env_before if k not in os.environ]

    # -- the loop -----------------------------------------------------------

    def serve(self):
        """Serves until killed; returns only in a forked child, with its job."""
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.selector.register(self.fork_sock, selectors.EVENT_READ, "fork")
        self.selector.register(self.health_sock, selectors.EVENT_READ, "health")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        # Children that ended while we were still preloading.
        self.reap()
        while True:
            for key, _ in self.selector.select(timeout=1.0):
                job = self.dispatch(key)
                if job is not None:
                    return job
            self.drop_idle_health()

    def dispatch(self, key):
        what = key.data
        if what == "fork":
            self.accept_shim()
        elif what == "health":
            self.accept_health()
        elif what == "wake":
            try:
                while os.read(self.wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            self.reap()
        elif what == "shim":
            return self.on_shim(key.fileobj)
        elif what == "healthconn":
            self.on_health(key.fileobj)
        return None

    # -- shims --------------------------------------------------------------

    def accept_shim(self) -> None:
        try:
            conn, _ = self.fork_sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        uid = int.from_bytes(creds[4:8], sys.byteorder)
        if uid != os.getuid():
            say(f"refused a connection from uid {uid}")
            conn.close()
            return
        conn.setblocking(False)
        self.shims[conn] = None
        self.selector.register(conn, selectors.EVENT_READ, "shim")

    def on_shim(self, conn):
        if self.shims.get(conn) is not None:
            # After the fork the shim sends nothing more: this is its end.
            self.drop_shim(conn)
            return None
        try:
            data, fds, _flags, _ = socket.recv_fds(conn, MAX_REQUEST_BYTES, REQUEST_FDS)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            say(f"reading a request failed: {exc}")
            self.drop_shim(conn)
            return None
        if not data:
            for fd in fds:
                os.close(fd)
            self.drop_shim(conn)
            return None
        try:
            name, env, cwd, pgid = self.check(data, fds)
            if thread_count() != 1:
                raise Request(
                    f"the zygote has {thread_count()} threads; forking it is not safe")
            return self.fork(conn, name, env, cwd, pgid, fds)
        except Request as exc:
            for fd in fds:
                os.close(fd)
            say(f"refused a request: {exc}")
            self.reply(conn, {"error": str(exc)})
            self.drop_shim(conn)
            return None

    def check(self, data: bytes, fds):
        try:
            req = json.loads(data)
        except ValueError as exc:
            raise Request(f"not JSON: {exc}")
        if not isinstance(req, dict) or req.get("v") != PROTOCOL:
            raise Request(f"protocol {req.get('v') if isinstance(req, dict) else '?'}, "
                          f"this zygote speaks {PROTOCOL}")
        if len(fds) != REQUEST_FDS:
            raise Request(f"{len(fds)} descriptors, expected {REQUEST_FDS}")
        name, env, cwd, pgid = req.get("module"), req.get("env"), req.get("cwd"), req.get("pgid")
        if name not in self.names:
            raise Request(f"module {name!r} is not preloaded here "
                          f"(preloaded: {', '.join(sorted(self.names))})")
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise Request("env must map strings to strings")
        if not isinstance(cwd, str) or not isinstance(pgid, int):
            raise Request("cwd must be a string and pgid a number")
        public = public_env(env)
        if public != self.env:
            differ = sorted(k for k in set(public) | set(self.env)
                            if public.get(k) != self.env.get(k))
            raise Request("the module's environment differs from the zygote's in "
                          f"{', '.join(differ[:5])}{' …' if len(differ) > 5 else ''}")
        return name, env, cwd, pgid

    def fork(self, conn, name, env, cwd, pgid, fds):
        # Anything buffered would be written twice, once by each process.
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return self.become_child(name, env, cwd, pgid, fds)
        for fd in fds:
            os.close(fd)
        self.shims[conn] = pid
        self.children[pid] = conn
        self.reply(conn, {"pid": pid})
        say(f"forked {name} as pid {pid} for process group {pgid}")
        return None

    def become_child(self, name, env, cwd, pgid, fds) -> Child:
        """In the child: drop everything of the zygote's, take the shim's world."""
        # First of all, into the shim's cgroup (when ray-dashd runs each
        # incarnation in one): ray-dashd kills that cgroup whole when the
        # module's incarnation ends, and the zygote's when the zygote's does,
        # so nothing this child starts may stay behind in the zygote's.
        join_cgroup(env.get("RAY_DASHD_CGROUP"))
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.selector.close()
        for sock in [self.fork_sock, self.health_sock, *self.shims, *self.health]:
            sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        try:
            # The shim's group: ray-dashd stops a module by signalling it.
            os.setpgid(0, pgid)
        except OSError:
            # Another session: a group of our own, so that nothing aimed at
            # the zygote's group reaches us; the shim forwards its signals.
            os.setpgid(0, 0)
        stdin, stdout, stderr, lifeline = fds
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.environ.update(self.preload_set)
        for key in self.preload_unset:
            os.environ.pop(key, None)
        try:
            os.chdir(cwd)
        except OSError as exc:
            say(f"cannot enter {cwd}: {exc}; staying in {os.getcwd()}")
        gc.enable()
        return Child(self.app, name, lifeline)

    def reply(self, conn, message: dict) -> None:
        try:
            conn.send(json.dumps(message).encode())
        except OSError:
            # The shim is gone; its child (if any) sees its lifeline close.
            pass

    def drop_shim(self, conn) -> None:
        pid = self.shims.pop(conn, None)
        if pid is not None and pid in self.children:
            self.children[pid] = None
        self.selector.unregister(conn)
        conn.close()

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            say(f"child {pid} ended ({'signal ' + str(-code) if code < 0 else 'exit ' + str(code)})")
            if conn is not None:
                self.reply(conn, {"exit": code})
                self.drop_shim(conn)

    # -- health -------------------------------------------------------------

    def accept_health(self) -> None:
        try:
            conn, _ = self.health_sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        self.health[conn] = (time.monotonic(), b"")
        self.selector.register(conn, selectors.EVENT_READ, "healthconn")

    def on_health(self, conn) -> None:
        opened, head = self.health[conn]
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        head += chunk
        if chunk and b"\r\n\r\n" not in head and len(head) < MAX_HEAD_BYTES:
            self.health[conn] = (opened, head)
            return
        if chunk:
            line = head.split(b"\r\n", 1)[0].split()
            ok = len(line) >= 2 and line[0] == b"GET" and line[1] == b"/api/healthz"
            status, body = (b"200 OK", b"success") if ok else (b"404 Not Found", b"not found")
            try:
                conn.send(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\n"
                          b"Content-Length: " + str(len(body)).encode() +
                          b"\r\nConnection: close\r\n\r\n" + body)
            except OSError:
                pass
        self.close_health(conn)

    def close_health(self, conn) -> None:
        self.health.pop(conn, None)
        self.selector.unregister(conn)
        conn.close()

    def drop_idle_health(self) -> None:
        now = time.monotonic()
        for conn, (opened, _) in list(self.health.items()):
            if now - opened > HEALTH_IDLE_SECS:
                self.close_health(conn)


def main(argv) -> int:
    # Python's advice for fork-without-exec: no collection in the parent (no
    # freed holes in the pages children share), freeze before forking (the
    # children's collections then leave the inherited objects' pages alone),
    # collect again in the child.
    gc.disable()
    usage = "usage: zygote.py --app APP.py [--report FILE [--report-arg ARG]...] [TARGET...]"
    if len(argv) < 3 or argv[1] != "--app":
        say(usage)
        return EXIT_BAD_USAGE
    app_path, rest = argv[2], argv[3:]
    report_path, report_args = None, []
    while rest[:1] in (["--report"], ["--report-arg"]):
        if len(rest) < 2:
            say(usage)
            return EXIT_BAD_USAGE
        if rest[0] == "--report":
            report_path = rest[1]
        else:
            report_args.append(rest[1])
        rest = rest[2:]
    report = (report_path, report_args) if report_path else None
    health_path = os.environ.get("RAY_DASHD_SOCKET")
    if not health_path:
        say("RAY_DASHD_SOCKET is not set: this program is meant to be started by ray-dashd")
        return EXIT_BAD_USAGE
    fork_path = health_path + ".fork"
    env_before = dict(os.environ)
    try:
        fork_sock = bind(fork_path, socket.SOCK_SEQPACKET)
    except OSError as exc:
        say(f"cannot listen on {fork_path}: {exc}")
        return 1
    bound = os.stat(fork_path).st_ino
    zygote_pid = os.getpid()
    # SIGTERM (ray-dashd stopping us) unwinds through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        child = run(app_path, rest, report, health_path, fork_sock, env_before)
    finally:
        if os.getpid() == zygote_pid:
            remove_socket(fork_path, bound)
    if isinstance(child, int):
        return child
    # Only a forked child gets here, with the zygote's loop unwound.
    del fork_sock
    child.run()
    return 0


def run(app_path: str, targets, report, health_path: str, fork_sock, env_before: dict):
    """Preloads, reports (`report`: None or (FILE, ARGS)) and serves.
    Returns an exit status in the zygote (it failed), and the job to run in
    a forked child."""
    started = time.monotonic()
    try:
        app = load_app(app_path)
        names = app.preload(targets)
    except Exception as exc:
        say(f"preload failed: {exc}")
        return EXIT_BAD_USAGE
    if report is not None:
        try:
            write_atomically(report[0], app.report(report[1]))
        except SystemExit as exc:
            if exc.code == 0:  # SIGTERM, through our handler
                raise
            say(f"report to {report[0]} failed: bad report arguments (exit {exc.code})")
            return EXIT_BAD_USAGE
        except Exception as exc:
            say(f"report to {report[0]} failed: {exc!r}")
            return EXIT_BAD_USAGE
    threads = thread_count()
    if threads != 1:
        say(f"preloading left {threads} threads running: forking would not be safe")
        return EXIT_BAD_USAGE
    gc.collect()
    filled = fill_free_blocks()
    gc.freeze()
    try:
        health_sock = bind(health_path, socket.SOCK_STREAM)
    except OSError as exc:
        say(f"cannot listen on {health_path}: {exc}")
        return 1
    say(f"preloaded {', '.join(sorted(names))} in {time.monotonic() - started:.2f}s "
        f"({filled} bytes of free blocks filled); forking on {health_path}.fork")
    return Zygote(app, names, fork_sock, health_sock, env_before).serve()


def write_atomically(path: str, text: str) -> None:
    """`text` to `path` (mode 0600): a reader sees all of it or no file."""
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def remove_socket(path: str, inode: int) -> None:
    """Removes our fork socket, unless another zygote has bound that path since."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
