#!/usr/bin/env bash
# Note [input record] end to end (issue #47), in fresh processes: a cnn
# trained with --augment crop-flip --normalize says both in its header and
# records them in its checkpoints; --eval-only on a checkpoint without
# --normalize applies the recorded normalisation and prints the training
# run's own val figures to the digit; an explicit --normalize (another value,
# or none) overrides it and the output says so; a file without the record
# (a PyTorch-style state_dict written with h5py) keeps the flags and says it
# has no record; --init-from carries the record into a new run and its
# checkpoints. Usage: input_record.sh BUILD_DIR (exits 77, skipped, without h5py).
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "input_record.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
/usr/bin/python3 -c 'import h5py' 2>/dev/null || { echo "input_record.sh: no h5py: skipped"; exit 77; }
# Learnable images (class k of 4: a bright band at rows 7k..7k+6), so that
# the figures with and without the normalisation differ in accuracy too.
/usr/bin/python3 - "$work" <<'PY'
import os, sys, h5py, numpy as np
rng = np.random.default_rng(5)
for split, n in (("train", 256), ("val", 128)):
    y = rng.integers(0, 4, n)
    x = rng.integers(40, 70, (n, 1, 28, 28))
    for i, k in enumerate(y):
        x[i, 0, 7 * k:7 * k + 7, :] += 120
    os.makedirs(f"{sys.argv[1]}/{split}")
    with h5py.File(f"{sys.argv[1]}/{split}/shard-0.h5", "w") as f:
        f.create_dataset("inputs", data=x.astype("uint8"))
        f.create_dataset("labels", data=y.astype("int64"))
PY

# Training: the header's input line, and the epoch's evaluation to compare with.
common=(--model cnn --device cpu --batch-size 32 --seed 3 --log-every 1000)
"$train" "${common[@]}" --data "$work/train" --val-data "$work/val" --epochs 1 --lr 0.05 \
  --augment crop-flip --normalize 0.5,0.1 --checkpoint-dir "$work/a" >"$work/a.log"
expect "$work/a.log" "  input        u8 / 255, augment crop-flip (random-crop 28x28 of 1 channel, padding 4, flip), normalize 0.5,0.1 (--normalize), evaluation centre-crop 28x28 of 1 channel"
ckpt=$work/a/ckpt-8.h5
want=$(grep '^epoch 1: val_loss' "$work/a.log" | sed 's/^epoch 1: //')
[ -n "$want" ] || { cat "$work/a.log" >&2; fail "the training run printed no val figures"; }
/usr/bin/python3 - "$ckpt" <<'PY'
import sys, h5py
a = h5py.File(sys.argv[1], "r").attrs
got = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in a.items()
       if k.startswith("input.")}
want = {"input.scaling": "u8/255", "input.mean": "0.5", "input.std": "0.1",
        "input.augment": "crop-flip", "input.eval_transform": "centre-crop 28x28 of 1 channel"}
assert got == want, got
PY

# --eval-only without --normalize: the checkpoint's normalisation, the run's figures.
eval_only=(--eval-only --val-data "$work/val" --model cnn --device cpu --batch-size 32)
evaluated() { grep 'val_loss' "$1" | sed 's/^.*: val_loss/val_loss/'; }
"$train" "${eval_only[@]}" --init-from "$ckpt" >"$work/e.log"
expect "$work/e.log" "input: u8 / 255, normalize 0.5,0.1 (the checkpoint's), evaluation centre-crop 28x28 of 1 channel"
[ "$(evaluated "$work/e.log")" = "$want" ] ||
  fail "--eval-only without --normalize printed '$(evaluated "$work/e.log")', the run '$want'"
# The same value given on purpose: the same figures.
"$train" "${eval_only[@]}" --init-from "$ckpt" --normalize 0.50,0.1 >"$work/same.log"
expect "$work/same.log" "normalize 0.50,0.1 (--normalize, as the checkpoint's)"
[ "$(evaluated "$work/same.log")" = "$want" ] || fail "--normalize 0.50,0.1 changed the figures"
# Overrides are said, and change the figures (so the comparisons above can fail).
"$train" "${eval_only[@]}" --init-from "$ckpt" --normalize 0.4,0.2 >"$work/other.log"
expect "$work/other.log" "normalize 0.4,0.2 (overriding the checkpoint's 0.5,0.1)"
"$train" "${eval_only[@]}" --init-from "$ckpt" --normalize none >"$work/none.log"
expect "$work/none.log" "normalize none (overriding the checkpoint's 0.5,0.1), evaluation none"
accuracy() { sed 's/^.*val_accuracy \([0-9.]*%\).*$/\1/' <<<"$1"; }
[ "$(accuracy "$(evaluated "$work/none.log")")" != "$(accuracy "$want")" ] ||
  fail "no normalisation gave the trained accuracy, $(accuracy "$want"): the test cannot tell"

# A weights file without the record (PyTorch's state_dict through h5py): the
# flags as given, and the output says the file has no record.
/usr/bin/python3 - "$ckpt" "$work/state_dict.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as src, h5py.File(sys.argv[2], "w") as dst:
    src.copy("model", dst)
    if "buffers" in src:
        for name, data in src["buffers"].items():
            dst["model/" + name] = data[()]
PY
"$train" "${eval_only[@]}" --init-from "$work/state_dict.h5" >"$work/sd.log"
expect "$work/sd.log" "normalize none (no --normalize: $work/state_dict.h5 has no input record, as a PyTorch state_dict has none)"
"$train" "${eval_only[@]}" --init-from "$work/state_dict.h5" --normalize 0.5,0.1 >"$work/sd2.log"
[ "$(evaluated "$work/sd2.log")" = "$want" ] || fail "the state_dict with --normalize differs"

# --init-from carries the record into a new run, its header and its checkpoints.
"$train" "${common[@]}" --data "$work/train" --steps 1 --init-from "$ckpt" \
  --checkpoint-dir "$work/b" >"$work/b.log"
expect "$work/b.log" "  input        u8 / 255, augment none, normalize 0.5,0.1 (the checkpoint's), evaluation centre-crop 28x28 of 1 channel"
/usr/bin/python3 -c 'import sys, h5py; a = h5py.File(sys.argv[1], "r").attrs
assert a["input.mean"] in (b"0.5", "0.5") and a["input.augment"] in (b"none", "none"), dict(a)' \
  "$work/b/ckpt-1.h5"
echo "input_record.sh: the input record written, applied, overridden and reported: ok"
