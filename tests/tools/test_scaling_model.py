"""tools/scaling_model.py --check on crafted bench_scaling files with hand-computed answers: the
terms added one at a time (ideal, contention, measured stragglers, communication in the step,
ZeRO-1's sharded optimizer, compute after communication) and the fallbacks of a record that lacks the measured terms (the
straggler from jitter, no in-step terms); bad input named by file and line; the rank-invariant
mode's terms (all-to-all + all-gather, the tree's adds) on hand-computed networks. The arithmetic is
exact up to float rounding, so results are compared to 1e-9. Run by ctest (tools_python)."""
import json
import os
import tempfile
import unittest

import scaling_model
from fixtures import run_main, write_lines

# One rank: forward 1 + backward 2 + optimizer 1 = 4 ms; one 1 MB bucket ready at the end of
# backward. The link: 20 us per message at 2 ranks (10 us per ring step, 2 steps) and 1 GB/s,
# so the bucket's allreduce is 0.02 + 2 (2-1)/2 x 1e6 B / 1e6 B/ms = 1.02 ms.
PROFILE = {"bench": "scaling_profile", "model": "mlp", "device": "cpu", "gemm_gflops": 100.0,
           "forward_ms": 0.5, "backward_ms": 1.0, "optimizer_ms": 0.5,
           "buckets": [{"bytes": 1000000, "ready_ms": 1.0}]}
LINK = {"bench": "scaling_link", "device": "cpu", "ranks": 2, "alpha_us": 20.0,
        "bus_bandwidth_gbps": 1.0}
# solo 4, compute 4.4 (contention 1.1), synced 6: the profile above is scaled by 2 to solo.
MEASURED = {"bench": "scaling", "model": "mlp", "mode": "weak", "ranks": 2, "solo_ms": 4.0,
            "compute_ms": 4.4, "synced_ms": 6.0, "comm_ms": 1.0, "efficiency": 4.0 / 6.0,
            "jitter": 0.05, "host_overlap": False, "straggler_ms": 0.1, "comm_in_step_ms": 1.2,
            "serial_compute_ms": 4.6}


class ScalingCheckTest(unittest.TestCase):
    def check(self, measured, extra=()):
        with tempfile.TemporaryDirectory() as d:
            bench, out = os.path.join(d, "scaling.jsonl"), os.path.join(d, "check.jsonl")
            write_lines(bench, [PROFILE, measured, LINK])
            status, stdout, _ = run_main(scaling_model.main,
                                         ["--check", bench, "--json", out, "--stall-prob", "0",
                                          *extra])
            self.assertIsNone(status)
            self.assertIn("unexpl", stdout)
            with open(out) as f:
                return [json.loads(line) for line in f]

    def test_measured_terms_one_at_a_time(self):
        [r] = self.check(MEASURED)
        steps = {"predicted_ideal": 4.0 + 1.02,             # solo + the alpha-beta allreduce
                 "predicted_with_contention": 4.4 + 1.02,   # compute stretched by 1.1
                 "predicted_with_stragglers": 5.42 + 0.1,   # the measured straggler
                 "predicted_with_comm_in_step": 5.52 + 1.2 - 1.02,  # measured in the step
                 "predicted_with_after_comm": 5.70 + 4.6 - 4.4,     # compute after comm
                 "predicted_with_terms": 5.90}              # no loader stalls (--stall-prob 0)
        for key, step in steps.items():
            self.assertAlmostEqual(r[key], 4.0 / step, places=9, msg=key)
        self.assertAlmostEqual(r["comm_ms_predicted"], 1.02, places=9)
        self.assertAlmostEqual(r["unexplained_ms"], 0.1, places=9)
        self.assertAlmostEqual(r["difference_with_terms"], 4.0 / 5.9 - 4.0 / 6.0, places=9)
        self.assertAlmostEqual(r["loss_stragglers"], 4.0 / 5.42 - 4.0 / 5.52, places=9)
        self.assertAlmostEqual(r["no_overlap_bound"], 4.0 / 5.4, places=9)

    def test_zero_shards_the_optimizer(self):
        # ZeRO-1 at 2 ranks: half of the contended optimizer (0.5 x 2 x 1.1 ms) is not done.
        [r] = self.check(dict(MEASURED, zero=1))
        self.assertAlmostEqual(r["predicted_with_sharded_optimizer"], 4.0 / (5.52 - 0.55),
                               places=9)
        self.assertAlmostEqual(r["predicted_with_terms"], 4.0 / (5.90 - 0.55), places=9)

    def test_record_without_measured_terms(self):
        old = {k: v for k, v in MEASURED.items()
               if k not in ("straggler_ms", "comm_in_step_ms", "serial_compute_ms")}
        [r] = self.check(old)
        # sigma x compute x E[max of 2 standard normals] = 0.05 x 4.4 x 1/sqrt(pi)
        straggler = 0.05 * 4.4 / 3.141592653589793 ** 0.5
        self.assertAlmostEqual(r["predicted_with_terms"], 4.0 / (5.42 + straggler), places=6)
        self.assertAlmostEqual(r["loss_comm_in_step"], 0.0, places=12)
        self.assertAlmostEqual(r["loss_after_comm"], 0.0, places=12)

    def test_overlapped_record_ignores_serial_terms(self):
        # With host overlap the serial step's comm and compute do not describe the step.
        [r] = self.check(dict(MEASURED, host_overlap=True), ["--interference", "0"])
        self.assertAlmostEqual(r["loss_comm_in_step"], 0.0, places=12)
        self.assertAlmostEqual(r["loss_after_comm"], 0.0, places=12)

    def test_bad_record_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            bench = os.path.join(d, "scaling.jsonl")
            write_lines(bench, [PROFILE, dict(MEASURED, solo_ms=-1), LINK])
            with self.assertRaises(SystemExit) as e:
                run_main(scaling_model.main, ["--check", bench])
            self.assertIn("scaling.jsonl:2", str(e.exception.code))
            self.assertIn("solo_ms", str(e.exception.code))
            write_lines(bench, [PROFILE, dict(MEASURED, straggler_ms="fast"), LINK])
            with self.assertRaises(SystemExit) as e:
                run_main(scaling_model.main, ["--check", bench])
            self.assertIn("'straggler_ms' is 'fast', expected a number", str(e.exception.code))


class RankInvariantTest(unittest.TestCase):
    # 2 GPUs a node; NVLink 1 GB/s (1e6 B/ms) and 10 us a step, NICs 0.5 GB/s and 100 us.
    NET = scaling_model.Network(gpus_per_node=2, intra_alpha_us=10.0, intra_busbw_gbs=1.0,
                                inter_alpha_us=100.0, inter_busbw_gbs=0.5, intra_half_bytes=0.0,
                                inter_half_bytes=0.0)

    def test_one_node_moves_a_ring_allreduce(self):
        # 2 GPUs, 2 MB: all-to-all 1 MB + 10 us, all-gather 1 MB + 10 us: the ring's 2.02 ms.
        self.assertAlmostEqual(self.NET.ordered_allreduce_ms(2e6, 2), 2.02, places=9)
        ring, _ = self.NET.allreduce_ms(2e6, 2, False)
        self.assertAlmostEqual(self.NET.ordered_allreduce_ms(2e6, 2), ring, places=9)
        self.assertEqual(self.NET.ordered_allreduce_ms(2e6, 1), 0.0)

    def test_across_nodes_the_alltoall_uses_one_nic(self):
        # 4 GPUs on 2 nodes, 4 MB (1 MB shards): all-to-all max(1 MB NVLink, 2 MB NIC) = 4 ms
        # + 3 messages x 100 us; all-gather 3 MB at min(1, 2 x 0.5) GB/s = 3 ms + 2 x 10 us
        # + 1 x 100 us.
        self.assertAlmostEqual(self.NET.ordered_allreduce_ms(4e6, 4), 4.3 + 3.12, places=9)

    def test_tree_adds(self):
        # K = 3: 2 adds (3 buffers each) + 2 copies (2) of 1 MB, and 3 adds of a 1/4 shard at
        # the owner, at 1 GB/s: (10 + 2.25) MB / 1e6 B/ms.
        self.assertAlmostEqual(scaling_model.tree_adds_ms(1e6, 4, 3, 1.0), 12.25, places=9)

    def test_step_beside_the_default(self):
        profile = scaling_model.Profile("mlp", "test", forward_ms=0.5, backward_ms=1.0,
                                        optimizer_ms=0.5, buckets=[(2000000, 1.0)])
        r = scaling_model.predict_invariant(profile, self.NET, 2, 2, 1.0)
        # 2 chunks of 1.5 ms, the reduction 2.02, the tree 13 (5 x 2 MB + 3 x 1 MB), 0.5.
        self.assertAlmostEqual(r["invariant_step_ms"], 3.0 + 2.02 + 13.0 + 0.5, places=9)
        # The default: one micro-batch more, then 0.5 + the allreduce after backward + 0.5.
        self.assertAlmostEqual(r["default_step_ms"], 1.5 + 0.5 + 1.0 + 2.02 + 0.5, places=9)
        self.assertAlmostEqual(r["invariant_over_default"], 18.52 / 5.52, places=9)
        self.assertAlmostEqual(r["invariant_efficiency"], 3.5 / 18.52, places=9)

    def test_flags(self):
        status, stdout, _ = run_main(scaling_model.main, ["--rank-invariant", "--gpus", "8,64",
                                                          "--chunks-per-rank", "2"])
        self.assertIsNone(status)
        self.assertIn("--rank-invariant, 2 chunk(s) per rank", stdout)
        with self.assertRaises(SystemExit):
            run_main(scaling_model.main, ["--rank-invariant", "--wire-dtype", "bf16"])


if __name__ == "__main__":
    unittest.main()
