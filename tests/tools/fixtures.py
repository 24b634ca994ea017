"""A small --metrics file's records (a run of 4 steps over 2 epochs with two evaluations), shared
by tests/tools/test_tools.py and tensorboard_roundtrip.py; and run_main, a tool's main() with its
output captured, shared by test_flight.py and test_trace.py."""
import contextlib
import io
import json

START = {"run": "start", "program": "lockstep-train", "model": "cnn", "ranks": 2,
         "micro_batch": 32, "accumulation": 1, "global_batch": 64, "precision": "bf16",
         "start_step": 0, "total_steps": 4}
STEPS = [{"step": s, "epoch": 1 + (s > 2), "loss": 2.0 / s, "lr": 0.1, "loss_scale": 1,
          "grad_norm": 0.5, "skipped": False, "samples_per_s": 100.0} for s in (1, 2, 3, 4)]
EVALS = [{"step": 2, "epoch": 1, "val_loss": 1.5, "val_accuracy": 0.5},
         {"step": 4, "epoch": 2, "val_loss": 1.0, "val_accuracy": 0.75}]
END = {"run": "end", "step": 4, "wall_s": 1.0, "skipped_steps": 0, "val_loss": 1.0,
       "val_accuracy": 0.75, "checkpoint": None}


def write_lines(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def run_main(main, argv):
    """(exit status, stdout, stderr) of a tool's main(argv)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()
