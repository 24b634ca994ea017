#!/usr/bin/env bash
# The image pipeline end to end, in fresh processes: an ImageFolder tree of
# small JPEGs (made here with Debian's python3-pil) becomes encoded-image
# shards with one lockstep-shard command; lockstep-train trains the cnn on it
# with --augment preset (crop-flip) and --normalize on 2 ranks, evaluating
# every 4 steps; a run resumed from its step-4 checkpoint ends with the same
# checkpoint bit for bit; --eval-only gives that checkpoint's val figures,
# the same on 1 and 2 ranks and the same as the run's own evaluation at that
# step; resnet (3 channels) on grayscale images is refused naming both.
# Usage: images.sh BUILD_DIR (exits 77, skipped, without PIL or h5py).
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "images.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
/usr/bin/python3 -c 'import PIL, h5py' 2>/dev/null || { echo "images.sh: no python3-pil or h5py: skipped"; exit 77; }

# Class k of 4 is a bright band at rows 6k..6k+5; images of 24 to 80 pixels a
# side, so the centre crop and the random crops resample them, and some of the
# larger ones (a crop box of 56 pixels or more a side for the 28 x 28 input) are
# decoded at half size (Note [scaled decode] in io/image_transform.cpp).
/usr/bin/python3 - "$work" <<'PY'
import os, sys, random
from PIL import Image
work = sys.argv[1]
rng = random.Random(3)
for split, count in (("train", 24), ("val", 8)):
    for k in range(4):
        os.makedirs(f"{work}/{split}/class-{k}", exist_ok=True)
        for i in range(count):
            w, h = rng.randint(24, 80), rng.randint(24, 80)
            im = Image.new("L", (w, h))
            px = im.load()
            for y in range(h):
                for x in range(w):
                    band = (y * 28 // h) // 7 == k
                    px[x, y] = (200 if band else 40) + rng.randint(0, 30)
            im.save(f"{work}/{split}/class-{k}/{i:03d}.jpg", quality=90)
PY
"$shard" images --src "$work/train" --out "$work/shards/train" --shards 2 >"$work/shard.log"
expect "$work/shard.log" "wrote 96 images"
"$shard" images --src "$work/val" --out "$work/shards/val" >/dev/null

common=(--data "$work/shards/train" --val-data "$work/shards/val" --model cnn --seed 4
  --batch-size 8 --lr 0.05 --device cpu --log-every 1000 --augment preset
  --normalize 0.3,0.3 --val-every 4 --steps 8)
run2() { mpirun -np 2 --oversubscribe "$train" "$@"; }
run2 "${common[@]}" --checkpoint-dir "$work/a" --checkpoint-every 4 --keep 5 >"$work/a.log"
expect "$work/a.log" "step 8: val_loss"
mkdir -p "$work/b" && cp "$work"/a/ckpt-4.h5* "$work/b/"
run2 "${common[@]}" --checkpoint-dir "$work/b" --resume auto >"$work/b.log"
/usr/bin/python3 "$(dirname "$0")/same_checkpoints.py" "$work/a/ckpt-8.h5" "$work/b/ckpt-8.h5" 0
# The resumed run's evaluation at step 8 is the straight run's, to the digit.
[ "$(grep 'step 8: val_loss' "$work/a.log")" = "$(grep 'step 8: val_loss' "$work/b.log")" ] ||
  fail "step 8's evaluation differs after the resume"

# --eval-only: the figures of the run's own evaluation at step 8, on 1 and 2 ranks.
want=$(grep 'step 8: val_loss' "$work/a.log" | sed 's/^step 8: //')
eval_only=(--eval-only --init-from "$work/a/ckpt-8.h5" --val-data "$work/shards/val" --model cnn
  --batch-size 8 --device cpu --normalize 0.3,0.3)
"$train" "${eval_only[@]}" --metrics "$work/eval.jsonl" >"$work/e1.log"
run2 "${eval_only[@]}" >"$work/e2.log"
for log in e1 e2; do
  got=$(grep 'val_loss' "$work/$log.log" | sed 's/^.*: val_loss/val_loss/')
  [ "$got" = "$want" ] || fail "--eval-only ($log) printed '$got', the run's step 8 '$want'"
done
expect "$work/eval.jsonl" '"eval_only": "'"$work/a/ckpt-8.h5"'"'
expect "$work/eval.jsonl" '"val_accuracy":'

# --eval-only needs the weights and the val set, and no training data.
"$train" --eval-only --val-data "$work/shards/val" --model cnn --device cpu >"$work/n.log" 2>&1 &&
  fail "--eval-only ran without --init-from"
expect "$work/n.log" "--eval-only evaluates the weights of --init-from FILE"
"$train" "${eval_only[@]}" --data "$work/shards/train" >"$work/n.log" 2>&1 &&
  fail "--eval-only ran with --data"
expect "$work/n.log" "leave --data out"

# Grayscale images for a 3-channel model: refused naming both.
if "$train" --data "$work/shards/train" --model resnet --steps 1 --device cpu >"$work/r.log" 2>&1; then
  fail "resnet trained on grayscale images"
fi
expect "$work/r.log" "the image has 1 channel (grayscale), but the model takes 3"
echo "images.sh: shards, augmented training on 2 ranks, exact resume and --eval-only: ok"
