#!/usr/bin/env python3
"""ONNX export against ONNX Runtime (tests/export/CMakeLists.txt).

For each preset: lockstep-onnx-reference writes a checkpoint of a random
model and lockstep's eval-mode forward at batch 1 and 7; lockstep-export
turns the checkpoint into ONNX (dynamic batch); the ONNX checker (full
check, with shape inference) must pass, and ONNX Runtime's CPU provider
must reproduce lockstep's outputs. A cnn whose checkpoint records
--normalize (Note [input record]) must take raw 0-255 pixels, preprocess
them in the graph's first nodes and give lockstep's output on those pixels
after its own evaluation pipeline. onnx, onnxruntime and numpy come from
PyPI into a virtual environment made here and kept for later runs; when
PyPI cannot be reached the test says so and exits 77 (skipped).

usage: check_onnx.py BUILD_DIR VENV_DIR PRESET[:SEQ] ...
"""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
PACKAGES = ["onnx", "onnxruntime", "numpy"]


def pypi_reachable():
    import urllib.request
    try:
        urllib.request.urlopen("https://pypi.org/simple/onnx/", timeout=20).close()
        return True
    except OSError:
        return False


def ensure_venv(venv):
    """Re-executes this script under the cached venv, making it first."""
    python = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    marker = os.path.join(venv, ".lockstep-ready")
    if not os.path.exists(marker):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              "--timeout", "30", "--retries", "2", *PACKAGES],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            if not pypi_reachable():
                print("SKIPPED: PyPI (https://pypi.org) cannot be reached from here, so %s "
                      "cannot be installed into %s:\n%s"
                      % (" ".join(PACKAGES), venv, pip.stderr[-2000:]))
                sys.exit(SKIP)
            sys.exit("FAILED: pip could not install %s into %s although PyPI is reachable:\n%s"
                     % (" ".join(PACKAGES), venv, pip.stderr[-4000:]))
        open(marker, "w").close()
    os.execv(python, [python, *sys.argv])


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        sys.exit("FAILED: %s\nrc %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


# Note [f16 tolerance]: f16 has a unit roundoff u = 2^-11. Each weighted
# layer rounds its weights and its output once, so a layer's output carries
# a relative error of about 2u, and the errors of `depth` layers in series
# add: the normwise bound used is 4 u depth (twice the estimate, for the
# growth a ReLU network allows). depth counts the GEMMs and convolutions on
# the longest path, plus the softmax of each attention.
F16_DEPTH = {"mlp": 3, "cnn": 4, "resnet": 18, "mlp-large": 4, "gpt-tiny": 4 * 5 + 1,
             "gpt2": 12 * 5 + 1}
U16 = 2.0 ** -11
# f32: 1e-5 normwise (max |ort - lockstep| / max |lockstep|). Elementwise
# relative error is meaningless for logits near zero; the normwise measure
# still catches a wrong weight, layout or mask (those give errors near 1).
F32_TOL = 1e-5


def check_preset(build, work, spec):
    import numpy as np
    import onnx
    import onnxruntime as ort

    name, _, seq = spec.partition(":")
    seq = int(seq or 0)
    out = run([os.path.join(build, "tests", "export", "lockstep-onnx-reference"), name, "7",
               str(seq), work]).stdout
    ckpt = out.splitlines()[0].split(" ", 1)[1]
    shapes = {}
    for line in out.splitlines()[1:]:
        w = line.split()
        shapes[int(w[1])] = (json.loads(w[3]), json.loads(w[5]))
    failures = []
    for precision in ("fp32", "fp16"):
        path = os.path.join(work, "%s-%s.onnx" % (name, precision))
        run([os.path.join(build, "examples", "export", "lockstep-export"), "--checkpoint", ckpt,
             "--model", name, "--out", path, "--precision", precision, "--io", "fp32"])
        model = onnx.load(path)
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta.get("lockstep.preset") == name, meta
        params = {i.name for i in model.graph.initializer}
        assert ("fc1.weight" in params or "fc.weight" in params
                or "transformer.wte.weight" in params), sorted(params)[:5]
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (inp,) = session.get_inputs()
        assert inp.shape[0] == "batch", inp.shape
        tol = F32_TOL if precision == "fp32" else 4 * U16 * F16_DEPTH[name]
        for batch, (in_shape, out_shape) in sorted(shapes.items()):
            stem = os.path.join(work, "%s_b%d" % (name, batch))
            dtype = np.int64 if inp.type == "tensor(int64)" else np.float32
            x = np.fromfile(stem + "_input.bin", dtype=dtype).reshape(in_shape)
            ref = np.fromfile(stem + "_output.bin", dtype=np.float32).reshape(out_shape)
            (y,) = session.run(None, {inp.name: x})
            if y.shape != ref.shape:
                failures.append("%s %s batch %d: shape %s, lockstep %s"
                                % (name, precision, batch, y.shape, ref.shape))
                continue
            err = float(np.max(np.abs(y.astype(np.float64) - ref)) / np.max(np.abs(ref)))
            verdict = "ok" if err <= tol else "FAIL"
            print("%-9s %s batch %d: normwise relative error %.2e (tolerance %.1e) %s"
                  % (name, precision, batch, err, tol, verdict))
            if err > tol:
                failures.append("%s %s batch %d: error %.2e > %.1e" % (name, precision, batch,
                                                                       err, tol))
    return failures, ckpt


def check_fixed_shapes(build, work, ckpts):
    """A fixed batch, a fixed sequence, the highest opset (21) and f16 inputs
    and outputs export, check and run with those shapes and types."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    export = os.path.join(build, "examples", "export", "lockstep-export")
    failures = []
    f16_mlp = 4 * U16 * F16_DEPTH["mlp"]
    cases = [("mlp", ["--batch", "7", "--opset", "21"], "input", [7, 1, 28, 28], F32_TOL),
             ("mlp", ["--precision", "fp16", "--io", "fp16"], "input", ["batch", 1, 28, 28],
              f16_mlp),
             ("gpt-tiny", ["--seq", "16", "--opset", "21"], "tokens", ["batch", 16], F32_TOL)]
    for n, (name, args, input_name, want, tol) in enumerate(cases):
        if name not in ckpts:
            continue
        path = os.path.join(work, "%s-fixed-%d.onnx" % (name, n))
        run([export, "--checkpoint", ckpts[name], "--model", name, "--out", path, *args])
        model = onnx.load(path)
        onnx.checker.check_model(model, full_check=True)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (inp,) = session.get_inputs()
        if inp.name != input_name or inp.shape != want:
            failures.append("%s %s: input %s %s, expected %s %s" % (name, " ".join(args), inp.name,
                                                                    inp.shape, input_name, want))
            continue
        stem = os.path.join(work, "%s_b7" % name)
        dtype = np.int64 if inp.type == "tensor(int64)" else np.float32
        ref = np.fromfile(stem + "_output.bin", dtype=np.float32)
        x = np.fromfile(stem + "_input.bin", dtype=dtype).reshape([7, *want[1:]])
        if inp.type == "tensor(float16)":
            x = x.astype(np.float16)
        (y,) = session.run(None, {inp.name: x})
        err = float(np.max(np.abs(y.ravel().astype(np.float64) - ref)) / np.max(np.abs(ref)))
        print("%-9s %s: output %s, normwise relative error %.2e (tolerance %.1e)"
              % (name, " ".join(args), y.dtype, err, tol))
        if err > tol:
            failures.append("%s %s: error %.2e > %.1e" % (name, " ".join(args), err, tol))
    return failures


def check_normalized(build, work):
    """Note [preprocessing in the graph]: a cnn whose checkpoint records
    --normalize 0.5,0.25 exports a graph that takes raw 0-255 pixel floats:
    Div, Sub, Div first, metadata saying so, and ONNX Runtime's output on the
    raw pixels equal to lockstep's after its loader's normalisation (its own
    code path, io/image_transform.h). The old advice (feed x / 255) must give
    something else, so the comparison can tell the two apart."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    out_dir = os.path.join(work, "normalized")
    os.makedirs(out_dir)
    out = run([os.path.join(build, "tests", "export", "lockstep-onnx-reference"), "cnn", "7", "0",
               out_dir, "0.5,0.25"]).stdout
    ckpt = out.splitlines()[0].split(" ", 1)[1]
    path = os.path.join(out_dir, "cnn-normalized.onnx")
    said = run([os.path.join(build, "examples", "export", "lockstep-export"), "--checkpoint",
                ckpt, "--model", "cnn", "--out", path]).stdout
    failures = []
    if "raw 0-255 pixel floats" not in said:
        failures.append("lockstep-export did not say the input is raw pixels: %s" % said)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    first = [n.op_type for n in model.graph.node[:3]]
    if first != ["Div", "Sub", "Div"]:
        failures.append("normalised cnn: first nodes %s, expected Div, Sub, Div" % first)
    meta = {p.key: p.value for p in model.metadata_props}
    for needle in ("float32 [batch, 1, 28, 28] (NCHW)", "raw pixel values 0 to 255",
                   "mean [0.5]", "std [0.25]"):
        if needle not in meta.get("lockstep.input", ""):
            failures.append("normalised cnn: lockstep.input lacks '%s': %s"
                            % (needle, meta.get("lockstep.input")))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for line in out.splitlines()[1:]:
        w = line.split()
        batch, in_shape, out_shape = int(w[1]), json.loads(w[3]), json.loads(w[5])
        stem = os.path.join(out_dir, "cnn_b%d" % batch)
        x = np.fromfile(stem + "_input.bin", dtype=np.float32).reshape(in_shape)
        ref = np.fromfile(stem + "_output.bin", dtype=np.float32).reshape(out_shape)
        assert x.max() > 1.0 and np.all(x == np.round(x)), "the inputs are not raw pixels"
        (y,) = session.run(None, {"input": x})
        err = float(np.max(np.abs(y.astype(np.float64) - ref)) / np.max(np.abs(ref)))
        (old,) = session.run(None, {"input": x / np.float32(255)})
        old_err = float(np.max(np.abs(old.astype(np.float64) - ref)) / np.max(np.abs(ref)))
        print("cnn normalised fp32 batch %d: raw pixels, normwise relative error %.2e "
              "(tolerance %.1e); x / 255 instead: %.2e" % (batch, err, F32_TOL, old_err))
        if err > F32_TOL:
            failures.append("normalised cnn batch %d: error %.2e > %.1e" % (batch, err, F32_TOL))
        if old_err < 0.05:  # a wrong input contract moves the logits by tens of percent
            failures.append("normalised cnn batch %d: x / 255 gives lockstep's output too "
                            "(%.2e): the test cannot see the preprocessing" % (batch, old_err))
    return failures


def check_refusals(build, work, ckpts):
    """Hostile uses of lockstep-export: each must fail with a clear message."""
    export = os.path.join(build, "examples", "export", "lockstep-export")
    failures = []
    cases = []
    if "mlp" in ckpts:
        cases.append((["--checkpoint", ckpts["mlp"], "--model", "cnn"], "conv1.weight"))
        cases.append((["--checkpoint", ckpts["mlp"], "--model", "mlp", "--opset", "16"],
                      "--opset"))
        cases.append((["--checkpoint", ckpts["mlp"], "--model", "mlp", "--opset", "22"],
                      "--opset"))
    for args, needle in cases:
        p = run([export, *args, "--out", os.path.join(work, "refused.onnx")], expect_ok=False)
        message = p.stdout + p.stderr
        ok = 0 < p.returncode < 128 and needle in message  # CLI11's parse errors exit 105
        print("refusal %s: rc %d, %s" % (" ".join(args[2:]), p.returncode,
                                          message.strip().splitlines()[0] if message else ""))
        if not ok:
            failures.append("lockstep-export %s: rc %d, message without '%s': %s"
                            % (" ".join(args), p.returncode, needle, message))
        if os.path.exists(os.path.join(work, "refused.onnx")):
            failures.append("lockstep-export %s left refused.onnx behind" % " ".join(args))
    return failures


def main():
    build, venv, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    ensure_venv(venv)
    failures, ckpts = [], {}
    with tempfile.TemporaryDirectory(prefix="lockstep-onnx-") as work:
        for spec in specs:
            f, ckpt = check_preset(build, work, spec)
            failures += f
            ckpts[spec.partition(":")[0]] = ckpt
        failures += check_fixed_shapes(build, work, ckpts)
        if "cnn" in ckpts:
            failures += check_normalized(build, work)
        failures += check_refusals(build, work, ckpts)
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    print("all ONNX checks passed")


if __name__ == "__main__":
    main()
