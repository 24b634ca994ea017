#!/usr/bin/env python3
"""Reads the timeline traces (rank-<r>.json, written by lockstep-train --trace DIR or any program
that calls core::trace::enable) in DIR.

    python3 tools/trace.py merge DIR -o all.json   # one file, ranks' clocks aligned (Perfetto)
    python3 tools/trace.py summary DIR             # per rank: where each step's time went, and
                                                   # which rank the others waited for
    python3 tools/trace.py top DIR [--rank R]      # rank R's spans by name, the longest first:
                                                   # mean ms per step and calls per step

GPU spans (args.gpu, on a track per CUDA stream) time the device's work. summary keeps them
apart from the host's spans, which are the step breakdown and the collectives' arrivals: it
adds them up per step by category as gpu compute (the modules' and the optimizer's kernels),
gpu comm (the collectives) and gpu copy (host-to-device copies), the time each stream was busy.

Clocks are aligned by each rank's clock_sync moment, taken right after a barrier when tracing
started: a rank's offset is its clock_sync minus rank 0's.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

from jsonl import InputError, read_json  # tools/jsonl.py

PHASES = {"X", "i", "I", "M", "B", "E", "C"}
# What summary adds up per step, by span name (the spans of engine/trainer.cpp).
KINDS = {"compute": ("forward", "backward"),
         "exposed comm": ("gradient sync wait", "agreement"),
         "data wait": ("data wait",),
         "optimizer": ("unscale and measure", "decide and schedule", "optimizer")}
# What summary adds up per step from the GPU spans, by category.
GPU_KINDS = {"gpu compute": ("module", "compute", "optimizer"),
             "gpu comm": ("comm",),
             "gpu copy": ("data",)}


def load(path):
    trace = read_json(path, "JSON trace")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise InputError(f"{path}: no traceEvents list (is it a lockstep trace?)")
    other = trace.get("otherData")
    if not isinstance(other, dict) or not isinstance(other.get("clock_sync_us"), (int, float)) \
            or not isinstance(other.get("rank"), int):
        raise InputError(f"{path}: otherData lacks rank and clock_sync_us (is it a lockstep trace?)")
    for n, e in enumerate(trace["traceEvents"]):
        if not isinstance(e, dict):
            raise InputError(f"{path}: event {n} is not an object")
        for key, kind in (("name", str), ("ph", str), ("ts", (int, float)), ("pid", int),
                          ("tid", int)):
            if not isinstance(e.get(key), kind):
                raise InputError(f"{path}: event {n} has no valid '{key}'")
        if e["ph"] not in PHASES:
            raise InputError(f"{path}: event {n} has phase '{e['ph']}', not one of {sorted(PHASES)}")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            raise InputError(f"{path}: complete event {n} ('{e['name']}') has no duration >= 0")
    return trace


def load_dir(directory):
    paths = glob.glob(os.path.join(directory, "rank-*.json"))
    paths = [p for p in paths if re.fullmatch(r"rank-\d+\.json", os.path.basename(p))]
    if not paths:
        raise InputError(f"{directory}: no rank-<r>.json files (write them with --trace {directory})")
    traces = {}
    for p in paths:
        t = load(p)
        rank = t["otherData"]["rank"]
        if rank in traces:
            raise InputError(f"{p}: rank {rank} appears twice in {directory}")
        traces[rank] = t
    base = traces[min(traces)]["otherData"]["clock_sync_us"]
    offsets = {r: t["otherData"]["clock_sync_us"] - base for r, t in traces.items()}
    return dict(sorted(traces.items())), offsets


def merge(directory, out):
    traces, offsets = load_dir(directory)
    events = []
    for rank, t in traces.items():
        for e in t["traceEvents"]:
            e = dict(e)
            if e["ph"] != "M":
                e["ts"] = round(e["ts"] - offsets[rank], 3)
            events.append(e)
    dropped = sum(t["otherData"].get("dropped_events", 0) for t in traces.values())
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"ranks": sorted(traces), "offsets_us": offsets,
                                 "dropped_events": dropped}}, f)
    print(f"{out}: {len(events)} events of {len(traces)} ranks; clock offsets "
          + ", ".join(f"rank {r} {o / 1e3:+.3f} ms" for r, o in offsets.items()))


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def step_of(e):
    args = e.get("args")
    return args.get("step") if isinstance(args, dict) else None


def is_gpu(e):
    args = e.get("args")
    return isinstance(args, dict) and args.get("gpu") is True


def summary(directory):
    traces, offsets = load_dir(directory)
    print(f"{len(traces)} ranks; times per step in ms: mean / p50 / p99")
    arrivals = {}  # (step, collective name, occurrence) -> {rank: aligned start}
    for rank, t in traces.items():
        per_step = {}
        gpu_kinds = set()
        seen = {}
        for e in t["traceEvents"]:
            if e["ph"] != "X" or step_of(e) is None:
                continue
            step = step_of(e)
            if is_gpu(e):
                for kind, categories in GPU_KINDS.items():
                    if e.get("cat") in categories:
                        gpu_kinds.add(kind)
                        per_step.setdefault(step, dict.fromkeys(KINDS, 0.0)).setdefault(kind, 0.0)
                        per_step[step][kind] += e["dur"] / 1e3
                continue
            for kind, names in KINDS.items():
                if e["name"] in names:
                    per_step.setdefault(step, dict.fromkeys(KINDS, 0.0))[kind] += e["dur"] / 1e3
            if e.get("cat") == "comm" and e["name"] not in KINDS["exposed comm"]:
                n = seen.get((step, e["name"]), 0)
                seen[(step, e["name"])] = n + 1
                arrivals.setdefault((step, e["name"], n), {})[rank] = e["ts"] - offsets[rank]
        steps = sorted(per_step)
        print(f"rank {rank}: {len(steps)} steps ({steps[0]}..{steps[-1]})" if steps
              else f"rank {rank}: no steps traced")
        for kind in list(KINDS) + [k for k in GPU_KINDS if k in gpu_kinds]:
            v = [per_step[s].get(kind, 0.0) for s in steps]
            if v:
                print(f"  {kind:<13} {statistics.mean(v):9.3f} {percentile(v, 50):9.3f} "
                      f"{percentile(v, 99):9.3f}")
    # Note [straggler]: each collective's last rank made the others wait (last - first arrival);
    # a step's straggler is the rank whose waits add up to the most. Counting collectives alone
    # would blame the wrong rank: after one rank arrives 90 ms late to a step's first allreduce,
    # the ranks leave it together and reach the next ones in an order that is a coin toss.
    last = {}  # step -> {rank: [collectives it was last to, ms the others waited, largest wait]}
    for (step, name, n), starts in arrivals.items():
        if len(starts) < 2:
            continue
        rank = max(starts, key=starts.get)
        wait = (max(starts.values()) - min(starts.values())) / 1e3
        figures = last.setdefault(step, {}).setdefault(rank, [0, 0.0, 0.0])
        figures[0] += 1
        figures[1] += wait
        figures[2] = max(figures[2], wait)
    if not last:
        print("straggler: no collective was traced on two or more ranks")
        return
    print("straggler (the rank the others waited for longest at a step's collectives):")
    counts = {}
    for step in sorted(last):
        rank = max(last[step], key=lambda r: last[step][r][1])
        collectives, wait, largest = last[step][rank]
        counts[rank] = counts.get(rank, 0) + 1
        print(f"  step {step}: rank {rank}, last to {collectives} of "
              f"{sum(f[0] for f in last[step].values())} collectives, up to {largest:.3f} ms "
              "behind")
    print("  " + ", ".join(f"rank {r} last at {c} of {len(last)} steps"
                           for r, c in sorted(counts.items())))


def top(directory, rank, count):
    """Rank `rank`'s spans grouped by (device, name): mean ms and calls per traced step, the
    longest first. Spans nest (a block holds its layers), so the rows do not add up to the step."""
    traces, _ = load_dir(directory)
    if rank not in traces:
        raise InputError(f"{directory} has no trace of rank {rank} (ranks: {sorted(traces)})")
    totals, calls, steps = {}, {}, set()
    for e in traces[rank]["traceEvents"]:
        if e["ph"] != "X" or step_of(e) is None:
            continue
        steps.add(step_of(e))
        key = ("gpu" if is_gpu(e) else "host", e["name"])
        totals[key] = totals.get(key, 0.0) + e["dur"] / 1e3
        calls[key] = calls.get(key, 0) + 1
    if not steps:
        print(f"rank {rank}: no steps traced")
        return
    n = len(steps)
    print(f"rank {rank}, {n} steps: ms per step (mean), calls per step, span")
    for key in sorted(totals, key=totals.get, reverse=True)[:count]:
        print(f"  {totals[key] / n:9.3f} {calls[key] / n:7.1f}  {key[0]:<4} {key[1]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge the ranks' traces into one file")
    m.add_argument("dir", help="the directory holding rank-<r>.json")
    m.add_argument("-o", "--output", required=True, help="the merged trace to write")
    s = sub.add_parser("summary", help="per-rank step breakdown and stragglers")
    s.add_argument("dir", help="the directory holding rank-<r>.json")
    t = sub.add_parser("top", help="one rank's spans by name, the longest first")
    t.add_argument("dir", help="the directory holding rank-<r>.json")
    t.add_argument("--rank", type=int, default=0, help="whose trace (default 0)")
    t.add_argument("--count", type=int, default=30, help="how many rows (default 30)")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            merge(args.dir, args.output)
        elif args.command == "top":
            top(args.dir, args.rank, args.count)
        else:
            summary(args.dir)
    except InputError as e:
        print(f"trace.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
