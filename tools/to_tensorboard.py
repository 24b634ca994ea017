#!/usr/bin/env python3
"""Writes a lockstep --metrics file (JSON lines) as TensorBoard event files, so that a run can be
followed in TensorBoard:

  tools/to_tensorboard.py METRICS.jsonl --logdir runs/NAME    then: tensorboard --logdir runs

Scalars: train/loss, train/lr, train/loss_scale, train/grad_norm, train/samples_per_s per step;
val/loss, val/accuracy per evaluation; each run record's figures as text (run/start, run/end).
Run it again as the file grows: each call replaces the event file it wrote before in that
folder (names ending .lockstep) with one holding everything so far. Needs the `tensorboard`
package from PyPI (pip install tensorboard); the rest of lockstep does not. (Not named
tensorboard.py, which would hide the package it imports.)
"""
import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsonl import InputError, metrics_kind, number, read_jsonl  # noqa: E402  (tools/jsonl.py)

STEP_TAGS = {"loss": "train/loss", "lr": "train/lr", "loss_scale": "train/loss_scale",
             "grad_norm": "train/grad_norm", "samples_per_s": "train/samples_per_s",
             "tokens_per_s": "train/tokens_per_s"}
SUFFIX = ".lockstep"  # marks the event files this tool writes (and replaces)
VAL_TAGS = {"val_loss": "val/loss", "val_accuracy": "val/accuracy"}


def events(path):
    """(scalars, texts) from a metrics file: scalars as [(tag, step, value)], texts as
    [(tag, step, text)], in file order. Needs no tensorboard package."""
    scalars, texts = [], []
    last_step = 0
    for where, row in read_jsonl(path):
        kind = metrics_kind(where, row)
        if kind == "run":
            step = next((number(where, row, k) for k in ("step", "start_step") if k in row),
                        last_step)
            body = ", ".join(f"{k}: {v}" for k, v in row.items() if k != "run")
            texts.append((f"run/{row['run']}", int(step), body))
            continue
        if "step" not in row:
            raise InputError(f"{where}: a {kind} record without 'step'")
        step = int(number(where, row, "step"))
        last_step = step
        for key, tag in (STEP_TAGS if kind == "step" else VAL_TAGS).items():
            if key in row and row[key] is not None:
                scalars.append((tag, step, number(where, row, key)))
    return scalars, texts


def write_events(scalars, texts, logdir):
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.plugins.text.summary_v2 import text_pb
    except ImportError as e:
        raise InputError(f"the tensorboard package is missing ({e}): pip install tensorboard "
                         "(in a virtual environment: python3 -m venv VENV && VENV/bin/pip install "
                         "tensorboard, then run this tool with VENV/bin/python)") from None
    os.makedirs(logdir, exist_ok=True)
    for old in glob.glob(os.path.join(glob.escape(logdir), f"events.out.tfevents.*{SUFFIX}")):
        os.remove(old)  # ours from an earlier call: the new file holds all of it again
    writer = EventFileWriter(logdir, filename_suffix=SUFFIX)
    now = time.time()
    for tag, step, value in scalars:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(Event(wall_time=now, step=step, summary=summary))
    for tag, step, body in texts:
        writer.add_event(Event(wall_time=now, step=step, summary=text_pb(tag, body)))
    writer.close()
    return writer.get_logdir()


def main(argv):
    ap = argparse.ArgumentParser(description="Write lockstep --metrics JSON lines as TensorBoard "
                                 "event files (needs: pip install tensorboard).")
    ap.add_argument("metrics", help="a lockstep-train (or custom program) --metrics file")
    ap.add_argument("--logdir", required=True, help="where the event file goes (one run's folder)")
    args = ap.parse_args(argv)
    try:
        scalars, texts = events(args.metrics)
        logdir = write_events(scalars, texts, args.logdir)
    except InputError as e:
        sys.exit(f"to_tensorboard.py: {e}")
    steps = len({s for tag, s, _ in scalars if tag == "train/loss"})
    print(f"{len(scalars)} scalars ({steps} steps) and {len(texts)} run records written to "
          f"{logdir}; view with: tensorboard --logdir {os.path.dirname(os.path.abspath(logdir))}")


if __name__ == "__main__":
    main(sys.argv[1:])
