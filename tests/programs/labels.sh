#!/usr/bin/env bash
# Labels and targets that mean the same thing everywhere, in fresh processes:
# lockstep-shard images refuses a val tree with an empty class folder (as
# torchvision's ImageFolder does) naming the folder; a val split written
# without that class (a list of its images) numbers the classes after it
# differently, and lockstep-train refuses it at the start naming both splits
# and the first class that differs, where the same classes train; --loss bce
# refuses targets outside [0, 1] in --data or --val-data naming the shard,
# the row and the value, where --loss mse takes them and in-range ones train.
# Usage: labels.sh BUILD_DIR (exits 77, skipped, without PIL or h5py).
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "labels.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
refused() {  # refused FILE TEXT ARGS...: lockstep-train exits 1 saying TEXT
  local out=$1 text=$2 rc=0
  shift 2
  "$train" --device cpu --steps 1 --batch-size 4 "$@" >"$out" 2>&1 || rc=$?
  [ "$rc" = 1 ] || { cat "$out" >&2; fail "lockstep-train $* exited $rc, not 1"; }
  expect "$out" "$text"
}
/usr/bin/python3 -c 'import PIL, h5py' 2>/dev/null || { echo "labels.sh: no python3-pil or h5py: skipped"; exit 77; }

# Small grey JPEGs: train has cat, dog and emu; val's dog folder is empty.
# Target shards of 8 rows of 10 (the mlp's outputs): in [0, 1], and with
# 1.5 at row 3, value 4 (train) or -0.5 at row 6, value 0 (val).
/usr/bin/python3 - "$work" <<'PY'
import os, sys
import h5py, numpy as np
from PIL import Image
work = sys.argv[1]
for split, classes in (("train", ("cat", "dog", "emu")), ("val", ("cat", "emu"))):
    for k, name in enumerate(classes):
        os.makedirs(f"{work}/{split}/{name}", exist_ok=True)
        for i in range(4):
            Image.new("L", (28, 28), 40 * k + 10 * i).save(f"{work}/{split}/{name}/{i}.jpg")
os.makedirs(f"{work}/val/dog")
rng = np.random.default_rng(2)
def targets(name, bad=None):
    os.makedirs(f"{work}/{name}")
    y = rng.random((8, 10)).astype("float32")
    if bad: y[bad[0], bad[1]] = bad[2]
    with h5py.File(f"{work}/{name}/shard-0.h5", "w") as f:
        f["inputs"] = rng.random((8, 1, 28, 28)).astype("float32")
        f["targets"] = y
targets("good")
targets("good-val")
targets("high", (3, 4, 1.5))
targets("low-val", (6, 0, -0.5))
PY

# The empty class folder: refused by name, nothing written.
if "$shard" images --src "$work/val" --out "$work/val-shards" >"$work/empty.log" 2>&1; then
  fail "lockstep-shard packed a tree with an empty class folder"
fi
expect "$work/empty.log" "class folder '$work/val/dog' holds no .jpg, .jpeg or .png file"
[ ! -e "$work/val-shards" ] || fail "lockstep-shard wrote $work/val-shards after refusing it"

"$shard" images --src "$work/train" --out "$work/train-shards" >/dev/null
# The val images without the dog folder, as a list: classes cat and emu.
(cd "$work/val" && ls cat/*.jpg emu/*.jpg) >"$work/val/list.txt"
"$shard" images --src "$work/val/list.txt" --out "$work/val-shards" >/dev/null
expect "$work/val-shards/classes.txt" "emu"
refused "$work/classes.log" "--val-data $work/val-shards and --data $work/train-shards number their classes differently: class 1 is \"emu\" in '$work/val-shards/classes.txt' but \"dog\" in '$work/train-shards/classes.txt'" \
  --model cnn --data "$work/train-shards" --val-data "$work/val-shards"
# The train split as its own val split: the same classes, so it trains.
"$train" --device cpu --steps 1 --batch-size 4 --model cnn --data "$work/train-shards" \
  --val-data "$work/train-shards" >"$work/same.log" 2>&1 || { cat "$work/same.log" >&2; fail "the same classes were refused"; }
expect "$work/same.log" "lockstep-train: done at step 1"

# --loss bce: targets are probabilities.
refused "$work/high.log" "shard-0.h5', dataset 'targets', row 3: target 1.5 (value 4 of the row) is outside [0, 1]" \
  --model mlp --loss bce --data "$work/high"
refused "$work/low.log" "low-val/shard-0.h5', dataset 'targets', row 6: target -0.5 (value 0 of the row) is outside [0, 1]" \
  --model mlp --loss bce --data "$work/good" --val-data "$work/low-val"
"$train" --device cpu --steps 1 --batch-size 4 --model mlp --loss bce --data "$work/good" \
  --val-data "$work/good-val" >"$work/bce.log" 2>&1 || { cat "$work/bce.log" >&2; fail "--loss bce refused targets in [0, 1]"; }
expect "$work/bce.log" "lockstep-train: done at step 1"
"$train" --device cpu --steps 1 --batch-size 4 --model mlp --loss mse --data "$work/high" \
  >"$work/mse.log" 2>&1 || { cat "$work/mse.log" >&2; fail "--loss mse refused a target of 1.5"; }
echo "labels.sh: an empty class, a val split of other classes and BCE targets out of [0, 1] refused; ok"
