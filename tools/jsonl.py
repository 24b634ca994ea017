"""Reading the JSON and JSON-lines files lockstep writes (bench --json, lockstep-train --metrics,
flight dumps, traces), shared by tools/plot.py, tools/scaling_model.py, tools/to_tensorboard.py,
tools/bench_table.py, tools/flight.py and tools/trace.py so that all report bad input alike: the
message names the file (and line) at fault."""
import json


class InputError(Exception):
    """Malformed input; the message names the file and line (or record) at fault."""


def read_json(path, what):
    """One JSON document; `what` names the kind of file for the message ("flight dump")."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a readable {what}: {e}") from None


def read_jsonl(path, allow_empty=False):
    """[(where, record)] with where = "path:line"; blank lines are skipped."""
    rows = []
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{where}: not JSON ({e.msg}); lockstep's tools write one "
                                     "JSON object per line") from None
                if not isinstance(row, dict):
                    raise InputError(f"{where}: expected a JSON object per line")
                rows.append((where, row))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    if not rows and not allow_empty:
        raise InputError(f"{path}: no records (was it written by a run that finished?)")
    return rows


def metrics_kind(where, row):
    """The kind of a --metrics record (Note [run records] in engine/run_report.h): "run" (a run's
    start or end), "val" (an evaluation) or "step"."""
    if row.get("run") in ("start", "end"):
        return "run"
    if "val_loss" in row or "val_accuracy" in row:  # a regression's evaluation has no accuracy
        return "val"
    if "loss" in row:
        return "step"
    raise InputError(f"{where}: neither a run record ('run'), a step record ('loss') nor an "
                     "evaluation ('val_loss'); is this a lockstep-train --metrics file?")


def number(where, row, key):
    """row[key] as a float; a missing, null or non-numeric value (a bool included) is an
    InputError naming the record and the key."""
    value = row.get(key)
    if value is None:
        raise InputError(f"{where}: '{row.get('bench', 'metrics')}' record lacks '{key}'")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: '{key}' is {value!r}, expected a number")
    return float(value)
