"""Print, as one JSON object, what ray-dashd needs to stand in for the parts
Ray's dashboard parent serves itself: where the installed Ray keeps its
built web UI, the head's time zone as the UI asks for it (`/timezone`), the
authentication mode and, in token mode, the token (Ray's own loader finds
it: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), and whether
usage stats are on (`/usage_stats_enabled`).

The token goes to stdout, which ray-dashd reads through a pipe; run by
hand, this prints it.

Usage (with the Python that has `ray` installed): python head_facts.py
"""

import importlib.util
import json
import os
import sys


def main() -> int:
    # Ray's own helpers answer the questions, so the answers match Ray's.
    from ray._common.usage import usage_lib
    from ray._private.authentication.authentication_utils import (
        get_authentication_mode_name,
    )
    from ray._raylet import (
        AuthenticationMode,
        AuthenticationTokenLoader,
        get_authentication_mode,
        is_k8s_token_auth_enabled,
    )
    from ray.dashboard import timezone_utils

    package = importlib.util.find_spec("ray").submodule_search_locations[0]
    mode = get_authentication_mode()
    k8s = bool(is_k8s_token_auth_enabled())
    facts = {
        "ui_dir": os.path.join(package, "dashboard", "client", "build"),
        "timezone": timezone_utils.get_current_timezone_info(),
        "authentication_mode": get_authentication_mode_name(mode),
        "k8s_token_auth": k8s,
        "usage_stats_enabled": usage_lib.usage_stats_enabled(),
        "usage_stats_prompt_enabled": usage_lib.usage_stats_prompt_enabled(),
    }
    if mode == AuthenticationMode.TOKEN and not k8s:
        try:
            facts["auth_token"] = AuthenticationTokenLoader.instance().get_raw_token()
        except Exception as exc:  # Ray's loader raises when there is no token
            print(f"token authentication is on, but: {exc}", file=sys.stderr)
            return 1
    json.dump(facts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
