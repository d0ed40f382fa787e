"""Read or set the GCS key through which Ray's tools find the dashboard.

Usage (with the Python that has `ray` installed):

    python dashboard_kv.py GCS_ADDRESS              print the current value
    python dashboard_kv.py GCS_ADDRESS HOST:PORT    point it at HOST:PORT

Ray's CLI (`ray logs`, and `ray list` / `ray job` without an http:// address),
the per-node agents and task-event publishing look the dashboard up in the
GCS internal KV: key `dashboard`, namespace `dashboard`, value `host:port`;
`ray.init()` reports the key `webui:url` of the same namespace.
`ray start --include-dashboard=false` still writes that key (for a dashboard
process that serves nothing), so whatever replaces the dashboard has to
overwrite it. That is ray-dashd's job; this script does the same by hand, for
trying things out before the host does it.
"""

import sys

from ray._private import ray_constants
from ray._raylet import GcsClient


def main(argv: list) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 64
    client = GcsClient(address=argv[1])
    key = ray_constants.DASHBOARD_ADDRESS.encode()
    namespace = ray_constants.KV_NAMESPACE_DASHBOARD
    if len(argv) == 3:
        # overwrite=True: replace whatever the minimal dashboard put there.
        client.internal_kv_put(key, argv[2].encode(), True, namespace)
        # What `ray.init()` reports as the dashboard's URL.
        client.internal_kv_put(b"webui:url", argv[2].encode(), True, namespace)
    value = client.internal_kv_get(key, namespace)
    print(value.decode() if value is not None else "(unset)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
