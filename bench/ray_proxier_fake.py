"""Ray's own Ray Client proxier, with fake specific servers.

usage: BENCH_FAKE_SERVER=/path/ray-dashd-fake-client-server BENCH_FAKE_PORTS=FIRST-LAST \
       python ray_proxier_fake.py --address=GCS --host=127.0.0.1 --port=PORT --mode=proxy

Runs `python -m ray.util.client.server --mode=proxy` (Ray's proxier, from the
installed wheel, unchanged) with two substitutions, the same two that
ray-dashd-client-proxy's --server-command and --port-range make for ours:

- a specific server is started as BENCH_FAKE_SERVER with Ray's flags,
  through Ray's own process starter (ray._private.services.start_ray_process,
  so fate sharing and the log files are Ray's); the argv keeps
  `-m ray.util.client.server`, because the proxier waits until a new
  process's command line shows it;
- its port pool is FIRST-LAST instead of 23000-23999.

Used by bench/ray_client_bench.py to count the clients Ray's proxier serves at
once, against the same fake servers as ours. It needs a GCS (the proxier
connects to it at start and for each server's log files).
"""

import os

from ray._private import ray_constants, services
from ray.util.client.server import proxier, server

FAKE = os.environ["BENCH_FAKE_SERVER"]
FIRST, LAST = (int(p) for p in os.environ["BENCH_FAKE_PORTS"].split("-"))


def start_fake_server(
    address,
    ray_client_server_ip,
    ray_client_server_port,
    stdout_file=None,
    stderr_file=None,
    fate_share=None,
    server_type="proxy",
    serialized_runtime_env_context=None,
    **_unused,
):
    command = [
        FAKE,
        "-m",
        "ray.util.client.server",
        f"--address={address}",
        f"--host={ray_client_server_ip}",
        f"--port={ray_client_server_port}",
        f"--mode={server_type}",
        "--language=PYTHON",
    ]
    if serialized_runtime_env_context:
        command.append(f"--serialized-runtime-env-context={serialized_runtime_env_context}")
    return services.start_ray_process(
        command,
        ray_constants.PROCESS_TYPE_RAY_CLIENT_SERVER,
        stdout_file=stdout_file,
        stderr_file=stderr_file,
        fate_share=fate_share,
    )


proxier.start_ray_client_server = start_fake_server
# ProxyManager reads these when it is created, in server.main().
proxier.MIN_SPECIFIC_SERVER_PORT = FIRST
proxier.MAX_SPECIFIC_SERVER_PORT = LAST + 1
server.main()
