#!/usr/bin/env python3
"""bench/compare_answers.py: are two dashboards' answers the same?

    compare_answers.py URL_A URL_B PATH...          fetch each PATH from both, compare
    compare_answers.py --save DIR URL PATH...       fetch and keep the answers in DIR
    compare_answers.py --dirs DIR_A DIR_B           compare two saved sets
        [--noise DIR_C]                             DIR_C: A again, later (see below)
    --all                                           also list every differing field

Each answer is compared after parsing: JSON as data, anything else as text,
and the HTTP status too. Lists are compared as multisets (the order of the
items is not compared: two processes can build the same list in another
order, and Ray's web UI sorts what it shows), maps key by key. Fields that
differ between two answers of the same dashboard a few seconds apart
(timestamps, uptimes, live usage, messages) are left out; the built-in list
is `DEFAULT_IGNORE` below (found by comparing Ray's dashboard with itself),
`--ignore PATTERN` adds more (patterns over paths such as
`data.summary[*].raylet.state`: `*` matches anything, `[*]` any list item,
and map keys that are hex ids are `*` too), `--no-default-ignore` drops the built-in
ones. With `--noise DIR_C`, a difference at a path where A and C differ as
well is reported as "volatile" instead (it changes on its own).

With `RAY_AUTH_TOKEN` set (a cluster with Ray's token authentication), it
is sent as `Authorization: Bearer`.

Prints one line per PATH: `same`, or the first difference (its path and both
values, shortened), and exits 1 when any PATH differs (volatile ones do not
count), 2 on a usage error or when a fetch fails. Standard library only.
"""

import argparse
import fnmatch
import gzip
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections import Counter

# Fields that change from one answer to the next on the same dashboard and the
# same cluster (Ray 2.45 to 2.60, measured on the synthetic cluster: Ray's
# dashboard against itself, 5-30 s apart).
DEFAULT_IGNORE = [
    # Every answer's message.
    "msg",
    # /nodes?view=summary: the head's live readings (its agent's report every
    # few seconds), and the live parts of its raylet's stats.
    "data.summary[*].now",
    "data.summary[*].cpu",
    "data.summary[*].cpus",
    "data.summary[*].mem",
    "data.summary[*].shm",
    "data.summary[*].disk",
    "data.summary[*].diskIo",
    "data.summary[*].diskIoSpeed",
    "data.summary[*].network",
    "data.summary[*].networkSpeed",
    "data.summary[*].loadAvg",
    "data.summary[*].cgroupMem",
    "data.summary[*].hostMem",
    "data.summary[*].agent",
    "data.summary[*].gcs",
    "data.summary[*].gpus",
    "data.summary[*].raylet.storeStats",
    "data.summary[*].raylet.coreWorkersStats",
    "data.summary[*].raylet.numWorkers",
    "data.summary[*].raylet.objectStoreUsedMemory",
    "data.summary[*].raylet.objectStoreAvailableMemory",
    "data.summary[*].raylet.stateSnapshot",
    # /api/cluster_status: the autoscaler's report, remade every few seconds
    # (its text has the latest heartbeat times).
    "data.autoscalingStatus",
    "data.clusterStatus.time",
    "data.clusterStatus.gcsRequestTime",
    "data.clusterStatus.nonTerminatedNodesTime",
    "data.clusterStatus.autoscalerUpdateTime",
    # /logical/actors: the live readings of each actor's node and process.
    "data.actors.*.mem",
    "data.actors.*.processStats",
    "data.actors.*.gpus",
]


def fetch(url, timeout):
    headers = {"Accept-Encoding": "identity"}
    # A cluster with Ray's token authentication: the token Ray's CLI reads.
    token = os.environ.get("RAY_AUTH_TOKEN")
    if token:
        headers["Authorization"] = "Bearer " + token.strip()
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, body, encoding = resp.status, resp.read(), resp.headers.get("Content-Encoding")
    except urllib.error.HTTPError as e:
        status, body, encoding = e.code, e.read(), e.headers.get("Content-Encoding")
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    return status, body


def parse(body):
    try:
        return "json", json.loads(body)
    except ValueError:
        return "text", body.decode("utf-8", "replace")


def pattern_path(path):
    """`a.b[3].c` → `a.b[*].c`, and ids as map keys (`data.actors.<hex>`)
    → `*`, for matching and grouping."""
    path = re.sub(r"\[\d+\]", "[*]", path)
    return re.sub(r"\.[0-9a-f]{16,}(?=[.\[]|$)", ".*", path)


class Comparer:
    def __init__(self, ignore):
        # `*` and `?` are the only wildcards: `[*]` means any list item.
        self.ignore = [re.compile(fnmatch.translate(pat.replace("[", "[[]"))) for pat in ignore]

    def ignored(self, path):
        p = pattern_path(path)
        return any(pat.match(p) for pat in self.ignore)

    def normalize(self, value, path=""):
        """The value without ignored fields; lists sorted (as multisets)."""
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                child = f"{path}.{k}" if path else str(k)
                if not self.ignored(child):
                    out[k] = self.normalize(v, child)
            return out
        if isinstance(value, list):
            items = [self.normalize(v, f"{path}[{i}]") for i, v in enumerate(value)]
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
        return value

    def differences(self, a, b, path=""):
        """Every path where normalized a and b differ, with both values, in
        order (a generator: take the first for the first difference)."""
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                child = f"{path}.{k}" if path else str(k)
                if k not in a:
                    yield child, "(missing)", b[k]
                elif k not in b:
                    yield child, a[k], "(missing)"
                else:
                    yield from self.differences(a[k], b[k], child)
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                # Which items one has and the other has not (as multisets).
                ka = Counter(json.dumps(v, sort_keys=True) for v in a)
                kb = Counter(json.dumps(v, sort_keys=True) for v in b)
                only_a, only_b = list((ka - kb).elements()), list((kb - ka).elements())
                yield (
                    f"{path} ({len(a)} vs {len(b)} items)",
                    f"{len(only_a)} only here, first {only_a[0] if only_a else '-'}",
                    f"{len(only_b)} only here, first {only_b[0] if only_b else '-'}",
                )
                return
            for i, (x, y) in enumerate(zip(a, b)):
                yield from self.differences(x, y, f"{path}[{i}]")
        elif a != b:
            yield path or "(top)", a, b

    def first_difference(self, a, b):
        return next(self.differences(a, b), None)

    def compare(self, answer_a, answer_b):
        """None when the same, else (path, a, b)."""
        (status_a, kind_a, doc_a), (status_b, kind_b, doc_b) = answer_a, answer_b
        if status_a != status_b:
            return "(HTTP status)", status_a, status_b
        if kind_a != kind_b:
            return "(type)", kind_a, kind_b
        if kind_a == "text":
            return None if doc_a == doc_b else ("(text)", doc_a, doc_b)
        return self.first_difference(self.normalize(doc_a), self.normalize(doc_b))


def field_of(where):
    """A difference's path as a pattern, without its item counts."""
    return pattern_path(re.sub(r" \(\d+ vs \d+ items\)$", "", where))


def short(value, n=80):
    s = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return s if len(s) <= n else s[: n - 1] + "…"


def save(directory, url, paths, timeout):
    os.makedirs(directory, exist_ok=True)
    index = []
    for i, path in enumerate(paths):
        status, body = fetch(url.rstrip("/") + path, timeout)
        name = f"{i:02d}.body"
        with open(os.path.join(directory, name), "wb") as f:
            f.write(body)
        index.append({"path": path, "status": status, "file": name, "bytes": len(body)})
    with open(os.path.join(directory, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


def load(directory):
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    out = {}
    for entry in index:
        with open(os.path.join(directory, entry["file"]), "rb") as f:
            out[entry["path"]] = (entry["status"], *parse(f.read()))
    return out


def report(comparer, answers_a, answers_b, noise=None, every=False):
    differing = 0
    for path, a in answers_a.items():
        if path not in answers_b:
            print(f"{path}: missing in B")
            differing += 1
            continue
        d = comparer.compare(a, answers_b[path])
        if every and d is not None and a[1] == "json" and answers_b[path][1] == "json":
            # Every differing field, by pattern: what to add to the ignores.
            seen = {}
            for where, va, vb in comparer.differences(
                comparer.normalize(a[2]), comparer.normalize(answers_b[path][2])
            ):
                entry = seen.setdefault(pattern_path(where), [0, va, vb])
                entry[0] += 1
            for where, (n, va, vb) in seen.items():
                print(f"{path}: {n} × {where}: A={short(va, 50)} B={short(vb, 50)}")
        if d is None:
            print(f"{path}: same")
            continue
        where, va, vb = d
        volatile = False
        if noise is not None and path in noise:
            n = comparer.compare(a, noise[path])
            volatile = n is not None and field_of(n[0]) == field_of(where)
        if volatile:
            print(f"{path}: volatile at {where} (A differs from itself there too)")
        else:
            differing += 1
            print(f"{path}: differs at {where}: A={short(va)} B={short(vb)}")
    return differing


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s URL_A URL_B PATH... | --save DIR URL PATH... | --dirs DIR_A DIR_B [--noise DIR_C]",
    )
    p.add_argument("--save", metavar="DIR")
    p.add_argument("--dirs", nargs=2, metavar=("DIR_A", "DIR_B"))
    p.add_argument("--noise", metavar="DIR_C")
    p.add_argument("--ignore", action="append", default=[], metavar="PATTERN")
    p.add_argument("--no-default-ignore", action="store_true")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--all", action="store_true", help="list every differing field (by pattern)")
    p.add_argument("rest", nargs="*")
    args = p.parse_args()
    ignore = ([] if args.no_default_ignore else DEFAULT_IGNORE) + args.ignore
    comparer = Comparer(ignore)
    try:
        if args.save:
            if len(args.rest) < 2:
                p.error("--save DIR URL PATH...")
            save(args.save, args.rest[0], args.rest[1:], args.timeout)
            return 0
        if args.dirs:
            noise = load(args.noise) if args.noise else None
            differing = report(comparer, load(args.dirs[0]), load(args.dirs[1]), noise, args.all)
            return 1 if differing else 0
        if len(args.rest) < 3:
            p.error("URL_A URL_B PATH...")
        url_a, url_b, paths = args.rest[0].rstrip("/"), args.rest[1].rstrip("/"), args.rest[2:]
        answers = []
        for url in (url_a, url_b):
            answers.append({path: (lambda s, b: (s, *parse(b)))(*fetch(url + path, args.timeout)) for path in paths})
        return 1 if report(comparer, answers[0], answers[1], None, args.all) else 0
    except (OSError, urllib.error.URLError, ValueError) as e:
        print(f"compare_answers: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
