#!/usr/bin/env bash
# README's demo command: installs what lockstep needs, builds it, converts
# Fashion-MNIST (Debian's dataset-fashion-mnist) into HDF5 shards, trains the
# cnn preset with `mpirun -np 2` (on the GPU when one is usable, else the CPU),
# prints the run header, progress, the val accuracy after each epoch and the
# run summary, and plots the curves to a PNG.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${LOCKSTEP_BUILD_DIR:-build}
out=${LOCKSTEP_DEMO_DIR:-out/demo}
epochs=${LOCKSTEP_DEMO_EPOCHS:-3}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target lockstep-train lockstep-shard

mkdir -p "$out"
if [ ! -d "$out/data/val" ]; then  # (data from before the split was named val: made again)
  rm -rf "$out/data"
  "$build"/examples/shard/lockstep-shard fashion-mnist \
    --src /usr/share/datasets/fashion-mnist --out "$out/data" --shards 4
fi

# Note [BLAS kernels] (kernels/gemm.h): OpenBLAS's own kernels for this
# processor, where Debian's OpenBLAS does not recognise it.
coretype=$(scripts/openblas-coretype.sh)
if [ -n "$coretype" ]; then
  export OPENBLAS_CORETYPE=$coretype
  echo "OPENBLAS_CORETYPE=$coretype: Debian's OpenBLAS does not recognise this processor"
fi
# OpenMPI refuses to run as root unless told that it is on purpose.
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Each demo run trains afresh: the previous demo's metrics and checkpoints go
# (lockstep-train refuses to start a fresh run over another run's checkpoints).
rm -rf "$out/metrics.jsonl" "$out/checkpoints"
mpirun -np 2 --bind-to none "$build"/examples/train/lockstep-train \
  --data "$out/data/train" --val-data "$out/data/val" --model cnn --epochs "$epochs" \
  --batch-size 32 --optimizer sgd --lr 0.05 --momentum 0.9 --schedule cosine --warmup 100 \
  --threads 1 --log-every 100 --metrics "$out/metrics.jsonl" --checkpoint-dir "$out/checkpoints"

/usr/bin/python3 tools/plot.py metrics "$out/metrics.jsonl" -o "$out/curves.png"
