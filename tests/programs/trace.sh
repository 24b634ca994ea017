#!/usr/bin/env bash
# The timeline trace of a 2-rank lockstep-train run (--trace, --trace-steps):
# each rank's file is valid trace-event JSON (checked here against the format's
# rules, independently of tools/trace.py: every event has a string name and ph,
# a numeric ts, integer pid and tid; ph in the allowed set; complete events
# have dur >= 0; instants a scope g, p or t; metadata events are process_name
# or thread_name with args.name, naming the process and every thread), holds
# the expected spans within the window only, and tools/trace.py merge and
# summary and tools/plot.py trace read it; so is bench_scaling's trace. Bad
# window flags are refused.
# Usage: trace.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
train=$build/examples/train/lockstep-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "trace.sh: $*" >&2; exit 1; }
source "$(dirname "$0")/synthetic_shards.sh"
synthetic_shards "$build" "$work" 512 64

# 8 steps an epoch, 2 epochs; the window 3:9 holds the evaluation and the save after step 8.
mpirun -np 2 --oversubscribe "$train" --data "$work/train" --val-data "$work/val" --model mlp \
  --device cpu --batch-size 32 --epochs 2 --checkpoint-dir "$work/ck" --checkpoint-every 8 \
  --log-every 1000 --trace "$work/tr" --trace-steps 3:9 >"$work/out"
grep -qF "trace: $work/tr/rank-0.json" "$work/out" || { cat "$work/out" >&2; fail "no trace line"; }

/usr/bin/python3 - "$work/tr" <<'PY'
import json, sys
d = sys.argv[1]
for rank in (0, 1):
    path = f"{d}/rank-{rank}.json"
    trace = json.load(open(path))
    events = trace["traceEvents"]
    assert isinstance(events, list) and events, path
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns"), path
    threads, processes = {}, {}
    for e in events:
        for key, kind in (("name", str), ("ph", str), ("ts", (int, float)), ("pid", int),
                          ("tid", int)):
            assert isinstance(e.get(key), kind) and not isinstance(e.get(key), bool), (path, key, e)
        assert isinstance(e.get("cat", ""), str) and isinstance(e.get("args", {}), dict), (path, e)
        assert e["ph"] in ("X", "i", "M"), (path, e)
        assert e["pid"] == rank, (path, e)
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, (path, e)
        if e["ph"] == "i":
            assert e.get("s", "t") in ("g", "p", "t"), (path, e)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name"), (path, e)
            assert isinstance(e["args"]["name"], str), (path, e)
            (threads if e["name"] == "thread_name" else processes)[e["tid"]] = e["args"]["name"]
    assert list(processes.values()) == [f"rank {rank}"], (path, processes)
    for e in events:
        assert e["tid"] in threads, (path, "a thread without a name", e)
    assert threads[0] == "main", (path, threads)
    assert any(n.startswith("loader ") for n in threads.values()), (path, threads)
    named = [e for e in events if e["ph"] != "M"]
    names = {e["name"] for e in named}
    for want in ("step", "data wait", "forward", "backward", "forward fc1", "backward fc1",
                 "forward loss", "backward loss", "bucket 0 ready", "allreduce bucket 0", "gradient sync wait", "unscale and measure",
                 "agreement", "decide and schedule", "optimizer", "evaluate", "load batch"):
        assert want in names, (path, want, sorted(names))
    assert "checkpoint save" in names, (path, "the save after step 8")
    steps = {e["args"]["step"] for e in named}
    assert steps <= set(range(3, 10)), (path, "events outside the window 3:9", sorted(steps))
    spans = [e for e in named if e["name"] == "step"]
    assert len(spans) == 7 + 1, (path, "steps 3..9 and the epoch's end", len(spans))
    # Nesting: each step's forward lies within its step span (the epoch's end, a call
    # that found no batch, is a step span of its own).
    for f in (e for e in named if e["name"] == "forward" and e["cat"] == "compute"):
        assert any(s["args"]["step"] == f["args"]["step"] and s["ts"] <= f["ts"]
                   and f["ts"] + f["dur"] <= s["ts"] + s["dur"] + 1e-3 for s in spans), (path, f)
    assert trace["otherData"]["rank"] == rank and trace["otherData"]["dropped_events"] == 0
print("trace files valid")
PY

/usr/bin/python3 "$src/tools/trace.py" merge "$work/tr" -o "$work/all.json" >"$work/merge"
grep -qF "events of 2 ranks" "$work/merge" || { cat "$work/merge" >&2; fail "merge"; }
/usr/bin/python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))
assert {e['pid'] for e in t['traceEvents']} == {0, 1}
assert sorted(t['otherData']['offsets_us']) == ['0', '1']" "$work/all.json"
/usr/bin/python3 "$src/tools/trace.py" summary "$work/tr" >"$work/summary"
for want in "2 ranks" "rank 0: 7 steps (3..9)" "rank 1: 7 steps (3..9)" "  compute" \
  "  exposed comm" "  data wait" "  optimizer" "straggler" "  step 3: rank"; do
  grep -qF -- "$want" "$work/summary" || { cat "$work/summary" >&2; fail "no '$want' in the summary"; }
done
# The Gantt chart of three steps: a lane per rank and thread with spans there, a PNG.
/usr/bin/python3 "$src/tools/plot.py" trace "$work/tr" --steps 4:6 -o "$work/gantt.png" >"$work/plot"
grep -qE "^([2-9]|1[0-9]) lanes, steps 4..6, in " "$work/plot" || { cat "$work/plot" >&2; fail "plot.py trace"; }
head -c 8 "$work/gantt.png" | od -An -c | grep -q "P   N   G" || fail "plot.py trace wrote no PNG"

# Bad windows and a window without a trace are refused while parsing.
for bad in "9:3" "0:5" "x" "3"; do
  if "$train" --data "$work/train" --device cpu --trace "$work/t2" --trace-steps "$bad" \
    >/dev/null 2>"$work/err"; then fail "--trace-steps $bad was accepted"; fi
  grep -qF -- "--trace-steps" "$work/err" || { cat "$work/err" >&2; fail "message for $bad"; }
done
if "$train" --data "$work/train" --device cpu --trace-steps 1:2 >/dev/null 2>"$work/err"; then
  fail "--trace-steps without --trace was accepted"
fi
# "--trace" itself, not only as the start of "--trace-steps".
grep -qE -- '--trace([^-]|$)' "$work/err" || { cat "$work/err" >&2; fail "message for a lone --trace-steps"; }
# bench_scaling traces its steps with the same names, where the benchmarks are built.
if [ -x "$build/bench/bench_scaling" ]; then
  mpirun -np 2 --oversubscribe "$build/bench/bench_scaling" --model mlp --batch 16 --steps 3 \
    --trials 1 --link false --mode weak --trace "$work/bs" --trace-steps 2:4 >"$work/bs.out"
  /usr/bin/python3 "$src/tools/trace.py" summary "$work/bs" >"$work/bs.summary"
  grep -qF "rank 1: 3 steps (2..4)" "$work/bs.summary" || { cat "$work/bs.summary" >&2; fail "bench_scaling trace"; }
  grep -qF "  step 2: rank" "$work/bs.summary" || { cat "$work/bs.summary" >&2; fail "bench_scaling straggler"; }
fi
echo "trace.sh: ok"
