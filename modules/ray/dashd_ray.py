"""Shared helpers for hosting Ray's own dashboard modules under ray-dashd.

Both `launcher.py` (runs one Ray module as a ray-dashd module) and
`routes.py` (prints the ray-dashd config for them) import this file. It is the
one place that knows which Ray internals we lean on, and it checks them before
anything else happens, so that a Ray release that moved things around fails
with a clear message instead of half-working.

Everything here must be imported with the Python that has `ray[default]`
installed. Keep the file name unusual: the folder of the running script is the
first entry of `sys.path`, so a generic name here could shadow a real package.
"""

import dataclasses
import importlib
import inspect
import logging
import os
import sys

# The oldest Ray release that hosts its dashboard modules as subprocesses by
# default (2.42-2.44 ship ray.dashboard.subprocesses but leave it unused).
OLDEST_RAY = (2, 45, 0)

# The newest Ray release this code was tested on. A newer one runs when the
# structural checks below pass, with one warning naming its version; the
# checks, not this number, decide whether it is hosted.
NEWEST_TESTED_RAY = (2, 60)

# Exit status for "this Ray is not the one we understand" (and for a bad
# invocation): the same code ray-dashd itself uses for a bad command line or
# config, so that an operator sees one meaning for 64 across the project.
EXIT_INCOMPATIBLE = 64

# Set to 1 to try a Ray older than OLDEST_RAY. The structural checks below
# still run; only the lower bound is forgiven.
ANY_VERSION_ENV = "RAY_DASHD_RAY_ANY_VERSION"

# The fields of SubprocessModuleConfig that the launcher fills (the same in
# every release from 2.45 to 2.60). One of them gone means the module expects
# something else; a new one is accepted only if it has a default.
EXPECTED_CONFIG_FIELDS = (
    "cluster_id_hex",
    "gcs_address",
    "session_name",
    "temp_dir",
    "session_dir",
    "logging_level",
    "logging_format",
    "log_dir",
    "logging_filename",
    "logging_rotate_bytes",
    "logging_rotate_backup_count",
    "socket_dir",
)

# The route kinds ray-dashd's config accepts, which happen to be the values of
# Ray's own ResponseType enum.
ROUTE_KINDS = ("http", "stream", "websocket")


def release(version: str) -> tuple:
    """(major, minor, patch) of a Ray version string such as "2.52.1" or
    "2.61.0rc1" (a suffix is ignored; a missing part counts as 0)."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def newer_than_tested(version: str):
    """One line warning that `version` is newer than the newest release this
    code was tested on, or None."""
    if release(version)[:2] <= NEWEST_TESTED_RAY:
        return None
    tested = ".".join(map(str, NEWEST_TESTED_RAY))
    return (f"Ray {version} is newer than {tested}.x, the newest release ray-dashd "
            "was tested on; its internals passed the checks, so its modules are hosted")


def first_of(*candidates: str):
    """The first of `module:attribute` names that imports, or raises
    IncompatibleRay naming them all. Ray moves helpers between
    `ray._private` and `ray._common` across releases."""
    for candidate in candidates:
        module, _, attribute = candidate.partition(":")
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if not attribute:
            return found
        if hasattr(found, attribute):
            return getattr(found, attribute)
    raise _differs(f"none of {', '.join(candidates)} exists")


def module_enabled(cls) -> bool:
    """Whether Ray itself would load module class `cls`: its `is_enabled()`
    where Ray has one (2.58 and later), else always (earlier releases load
    every module they find)."""
    is_enabled = getattr(cls, "is_enabled", None)
    return bool(is_enabled()) if callable(is_enabled) else True


class IncompatibleRay(Exception):
    """The installed Ray does not look like the one this code understands."""


def _differs(what: str) -> IncompatibleRay:
    """Build the one-line complaint used for every mismatch."""
    try:
        import ray

        found = f"Ray {ray.__version__} at {os.path.dirname(ray.__file__)}"
    except Exception as exc:  # ray itself failed to import
        found = f"no importable Ray ({exc!r}) for {sys.executable}"
    return IncompatibleRay(
        f"ray-dashd hosts the modules of Ray {'.'.join(map(str, OLDEST_RAY))} and later "
        f"whose internals it recognizes; found {found}: {what}"
    )


def _uses_name(func, name: str) -> bool:
    """True when `func`'s code refers to attribute or global `name`.

    A cheap way to confirm that a Ray function still calls the hook we
    override, without parsing its source.
    """
    code = getattr(func, "__code__", None)
    return code is not None and name in code.co_names


def _leave_stdio_alone(*_args, **_kwargs) -> None:
    """Stands in for Ray's stdout/stderr redirection: ray-dashd already
    captures both into the module's .out and .err files."""


class RayInternals:
    """The handful of Ray objects we use, looked up and checked once."""

    def __init__(self, check_version: bool = True):
        try:
            import ray
        except Exception as exc:
            raise _differs(f"`import ray` failed: {exc!r}") from exc
        self.ray = ray
        self.version = ray.__version__
        if check_version and release(self.version) < OLDEST_RAY:
            if os.environ.get(ANY_VERSION_ENV) != "1":
                oldest = ".".join(map(str, OLDEST_RAY))
                raise _differs(
                    f"releases before {oldest} do not run their dashboard modules "
                    f"as subprocesses (set {ANY_VERSION_ENV}=1 to try it anyway)"
                )
        self.warning = newer_than_tested(self.version)

        try:
            sub_module = importlib.import_module("ray.dashboard.subprocesses.module")
            sub_utils = importlib.import_module("ray.dashboard.subprocesses.utils")
        except Exception as exc:
            raise _differs(
                "ray.dashboard.subprocesses.{module,utils} do not import "
                f"({exc!r}); is ray[default] installed?"
            ) from exc

        # run_module(cls, config, incarnation, child_conn) is the entry point
        # Ray's own parent hands to multiprocessing.
        run_module = getattr(sub_module, "run_module", None)
        if run_module is None:
            raise _differs("ray.dashboard.subprocesses.module.run_module is missing")
        params = list(inspect.signature(run_module).parameters)
        if params != ["cls", "config", "incarnation", "child_conn"]:
            raise _differs(
                f"run_module takes {params}, expected "
                "['cls', 'config', 'incarnation', 'child_conn']"
            )
        self.run_module = run_module

        # run_module_inner is what starts the parent watch and reports
        # readiness; both are things we hook, so both must still be there.
        inner = getattr(sub_module, "run_module_inner", None)
        if inner is None:
            raise _differs("run_module_inner is missing")
        for name in ("_detect_parent_process_death", "send"):
            if not _uses_name(inner, name):
                raise _differs(f"run_module_inner no longer uses `{name}`")

        config_cls = getattr(sub_module, "SubprocessModuleConfig", None)
        if config_cls is None or not dataclasses.is_dataclass(config_cls):
            raise _differs("SubprocessModuleConfig is missing or not a dataclass")
        fields = {f.name: f for f in dataclasses.fields(config_cls)}
        missing = sorted(set(EXPECTED_CONFIG_FIELDS) - set(fields))
        required_new = sorted(
            name for name, f in fields.items()
            if name not in EXPECTED_CONFIG_FIELDS
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
        if missing or required_new:
            raise _differs(
                "SubprocessModuleConfig fields differ "
                f"(gone: {missing}, new without a default: {required_new})"
            )
        self.config_cls = config_cls

        # Ray's rotation settings for log files (under ray._common from 2.49,
        # ray._private before).
        self.rotate_bytes = first_of("ray._common.ray_constants:LOGGING_ROTATE_BYTES",
                                     "ray._private.ray_constants:LOGGING_ROTATE_BYTES")
        self.rotate_backup_count = first_of(
            "ray._common.ray_constants:LOGGING_ROTATE_BACKUP_COUNT",
            "ray._private.ray_constants:LOGGING_ROTATE_BACKUP_COUNT")

        base = getattr(sub_module, "SubprocessModule", None)
        if base is None:
            raise _differs("SubprocessModule is missing")
        for hook in ("_detect_parent_process_death", "_internal_module_health_check"):
            if not inspect.iscoroutinefunction(getattr(base, hook, None)):
                raise _differs(f"SubprocessModule.{hook} is missing or not async")
        # The health route must still be bound to the method we wrap.
        if not _uses_name(base.run, "_internal_module_health_check"):
            raise _differs("SubprocessModule.run no longer serves /api/healthz")
        self.base = base

        # The socket name: ray-dashd puts module NAME on <session>/sockets/
        # dash_NAME, and Ray modules reach each other on the same names.
        get_socket_path = getattr(sub_utils, "get_socket_path", None)
        if get_socket_path is None:
            raise _differs("subprocesses.utils.get_socket_path is missing")
        probe = get_socket_path("/s", "Probe")
        if probe != "/s/dash_Probe":
            raise _differs(f"socket naming changed: get_socket_path gives {probe!r}")
        self.get_socket_path = get_socket_path

        response_type = getattr(sub_utils, "ResponseType", None)
        values = sorted(m.value for m in response_type) if response_type else None
        if values != sorted(ROUTE_KINDS):
            raise _differs(f"ResponseType values are {values}, expected {ROUTE_KINDS}")
        self.response_type = response_type

    # -- logging ------------------------------------------------------------

    def keep_stdio(self) -> bool:
        """Turns off Ray's redirection of a module's stdout and stderr into
        files of its own, which `run_module` does whenever the config names a
        log file; True when that was possible (the module may then log to
        Ray's own `dashboard_<Class>.log`), False when this Ray redirects in
        a way we do not recognize."""
        try:
            logging_utils = importlib.import_module("ray._private.logging_utils")
        except ImportError:
            return False
        name = "redirect_stdout_stderr_if_needed"
        if not hasattr(logging_utils, name) or not _uses_name(self.run_module, name):
            return False
        setattr(logging_utils, name, _leave_stdio_alone)
        return True

    # -- module classes -----------------------------------------------------

    def all_module_classes(self) -> list:
        """Every SubprocessModule subclass Ray ships, enabled or not.

        Uses Ray's own discovery, which imports every package under
        ray.dashboard.modules (slow: only routes.py needs it).
        """
        dash_utils = importlib.import_module("ray.dashboard.utils")
        get_all = getattr(dash_utils, "get_all_modules", None)
        if get_all is None:
            raise _differs("ray.dashboard.utils.get_all_modules is missing")
        # Ray logs every module it finds at INFO; keep that off our stderr.
        chatty = logging.getLogger(dash_utils.__name__)
        level = chatty.level
        chatty.setLevel(logging.WARNING)
        try:
            found = get_all(self.base)
        finally:
            chatty.setLevel(level)
        return sorted(found, key=lambda c: c.__name__)

    def module_class(self, class_name: str, python_module: str = ""):
        """Find the SubprocessModule subclass called `class_name`.

        With `python_module` (routes.py passes it in the generated config) only
        that one file is imported, which keeps start-up time and memory down.
        Without it, fall back to Ray's discovery of all modules.
        """
        if python_module:
            try:
                mod = importlib.import_module(python_module)
            except Exception as exc:
                raise _differs(f"cannot import {python_module}: {exc!r}") from exc
            cls = getattr(mod, class_name, None)
        else:
            found = [c for c in self.all_module_classes() if c.__name__ == class_name]
            cls = found[0] if found else None
        if not (inspect.isclass(cls) and issubclass(cls, self.base)):
            where = python_module or "ray.dashboard.modules"
            raise _differs(f"no SubprocessModule class named {class_name} in {where}")
        return cls

    # -- routes -------------------------------------------------------------

    def route_kinds(self) -> dict:
        """Map (METHOD, path) to "http" / "stream" / "websocket".

        Ray keeps the kind only in the closure of the parent-side handler that
        SubprocessRouteTable registers for each route, so read it from there.
        Call after the module classes were imported (their decorators are what
        fill the table).
        """
        table_mod = importlib.import_module("ray.dashboard.subprocesses.routes")
        table = getattr(table_mod, "SubprocessRouteTable", None)
        items = getattr(getattr(table, "_routes", None), "_items", None)
        if items is None:
            raise _differs("SubprocessRouteTable._routes._items is missing")
        kinds = {}
        for item in items:
            handler = getattr(item, "handler", None)
            if handler is None:  # a static route or similar: not a module route
                continue
            try:
                captured = inspect.getclosurevars(handler).nonlocals
            except TypeError as exc:
                raise _differs(f"route handler {handler!r} is not a plain function") from exc
            kind = captured.get("resp_type")
            if not isinstance(kind, self.response_type):
                raise _differs(
                    f"the parent-side handler of {item.method} {item.path} "
                    "no longer captures `resp_type`"
                )
            kinds[(item.method.upper(), item.path)] = kind.value
        return kinds

    @staticmethod
    def declared_routes(cls) -> list:
        """(METHOD, path) of each route handler defined on a module class.

        Same test Ray's SubprocessRouteTable.bind() uses: a plain function that
        carries __route_method__ and __route_path__.
        """
        found = []
        for _, func in inspect.getmembers(cls, inspect.isfunction):
            method = getattr(func, "__route_method__", None)
            path = getattr(func, "__route_path__", None)
            if method and path:
                found.append((method.upper(), path))
        return sorted(found, key=lambda mp: (mp[1], mp[0]))
