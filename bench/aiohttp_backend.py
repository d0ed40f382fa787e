#!/usr/bin/env python3
"""Benchmark backend module for ray-dashd: a plain aiohttp app, as Ray's
dashboard modules are, serving HTTP on the Unix socket named by
RAY_DASHD_SOCKET (or --socket).

Routes:
  GET /api/healthz           200 "success" (ray-dashd's readiness/health probe)
  GET /bench/small           a ~100-byte JSON document
  GET /bench/stream?bytes=N  N bytes (default 1 GiB), chunked, in 64 KiB writes
  GET /bench/ws              websocket echo (text and binary)

`--prefix /bench3` serves the three /bench routes under /bench3 instead, so
that several of these modules can run under one host (bench/conn_scale.sh).

Access logging is off: the benchmark measures the proxy, not log writes.
"""

import argparse
import json
import os
import sys

from aiohttp import WSMsgType, web

CHUNK = 64 * 1024
DEFAULT_STREAM_BYTES = 1 << 30

SMALL = json.dumps(
    {
        "result": True,
        "msg": "small benchmark response",
        "data": {"module": "bench", "pid": os.getpid(), "items": [1, 2, 3]},
    }
).encode()


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="success")


async def small(_request: web.Request) -> web.Response:
    return web.Response(body=SMALL, content_type="application/json")


async def stream(request: web.Request) -> web.StreamResponse:
    try:
        remaining = int(request.query.get("bytes", DEFAULT_STREAM_BYTES))
    except ValueError:
        raise web.HTTPBadRequest(text="bytes must be an integer")
    if remaining < 0:
        raise web.HTTPBadRequest(text="bytes must not be negative")
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    chunk = b"x" * CHUNK
    view = memoryview(chunk)
    while remaining > 0:
        n = min(CHUNK, remaining)
        await response.write(chunk if n == CHUNK else view[:n].tobytes())
        remaining -= n
    await response.write_eof()
    return response


async def ws_echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
    await ws.prepare(request)
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            await ws.send_str(msg.data)
        elif msg.type == WSMsgType.BINARY:
            await ws.send_bytes(msg.data)
        elif msg.type == WSMsgType.ERROR:
            break
    return ws


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=os.environ.get("RAY_DASHD_SOCKET"))
    parser.add_argument("--prefix", default="/bench", help="path prefix of the /bench routes")
    args = parser.parse_args()
    prefix = args.prefix.rstrip("/")
    if not args.socket:
        print("aiohttp_backend: set RAY_DASHD_SOCKET or pass --socket", file=sys.stderr)
        return 64
    app = web.Application()
    app.router.add_get("/api/healthz", healthz)
    app.router.add_get(f"{prefix}/small", small)
    app.router.add_get(f"{prefix}/stream", stream)
    app.router.add_get(f"{prefix}/ws", ws_echo)
    print(f"aiohttp_backend pid={os.getpid()} socket={args.socket}", flush=True)
    # run_app turns SIGTERM/SIGINT into a graceful stop, which is how
    # ray-dashd stops a module.
    web.run_app(app, path=args.socket, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
