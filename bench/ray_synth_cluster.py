#!/usr/bin/env python3
"""bench/ray_synth_cluster.py: give a real Ray head the state of a big cluster.

Run with the Python of a venv that has ray[default] (2.45 or later), against a
running head's GCS (`--gcs-address 127.0.0.1:PORT`). Nothing is mocked
between Ray's dashboard modules and the GCS; the GCS holds:

- N extra nodes, registered through `NodeInfoGcsService.RegisterNode`, each
  with an address of its own on the loopback network (127.1.0.1, 127.1.0.2,
  ...). Their raylets are `ray-dashd-bench fake-raylets` (`--raylets-bin`),
  a child process with one port per node that answers what Ray's head asks
  every raylet: the GCS health check (SERVING, so the GCS keeps every node
  ALIVE), the GCS's resource-load pull (the node idle, all its resources
  free) and NodeHead's GetNodeStats (no workers); anything else answers
  UNIMPLEMENTED. Without `--raylets-bin`, one grpcio server of this script
  answers the health checks and GetNodeStats for all nodes (then at
  127.0.0.2; the GCS logs its failed resource-load pulls). The nodes have
  no CPU or GPU (only memory, object store memory, `node:<ip>` and
  `synthetic_node: 1`), so nothing real is ever scheduled on them. Their
  agent ports, in the node table and in the internal KV where agents
  publish themselves, name a port that is bound but never listens: whatever
  reaches a node's agent is refused at once, as for an unreachable node.
- A actors that can never be placed (they need a resource no node has):
  PENDING_CREATION in the GCS actor table, owned by this script's driver.
- T finished tasks, run in batches by the same driver, so the GCS task-event
  store is full (it keeps `task_events_max_num_task_in_gcs`, 100,000 by
  default, and evicts the rest: the summary says what it holds).
- J finished jobs through `JobInfoGcsService` (`GetNextJobID`, `AddJob`,
  `MarkJobFinished`), a share of them as job-API submissions (the job's
  `JobInfo` in the internal KV, as Ray's `JobInfoStorageClient` writes it,
  and the driver's job row pointing at it), plus a few real jobs through the
  job API when `--dashboard-url` is given (which also checks that Ray's job
  and state APIs answer with the synthetic rows present).

It prints progress with timings on stderr, then one line of JSON on stdout
(and to `--summary-file`), then holds everything (the driver, the raylets)
until SIGTERM or SIGINT, and exits 0. Loopback only; every wait is bounded.
Which fields the protos have is looked up, never the Ray version.
"""

import argparse
import concurrent.futures as futures
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, deque

T0 = time.monotonic()
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 1 << 30),
    ("grpc.max_send_message_length", 1 << 30),
]
HEALTH_SERVING = b"\x08\x01"
# The nodes' address when one Python server serves them all: not 127.0.0.1,
# which the head (and so a driver looking for its local raylet) may have.
SHARED_NODE_IP = "127.0.0.2"  # grpc.health.v1.HealthCheckResponse{status: SERVING}
IN_FLIGHT = 64  # RPCs in flight while registering nodes and jobs


def log(msg):
    print(f"[synth {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(f"error: {msg}")
    sys.exit(1)


def exit_with_parent():
    """SIGTERM this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# --- the node managers (a child process) ---------------------------------------------
#
# Ray's head calls every raylet: the GCS health check (grpc.health.v1, every
# 3 s per node), the GCS's resource-load pull (NodeManagerService.
# GetResourceLoad, every second per node) and NodeHead's GetNodeStats (every
# 15 s per node). Preferred: `ray-dashd-bench fake-raylets` (--raylets-bin),
# one loopback port per node, answering all three, each node with its own
# resource load (so the GCS keeps each node's resources as registered).
# Fallback: one grpcio server in Python for all nodes, answering the health
# check and GetNodeStats; GetResourceLoad answers UNIMPLEMENTED (it cannot
# tell the nodes apart), which the GCS logs (every 10th failure) and
# otherwise ignores. It costs about a third of a core at 2,000 nodes.


def serve_node_managers(args):
    """The Python fallback: one port for all nodes, until SIGTERM."""
    parent = os.getppid()
    exit_with_parent()
    if os.getppid() != parent:
        return 0
    import grpc

    stats_reply = bytes.fromhex(sys.stdin.readline().strip())
    calls = Counter()

    def health_check(_request, _context):
        calls["health"] += 1
        return HEALTH_SERVING

    def node_stats(_request, _context):
        calls["node_stats"] += 1
        return stats_reply

    def same(b):
        return b

    methods = {
        "/grpc.health.v1.Health/Check": grpc.unary_unary_rpc_method_handler(
            health_check, request_deserializer=same, response_serializer=same
        ),
        "/ray.rpc.NodeManagerService/GetNodeStats": grpc.unary_unary_rpc_method_handler(
            node_stats, request_deserializer=same, response_serializer=same
        ),
    }

    class Handler(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            method = handler_call_details.method
            if isinstance(method, bytes):
                method = method.decode()
            handler = methods.get(method)
            if handler is None:
                calls[f"unimplemented {method}"] += 1
            return handler

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        handlers=[Handler()],
        options=[("grpc.so_reuseport", 0)],
    )
    port = server.add_insecure_port(f"{SHARED_NODE_IP}:0")
    if not port:
        print("0", flush=True)
        return 1
    server.start()
    print(port, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # Bounded by the parent: SIGTERM when it ends (and a check each second).
    while not stop.wait(1.0):
        if os.getppid() != parent:
            break
    server.stop(1).wait(5)
    print(json.dumps(dict(calls)), file=sys.stderr, flush=True)
    return 0


def start_node_managers(args, stats_reply, resource_loads, scratch):
    """Starts the node managers; returns (process, one port per node)."""
    err = open(args.server_log, "ab") if args.server_log else subprocess.DEVNULL
    if args.raylets_bin:
        canned = os.path.join(scratch, "raylets.hex")
        ports_file = os.path.join(scratch, "raylets.ports")
        with open(canned, "w") as f:
            f.write(stats_reply.hex() + "\n")
            for ip, reply in resource_loads:
                f.write(f"{ip} {reply.hex()}\n")
        command = [args.raylets_bin, "fake-raylets", "--input", canned, "--ports-file", ports_file]
        if args.avoid_ports:
            command += ["--avoid-ports", ",".join(str(p) for p in sorted(args.avoid_ports))]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        deadline = time.monotonic() + 120
        while not os.path.exists(ports_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                die(f"{args.raylets_bin} fake-raylets did not start (exit {proc.poll()})")
            time.sleep(0.05)
        with open(ports_file) as f:
            ports = json.load(f)["ports"]
        if len(ports) != len(resource_loads):
            die(f"fake-raylets listens on {len(ports)} ports for {len(resource_loads)} nodes")
        return proc, ports
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve-node-managers"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
    )
    proc.stdin.write(stats_reply.hex() + "\n")
    proc.stdin.flush()
    line = read_line(proc.stdout, 60)
    if not line or not line.strip().isdigit() or int(line) == 0:
        proc.kill()
        die(f"the node-manager gRPC server did not start (said {line!r})")
    return proc, [int(line)] * len(resource_loads)


def read_line(stream, timeout):
    box = []
    t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else None


def closed_port(avoid):
    """A loopback TCP port bound but never listening: connects are refused.
    The socket is kept for as long as this process runs; its port is none
    of `avoid`."""
    passed_over = []
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Every address (the nodes' loopback addresses too), never listening.
        s.bind(("0.0.0.0", 0))
        if s.getsockname()[1] not in avoid:
            break
        passed_over.append(s)  # held until the loop ends: another port comes
    for other in passed_over:
        other.close()
    return s, s.getsockname()[1]


def port_list(text):
    """`--avoid-ports`: comma-separated port numbers."""
    return {int(p) for p in text.split(",") if p.strip()}


# --- protos -------------------------------------------------------------------------


def has_field(msg, name):
    return name in msg.DESCRIPTOR.fields_by_name


def set_fields(msg, **values):
    """Sets the scalar fields the message has; returns the names left out."""
    missing = []
    for name, value in values.items():
        if has_field(msg, name):
            setattr(msg, name, value)
        else:
            missing.append(name)
    return missing


def address_node_field(address_msg):
    # Renamed from raylet_id to node_id in Ray 2.4x.
    return "node_id" if has_field(address_msg, "node_id") else "raylet_id"


def node_stats_reply():
    from ray.core.generated import node_manager_pb2

    reply = node_manager_pb2.GetNodeStatsReply()
    set_fields(reply, num_workers=0)
    if has_field(reply, "store_stats"):
        set_fields(
            reply.store_stats,
            object_store_bytes_avail=2 * 1024**3,
            object_store_bytes_used=0,
            num_local_objects=0,
        )
    return reply.SerializeToString()


def check_status(reply, what):
    status = getattr(reply, "status", None)
    if status is not None and status.code != 0:
        raise RuntimeError(f"{what}: GCS status {status.code} {status.message}")


def drain(pending, limit, what):
    """Waits for the oldest RPCs until at most `limit` are in flight."""
    while len(pending) > limit:
        check_status(pending.popleft().result(), what)


def progress(what, done, total, t0, state):
    """Logs `done/total` every 5 s and at the end."""
    now = time.monotonic()
    if done == total or now - state[0] >= 5:
        state[0] = now
        rate = done / max(now - t0, 1e-6)
        log(f"{what}: {done}/{total} ({rate:.0f}/s)")


# --- the phases ---------------------------------------------------------------------


def random_hex(rng, n_bytes):
    return bytes(rng.getrandbits(8) for _ in range(n_bytes))


def _token_interceptor_class():
    import grpc

    class Interceptor(grpc.UnaryUnaryClientInterceptor):
        """Adds `authorization: Bearer <token>` to every unary call."""

        def __init__(self, token):
            self.metadata = (("authorization", "Bearer " + token),)

        def intercept_unary_unary(self, continuation, details, request):
            metadata = tuple(details.metadata or ()) + self.metadata
            details = details._replace(metadata=metadata)
            return continuation(details, request)

    return Interceptor


def TokenInterceptor(token):
    return _token_interceptor_class()(token)


def head_node(node_stub):
    from ray.core.generated import gcs_service_pb2

    reply = node_stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=60)
    for n in reply.node_info_list:
        if n.is_head_node and n.state == 0:
            return n
    die("the GCS lists no alive head node")


def node_ip(i, unique):
    """A loopback address of node i's own (127.1.0.1, 127.1.0.2, ...; all of
    127.0.0.0/8 is this host's), or the one all nodes share."""
    if not unique:
        return SHARED_NODE_IP
    return f"127.{1 + i // 62500}.{(i // 250) % 250}.{i % 250 + 1}"


def build_nodes(args, rng, head, agent_port):
    """The synthetic nodes' GcsNodeInfo (node manager port still 0) and,
    for each, the GetResourceLoad reply its raylet would give when idle."""
    from ray.core.generated import gcs_pb2, node_manager_pb2

    now_ms = int(time.time() * 1000)
    infos, loads = [], []
    skipped = set()
    for i in range(args.nodes):
        # Unique across runs on one head (a seeded id could name a dead node).
        node_id = os.urandom(len(head.node_id))
        info = gcs_pb2.GcsNodeInfo()
        info.node_id = node_id
        info.state = gcs_pb2.GcsNodeInfo.ALIVE
        info.is_head_node = False
        start_ms = now_ms - rng.randint(600_000, 3 * 86_400_000)  # up 10 min to 3 days
        ip = node_ip(i, bool(args.raylets_bin))
        skipped.update(
            set_fields(
                info,
                node_manager_address=ip,
                object_manager_port=agent_port,
                node_manager_hostname=f"ray-worker-{i:05d}",
                node_name=ip,
                raylet_socket_name=f"/tmp/ray/session_synthetic/sockets/raylet.{i}",
                object_store_socket_name=f"/tmp/ray/session_synthetic/sockets/plasma_store.{i}",
                metrics_export_port=agent_port,
                runtime_env_agent_port=agent_port,
                metrics_agent_port=agent_port,
                dashboard_agent_listen_port=agent_port,
                instance_id=f"i-{i:017x}",
                node_type_name="synthetic-worker",
                instance_type_name="m5.4xlarge",
                start_time_ms=start_ms,
                temp_dir="/tmp/ray",
                session_dir="/tmp/ray/session_synthetic",
            )
        )
        # No CPU or GPU: nothing real is ever scheduled here.
        resources = {
            "memory": float(64 * 1024**3),
            "object_store_memory": float(19 * 1024**3),
            f"node:{ip}": 1.0,
            "synthetic_node": 1.0,
        }
        for k, v in resources.items():
            info.resources_total[k] = v
        if has_field(info, "labels"):
            info.labels["ray.io/node-id"] = node_id.hex()
        if has_field(info, "state_snapshot"):
            info.state_snapshot.state = gcs_pb2.NodeSnapshot.IDLE
        infos.append(info)

        reply = node_manager_pb2.GetResourceLoadReply()
        data = reply.resources
        data.node_id = node_id
        for k, v in resources.items():
            data.resources_available[k] = v
            data.resources_total[k] = v
        set_fields(data, node_manager_address=ip, idle_duration_ms=now_ms - start_ms)
        if has_field(data, "labels") and has_field(info, "labels"):
            data.labels.update(info.labels)
        loads.append((ip, reply.SerializeToString()))
    if skipped:
        log(f"fields this Ray's GcsNodeInfo lacks (left out): {sorted(skipped)}")
    return infos, loads


def register_nodes(channel, infos, ports, agent_port):
    """RegisterNode for each node, and the KV entry its agent would write."""
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
    kv = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
    t0 = time.monotonic()
    pending = deque()
    state = [t0]
    for i, (info, port) in enumerate(zip(infos, ports)):
        info.node_manager_port = port
        request = gcs_service_pb2.RegisterNodeRequest(node_info=info)
        pending.append(stub.RegisterNode.future(request, timeout=60))
        # Where the node's agent would publish itself: [ip, http port, grpc port].
        key = f"DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX:{info.node_id.hex()}".encode()
        ip = info.node_manager_address
        value = json.dumps([ip, agent_port, agent_port]).encode()
        put = gcs_service_pb2.InternalKVPutRequest(
            key=key, value=value, overwrite=True, namespace=b"dashboard"
        )
        pending.append(kv.InternalKVPut.future(put, timeout=60))
        if ip != SHARED_NODE_IP:
            # And by address: [node id, http port, grpc port].
            key = f"DASHBOARD_AGENT_ADDR_IP_PREFIX:{ip}".encode()
            value = json.dumps([info.node_id.hex(), agent_port, agent_port]).encode()
            put = gcs_service_pb2.InternalKVPutRequest(
                key=key, value=value, overwrite=True, namespace=b"dashboard"
            )
            pending.append(kv.InternalKVPut.future(put, timeout=60))
        drain(pending, IN_FLIGHT, "RegisterNode")
        progress("nodes registered", i + 1, len(infos), t0, state)
    drain(pending, 0, "RegisterNode")
    return [info.node_id for info in infos]


def count_alive(channel, node_ids):
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
    reply = stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=120)
    wanted = set(node_ids)
    states = Counter()
    for n in reply.node_info_list:
        if n.node_id in wanted:
            states["ALIVE" if n.state == 0 else "DEAD"] += 1
    return states["ALIVE"], states["DEAD"], len(reply.node_info_list)


SUBMISSION_ALPHABET = string.ascii_letters + string.digits
ENTRYPOINTS = [
    "python train.py --epochs 10 --batch-size 256",
    "python -m batch_inference --model resnet50 --input s3://bucket/images",
    "python etl_job.py --date 2026-11-30",
    "python tune_sweep.py --num-samples 64",
]


def job_config(i, submission_id):
    from ray.core.generated import common_pb2

    config = common_pb2.JobConfig()
    config.ray_namespace = str(uuid.UUID(int=i + 1))
    if submission_id:
        config.metadata["job_submission_id"] = submission_id
        config.metadata["job_name"] = submission_id
    config.runtime_env_info.serialized_runtime_env = json.dumps(
        {"env_vars": {"SYNTHETIC_JOB": str(i)}}
    )
    return config


def add_jobs(args, channel, rng, head, agent_port):
    """J finished jobs through the GCS job RPCs; a share of them as job-API
    submissions (their JobInfo in the internal KV)."""
    from ray.core.generated import common_pb2, gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.JobInfoGcsServiceStub(channel)
    kv = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
    from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient, JobStatus

    node_field = address_node_field(common_pb2.Address())
    n_sub = int(round(args.jobs * args.submitted_share))
    t0 = time.monotonic()
    # 1. job ids from the GCS's own counter, as a driver gets its id.
    pending = deque()
    ids = []
    for _ in range(args.jobs):
        pending.append(stub.GetNextJobID.future(gcs_service_pb2.GetNextJobIDRequest(), timeout=60))
        while len(pending) > IN_FLIGHT:
            ids.append(pending.popleft().result().job_id)
    while pending:
        ids.append(pending.popleft().result().job_id)
    log(f"jobs: {len(ids)} job ids from GetNextJobID ({time.monotonic() - t0:.1f} s)")
    # 2. the job rows (and the submissions' JobInfo), 3. each marked finished.
    now_ms = int(time.time() * 1000)
    state = [t0]
    statuses = Counter()
    for i, int_id in enumerate(ids):
        job_id = int_id.to_bytes(4, "little")
        submission_id = None
        if i < n_sub:
            submission_id = "raysubmit_" + "".join(rng.choice(SUBMISSION_ALPHABET) for _ in range(16))
        data = gcs_pb2.JobTableData()
        data.job_id = job_id
        data.is_dead = False
        data.driver_ip_address = "127.0.0.1"
        data.driver_pid = rng.randint(1000, 4_000_000)
        data.config.CopyFrom(job_config(i, submission_id))
        entrypoint = ENTRYPOINTS[i % len(ENTRYPOINTS)]
        set_fields(data, entrypoint=entrypoint, start_time=now_ms, timestamp=now_ms)
        if has_field(data, "driver_address"):
            setattr(data.driver_address, node_field, head.node_id)
            data.driver_address.ip_address = "127.0.0.1"
            data.driver_address.port = agent_port
            data.driver_address.worker_id = random_hex(rng, 28)
        pending.append(stub.AddJob.future(gcs_service_pb2.AddJobRequest(data=data), timeout=60))
        if submission_id:
            roll = rng.random()
            status = (
                JobStatus.SUCCEEDED if roll < 0.8 else JobStatus.FAILED if roll < 0.95 else JobStatus.STOPPED
            )
            statuses[str(status)] += 1
            start = now_ms - rng.randint(60_000, 86_400_000)
            info = {
                "status": status,
                "entrypoint": entrypoint,
                "message": {
                    JobStatus.SUCCEEDED: "Job finished successfully.",
                    JobStatus.FAILED: "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\nTraceback (most recent call last):\n  File \"train.py\", line 12, in <module>\nValueError: synthetic failure",
                    JobStatus.STOPPED: "Job was intentionally stopped.",
                }[status],
                "start_time": start,
                "end_time": start + rng.randint(5_000, 3_600_000),
                "metadata": {"owner": f"user{i % 37}"},
                "runtime_env": {"env_vars": {"SYNTHETIC_JOB": str(i)}},
                "driver_agent_http_address": f"http://127.0.0.1:{agent_port}",
                "driver_node_id": head.node_id.hex(),
                "driver_exit_code": 0 if status == JobStatus.SUCCEEDED else 1,
            }
            fields = set(JobInfo.__dataclass_fields__)
            job_info = JobInfo(**{k: v for k, v in info.items() if k in fields})
            key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=submission_id).encode()
            value = json.dumps(job_info.to_json()).encode()
            put = gcs_service_pb2.InternalKVPutRequest(key=key, value=value, overwrite=True, namespace=b"job")
            pending.append(kv.InternalKVPut.future(put, timeout=60))
        drain(pending, IN_FLIGHT, "AddJob")
        progress("jobs added", i + 1, len(ids), t0, state)
    drain(pending, 0, "AddJob")
    t1 = time.monotonic()
    for int_id in ids:
        req = gcs_service_pb2.MarkJobFinishedRequest(job_id=int_id.to_bytes(4, "little"))
        pending.append(stub.MarkJobFinished.future(req, timeout=60))
        drain(pending, IN_FLIGHT, "MarkJobFinished")
    drain(pending, 0, "MarkJobFinished")
    log(f"jobs: {len(ids)} marked finished ({time.monotonic() - t1:.1f} s)")
    return {"jobs_added": len(ids), "submission_jobs": n_sub, "submission_statuses": dict(statuses)}


def real_jobs(args):
    """A few real jobs through the job API (Ray's dashboard must be up)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(args.dashboard_url)
    ids = [
        client.submit_job(entrypoint=f"python -c 'print({i} * 42)'", metadata={"synthetic": "real"})
        for i in range(args.real_jobs)
    ]
    # A job that has not ended by then will not: on Ray 2.45 the synthetic
    # cluster's jobs stay in "Runtime env is setting up".
    deadline = time.monotonic() + args.real_jobs_wait
    done = {}
    while len(done) < len(ids) and time.monotonic() < deadline:
        for sid in ids:
            if sid not in done:
                status = client.get_job_status(sid)
                if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                    done[sid] = str(status)
        time.sleep(0.5)
    if len(done) < len(ids):
        log(
            f"warning: real jobs not finished within {args.real_jobs_wait:g} s: "
            f"{sorted(set(ids) - set(done))}"
        )
    return done


def run_tasks(args, ray):
    names = ["preprocess", "train_step", "evaluate", "write_shard"]
    funcs = []
    for name in names:

        def task(x=0):
            return x

        task.__name__ = task.__qualname__ = name
        funcs.append(ray.remote(num_cpus=args.task_cpus)(task))
    t0 = time.monotonic()
    state = [t0]
    submitted = done = 0
    batch = max(1, args.task_batch)
    in_flight = deque()  # two batches at most: the next is queued while one runs
    while done < args.tasks:
        while submitted < args.tasks and len(in_flight) < 2:
            n = min(batch, args.tasks - submitted)
            in_flight.append([funcs[(submitted + k) % len(funcs)].remote() for k in range(n)])
            submitted += n
        refs = in_flight.popleft()
        ray.get(refs, timeout=max(120, len(refs) / 5))
        done += len(refs)
        progress("tasks finished", done, args.tasks, t0, state)
    return done


def task_events(channel, timeout=120):
    """What the GCS task-event store holds, once it stops growing."""
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.TaskInfoGcsServiceStub(channel)
    deadline = time.monotonic() + timeout
    last = None
    stable_since = time.monotonic()
    while True:
        reply = stub.GetTaskEvents(gcs_service_pb2.GetTaskEventsRequest(limit=1), timeout=60)
        # The events beyond the limit count as dropped in the reply: not ours.
        now = (
            reply.num_total_stored,
            reply.num_status_task_events_dropped - reply.num_truncated,
        )
        if now != last:
            last = now
            stable_since = time.monotonic()
        elif time.monotonic() - stable_since >= 3:
            break
        if time.monotonic() > deadline:
            log("warning: the task-event store was still changing; counts may be short")
            break
        time.sleep(0.5)
    return {
        "task_events_stored": last[0],
        "task_attempts_dropped": last[1],
    }


def make_actors(args, ray):
    classes = []
    for name in ["TrainWorker", "DataShard", "ReplayBuffer"]:
        cls = type(name, (), {"ping": lambda self: 1, "__module__": "synthetic"})
        classes.append(ray.remote(resources={"never_placed": 1})(cls))
    t0 = time.monotonic()
    state = [t0]
    handles = []
    for i in range(args.actors):
        handles.append(classes[i % len(classes)].remote())
        progress("actors created", i + 1, args.actors, t0, state)
    return handles


def actor_states(channel):
    from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(channel)
    reply = stub.GetAllActorInfo(gcs_service_pb2.GetAllActorInfoRequest(), timeout=120)
    names = {v.number: v.name for v in gcs_pb2.ActorTableData.ActorState.DESCRIPTOR.values}
    return dict(Counter(names.get(a.state, str(a.state)) for a in reply.actor_table_data))


def wait_actors_pending(channel, n, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        states = actor_states(channel)
        if states.get("PENDING_CREATION", 0) >= n or time.monotonic() > deadline:
            return states
        time.sleep(1)


def job_count(channel):
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.JobInfoGcsServiceStub(channel)
    req = gcs_service_pb2.GetAllJobInfoRequest()
    set_fields(req, skip_submission_job_info_field=True, skip_is_running_tasks_field=True)
    reply = stub.GetAllJobInfo(req, timeout=120)
    return len(reply.job_info_list), sum(1 for j in reply.job_info_list if j.is_dead)


def gcs_config(channel):
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
    try:
        reply = stub.GetInternalConfig(gcs_service_pb2.GetInternalConfigRequest(), timeout=30)
        config = json.loads(reply.config or "{}")
    except Exception as e:  # noqa: BLE001 - only informative
        return {"error": str(e)}
    keys = ["task_events_max_num_task_in_gcs", "health_check_period_ms", "health_check_timeout_ms"]
    return {k: config.get(k, "default") for k in keys}


def check_dashboard(url):
    """Ray's job and state APIs with the synthetic rows present."""
    paths = [
        "/api/jobs/",
        "/api/v0/jobs?limit=10000",
        "/api/v0/nodes?limit=10000",
        "/api/v0/actors?limit=100",
        "/api/v0/tasks/summarize",
        "/api/cluster_status",
    ]
    out = {}
    for path in paths:
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(url + path, timeout=120) as resp:
                body = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            body, status = e.read(), e.code
        except Exception as e:  # noqa: BLE001 - reported
            out[path] = {"error": str(e)}
            continue
        entry = {"status": status, "bytes": len(body), "ms": round((time.monotonic() - t0) * 1000)}
        try:
            doc = json.loads(body)
            if isinstance(doc, list):
                entry["items"] = len(doc)
            elif isinstance(doc, dict):
                data = doc.get("data", {})
                result = data.get("result", {}) if isinstance(data, dict) else {}
                if isinstance(result, dict) and "total" in result:
                    entry["total"] = result["total"]
                if doc.get("result") is False:
                    entry["msg"] = str(doc.get("msg"))[:300]
        except ValueError:
            entry["json"] = False
        out[path] = entry
    return out


# --- main ---------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gcs-address", help="the head's GCS, 127.0.0.1:PORT")
    p.add_argument("--nodes", type=int, default=0)
    p.add_argument("--actors", type=int, default=0)
    p.add_argument("--tasks", type=int, default=0)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--submitted-share", type=float, default=0.5,
                   help="share of the synthetic jobs that are job-API submissions (default 0.5)")
    p.add_argument("--dashboard-url", help="Ray's dashboard, for --real-jobs and the API check")
    p.add_argument("--real-jobs", type=int, default=2,
                   help="jobs submitted through the job API (needs --dashboard-url)")
    p.add_argument("--real-jobs-wait", type=float, default=60,
                   help="seconds to wait for the real jobs to end")
    p.add_argument("--task-batch", type=int, default=1000)
    p.add_argument("--task-cpus", type=float, default=0.5,
                   help="num_cpus of each tiny task (0.5: two workers per CPU)")
    p.add_argument("--seed", type=int, default=24)
    p.add_argument("--summary-file", help="also write the summary JSON here")
    p.add_argument("--raylets-bin",
                   help="ray-dashd-bench: its fake-raylets serve the nodes, a port each "
                        "(default: one Python gRPC server for all)")
    p.add_argument("--server-log", help="where the node managers' output goes")
    p.add_argument("--avoid-ports", type=port_list, default=set(),
                   help="ports no synthetic node may take (comma-separated): a Ray head's defaults")
    p.add_argument("--no-hold", action="store_true", help="exit after the summary (the nodes die then)")
    p.add_argument("--max-hold", type=float, default=6 * 3600, help="hold at most this many seconds")
    p.add_argument("--watch-interval", type=float, default=0,
                   help="while holding, check every this many seconds that the nodes are ALIVE (0: never)")
    p.add_argument("--exit-with-parent", action="store_true", help="SIGTERM when the parent dies")
    p.add_argument("--serve-node-managers", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.serve_node_managers:
        return serve_node_managers(args)
    if not args.gcs_address:
        p.error("--gcs-address is required")
    host = args.gcs_address.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        p.error("--gcs-address must be on the loopback interface")
    if args.exit_with_parent:
        exit_with_parent()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    import grpc
    import ray

    rng = random.Random(args.seed)
    summary = {"ray_version": ray.__version__, "pid": os.getpid()}
    timings = {}
    holder, agent_port = closed_port(args.avoid_ports)
    channel = grpc.insecure_channel(args.gcs_address, options=GRPC_OPTIONS)
    # A head with Ray's token authentication: every GCS call carries the
    # token Ray's own clients read, as they send it.
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        channel = grpc.intercept_channel(channel, TokenInterceptor(token))
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
    except grpc.FutureTimeoutError:
        die(f"no GCS at {args.gcs_address}")
    from ray.core.generated import gcs_service_pb2_grpc

    head = head_node(gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel))
    summary["head_node_id"] = head.node_id.hex()
    scratch = tempfile.mkdtemp(prefix="synth.")
    server = None
    try:
        t = time.monotonic()
        infos, loads = build_nodes(args, rng, head, agent_port)
        server, ports = start_node_managers(args, node_stats_reply(), loads, scratch)
        kind = "fake-raylets, a port per node" if args.raylets_bin else "Python gRPC, one port for all"
        summary.update(server_pid=server.pid, node_managers=kind, agent_port=agent_port)
        log(f"node managers up ({kind}, pid {server.pid}); agents at refused port {agent_port}")
        node_ids = register_nodes(channel, infos, ports, agent_port)
        timings["nodes_s"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        ray.init(address=args.gcs_address, namespace="synthetic", log_to_driver=False,
                 logging_level="WARNING")
        timings["driver_s"] = round(time.monotonic() - t, 2)
        # ray.init installs its own handlers (the core worker's): ours again.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        summary["driver_job_id"] = ray.get_runtime_context().get_job_id()
        log(f"driver connected (job {summary['driver_job_id']})")

        t = time.monotonic()
        summary.update(add_jobs(args, channel, rng, head, agent_port) if args.jobs else {"jobs_added": 0})
        timings["jobs_s"] = round(time.monotonic() - t, 2)

        if args.real_jobs and args.dashboard_url:
            t = time.monotonic()
            summary["real_jobs"] = real_jobs(args)
            timings["real_jobs_s"] = round(time.monotonic() - t, 2)
            log(f"real jobs: {summary['real_jobs']}")

        t = time.monotonic()
        summary["tasks_run"] = run_tasks(args, ray) if args.tasks else 0
        timings["tasks_s"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        handles = make_actors(args, ray) if args.actors else []
        summary["actor_states"] = wait_actors_pending(channel, args.actors) if args.actors else {}
        timings["actors_s"] = round(time.monotonic() - t, 2)

        t = time.monotonic()
        summary.update(task_events(channel))
        timings["task_events_settle_s"] = round(time.monotonic() - t, 2)
        alive, dead, all_nodes = count_alive(channel, node_ids)
        summary.update(nodes_registered=len(node_ids), nodes_alive=alive, nodes_dead=dead,
                       nodes_in_gcs=all_nodes)
        summary["jobs_in_gcs"], summary["jobs_finished_in_gcs"] = job_count(channel)
        summary["gcs_config"] = gcs_config(channel)
        if args.dashboard_url:
            summary["api_check"] = check_dashboard(args.dashboard_url)
        timings["total_s"] = round(time.monotonic() - T0, 2)
        summary["timings"] = timings
        summary["node_managers_alive"] = server.poll() is None
    except Exception as e:
        if server is not None:
            server.terminate()
        die(f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    line = json.dumps(summary, sort_keys=True)
    if args.summary_file:
        tmp = args.summary_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(line + "\n")
        os.replace(tmp, args.summary_file)
    print(line, flush=True)
    log(f"built in {timings['total_s']} s; holding until SIGTERM or SIGINT")

    status = 0
    if not args.no_hold:
        deadline = time.monotonic() + args.max_hold
        next_watch = time.monotonic() + args.watch_interval if args.watch_interval > 0 else None
        while not stop.wait(1.0):
            if server.poll() is not None:
                log(f"error: the node-manager gRPC server exited ({server.returncode}); the nodes will die")
                status = 1
                break
            if time.monotonic() > deadline:
                log(f"held for --max-hold {args.max_hold} s; exiting")
                break
            if next_watch is not None and time.monotonic() >= next_watch:
                next_watch += args.watch_interval
                alive, dead, _ = count_alive(channel, node_ids)
                if dead:
                    log(f"warning: {dead} synthetic nodes are DEAD ({alive} alive)")
    log("stopping")
    del handles
    try:
        ray.shutdown()
    except Exception as e:  # noqa: BLE001 - exiting anyway
        log(f"ray.shutdown: {e}")
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(5)
    channel.close()
    holder.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
