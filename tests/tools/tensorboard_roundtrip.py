"""tools/to_tensorboard.py end to end: writes a small metrics file as an event file and reads it
back with TensorBoard's own EventAccumulator (scalars by tag and step, run records as text).
Exits 77 (ctest: skipped) where the optional tensorboard package is not installed; run it with a
Python that has it: VENV/bin/python tests/tools/tensorboard_roundtrip.py (tools/ on PYTHONPATH)."""
import os
import sys
import tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard is not installed in this Python: skipped (pip install tensorboard)")
    sys.exit(77)

import to_tensorboard
from fixtures import END, EVALS, START, STEPS, write_lines

with tempfile.TemporaryDirectory() as work:
    metrics = os.path.join(work, "m.jsonl")
    write_lines(metrics, [START] + STEPS + EVALS + [END])
    logdir = os.path.join(work, "run")
    to_tensorboard.main([metrics, "--logdir", logdir])
    to_tensorboard.main([metrics, "--logdir", logdir])  # again: replaces, does not duplicate
    assert len(os.listdir(logdir)) == 1, os.listdir(logdir)
    events = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    expected = [(r["step"], r["loss"]) for r in STEPS]
    assert [s for s, _ in loss] == [s for s, _ in expected], loss
    # Stored as f32: equal to the JSON figure within f32 rounding (2^-24 relative).
    assert all(abs(v - w) <= 1e-7 * abs(w) for (_, v), (_, w) in zip(loss, expected)), loss
    accuracy = [(e.step, e.value) for e in events.Scalars("val/accuracy")]
    assert accuracy == [(2, 0.5), (4, 0.75)], accuracy  # exact in f32
    assert [e.step for e in events.Tensors("run/start")] == [0]
    assert [e.step for e in events.Tensors("run/end")] == [4]
print("to_tensorboard.py: event file read back by TensorBoard as written")
