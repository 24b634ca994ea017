#!/usr/bin/env bash
# NVIDIA's ResNet-50 v1.5 recipe through lockstep-train (docs/recipes.md), at a
# sixteenth of resnet50's widths on the CPU so that it runs in seconds: an
# ImageFolder tree of 3 classes of JPEGs (made here with Debian's
# python3-pil) sharded by lockstep-shard images; trained with the recipe's
# flags (SGD momentum 0.875, weight decay 3.0517578125e-05 off BatchNorm and
# biases, warmup then cosine, label smoothing 0.1, zero-init residual,
# random-resized-crop at 224, flip, ImageNet normalisation); the model takes
# its 3 classes from classes.txt (Note [classes from the data]) and the header
# says so, --eval-only rebuilds it the same way, and without a classes.txt the
# preset's 1000 stay; lockstep-predict and lockstep-export take the classes
# and widths from the checkpoint; the loader-pace line before the summary (Note [loader
# pace]); the new flags' refusals; bench_loader --threads-sweep where built.
# Usage: recipe.sh BUILD_DIR (exits 77, skipped, without PIL).
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "recipe.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
/usr/bin/python3 -c 'import PIL' 2>/dev/null || { echo "recipe.sh: no python3-pil: skipped"; exit 77; }

/usr/bin/python3 - "$work" <<'PY'
import os, sys, random
from PIL import Image
work = sys.argv[1]
rng = random.Random(7)
for split, count in (("train", 8), ("val", 4)):
    for k, name in enumerate(("cat", "dog", "fox")):
        os.makedirs(f"{work}/{split}/{name}", exist_ok=True)
        for i in range(count):
            w, h = rng.randint(40, 120), rng.randint(40, 120)
            im = Image.new("RGB", (w, h), (80 * k, 100, 200 - 60 * k))
            px = im.load()
            for y in range(0, h, 3):
                for x in range(0, w, 3):
                    px[x, y] = (rng.randint(0, 255), rng.randint(0, 255), rng.randint(0, 255))
            im.save(f"{work}/{split}/{name}/{i:03d}.jpg", quality=90)
PY
"$shard" images --src "$work/train" --out "$work/shards/train" >/dev/null
"$shard" images --src "$work/val" --out "$work/shards/val" >/dev/null

recipe=(--model resnet50 --width-divisor 16 --device cpu --batch-size 4 --lr 0.256
  --momentum 0.875 --weight-decay 3.0517578125e-05 --no-decay-bias-norm --schedule cosine
  --warmup 1 --label-smoothing 0.1 --zero-init-residual --augment imagenet
  --normalize 0.485,0.456,0.406,0.229,0.224,0.225 --loader-threads 2 --seed 3)
"$train" --data "$work/shards/train" --val-data "$work/shards/val" "${recipe[@]}" --steps 4 \
  --checkpoint-dir "$work/ck" --log-every 1 >"$work/a.log"
expect "$work/a.log" "lockstep-train: resnet50, 3 classes, as --data's classes.txt names them (the preset has 1000), widths / 16, zero-init residual"
expect "$work/a.log" "2 loader threads"
expect "$work/a.log" "augment imagenet (random-resized-crop 224x224 of 3 channels, flip)"
expect "$work/a.log" "evaluation centre-crop 224x224 of 3 channels"
expect "$work/a.log" "loader pace: rank 0's steps waited for data"
expect "$work/a.log" "(steps 2-4, 2 loader threads a rank)"
expect "$work/a.log" "epoch 1: val_loss"
# Warmup then cosine: the first step's lr is the whole lr after 1 warmup step,
# the last is 0 (the cosine's end).
expect "$work/a.log" "step 1/4  loss"
grep -q "step 1/4 .* lr 0.256 " "$work/a.log" || fail "step 1's lr is not 0.256"
grep -q "step 4/4 .* lr 0 " "$work/a.log" || fail "step 4's lr is not 0"

# --eval-only builds the same 3-class model from --val-data's classes.txt,
# and gives the run's own figures (with its label smoothing, the run's loss).
want=$(grep 'epoch 1: val_loss' "$work/a.log" | sed 's/^epoch 1: //')
"$train" --eval-only --init-from "$work/ck/ckpt-4.h5" --val-data "$work/shards/val" \
  --model resnet50 --width-divisor 16 --device cpu --batch-size 4 --label-smoothing 0.1 \
  >"$work/e.log"
got=$(grep 'val_loss' "$work/e.log" | sed 's/^.*: val_loss/val_loss/')
[ "$got" = "$want" ] || fail "--eval-only printed '$got', the run's evaluation '$want'"

# lockstep-predict and lockstep-export build the 3-class model at widths / 16
# from the checkpoint's own weights and say so (Note [model from the weights]).
"$build/examples/predict/lockstep-predict" --checkpoint "$work/ck/ckpt-4.h5" --model resnet50 \
  --data "$work/shards/val" --device cpu --out "$work/p.jsonl" >"$work/p.log"
expect "$work/p.log" "model resnet50: 3 classes, widths / 16, as the weights of ckpt-4.h5 have them (the preset has 1000 classes)"
[ "$(grep -c '"class": [012][,}]' "$work/p.jsonl")" = 12 ] || fail "lockstep-predict gave no class of 3 for each of 12 images"
"$build/examples/export/lockstep-export" --checkpoint "$work/ck/ckpt-4.h5" --model resnet50 \
  --out "$work/r.onnx" >"$work/x.log"
expect "$work/x.log" "lockstep-export: model resnet50: 3 classes, widths / 16, as the weights"
grep -qaF "output: [batch, 3] logits" "$work/r.onnx" || fail "the ONNX file does not say 3 classes"

# Without a classes.txt the preset's 1000 classes stay, and the header names none.
rm "$work/shards/train/classes.txt"
"$train" --data "$work/shards/train" "${recipe[@]}" --steps 2 >"$work/b.log"
expect "$work/b.log" "lockstep-train: resnet50, widths / 16, zero-init residual"
python3 - "$work/b.log" <<'PY' || fail "the run without classes.txt named a class count"
import sys
sys.exit(1 if "classes" in open(sys.argv[1]).readline() else 0)
PY

# The new flags' refusals name the flag and the value.
for bad in "--width-divisor 0" "--width-divisor 5000" "--loader-threads 0"; do
  read -r -a args <<<"$bad"
  if "$train" --data "$work/shards/train" --model resnet50 --device cpu --steps 1 "${args[@]}" \
    >"$work/r.log" 2>&1; then
    fail "$bad was accepted"
  fi
  expect "$work/r.log" "${args[0]}"
done
if "$train" --data "$work/shards/train" --model resnet50 --width-divisor 3 --device cpu --steps 1 \
  >"$work/r.log" 2>&1; then
  fail "--width-divisor 3 was accepted"
fi
expect "$work/r.log" "width_divisor 3"
if "$train" --data "$work/shards/train" --model mlp --zero-init-residual --device cpu --steps 1 \
  >"$work/r.log" 2>&1; then
  fail "--zero-init-residual was accepted for mlp"
fi
expect "$work/r.log" "no residual blocks to zero-initialise"
# bench_loader --threads-sweep (where the benchmarks are built): a row per
# thread count and the threads a rate needs, in the table and the JSON.
if [ -x "$build/bench/bench_loader" ]; then
  "$build/bench/bench_loader" --data "$work/shards/val" --batch 4 --threads-sweep 1,2 --trials 1 \
    --target-images-per-s 1e6 --json "$work/sweep.jsonl" >"$work/sweep.log"
  expect "$work/sweep.log" "delivered to cpu"
  expect "$work/sweep.log" "1000000 images/s (--target-images-per-s): no thread count tried reaches it"
  [ "$(grep -c '"bench": "loader_images_threads"' "$work/sweep.jsonl")" = 2 ] ||
    fail "bench_loader --threads-sweep 1,2 wrote no row per thread count"
  expect "$work/sweep.jsonl" '"bench": "loader_images_threads_needed"'
  "$shard" synthetic --out "$work/fixed" --count 64 --shape 3,8,8 --dtype u8 --classes 3 >/dev/null
  if "$build/bench/bench_loader" --data "$work/fixed" --batch 4 --threads-sweep 1 >"$work/r.log" 2>&1; then
    fail "bench_loader --threads-sweep ran on fixed-shape shards"
  fi
  expect "$work/r.log" "--threads-sweep times the image pipeline"
fi
echo "recipe.sh: the ResNet-50 recipe at width / 16, classes from classes.txt, --eval-only: ok"
