#!/usr/bin/env python3
"""Who had the CPU, and when: samples every process's CPU time from /proc.

Writes one JSON object a line to --out: every --interval seconds, the
time since start, the run queue (procs_running), and each process that
used CPU in the interval (pid, short name, milliseconds used). Stops after
--duration seconds. bench/ray_scale.sh runs it beside each load, so that a
moment when every route slowed at once can be put down to a process.

`--summary FILE --at S --window W` (or `--slowest-of LOAD_JSON`, around
the slowest poll of a poll-mix report) reads such a file back and prints, as
JSON: the CPU used over the whole trace by the dashboard's tree (the
descendants of --tree PID, given when tracing) and by every other process,
grouped by program; how much of the time all the CPUs were busy; and the
processes that used the most CPU between S - W and S + W, busiest first.
"""

import argparse
import json
import os
import time


def cpu_ticks():
    """{pid: (name, utime + stime, ppid)} for every process readable now."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        # The name is in parentheses and may hold spaces or parentheses.
        close = stat.rfind(")")
        name = stat[stat.find("(") + 1 : close]
        fields = stat[close + 2 :].split()
        out[int(entry.name)] = (name, int(fields[11]) + int(fields[12]), int(fields[1]))
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return ""
    return " ".join(w.decode("utf-8", "replace") for w in words if w)[:160]


def procs_running():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return -1


def in_tree(pid, root, procs):
    """Whether pid is root or one of its descendants (by the ppid chain)."""
    for _ in range(64):
        if pid == root:
            return True
        if pid not in procs or pid <= 1:
            return False
        pid = procs[pid][2]
    return False


def trace(out, interval, duration, root):
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    names = {}
    tree = set()
    start = time.monotonic()
    before = cpu_ticks()
    with open(out, "w") as f:
        while (now := time.monotonic()) - start < duration:
            time.sleep(max(0.0, interval - (now - start) % interval))
            after = cpu_ticks()
            used = []
            for pid, (name, ticks, _) in after.items():
                delta = ticks - before.get(pid, (name, ticks))[1]
                if delta > 0:
                    if pid not in names:
                        names[pid] = cmdline(pid) or name
                        if root and in_tree(pid, root, after):
                            tree.add(pid)
                    used.append({"pid": pid, "name": name, "ms": round(delta * tick_ms)})
            used.sort(key=lambda u: -u["ms"])
            f.write(json.dumps({"t": round(time.monotonic() - start, 3),
                                "running": procs_running(), "used": used}) + "\n")
            before = after
        f.write(json.dumps({"cmdlines": {str(p): c for p, c in names.items()},
                            "tree": sorted(tree), "cpus": os.cpu_count()}) + "\n")


def program(cmd):
    """A short name for a command line: Ray's process titles, else the program."""
    for word in cmd.split():
        if word.startswith(("ray::", "ray-dashboard-")):
            return word.split("(")[0]
    words = [w for w in cmd.split() if not w.startswith("-")]
    for w in words[1:3]:
        if w.endswith(".py"):
            return os.path.basename(w)
    if not words:
        return "?"
    name = os.path.basename(words[0])
    # The bench's tool names its part by its first argument.
    return f"{name} {words[1]}" if name == "ray-dashd-bench" and len(words) > 1 else name


def summary(path, at, window):
    rows = [json.loads(line) for line in open(path)]
    meta = rows[-1] if rows and "cmdlines" in rows[-1] else {}
    cmdlines, tree = meta.get("cmdlines", {}), set(meta.get("tree", []))
    cpus = meta.get("cpus", os.cpu_count())
    total, near, running = {}, {}, []
    busy = samples = last = 0
    for row in rows:
        if "t" not in row:
            continue
        samples += 1
        # A sample can come late (the CPUs were busy): its interval is
        # the time since the last one.
        busy += sum(u["ms"] for u in row["used"]) >= 0.9 * cpus * (row["t"] - last) * 1000
        last = row["t"]
        inside = at - window <= row["t"] <= at + window
        for u in row["used"]:
            total[u["pid"]] = total.get(u["pid"], 0) + u["ms"]
            if inside:
                near[u["pid"]] = near.get(u["pid"], 0) + u["ms"]
        if inside:
            running.append(row["running"])
    groups = {}
    for pid, ms in total.items():
        name = "the dashboard's tree" if pid in tree else program(cmdlines.get(str(pid), ""))
        groups[name] = groups.get(name, 0) + ms
    busiest = sorted(near.items(), key=lambda kv: -kv[1])[:8]
    print(json.dumps({
        "samples": samples,
        "all_cpus_busy_share": round(busy / samples, 3) if samples else None,
        "cpu_s": {k: round(v / 1000, 1) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])[:8]},
        "around": {"from_s": at - window, "to_s": at + window,
                   "max_running": max(running, default=None),
                   "busiest": [{"ms": ms, "tree": pid in tree,
                                "program": program(cmdlines.get(str(pid), ""))}
                               for pid, ms in busiest]}}))


def slowest_poll(load):
    """(at, window) covering the slowest poll of the mix in a poll-mix
    report: from when it was asked to when it was answered, 1.5 s each
    side at least."""
    polls = [s for e in json.load(open(load))["endpoints"] if e.get("kind") == "mix"
             for s in e.get("slowest", [])]
    slow = max(polls, key=lambda s: s["ms"], default={"at_s": 0, "ms": 0})
    return slow["at_s"] + slow["ms"] / 2000, max(1.5, slow["ms"] / 2000)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--summary")
    p.add_argument("--at", type=float, default=0)
    p.add_argument("--window", type=float, default=1.5)
    p.add_argument("--slowest-of", metavar="LOAD_JSON",
                   help="around the slowest mix poll of this poll-mix report (instead of --at, --window)")
    p.add_argument("--tree", type=int, default=0, help="the dashboard's pid")
    a = p.parse_args()
    if a.summary:
        at, window = slowest_poll(a.slowest_of) if a.slowest_of else (a.at, a.window)
        summary(a.summary, at, window)
    elif a.out:
        trace(a.out, a.interval, a.duration, a.tree)
    else:
        p.error("--out or --summary")


if __name__ == "__main__":
    main()
