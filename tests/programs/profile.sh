#!/usr/bin/env bash
# What lockstep-train says about where a step's time goes, against the trace of
# the same 2-rank run (--trace, whose default window 1: holds the same spans
# as --profile): every row of the --profile table has its name's count, total
# and max of rank 0's trace events; every step record's breakdown in the
# --metrics file is the sum of rank 0's spans of that part within that step;
# the parts fit in the step; the progress line and the summary state the
# breakdown and each rank's peak memory. Usage: profile.sh BUILD_DIR
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "profile.sh: $*" >&2; exit 1; }
source "$(dirname "$0")/synthetic_shards.sh"
synthetic_shards "$build" "$work" 512 64

# 8 steps an epoch, 2 epochs, an evaluation after each and a save at the end.
mpirun -np 2 --oversubscribe "$train" --data "$work/train" --val-data "$work/val" --model mlp \
  --device cpu --batch-size 32 --epochs 2 --checkpoint-dir "$work/ck" --log-every 4 \
  --metrics "$work/m.jsonl" --trace "$work/tr" --profile >"$work/out"

/usr/bin/python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
out = open(f"{work}/out").read()
events = [e for e in json.load(open(f"{work}/tr/rank-0.json"))["traceEvents"] if e["ph"] == "X"]

# The progress line: step 4 holds the breakdown and rank 0's peak memory.
line = next(l for l in out.splitlines() if l.startswith("step 4/16 "))
assert re.search(r"  data \d+\.\d\d  compute \d+\.\d\d  comm \d+\.\d\d  opt \d+\.\d\d ms "
                 r"\(of \d+\.\d\d\)  peak \d+\.\d (KiB|MiB) on cpu$", line), line
assert re.search(r"memory       peak rank 0 \d+\.\d MiB on cpu, rank 1 \d+\.\d MiB on cpu", out), out

# The table: a header, then one row per span name, by total, largest first.
head = out.index("profile of rank 0: spans by name over ")
table = out[head:].splitlines()
wall_ms = 1e3 * float(re.match(r"profile of rank 0: spans by name over (\d+\.\d+) s", table[0])[1])
assert re.match(r"span +count +total ms +mean ms +max ms +% of run$", table[1]), table[1]
rows = {}
for text in table[2:]:
    m = re.match(r"(.+?) +(\d+) +(\d+\.\d{3}) +(\d+\.\d{3}) +(\d+\.\d{3}) +(\d+\.\d)$", text)
    if not m:
        break
    rows[m[1]] = [float(v) for v in m.groups()[1:]]
totals = [r[1] for r in rows.values()]
assert totals == sorted(totals, reverse=True), totals
by_name = {}
for e in events:
    by_name.setdefault(e["name"], []).append(e["dur"] / 1e3)
# The same spans: every name of the trace is a row and the other way round.
assert set(rows) == set(by_name), (sorted(rows), sorted(by_name))
for name, (count, total, mean, peak, percent) in rows.items():
    durs = by_name[name]
    # The table prints ms to 3 decimals: 0.0005 ms of rounding, plus the sum's.
    assert count == len(durs), (name, count, len(durs))
    assert abs(total - sum(durs)) <= 0.0006, (name, total, sum(durs))
    assert abs(peak - max(durs)) <= 0.0006, (name, peak, max(durs))
    assert abs(mean - sum(durs) / count) <= 0.0006, (name, mean)
    # A name of the main thread alone cannot take more than the whole run.
    main_only = all(e["tid"] == 0 for e in events if e["name"] == name)
    assert 0 <= percent and (percent <= 100.05 or not main_only), (name, percent)
for want in ("step", "data wait", "forward", "backward", "forward fc1", "gradient sync wait",
             "unscale and measure", "agreement", "decide and schedule", "optimizer", "evaluate",
             "checkpoint save"):
    assert want in rows, (want, sorted(rows))
assert rows["step"][0] == 16 + 1, "16 steps and the call at the first epoch's end"
assert rows["step"][1] <= wall_ms + 0.5, (rows["step"], wall_ms)  # the wall is printed to 1 ms

# Every step record's breakdown is its step's spans of each part, summed.
parts = {"data_wait_ms": ("data wait",), "compute_ms": ("forward", "backward"),
         "exposed_comm_ms": ("gradient sync wait", "agreement"),
         "optimizer_ms": ("unscale and measure", "decide and schedule", "optimizer")}
records = [json.loads(l) for l in open(f"{work}/m.jsonl")]
steps = [r for r in records if "loss" in r]
assert len(steps) == 16, len(steps)
for r in steps:
    # The last "step" span of that number: the first epoch's end also made one (no batch).
    span = [e for e in events if e["name"] == "step" and e["args"]["step"] == r["step"]][-1]
    inside = [e for e in events if span["ts"] <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 1e-3]
    for key, names in parts.items():
        want = sum(e["dur"] for e in inside if e["name"] in names) / 1e3
        # The metrics print ms to 4 decimals.
        assert abs(r[key] - want) <= 0.0001, (r["step"], key, r[key], want)
    assert sum(r[k] for k in parts) <= r["step_ms"] + 0.0002, r
    assert r["compute_ms"] > 0 and r["peak_memory_bytes"] > 0, r
end = records[-1]
assert end["run"] == "end" and len(end["peak_memory_bytes"]) == 2, end
# A running peak: rank 0's at the end is at least its peak at every step.
assert end["peak_memory_bytes"][0] >= max(r["peak_memory_bytes"] for r in steps), end
print("profile table and breakdown match the trace")
PY
echo "profile.sh: ok"
