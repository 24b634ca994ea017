"""tools/trace.py on traces written here: clock alignment in merge and summary (rank 1's clock
runs 1 s ahead; it arrives 2 ms late to every collective of step 2, so the straggler there is
rank 1 and elsewhere rank 0), the per-step sums against hand-computed figures, and bad input
named by file; tools/plot.py trace's lanes (the same alignment) and its Gantt PNG. The end-to-end run on a real trace is programs_trace. Run by ctest (tools_python)."""
import json
import os
import tempfile
import unittest

import plot
import trace as trace_tool
from fixtures import run_main
from jsonl import InputError


def span(name, cat, ts, dur, rank, step, tid=0):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": rank, "tid": tid,
            "args": {"step": step}}


def rank_trace(rank, clock, late_step):
    events = [{"name": "thread_name", "ph": "M", "ts": 0, "pid": rank, "tid": 0,
               "args": {"name": "main"}}]
    for step in (1, 2, 3):
        t = clock + step * 100_000.0
        late = 2000.0 if step == late_step else 0.0
        events += [span("data wait", "data", t, 10, rank, step),
                   span("forward", "compute", t + 10, 300, rank, step),
                   span("backward", "compute", t + 310, 600, rank, step),
                   span("allreduce bucket 0", "comm", t + 950 + late + (rank == 0) * 5, 40, rank, step),
                   span("gradient sync wait", "comm", t + 910, 80 + late, rank, step),
                   span("optimizer", "optimizer", t + 1000 + late, 50, rank, step),
                   span("allreduce", "comm", t + 1060 + late + (rank == 0) * 5, 5, rank, step),
                   span("agreement", "comm", t + 1055 + late, 20, rank, step)]
    return {"traceEvents": events, "otherData": {"rank": rank, "clock_sync_us": clock,
                                                 "dropped_events": 0}}


class TraceToolTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.write(0, rank_trace(0, 5_000_000.0, None))
        self.write(1, rank_trace(1, 6_000_000.0, 2))

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rank, trace, name=None):
        with open(os.path.join(self.dir, name or f"rank-{rank}.json"), "w") as f:
            json.dump(trace, f)

    def run_tool(self, *argv):
        return run_main(trace_tool.main, list(argv))

    def test_merge_aligns_clocks(self):
        out_path = os.path.join(self.dir, "..", os.path.basename(self.dir) + "-all.json")
        rc, out, _ = self.run_tool("merge", self.dir, "-o", out_path)
        self.assertEqual(rc, 0)
        self.assertIn("rank 1 +1000.000 ms", out)
        with open(out_path) as f:
            merged = json.load(f)
        os.remove(out_path)
        data = {(e["pid"], e["args"]["step"]): e["ts"] for e in merged["traceEvents"]
                if e["name"] == "data wait"}
        self.assertEqual(data[(0, 1)], 5_100_000.0)
        self.assertEqual(data[(1, 1)], 5_100_000.0)  # 6_100_000 less the 1 s offset

    def test_summary_sums_and_straggler(self):
        rc, out, _ = self.run_tool("summary", self.dir)
        self.assertEqual(rc, 0)
        # rank 1: compute 0.9 ms every step; exposed comm 0.1, 2.1, 0.1 ms -> mean 0.767, p50 0.1
        self.assertIn("rank 1: 3 steps (1..3)", out)
        self.assertRegex(out, r"rank 1:.*\n  compute +0\.900 +0\.900 +0\.900\n"
                              r"  exposed comm +0\.767 +0\.100 +2\.100\n"
                              r"  data wait +0\.010 +0\.010 +0\.010\n  optimizer +0\.050")
        self.assertIn("step 1: rank 0, last to 2 of 2 collectives, up to 0.005 ms behind", out)
        self.assertIn("step 2: rank 1, last to 2 of 2 collectives, up to 1.995 ms behind", out)
        self.assertIn("rank 0 last at 2 of 3 steps, rank 1 last at 1 of 3 steps", out)

    def test_gpu_spans_are_summed_apart_from_the_host_spans(self):
        # Rank 0's streams, as core::trace writes them (tid 1000 up, args.gpu): the modules and
        # the optimizer on the compute stream, a bucket's allreduce on the NCCL stream, a copy.
        # They share the host spans' names, but neither the host rows nor the straggler
        # (whose figures the other tests pin) may count them.
        t = rank_trace(0, 5_000_000.0, None)
        for tid, name in ((1000, "cuda compute stream"), (1001, "nccl stream"),
                          (1002, "copy stream")):
            t["traceEvents"].append({"name": "thread_name", "ph": "M", "ts": 0, "pid": 0,
                                     "tid": tid, "args": {"name": name}})
        for step in (1, 2, 3):
            base = 5_000_000.0 + step * 100_000.0
            for e in (span("forward fc1", "module", base + 20, 100 * step, 0, step, 1000),
                      span("backward fc1", "module", base + 400, 200, 0, step, 1000),
                      span("optimizer", "optimizer", base + 1010, 30, 0, step, 1000),
                      span("allreduce bucket 0", "comm", base + 2000, 70, 0, step, 1001),
                      span("host-to-device copy", "data", base + 5, 4, 0, step, 1002)):
                e["args"]["gpu"] = True
                t["traceEvents"].append(e)
        self.write(0, t)
        rc, out, _ = self.run_tool("summary", self.dir)
        self.assertEqual(rc, 0)
        # Host rows as before; gpu compute per step 0.33, 0.43, 0.53 ms (mean 0.43, p99 0.53),
        # gpu comm 0.07 and gpu copy 0.004 every step.
        self.assertRegex(out, r"rank 0: 3 steps \(1\.\.3\)\n  compute +0\.900 +0\.900 +0\.900\n"
                              r"  exposed comm +0\.100 .*\n  data wait +0\.010 .*\n"
                              r"  optimizer +0\.050 +0\.050 +0\.050\n"
                              r"  gpu compute +0\.430 +0\.430 +0\.530\n"
                              r"  gpu comm +0\.070 +0\.070 +0\.070\n"
                              r"  gpu copy +0\.004 +0\.004 +0\.004\n"
                              r"rank 1: 3 steps \(1\.\.3\)\n  compute +0\.900 .*\n.*\n.*\n"
                              r"  optimizer +0\.050 +0\.050 +0\.050\nstraggler")
        self.assertIn("step 1: rank 0, last to 2 of 2 collectives, up to 0.005 ms behind", out)
        self.assertIn("step 2: rank 1, last to 2 of 2 collectives, up to 1.995 ms behind", out)
        out_path = os.path.join(self.dir, "..", os.path.basename(self.dir) + "-all.json")
        rc, merged_out, _ = self.run_tool("merge", self.dir, "-o", out_path)
        self.assertEqual(rc, 0)
        with open(out_path) as f:
            merged = json.load(f)
        os.remove(out_path)
        copies = [e for e in merged["traceEvents"] if e["name"] == "host-to-device copy"]
        self.assertEqual([(e["tid"], e["ts"]) for e in copies],
                         [(1002, 5_100_005.0), (1002, 5_200_005.0), (1002, 5_300_005.0)])

    def test_top_lists_one_ranks_spans_longest_first(self):
        # Rank 1 per step: backward 0.6 ms, forward 0.3, gradient sync wait 0.08 + 2 ms at step 2
        # (mean 0.747), optimizer 0.05, allreduce bucket 0 0.04; a GPU span of the same name as
        # a host one is its own row.
        t = rank_trace(1, 6_000_000.0, 2)
        for step in (1, 2, 3):
            e = span("backward", "module", 6_000_000.0 + step * 100_000.0, 250, 1, step, 1000)
            e["args"]["gpu"] = True
            t["traceEvents"] += [e, dict(e)]
        self.write(1, t)
        rc, out, _ = self.run_tool("top", self.dir, "--rank", "1", "--count", "4")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"rank 1, 3 steps: .*\n"
                              r" +0\.747 +1\.0  host gradient sync wait\n"
                              r" +0\.600 +1\.0  host backward\n"
                              r" +0\.500 +2\.0  gpu  backward\n"
                              r" +0\.300 +1\.0  host forward\n$")
        self.assertIn("has no trace of rank 5", self.run_tool("top", self.dir, "--rank", "5")[2])

    def test_the_straggler_is_the_rank_waited_for_longest(self):
        # Step 4: rank 1 is 90 ms late to the first collective, then a few µs early to the next
        # two (the ranks leave the first together): rank 1, though last to 1 of 3.
        for rank in (0, 1):
            t = rank_trace(rank, 0.0, None)
            t["traceEvents"] += [
                span("allreduce bucket 1", "comm", 1e6 + (90_000 if rank else 0), 10, rank, 4),
                span("allreduce bucket 0", "comm", 1.2e6 + (0 if rank else 3), 10, rank, 4),
                span("allreduce", "comm", 1.3e6 + (0 if rank else 4), 10, rank, 4)]
            self.write(rank, t)
        rc, out, _ = self.run_tool("summary", self.dir)
        self.assertEqual(rc, 0)
        self.assertIn("step 4: rank 1, last to 1 of 3 collectives, up to 90.000 ms behind", out)

    def test_gantt_lanes_align_clocks_and_keep_the_steps(self):
        lanes = plot.trace_lanes(self.dir, 2, 3)
        self.assertEqual([label for label, _, _ in lanes], ["rank 0 main", "rank 1 main"])
        for _, spans, instants in lanes:
            self.assertEqual(len(spans), 2 * 8)  # steps 2 and 3, 8 spans each
            self.assertEqual(instants, [])
        # Rank 1's clock runs 1 s ahead: on rank 0's clock its step 2 starts when rank 0's does.
        starts = [min(e["ts"] for e in spans if e["args"]["step"] == 2) for _, spans, _ in lanes]
        self.assertEqual(starts, [5_200_000.0, 5_200_000.0])
        # Nesting depth by containment in start order (a span ending where the next starts
        # does not hold it).
        self.assertEqual(plot.depths([{"ts": 0, "dur": 10}, {"ts": 1, "dur": 2},
                                      {"ts": 2, "dur": 1}, {"ts": 5, "dur": 1},
                                      {"ts": 10, "dur": 1}]), [0, 1, 2, 1, 0])
        png = os.path.join(self.dir, "gantt.png")
        rc, out, _ = run_main(plot.main, ["trace", self.dir, "--steps", "1:2", "-o", png])
        self.assertIn("2 lanes, steps 1..2", out)
        self.assertGreater(os.path.getsize(png), 1000)
        with self.assertRaisesRegex(InputError, "no span of steps 7..9"):
            plot.trace_lanes(self.dir, 7, 9)
        for bad in ("3:1", "0:2", "x", "3"):
            with self.assertRaisesRegex(InputError, f"--steps '{bad}' is not FIRST:LAST"):
                plot.parse_steps(bad)

    def test_bad_input_is_named(self):
        self.write(2, {"traceEvents": [{"name": "x", "ph": "X", "ts": 1, "pid": 2, "tid": 0,
                                        "dur": -1}], "otherData": {"rank": 2, "clock_sync_us": 0}})
        rc, _, err = self.run_tool("summary", self.dir)
        self.assertEqual(rc, 1)
        self.assertIn("rank-2.json: complete event 0 ('x') has no duration >= 0", err)
        self.write(2, {"traceEvents": [{"name": "x", "ph": "Q", "ts": 1, "pid": 2, "tid": 0}],
                       "otherData": {"rank": 2, "clock_sync_us": 0}})
        self.assertIn("has phase 'Q'", self.run_tool("summary", self.dir)[2])
        self.write(2, {"traceEvents": []})
        self.assertIn("rank-2.json: otherData lacks rank", self.run_tool("summary", self.dir)[2])
        self.write(2, rank_trace(1, 0.0, None))
        self.assertIn("rank 1 appears twice", self.run_tool("summary", self.dir)[2])
        with open(os.path.join(self.dir, "rank-2.json"), "w") as f:
            f.write("{not json")
        self.assertIn("rank-2.json: not a readable JSON trace", self.run_tool("summary", self.dir)[2])
        with tempfile.TemporaryDirectory() as empty:
            rc, _, err = self.run_tool("summary", empty)
            self.assertEqual(rc, 1)
            self.assertIn("no rank-<r>.json files", err)


if __name__ == "__main__":
    unittest.main()
