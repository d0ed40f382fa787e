"""Print, as one JSON object, what ray-dashd needs to stand in for the parts
Ray's dashboard parent serves itself: where the installed Ray keeps its
built web UI, the head's time zone as the UI asks for it (`/timezone`), the
authentication mode and, in token mode, the token (Ray's own loader finds
it: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), whether
usage stats are on (`/usage_stats_enabled`), and how Ray's modules mask
runtime-env secrets for a browser (the Ray state module masks the same).

The token goes to stdout, which ray-dashd reads through a pipe; run by
hand, this prints it.

Usage (with the Python that has `ray` installed): python head_facts.py
"""

import importlib.util
import json
import os
import sys


def auth_facts() -> tuple:
    """(mode name, k8s token auth on, the TOKEN mode or None) from Ray's own
    helpers, as far as this release has them: none before 2.52 (token
    authentication does not exist there: "disabled"), the mode from 2.52,
    Ray's name for it from 2.53, the Kubernetes flag from 2.54."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError:
        return "disabled", False, None
    mode = get_authentication_mode()
    try:
        from ray._private.authentication.authentication_utils import (
            get_authentication_mode_name,
        )
        name = get_authentication_mode_name(mode)
    except ImportError:
        names = {AuthenticationMode.TOKEN: "token", AuthenticationMode.K8S: "k8s"}
        name = names.get(mode, "disabled")
    try:
        from ray._raylet import is_k8s_token_auth_enabled
        k8s = bool(is_k8s_token_auth_enabled())
    except ImportError:
        k8s = mode == AuthenticationMode.K8S
    return name, k8s, (mode if mode == AuthenticationMode.TOKEN else None)


def redaction_facts() -> dict:
    """How this Ray's modules mask runtime-env secrets in what they answer a
    browser: {"kind": "none"} before 2.60 or with
    RAY_DASHBOARD_REDACT_RUNTIME_ENV off; the fields and the mask when they
    can be read; {"kind": "unknown"} when masking is on but they cannot."""
    try:
        from ray.dashboard import runtime_env_redaction as redaction
    except ImportError:
        return {"kind": "none"}
    from ray._private import ray_constants
    if not getattr(ray_constants, "RAY_DASHBOARD_REDACT_RUNTIME_ENV", True):
        return {"kind": "none"}
    fields = getattr(redaction, "_SECRET_RUNTIME_ENV_FIELDS", None)
    placeholder = getattr(redaction, "REDACTED_PLACEHOLDER", None)
    if not isinstance(placeholder, str) or not isinstance(fields, (tuple, list)) \
            or not all(isinstance(f, str) for f in fields):
        return {"kind": "unknown"}
    return {"kind": "masks", "fields": list(fields), "placeholder": placeholder}


def main() -> int:
    import ray

    import dashd_ray

    # Ray's own helpers answer the questions, so the answers match Ray's.
    # usage_lib moved from ray._private.usage to ray._common.usage in 2.49.
    usage_lib = dashd_ray.first_of("ray._common.usage.usage_lib",
                                   "ray._private.usage.usage_lib")
    from ray.dashboard import timezone_utils

    package = importlib.util.find_spec("ray").submodule_search_locations[0]
    mode_name, k8s, token_mode = auth_facts()
    facts = {
        "ray_version": ray.__version__,
        "ui_dir": os.path.join(package, "dashboard", "client", "build"),
        "timezone": timezone_utils.get_current_timezone_info(),
        "authentication_mode": mode_name,
        "k8s_token_auth": k8s,
        "usage_stats_enabled": usage_lib.usage_stats_enabled(),
        "usage_stats_prompt_enabled": usage_lib.usage_stats_prompt_enabled(),
        "runtime_env_redaction": redaction_facts(),
    }
    warnings = [dashd_ray.newer_than_tested(ray.__version__)]
    if os.environ.get("RAY_AUTH_MODE", "").strip() == "token" and mode_name == "disabled":
        warnings.append(f"RAY_AUTH_MODE=token is set, but Ray {ray.__version__} has no token "
                        "authentication: like Ray's own dashboard, ray-dashd serves without it")
    facts["warnings"] = [w for w in warnings if w]
    if token_mode is not None and not k8s:
        from ray._raylet import AuthenticationTokenLoader

        try:
            facts["auth_token"] = AuthenticationTokenLoader.instance().get_raw_token()
        except Exception as exc:  # Ray's loader raises when there is no token
            print(f"token authentication is on, but: {exc}", file=sys.stderr)
            return 1
    json.dump(facts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
