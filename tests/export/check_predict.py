#!/usr/bin/env python3
"""lockstep-predict against ONNX Runtime (tests/export/CMakeLists.txt).

A resnet trained two steps with --normalize (BatchNorm's running statistics
moved, a per-channel normalisation in the checkpoint's input record) is
exported with lockstep-export and predicted with lockstep-predict on shards;
ONNX Runtime's CPU provider runs the ONNX file on the same images, read out
of the shard with h5dump, as raw 0-255 floats (the graph normalises). Its
logits must match lockstep-predict's JSON lines to check_onnx.py's f32
tolerance, its classes must be the same, and its accuracy the one
lockstep-predict printed. The venv is check_onnx.py's; without PyPI or
h5dump (hdf5-tools) the test exits 77 (skipped).

usage: check_predict.py BUILD_DIR VENV_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_onnx import F32_TOL, SKIP, ensure_venv, run  # noqa: E402

ROWS = 20


def main():
    build, venv = sys.argv[1], sys.argv[2]
    if not shutil.which("h5dump"):
        print("SKIPPED: no h5dump (hdf5-tools) to read the shard's images")
        sys.exit(SKIP)
    ensure_venv(venv)
    import numpy as np
    import onnxruntime as ort

    examples = os.path.join(build, "examples")
    with tempfile.TemporaryDirectory(prefix="lockstep-predict-") as work:
        for split, count, seed in (("train", 64, 1), ("val", ROWS, 2)):
            run([os.path.join(examples, "shard", "lockstep-shard"), "synthetic", "--out",
                 os.path.join(work, split), "--count", str(count), "--shape", "3,32,32",
                 "--dtype", "u8", "--classes", "10", "--shards", "1", "--seed", str(seed)])
        run([os.path.join(examples, "train", "lockstep-train"), "--model", "resnet", "--device",
             "cpu", "--data", os.path.join(work, "train"), "--steps", "2", "--batch-size", "16",
             "--normalize", "0.485,0.456,0.406,0.229,0.224,0.225", "--checkpoint-dir",
             os.path.join(work, "ckpt")])
        ckpt = os.path.join(work, "ckpt", "ckpt-2.h5")
        onnx_file = os.path.join(work, "resnet.onnx")
        run([os.path.join(examples, "export", "lockstep-export"), "--checkpoint", ckpt,
             "--model", "resnet", "--out", onnx_file])
        lines = os.path.join(work, "val.jsonl")
        out = run([os.path.join(examples, "predict", "lockstep-predict"), "--checkpoint", ckpt,
                   "--model", "resnet", "--data", os.path.join(work, "val"), "--out", lines,
                   "--device", "cpu", "--batch-size", "8"]).stdout
        printed = re.search(r"^accuracy ([0-9.]+)%", out, re.M)
        assert printed, out
        shard = os.path.join(work, "val", os.listdir(os.path.join(work, "val"))[0])
        for name in ("inputs", "labels"):
            subprocess.run(["h5dump", "-d", "/" + name, "-b", "LE", "-o",
                            os.path.join(work, name + ".bin"), shard], check=True,
                           capture_output=True)
        x = np.fromfile(os.path.join(work, "inputs.bin"), dtype=np.uint8).reshape(ROWS, 3, 32, 32)
        labels = np.fromfile(os.path.join(work, "labels.bin"), dtype=np.int64)
        session = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {"input": x.astype(np.float32)})
        with open(lines) as f:
            rows = [json.loads(line) for line in f]
        assert [r["sample"] for r in rows] == list(range(ROWS)), rows
        logits = np.array([r["logits"] for r in rows], dtype=np.float64)
        err = float(np.max(np.abs(y - logits)) / np.max(np.abs(logits)))
        print("resnet: lockstep-predict against ONNX Runtime, normwise relative error %.2e "
              "(tolerance %.1e)" % (err, F32_TOL))
        failures = []
        if err > F32_TOL:
            failures.append("error %.2e > %.1e" % (err, F32_TOL))
        if [r["class"] for r in rows] != list(y.argmax(axis=1)):
            failures.append("classes differ: %s against %s"
                            % ([r["class"] for r in rows], list(y.argmax(axis=1))))
        accuracy = "%.2f" % (100.0 * float(np.mean(y.argmax(axis=1) == labels)))
        if accuracy != printed.group(1):
            failures.append("ONNX Runtime's accuracy %s%%, lockstep-predict printed %s%%"
                            % (accuracy, printed.group(1)))
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print("lockstep-predict and ONNX Runtime agree")


if __name__ == "__main__":
    main()
