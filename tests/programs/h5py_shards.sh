#!/usr/bin/env bash
# lockstep-train on shards a user writes with h5py (docs/data-format.md), in
# fresh processes on 2 ranks: f32 images with h5py's uint8 labels trained by
# the cnn preset with --loss cross-entropy (and label smoothing) to a val
# accuracy well above chance; f32 inputs with float 'targets' trained by the
# mlp with --loss mse until the loss falls; and what is refused, in h5py's
# words: f64 inputs, labels for an elementwise loss, targets for
# cross-entropy, smoothing for mse. Usage: h5py_shards.sh BUILD_DIR
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "h5py_shards.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}

# Class k lights the k-th 2x28 band of the image; the regression target is
# the mean of each band, so both tasks are learnable.
/usr/bin/python3 - "$work" <<'PY'
import os, sys
import h5py, numpy as np
work = sys.argv[1]
rng = np.random.default_rng(5)
def images(n):
    y = rng.integers(0, 10, n).astype(np.uint8)
    x = 0.3 * rng.random((n, 1, 28, 28))
    for i, k in enumerate(y):
        x[i, 0, 2 * k:2 * k + 2, :] += 0.7
    return x, y
for split, n in (("train", 1024), ("val", 256)):
    x, y = images(n)
    bands = x[:, 0, :20, :].reshape(n, 10, 56).mean(axis=2)
    for kind in ("images", "regress", "f64"):
        os.makedirs(f"{work}/{kind}/{split}", exist_ok=True)
    with h5py.File(f"{work}/images/{split}/shard-0.h5", "w") as f:
        f.create_dataset("inputs", data=x.astype("float32"))
        f.create_dataset("labels", data=y)  # uint8, as h5py keeps numpy's dtype
    with h5py.File(f"{work}/regress/{split}/shard-0.h5", "w") as f:
        f.create_dataset("inputs", data=x.astype("float32"))
        f.create_dataset("targets", data=bands.astype("float32"))
    with h5py.File(f"{work}/f64/{split}/shard-0.h5", "w") as f:
        f.create_dataset("inputs", data=x)  # numpy's default float64
        f.create_dataset("labels", data=y.astype("int64"))
PY

common=(--device cpu --batch-size 32 --epochs 3 --optimizer adamw --lr 0.002 --log-every 1000)
mpirun -np 2 --oversubscribe "$train" "${common[@]}" --model cnn --data "$work/images/train" \
  --val-data "$work/images/val" --label-smoothing 0.05 >"$work/ce" 2>&1 || { cat "$work/ce"; fail "cross-entropy run failed"; }
expect "$work/ce" "inputs f32 [1, 28, 28], labels u8"
expect "$work/ce" "lockstep-train: done at step 48"
accuracy=$(grep -oP 'epoch 3: val_loss [0-9.]+  val_accuracy \K[0-9.]+' "$work/ce") ||
  { cat "$work/ce"; fail "no val accuracy after epoch 3"; }
# Chance is 10%; the bands separate the classes.
awk -v a="$accuracy" 'BEGIN { exit !(a > 80) }' || fail "val accuracy $accuracy% after 3 epochs"

mpirun -np 2 --oversubscribe "$train" "${common[@]}" --model mlp --data "$work/regress/train" \
  --val-data "$work/regress/val" --loss mse --metrics "$work/mse.jsonl" >"$work/mse" 2>&1 ||
  { cat "$work/mse"; fail "mse run failed"; }
expect "$work/mse" "targets f32 [10]"
expect "$work/mse" "lockstep-train: done at step 48"
grep -q "val_accuracy" "$work/mse" && fail "an mse run reported an accuracy"
/usr/bin/python3 - "$work/mse.jsonl" <<'PY' || fail "the mse loss did not fall"
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r and "step" in r]
first, last = steps[0]["loss"], steps[-1]["loss"]
print(f"mse: step 1 loss {first:.4g}, step {steps[-1]['step']} loss {last:.4g}")
sys.exit(0 if last < 0.2 * first else 1)
PY

refused() {  # refused FILE TEXT ARGS...: lockstep-train exits 1 saying TEXT
  local out=$1 text=$2
  shift 2
  if "$train" --model mlp --device cpu --steps 1 "$@" >"$out" 2>&1; then
    fail "lockstep-train $* did not fail"
  fi
  expect "$out" "$text"
}
refused "$work/e1" "astype('float32')" --data "$work/f64/train"
refused "$work/e2" "--loss mse reads float 'targets'" --data "$work/images/train" --loss mse
refused "$work/e3" "reads class indices from a 'labels' dataset" --data "$work/regress/train"
refused "$work/e4" "--label-smoothing 0.1 applies to --loss cross-entropy" \
  --data "$work/regress/train" --loss mse --label-smoothing 0.1
echo "h5py_shards.sh: h5py's shards train with cross-entropy and mse; bad ones are refused in h5py's words"
