#!/usr/bin/env python3
"""Writes the protobuf descriptors ray-dashd compiles, read from an installed Ray.

Run with a Python that has `ray` installed (tests/requirements.txt pins the version):

    target/test-venv/bin/python scripts/ray-protos.py

The wheel ships no `.proto` files, only the generated `*_pb2.py` modules, each of
which registers its file descriptor. This collects the files ray-dashd speaks
(the Ray Client protocol, the GCS services, the runtime env agent) and every file
they import, and writes them as one `FileDescriptorSet` that prost/tonic build from.
"""

import importlib
import pathlib
import sys

import ray
from google.protobuf import descriptor_pb2, descriptor_pool

ROOTS = [
    "ray.core.generated.ray_client_pb2",
    "ray.core.generated.gcs_service_pb2",
    "ray.core.generated.runtime_env_agent_pb2",
]
OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/ray-proto/proto/ray.desc"


def main() -> int:
    for name in ROOTS:
        importlib.import_module(name)
    pool = descriptor_pool.Default()
    ordered, seen = [], set()

    def visit(file_desc):
        if file_desc.name in seen:
            return
        seen.add(file_desc.name)
        for dep in file_desc.dependencies:
            visit(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        file_desc.CopyToProto(proto)
        ordered.append(proto)

    for name in ROOTS:
        visit(sys.modules[name].DESCRIPTOR)
    fds = descriptor_pb2.FileDescriptorSet(file=ordered)
    OUT.write_bytes(fds.SerializeToString(deterministic=True))
    print(f"wrote {OUT} from ray {ray.__version__}: {len(ordered)} files")
    for proto in ordered:
        print(f"  {proto.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
