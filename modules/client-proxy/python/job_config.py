"""Reads a client's pickled JobConfig (stdin) and prints, as one JSON line,
what the runtime env agent needs: the serialized runtime env and the
serialized RuntimeEnvConfig (base64). Run by ray-dashd-client-proxy with the
Python that has `ray` installed; the pickle comes from the client's `init`."""

import base64
import json
import pickle
import sys

from ray.job_config import JobConfig

data = sys.stdin.buffer.read()
job_config = pickle.loads(data) if data else JobConfig()
if not isinstance(job_config, JobConfig):
    raise SystemExit(f"the init's job_config is a {type(job_config).__name__}, not a JobConfig")
config = job_config._get_proto_runtime_env_config()
json.dump(
    {
        "serialized_runtime_env": job_config._get_serialized_runtime_env(),
        "runtime_env_config": base64.b64encode(config.SerializeToString()).decode(),
    },
    sys.stdout,
)
