#!/usr/bin/env bash
# Exact resume and crash safety of the real programs, in fresh processes
# (issue: checkpoints). Usage: resume.sh BUILD_DIR MODE, MODE one of
#   exact        N steps straight == k steps, save, new process, resume, N-k steps:
#                bit-for-bit parameters, optimizer state and loss sequence;
#                fp32 and fp16 (loss scaler), 1 and 2 ranks, shuffling on
#   world-size   2 ranks x batch 16 resumed as 1 rank x batch 32: same data
#                order, parameters within 1e-5
#   crash        20 SIGKILLs at random moments of a run that saves every step;
#                after each, --resume auto loads a good checkpoint
set -euo pipefail
build=$1
mode=$2
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$shard" synthetic --out "$work/data" --count 2048 --shape 1,28,28 --dtype u8 --classes 10 \
  --shards 2 --seed 1 >/dev/null

launch() {  # launch RANKS ARGS...
  local ranks=$1
  shift
  if [ "$ranks" -eq 1 ]; then "$train" "$@"; else mpirun -np "$ranks" --oversubscribe "$train" "$@"; fi
}

common=(--data "$work/data" --model mlp --seed 7 --log-every 1000 --device cpu)

same_checkpoints() {  # same_checkpoints A B TOLERANCE: every dataset of A equals B's
  /usr/bin/python3 "$(dirname "$0")/same_checkpoints.py" "$@"
}

case $mode in
  exact)
    for ranks in 1 2; do
      for precision in fp32 fp16; do
        batch=$((32 / ranks))
        args=("${common[@]}" --batch-size "$batch" --precision "$precision" --optimizer adamw --lr 0.001)
        launch "$ranks" "${args[@]}" --steps 12 --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/a" \
          --metrics "$work/a.jsonl" >/dev/null
        mkdir -p "$work/b" && cp "$work"/a/ckpt-6.h5* "$work/b/"
        head -n 6 "$work/a.jsonl" >"$work/b.jsonl"
        launch "$ranks" "${args[@]}" --steps 12 --checkpoint-dir "$work/b" --resume auto \
          --metrics "$work/b.jsonl" >/dev/null
        same_checkpoints "$work/a/ckpt-12.h5" "$work/b/ckpt-12.h5" 0
        # The loss sequence: every step's metrics line, lr, scale and norm included.
        cut -d, -f1,3- "$work/a.jsonl" | sed 's/"samples_per_s.*//' >"$work/a.losses"
        cut -d, -f1,3- "$work/b.jsonl" | sed 's/"samples_per_s.*//' >"$work/b.losses"
        diff "$work/a.losses" "$work/b.losses"
        echo "exact resume: $ranks rank(s), $precision: identical"
        rm -rf "$work/a" "$work/b" "$work"/*.jsonl
      done
    done
    ;;
  world-size)
    launch 2 "${common[@]}" --batch-size 16 --steps 12 --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/a" >/dev/null
    mkdir -p "$work/b" && cp "$work"/a/ckpt-6.h5* "$work/b/"
    launch 1 "${common[@]}" --batch-size 32 --steps 12 --checkpoint-dir "$work/b" --resume auto >/dev/null
    # Same data and order; the sums over 32 rows differ only in order (two
    # halves allreduced vs one GEMM): f32 rounding after 6 SGD steps.
    same_checkpoints "$work/a/ckpt-12.h5" "$work/b/ckpt-12.h5" 1e-5
    ;;
  crash)
    # Each run resumes from the last one's newest good checkpoint and saves
    # every step, so most kills land during or between saves.
    checked=0
    for i in $(seq 1 20); do
      "$train" "${common[@]}" --batch-size 32 --steps 100000 --checkpoint-every 1 --keep 3 \
        --checkpoint-dir "$work/c" --resume auto >/dev/null 2>&1 &
      pid=$!
      sleep "$((RANDOM % 2 + 1)).$((RANDOM % 10))"
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      ls "$work"/c/ckpt-*.h5 >/dev/null 2>&1 || continue
      "$train" "${common[@]}" --batch-size 32 --steps 1 --checkpoint-dir "$work/c" --resume auto \
        >"$work/resume.log" 2>&1 || { echo "kill $i: resuming failed:"; cat "$work/resume.log"; exit 1; }
      grep -q "resumed from" "$work/resume.log" || { echo "kill $i: nothing resumed:"; cat "$work/resume.log"; exit 1; }
      checked=$((checked + 1))
    done
    [ "$checked" -ge 15 ] || { echo "only $checked of 20 kills left a checkpoint to resume"; exit 1; }
    echo "crash safety: 20 kills, $checked resumes, each from a good checkpoint"
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
