"""Print, as one JSON object, what ray-dashd needs to stand in for the parts
Ray's dashboard parent serves itself: where the installed Ray keeps its
built web UI, the head's time zone as the UI asks for it (`/timezone`), and
the cluster's authentication mode (`/api/authentication_mode`).

Usage (with the Python that has `ray` installed): python head_facts.py
"""

import importlib.util
import json
import os
import sys


def main() -> int:
    # Ray's own helpers answer the questions, so the answers match Ray's.
    from ray._private.authentication.authentication_utils import (
        get_authentication_mode_name,
    )
    from ray._raylet import get_authentication_mode
    from ray.dashboard import timezone_utils

    package = importlib.util.find_spec("ray").submodule_search_locations[0]
    facts = {
        "ui_dir": os.path.join(package, "dashboard", "client", "build"),
        "timezone": timezone_utils.get_current_timezone_info(),
        "authentication_mode": get_authentication_mode_name(get_authentication_mode()),
    }
    json.dump(facts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
