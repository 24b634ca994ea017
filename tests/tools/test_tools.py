"""The tools' parsing, without TensorBoard and without running benchmarks: the kinds of
--metrics record (Note [run records] in engine/run_report.h), what tools/to_tensorboard.py
would write for a small metrics file, the plot's title and axes, and tools/bench_table.py's table from
bench JSON written here. Run by ctest (tools_python) with tools/ on PYTHONPATH."""
import contextlib
import io
import json
import math
import os
import tempfile
import unittest

import bench_table
import plot
import to_tensorboard
from fixtures import END, EVALS, START, STEPS, write_lines
from jsonl import InputError, metrics_kind

class MetricsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "m.jsonl")
        write_lines(self.path, [START] + STEPS[:2] + EVALS[:1] + STEPS[2:] + EVALS[1:] + [END])

    def tearDown(self):
        self.dir.cleanup()

    def test_record_kinds(self):
        self.assertEqual(metrics_kind("x", START), "run")
        self.assertEqual(metrics_kind("x", END), "run")  # has val_accuracy, still a run record
        self.assertEqual(metrics_kind("x", STEPS[0]), "step")
        self.assertEqual(metrics_kind("x", EVALS[0]), "val")
        with self.assertRaises(InputError):
            metrics_kind("x", {"step": 1})

    def test_tensorboard_events(self):
        scalars, texts = to_tensorboard.events(self.path)
        loss = [(s, v) for tag, s, v in scalars if tag == "train/loss"]
        self.assertEqual(loss, [(1, 2.0), (2, 1.0), (3, 2.0 / 3), (4, 0.5)])
        accuracy = [(s, v) for tag, s, v in scalars if tag == "val/accuracy"]
        self.assertEqual(accuracy, [(2, 0.5), (4, 0.75)])
        # 5 step tags x 4 steps + 2 val tags x 2 evaluations; run records become text.
        self.assertEqual(len(scalars), 5 * 4 + 2 * 2)
        self.assertEqual([(t, s) for t, s, _ in texts], [("run/start", 0), ("run/end", 4)])

    def test_tensorboard_rejects_a_text_figure(self):
        write_lines(self.path, [{"step": 1, "loss": "low"}])
        with self.assertRaisesRegex(InputError, "m.jsonl:1: 'loss' is 'low'"):
            to_tensorboard.events(self.path)

    def test_plot_title_and_png(self):
        runs = [("x", START)]
        self.assertEqual(plot.plot_title(runs), "cnn: 2 rank(s), global batch 64, bf16")
        png = os.path.join(self.dir.name, "c.png")
        plot.plot_metrics(self.path, png)
        self.assertGreater(os.path.getsize(png), 1000)


class PlotAxesTest(unittest.TestCase):
    """plot.py metrics draws evaluations against the step (they come every --val-every steps as
    well as at an epoch's end), one point per evaluated step, and a language model's val loss and
    bits per token on a loss axis. Expected points are the records written here."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "m.jsonl")
        self.png = os.path.join(self.dir.name, "c.png")

    def tearDown(self):
        self.dir.cleanup()
        plot.plt.close("all")

    def right_panel(self, records):
        write_lines(self.path, records)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            plot.plot_metrics(self.path, self.png)
        self.output = out.getvalue()
        left, right = plot.plt.gcf().axes  # the figure just drawn
        return left, right

    def test_evaluations_of_one_epoch_against_their_steps(self):
        # --val-every 2 over one epoch of 6 steps; the file of an older build recorded the
        # evaluation at the epoch's end twice.
        steps = [{"step": s, "epoch": 1, "loss": 1.0 / s} for s in range(1, 7)]
        evals = [{"step": s, "epoch": 1, "val_loss": 2.0 / s, "val_accuracy": s / 10}
                 for s in (2, 4, 6)]
        left, right = self.right_panel([START] + steps + evals + [evals[-1]])
        self.assertEqual(right.get_xlabel(), "step")
        self.assertEqual(right.get_ylabel(), "val accuracy (%)")
        (line,) = right.get_lines()
        self.assertEqual(list(line.get_xdata()), [2, 4, 6])
        self.assertEqual(list(line.get_ydata()), [20.0, 40.0, 60.0])
        val = [l for l in left.get_lines() if l.get_label() == "val loss"][0]
        self.assertEqual(list(val.get_xdata()), [2, 4, 6])
        self.assertIn("final val accuracy: 60.00% after epoch 1 (step 6)", self.output)

    def test_language_model_loss_and_bits_on_a_loss_axis(self):
        start = dict(START, model="gpt-tiny", tokens_per_sample=32)
        steps = [{"step": s, "epoch": 1, "loss": 5.0 / s} for s in range(1, 5)]
        evals = [{"step": s, "epoch": 1, "val_loss": 4.0 / s,
                  "val_bits_per_token": 4.0 / s / math.log(2), "val_accuracy": 0.1 * s}
                 for s in (2, 4)]
        _, right = self.right_panel([start] + steps + evals)
        self.assertEqual(right.get_xlabel(), "step")
        self.assertNotIn("accuracy", right.get_ylabel())
        self.assertIn("loss", right.get_ylabel())
        lines = {l.get_label(): l for l in right.get_lines()}
        self.assertEqual(list(lines["val loss (nats per token)"].get_ydata()), [2.0, 1.0])
        bits = lines["val bits per token (per byte for byte tokens)"]
        self.assertEqual(list(bits.get_xdata()), [2, 4])
        for got, nats in zip(bits.get_ydata(), (2.0, 1.0)):
            self.assertAlmostEqual(got, nats / math.log(2), places=12)
        self.assertIn("final val loss: 1.0000 (1.4427 bits per token) after epoch 1 (step 4)",
                      self.output)

    def test_regression_without_accuracy(self):
        steps = [{"step": s, "epoch": 1, "loss": 1.0 / s} for s in (1, 2)]
        _, right = self.right_panel([START] + steps + [{"step": 2, "epoch": 1, "val_loss": 0.25}])
        self.assertEqual(right.get_ylabel(), "val loss")
        self.assertEqual(list(right.get_lines()[0].get_ydata()), [0.25])
        self.assertIn("final val loss: 0.2500 after epoch 1 (step 2)", self.output)


class BenchTableTest(unittest.TestCase):
    def test_table_from_kept_output(self):
        with tempfile.TemporaryDirectory() as out:
            write_lines(os.path.join(out, "gemm.jsonl"), [
                {"bench": "gemm", "shape": "square", "m": 1024, "n": 1024, "k": 1024,
                 "dtype": "f32", "lockstep_gflops": 99.0, "raw_gflops": 100.0, "ratio": 0.99},
                {"bench": "gemm", "shape": "square", "m": 1024, "n": 1024, "k": 1024,
                 "dtype": "bf16", "lockstep_gflops": 40.0, "raw_gflops": None, "ratio": None}])
            write_lines(os.path.join(out, "step.jsonl"), [
                {"bench": "step", "model": "mlp", "batch": 128, "samples_per_s": 26000.0,
                 "ms_per_step": 4.9, "torch_samples_per_s": None, "ratio": None,
                 "gemm_ms": 4.5, "step_over_gemm": 1.09,
                 "no_baseline": "python3 could not run bench/torch_step.py (no torch)"}])
            for name, model, batch, gemm_ms in (("step_cnn.jsonl", "cnn", 64, None),
                                                ("step_gpt.jsonl", "gpt-tiny", 16, 16.0)):
                write_lines(os.path.join(out, name), [
                    {"bench": "step", "model": model, "batch": batch, "samples_per_s": 3000.0,
                     "ms_per_step": 20.0, "torch_samples_per_s": 2000.0, "ratio": 1.5,
                     "ratio_low": 1.25, "ratio_high": 1.625, "gemm_ms": gemm_ms,
                     "step_over_gemm": gemm_ms and 1.25, "torch_over_gemm": gemm_ms and 1.875,
                     "baselines": [{"torch_version": "2.15.0+cpu", "ratio": 1.5}],
                     "no_baseline": None}])
            for name, model in (("scaling_mlp.jsonl", "mlp"), ("scaling_cnn.jsonl", "cnn")):
                write_lines(os.path.join(out, name), [
                    {"bench": "scaling", "model": model, "ranks": 2, "batch_per_rank": 64,
                     "solo_ms": 4.0, "synced_ms": 5.0, "efficiency": 0.8}])
            with open(os.path.join(out, bench_table.MACHINE), "w") as f:
                json.dump({"date": "2026-12-01", "host": "vm", "cpu": "X", "cores": 2,
                           "note": "shared"}, f)
            lines = bench_table.table(out)
        self.assertIn("Measured 2026-12-01 on vm (X, 2 cores, shared)", lines[0])
        rows = [l for l in lines if l.startswith("| ") and "benchmark" not in l]
        # f32 GEMM only, mlp step, step / GEMMs, cnn step, gpt-tiny step and its step /
        # GEMMs, two scalings
        self.assertEqual(len(rows), 8)
        self.assertIn("| 99.0 GF/s | OpenBLAS 100.0 GF/s | 0.990 |", rows[0])
        self.assertIn("none: python3 could not run bench/torch_step.py (no torch) | — |", rows[1])
        self.assertIn("| mlp step over its GEMMs alone | same |", rows[2])
        self.assertIn("1.090 (step / GEMMs, lower is better)", rows[2])
        self.assertIn("| PyTorch 2.15.0+cpu 2,000 samples/s | 1.500 (1.250–1.625 block by block) |",
                      rows[3])
        self.assertIn("| gpt-tiny training step, batch 16 | `bench_step --model gpt-tiny", rows[4])
        self.assertIn("1.250 (step / GEMMs, lower is better; PyTorch's step / these GEMMs "
                      "1.875, the highest ratio they allow)", rows[5])
        self.assertNotIn("PyTorch's step / these GEMMs", rows[2])  # mlp: no PyTorch ran
        self.assertIn("0.80 (efficiency)", rows[6])

    def test_processor_named_by_family_and_model(self):
        cpuinfo = ["processor\t: 0\n", "cpu family\t: 23\n", "model\t\t: 1\n",
                   "model name\t: AMD EPYC\n", "flags\t\t: fpu sse2 avx2 fma\n", "\n",
                   "processor\t: 1\n", "model name\t: Other\n"]
        self.assertEqual(bench_table.processor_description(cpuinfo),
                         "AMD EPYC (family 23, model 1; AVX2)")
        cpuinfo[4] = "flags\t\t: avx2 avx512f\n"
        self.assertIn("; AVX-512)", bench_table.processor_description(cpuinfo))

    def test_missing_output_says_what_to_run(self):
        with tempfile.TemporaryDirectory() as out:
            with self.assertRaisesRegex(InputError, "bench_table.py run"):
                bench_table.table(out)


if __name__ == "__main__":
    unittest.main()
