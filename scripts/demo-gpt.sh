#!/usr/bin/env bash
# README's language-model demo: installs what lockstep needs and Debian's
# `fortunes` package (about 2.6 MB of plain-text fortune cookies), builds
# lockstep, writes the fortunes as byte-level token windows (5% held out),
# trains the gpt-tiny preset with `mpirun -np 2` (on the GPU when one is
# usable, else the CPU), prints the loss, the val loss and bits per byte,
# a greedy sample, and plots the curves to a PNG.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${LOCKSTEP_BUILD_DIR:-build}
out=${LOCKSTEP_DEMO_DIR:-out/demo-gpt}
steps=${LOCKSTEP_DEMO_STEPS:-400}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target lockstep-train lockstep-shard

mkdir -p "$out"
# The fortune files themselves: not their .dat indexes nor the .u8 links.
mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
[ -d "$out/data/train" ] || "$build"/examples/shard/lockstep-shard text --src "${texts[@]}" \
  --out "$out/data" --seq 128 --shards 4 --val-fraction 0.05

# OpenMPI refuses to run as root unless told that it is on purpose.
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Each demo run trains afresh: the previous demo's metrics and checkpoints go
# (lockstep-train refuses to start a fresh run over another run's checkpoints).
rm -rf "$out/metrics.jsonl" "$out/checkpoints"
# gpt-tiny's tokens are bytes, so its bits per token are bits per byte.
mpirun -np 2 --bind-to none "$build"/examples/train/lockstep-train \
  --data "$out/data/train" --val-data "$out/data/val" --model gpt-tiny --steps "$steps" \
  --batch-size 8 --optimizer adamw --lr 0.002 --weight-decay 0.1 --no-decay-bias-norm \
  --schedule cosine --warmup $((steps / 10)) --clip 1.0 --threads 1 --log-every 25 \
  --metrics "$out/metrics.jsonl" --checkpoint-dir "$out/checkpoints" \
  --sample-tokens 200 --prompt $'\n'

/usr/bin/python3 tools/plot.py metrics "$out/metrics.jsonl" -o "$out/curves.png"
