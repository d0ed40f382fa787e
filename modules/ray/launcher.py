"""Run one of Ray's own dashboard modules, unchanged, as a ray-dashd module.

Usage (with the Python that has `ray[default]` installed):

    python launcher.py <ClassName>         e.g. python launcher.py JobHead

or, preloaded once and forked per module, as the app of `zygote.py`
(`python zygote.py --app launcher.py JobHead=ray.dashboard.modules.job.job_head ...`),
which calls `preload()` once and `run_forked()` in each forked child.

ray-dashd starts it with the module contract's environment (RAY_DASHD_SOCKET,
RAY_DASHD_SESSION_DIR, RAY_DASHD_LOG_DIR, RAY_DASHD_MODULE,
RAY_DASHD_INCARNATION). The ray-dashd module name must be the class name:
Ray's modules call each other on `<session>/sockets/dash_<ClassName>`.

What it does:
  1. checks that the installed Ray has the internals we rely on (exit 64 with
     one line naming the Ray version and what differs, if not);
  2. works out the Ray session facts the module needs (GCS address, cluster
     id, session name, temp dir) from the environment or the session itself;
  3. hands the module to Ray's own entry point, `run_module`, with two hooks
     changed in a same-named subclass:
       - the parent check: Ray's version asks `multiprocessing` for the parent
         and, started by anyone else, exits at once; ours watches os.getppid()
         and exits when ray-dashd goes away (ray-dashd also sets a
         parent-death signal, so this is only a second line of defence);
         forked by the zygote, it never returns: the zygote's lifeline to the
         shim ends the child instead;
       - /api/healthz answers 503 until Ray's own start-up (the module's whole
         `run()`) has finished, where Ray's answers 200 as soon as the socket
         is bound; ray-dashd counts a module ready at the first 200.
The module logs to <session>/logs/dashboard_<ClassName>.log, as under Ray's own
dashboard; its stdout and stderr go to the .out and .err files ray-dashd appends to.

Optional environment (ray-dashd or the config may set these):
  RAY_DASHD_GCS_ADDRESS   GCS host:port. Default: <temp dir>/ray_current_cluster,
                          accepted only if that GCS reports our session name.
  RAY_DASHD_CLUSTER_ID    cluster id (hex). Default: asked from the GCS.
  RAY_DASHD_RAY_TEMP_DIR  Ray's temp dir. Default: the folder that holds the
                          (resolved) session folder.
  RAY_DASHD_RAY_PYMODULE  Python module that defines the class (routes.py
                          writes it); saves importing every dashboard module.
  RAY_DASHD_RAY_LOG_LEVEL Python log level for the module (default: Ray's,
                          i.e. RAY_LOGGER_LEVEL or "info").
  RAY_DASHD_RAY_ANY_VERSION=1  try a Ray older than the oldest supported one.
  RAY_DASHD_GCS_TIMEOUT_SECS   how long to wait for the GCS at start (default 10).
  RAY_DASHD_PY_MALLOC     "lean" (default): glibc's malloc gives memory back
                          (see lean_malloc()); "default": left as glibc sets it.

Exit codes: 64 for a bad invocation or an incompatible Ray; 1 when the Ray
session cannot be found or reached (ray-dashd retries with backoff); whatever
Ray's module exits with otherwise (15 after SIGTERM).
"""

import asyncio
import ctypes
import logging
import os
import socket
import sys
import threading
import time
from typing import NoReturn

import dashd_ray

# The contract's variables, all required.
CONTRACT_ENV = (
    "RAY_DASHD_SOCKET",
    "RAY_DASHD_SESSION_DIR",
    "RAY_DASHD_LOG_DIR",
    "RAY_DASHD_MODULE",
    "RAY_DASHD_INCARNATION",
)

EXIT_NO_SESSION = 1

# After noticing that ray-dashd is gone, give Ray's own exit path this long.
HARD_EXIT_AFTER_SECS = 5


def say(message: str) -> None:
    """Launcher messages, before Ray's logging is set up: one line on stderr."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp}\tlauncher ({os.environ.get('RAY_DASHD_MODULE', '?')}): {message}",
          file=sys.stderr, flush=True)


def fail(code: int, message: str) -> NoReturn:
    say(message)
    sys.exit(code)


class SessionNotFound(Exception):
    """The Ray session (its GCS) could not be found or does not match."""


def read_contract(class_name: str) -> dict:
    """Read and sanity-check the variables ray-dashd passes to every module."""
    missing = [name for name in CONTRACT_ENV if not os.environ.get(name)]
    if missing:
        fail(dashd_ray.EXIT_INCOMPATIBLE,
             f"missing environment {missing}: this program is meant to be started "
             "by ray-dashd (see modules/ray/README.md)")
    env = {name: os.environ[name] for name in CONTRACT_ENV}
    if env["RAY_DASHD_MODULE"] != class_name:
        fail(dashd_ray.EXIT_INCOMPATIBLE,
             f"the ray-dashd module is named {env['RAY_DASHD_MODULE']!r} but runs "
             f"Ray's {class_name}: name it {class_name!r}, since Ray modules reach "
             "each other on sockets named after their classes")
    try:
        env["RAY_DASHD_INCARNATION"] = int(env["RAY_DASHD_INCARNATION"])
    except ValueError:
        fail(dashd_ray.EXIT_INCOMPATIBLE,
             f"RAY_DASHD_INCARNATION={env['RAY_DASHD_INCARNATION']!r} is not a number")
    return env


def discover_session(internals: dashd_ray.RayInternals, session_dir: str) -> dict:
    """Find the Ray session facts SubprocessModuleConfig needs.

    The session folder is resolved (`session_latest` is a link), because Ray
    gives its modules the real folder and derives the session name from it.
    """
    from ray._raylet import GcsClient
    from ray._private import ray_constants

    real_session = os.path.realpath(session_dir)
    session_name = os.path.basename(real_session)
    temp_dir = os.environ.get("RAY_DASHD_RAY_TEMP_DIR") or os.path.dirname(real_session)

    gcs_address = os.environ.get("RAY_DASHD_GCS_ADDRESS", "").strip()
    source = "RAY_DASHD_GCS_ADDRESS"
    if not gcs_address:
        # `ray start --head` writes the GCS address of the newest cluster here.
        pointer = os.path.join(temp_dir, "ray_current_cluster")
        source = pointer
        try:
            with open(pointer) as f:
                gcs_address = f.read().strip()
        except OSError as exc:
            raise SessionNotFound(
                f"no GCS address: RAY_DASHD_GCS_ADDRESS is unset and {pointer} "
                f"cannot be read ({exc.strerror}); is a Ray head running with "
                f"--temp-dir={temp_dir}?")
        if not gcs_address:
            raise SessionNotFound(f"{pointer} is empty")

    timeout = float(os.environ.get("RAY_DASHD_GCS_TIMEOUT_SECS", "10"))
    # Ray's client, given an address nobody listens on, keeps retrying for
    # about 40 s before it gives up; a plain connect tells us at once.
    host, _, port = gcs_address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise SessionNotFound(
            f"nothing answers at the GCS address {gcs_address} (from {source}): {exc}")

    cluster_id = os.environ.get("RAY_DASHD_CLUSTER_ID", "").strip() or None
    try:
        # Without a cluster id the client asks the GCS for it.
        client = GcsClient(address=gcs_address, cluster_id=cluster_id)
        if cluster_id is None:
            cluster_id = client.cluster_id.hex()
        # The GCS records its session's name; it must be ours, or this GCS
        # belongs to another cluster sharing the temp dir.
        gcs_session = client.internal_kv_get(
            b"session_name", ray_constants.KV_NAMESPACE_SESSION, timeout=timeout)
    except Exception as exc:
        raise SessionNotFound(
            f"cannot reach the GCS at {gcs_address} (from {source}): {exc!r}")
    gcs_session = gcs_session.decode() if gcs_session else None
    if gcs_session != session_name:
        raise SessionNotFound(
            f"the GCS at {gcs_address} (from {source}) serves session "
            f"{gcs_session!r}, not {session_name!r} ({real_session}); set "
            "RAY_DASHD_GCS_ADDRESS to this session's GCS")

    return {
        "gcs_address": gcs_address,
        "cluster_id_hex": cluster_id,
        "session_name": session_name,
        "session_dir": real_session,
        "temp_dir": temp_dir,
    }


# glibc's mallopt() parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_ARENA_MAX = -8
# What lean_malloc() sets, each unless the operator set it in the
# environment (glibc has applied that already; GLIBC_TUNABLES naming
# glibc.malloc leaves both alone).
LEAN_MALLOC = (
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, 1 << 20),
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, 2),
)
# How often lean_malloc()'s thread hands free heap pages back.
TRIM_EVERY_SECS = 10.0


def lean_malloc() -> str:
    """Has glibc's malloc give back what a module frees; says what it did.

    A Ray module on a big cluster builds answers of megabytes again and
    again. With glibc's defaults the pages those answers leave free inside
    the heap stay with the process (only the heap's top is ever returned,
    and a freed large block raises the threshold below which blocks come
    from the heap), and each thread of the module's executors gets an arena
    of its own (up to 8 per core) with pages of its own. Here: two arenas at
    most, the heap's top returned beyond 1 MiB free, and a thread that hands
    the free pages inside the heaps back (malloc_trim) every
    TRIM_EVERY_SECS.
    """
    if os.environ.get("RAY_DASHD_PY_MALLOC", "lean") != "lean":
        return "malloc left at glibc's defaults (RAY_DASHD_PY_MALLOC)"
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return "malloc left alone (not glibc)"
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "malloc left to GLIBC_TUNABLES"
    set_here = []
    for var, param, value in LEAN_MALLOC:
        if var not in os.environ and mallopt(param, value) == 1:
            set_here.append(var.rstrip("_").lower())

    def trim():
        while True:
            time.sleep(TRIM_EVERY_SECS)
            malloc_trim(0)

    threading.Thread(target=trim, name="malloc-trim", daemon=True).start()
    return f"lean malloc ({', '.join(set_here) or 'environment settings kept'}; trim every {TRIM_EVERY_SECS:g}s)"


def log_level() -> int:
    """The module's Python log level, as Ray's dashboard parses it."""
    from ray._private import ray_constants

    name = os.environ.get("RAY_DASHD_RAY_LOG_LEVEL") or ray_constants.LOGGER_LEVEL
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        fail(dashd_ray.EXIT_INCOMPATIBLE, f"unknown log level {name!r}")
    return level


class ReadySignal:
    """Stands in for the pipe Ray's module uses to tell its parent it is ready.

    `run_module_inner` calls send(None) once the module's run() has returned,
    then close(). We only remember that it happened.
    """

    def __init__(self):
        self.ready = False

    def send(self, _obj) -> None:
        self.ready = True

    def close(self) -> None:
        pass


def watch_parent(parent_pid: int):
    """The parent check of a standalone module: returns when `parent_pid`
    (ray-dashd) is no longer this process's parent."""
    watch_log = logging.getLogger("ray_dashd.launcher")

    async def watch():
        while os.getppid() == parent_pid:
            await asyncio.sleep(1)
        watch_log.warning("parent %d (ray-dashd) is gone; exiting", parent_pid)
        # sys.exit waits for non-daemon threads a module may have started;
        # make sure an orphan cannot linger because of one.
        timer = threading.Timer(HARD_EXIT_AFTER_SECS, os._exit, args=(1,))
        timer.daemon = True
        timer.start()

    return watch


async def never():
    """The parent check of a forked module: its lifeline ends it instead."""
    await asyncio.get_running_loop().create_future()


def hosted_class(module_cls, signal: ReadySignal, watch):
    """A subclass of `module_cls`, with the same name, changing two hooks.

    The name must stay the class's own: Ray derives the socket path, the log
    names and the process title from it. Everything else, routes included, is
    inherited untouched. `watch` is the parent check: a coroutine function
    that returns when the module should exit.
    """
    base_health = module_cls._internal_module_health_check

    async def _detect_parent_process_death(self):
        # Ray ends the process (sys.exit) when this coroutine returns.
        await watch()

    async def _internal_module_health_check(self, request):
        if not signal.ready:
            from aiohttp import web

            return web.Response(status=503, text="starting")
        return await base_health(self, request)

    return type(module_cls.__name__, (module_cls,), {
        "__module__": module_cls.__module__,
        "__qualname__": module_cls.__qualname__,
        "__doc__": module_cls.__doc__,
        "_detect_parent_process_death": _detect_parent_process_death,
        "_internal_module_health_check": _internal_module_health_check,
    })


def main(argv: list) -> None:
    """A standalone module: check Ray, find the class, run it."""
    if len(argv) != 2 or argv[1].startswith("-"):
        fail(dashd_ray.EXIT_INCOMPATIBLE, "usage: launcher.py <ClassName>, e.g. JobHead")
    class_name = argv[1]
    started = time.monotonic()
    parent_pid = os.getppid()
    env = read_contract(class_name)

    try:
        internals = dashd_ray.RayInternals()
        module_cls = internals.module_class(
            class_name, os.environ.get("RAY_DASHD_RAY_PYMODULE", ""))
    except dashd_ray.IncompatibleRay as exc:
        fail(dashd_ray.EXIT_INCOMPATIBLE, str(exc))
    host(internals, module_cls, env, started, watch_parent(parent_pid))


# What preload() found, for run_forked() in the forked children.
_preloaded = {}


def preload(targets: list) -> list:
    """In the zygote, once: check Ray and import the module classes.

    Each target is `ClassName=python.module` (as routes.py writes them) or a
    bare `ClassName` (found through Ray's discovery of all modules); no
    target at all means every module Ray itself would load here
    (`is_enabled()`), found by Ray's discovery. Imports only: nothing may
    start a thread or open a connection here, since the zygote forks
    afterwards. Returns the class names; raises on a Ray whose internals
    differ or a class that is not there.
    """
    internals = dashd_ray.RayInternals()
    classes = {}
    for target in targets:
        name, _, python_module = target.partition("=")
        classes[name] = internals.module_class(name, python_module)
    if not targets:
        for cls in internals.all_module_classes():
            if dashd_ray.module_enabled(cls):
                classes[cls.__name__] = cls
    _preloaded["internals"] = internals
    _preloaded["classes"] = classes
    return sorted(classes)


def report(args: list) -> str:
    """In the zygote, after preload(): the `[[modules]]` config of the
    preloaded classes, as `routes.py ARGS --shim ...` prints it minus the
    zygote's own entry (ray-dashd started the zygote already)."""
    import routes

    return routes.report(list(_preloaded["classes"].values()),
                         _preloaded["internals"], args)


def run_forked(class_name: str) -> None:
    """In a child forked by the zygote: run the preloaded module `class_name`.

    The environment and stdio are the shim's (the zygote set them up); Ray's
    internals were checked before the fork.
    """
    sys.argv = [os.path.abspath(__file__), class_name]
    env = read_contract(class_name)
    host(_preloaded["internals"], _preloaded["classes"][class_name], env,
         time.monotonic(), never)


def host(internals, module_cls, env: dict, started: float, watch) -> None:
    """Runs `module_cls` through Ray's own entry point, with our two hooks."""
    class_name = module_cls.__name__
    if not dashd_ray.module_enabled(module_cls):
        say(f"note: Ray would not load {class_name} here (is_enabled() is False); "
            "starting it anyway because the config asks for it")

    # The module binds <socket_dir>/dash_<ClassName>; that must be exactly the
    # socket ray-dashd probes and forwards to.
    socket_dir = os.path.dirname(env["RAY_DASHD_SOCKET"])
    expected = internals.get_socket_path(socket_dir, class_name)
    if expected != env["RAY_DASHD_SOCKET"]:
        fail(dashd_ray.EXIT_INCOMPATIBLE,
             f"Ray would bind {expected}, ray-dashd expects {env['RAY_DASHD_SOCKET']}")

    try:
        facts = discover_session(internals, env["RAY_DASHD_SESSION_DIR"])
    except SessionNotFound as exc:
        fail(EXIT_NO_SESSION, str(exc))

    from ray._private import ray_constants

    # Ray's own names and rotation: the module logs to dashboard_<Class>.log,
    # rotated as Ray rotates it (RAY_ROTATION_MAX_BYTES and
    # RAY_ROTATION_BACKUP_COUNT, as `ray start` passes them to its
    # dashboard). Its stdout and stderr stay what ray-dashd captures into
    # dashboard_<Class>.out and .err: Ray's own redirection of them is turned
    # off, so that each file has one writer.
    own_log = internals.keep_stdio()
    if not own_log:
        say("note: this Ray cannot log to dashboard_<Class>.log without also "
            "redirecting stdout and stderr; logging to stderr instead")
    config = internals.config_cls(
        **facts,
        logging_level=log_level(),
        logging_format=(ray_constants.LOGGER_FORMAT if own_log else
                        ray_constants.LOGGER_FORMAT_STDERR.format(
                            component=f"dashboard_{class_name}")),
        log_dir=os.path.realpath(env["RAY_DASHD_LOG_DIR"]),
        logging_filename="dashboard.log" if own_log else "",
        logging_rotate_bytes=int(os.environ.get("RAY_ROTATION_MAX_BYTES",
                                                internals.rotate_bytes)),
        logging_rotate_backup_count=int(os.environ.get("RAY_ROTATION_BACKUP_COUNT",
                                                       internals.rotate_backup_count)),
        socket_dir=socket_dir,
    )
    say(f"Ray {internals.version}: starting {class_name} incarnation "
        f"{env['RAY_DASHD_INCARNATION']} on {env['RAY_DASHD_SOCKET']} "
        f"(GCS {facts['gcs_address']}, session {facts['session_name']}, "
        f"checks took {time.monotonic() - started:.2f}s)")

    say(lean_malloc())
    signal = ReadySignal()
    internals.run_module(
        hosted_class(module_cls, signal, watch),
        config,
        env["RAY_DASHD_INCARNATION"],
        signal,
    )


if __name__ == "__main__":
    main(sys.argv)
