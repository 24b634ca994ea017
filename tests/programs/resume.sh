#!/usr/bin/env bash
# Exact resume and crash safety of the real programs, in fresh processes
# (issue: checkpoints). Usage: resume.sh BUILD_DIR MODE, MODE one of
#   exact        N steps straight == k steps, save, new process, resume, N-k steps:
#                bit-for-bit parameters, optimizer state and loss sequence;
#                fp32 and fp16 (loss scaler), 1 and 2 ranks, shuffling on
#   gpt          exact resume with gpt-tiny (dropout 0.1; fp32, fp16, and --zero 3,
#                whose checkpoint is --zero 0's bit for bit) on byte windows of the
#                project's docs: 2 ranks, fp32 and fp16 (loss scaler), bit for bit
#   world-size   2 ranks x batch 16 resumed as 1 rank x batch 32: same data
#                order, parameters within 1e-5
#   invariant    --rank-invariant (--global-batch 64 of 8-row chunks, clipping):
#                4 ranks to step 10, then 2 ranks (--zero 1) to step 20, then
#                1 rank to step 30 equals 4 ranks straight to step 30, bit for
#                bit: checkpoints and loss lines; a world size the global batch
#                does not support (3 ranks) is refused naming 1, 2, 4 or 8
#   invariant-models  --rank-invariant with the cnn preset (bf16, clipping,
#                --zero 1 on 4 ranks) and resnet (BatchNorm, fp16 with the loss
#                scaler) on tiny shards: 1, 2 and 4 ranks write the same
#                checkpoints (running statistics included) and loss lines
#   zero         --zero 1, 2 and 3 on 2 ranks: exact resume; the checkpoint is the one
#                --zero 0 writes, bit for bit (a --zero 0 one resumed with
#                --zero 2 ends on it); resumed without ZeRO on 1 rank
#                x batch 32, parameters within 1e-5 of the 2-rank ZeRO run
#   checkpointing  gpt-tiny (dropout 0.1) with --activation-checkpointing makes
#                the checkpoints of the plain run bit for bit; each resumes
#                the other's step-6 checkpoint with the setting switched and
#                ends on the other's step-12 checkpoint, bit for bit
#   channels-last  resnet (widths / 16, bf16) with --channels-last runs two
#                steps, says so in its header, and writes the NCHW run's
#                checkpoints bit for bit; the NCHW run's step-1 checkpoint
#                resumed with --channels-last ends on its step-2 checkpoint
#   crash        20 SIGKILLs at random moments of a run that saves every step;
#                after each, --resume auto loads a good checkpoint
#   fingerprint  a gpt-tiny checkpoint made with --dropout 0.1 is refused by a
#                resume that leaves --dropout at its default (0), and resumes
#                with --dropout 0.1 (Note [resume fingerprint]); a resume with
#                half the global batch is refused naming --batch-size, and one
#                of the same global batch with --accum 2 resumes (Note [run
#                fingerprint])
#   lock         while one run trains into a directory, a second one, fresh or
#                --resume auto, is refused naming the first's host, pid and
#                start time; once the first is killed (SIGKILL), a resume
#                takes the directory (Note [checkpoint lock])
#   ownership    a fresh run refuses a --checkpoint-dir that holds checkpoints;
#                a run resumed from an early checkpoint into a directory with
#                a later one keeps the checkpoint it writes (--keep 1)
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

exact_resume() {  # exact_resume RANKS ARGS...: 12 steps straight == 6, save, resume, 6
  local ranks=$1
  shift
  launch "$ranks" "$@" --steps 12 --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/a" \
    --metrics "$work/a.jsonl" >/dev/null
  mkdir -p "$work/b" && cp "$work"/a/ckpt-6.h5* "$work/b/"
  grep -m 6 '"loss":' "$work/a.jsonl" >"$work/b.jsonl"  # steps 1-6 (Note [run records])
  launch "$ranks" "$@" --steps 12 --checkpoint-dir "$work/b" --resume auto \
    --metrics "$work/b.jsonl" >/dev/null
  same_checkpoints "$work/a/ckpt-12.h5" "$work/b/ckpt-12.h5" 0
  # The loss sequence: every step's metrics line, lr, scale and norm included.
  grep '"loss":' "$work/a.jsonl" | cut -d, -f1,3- | sed 's/"samples_per_s.*//' >"$work/a.losses"
  grep '"loss":' "$work/b.jsonl" | cut -d, -f1,3- | sed 's/"samples_per_s.*//' >"$work/b.losses"
  diff "$work/a.losses" "$work/b.losses"
  rm -rf "$work/a" "$work/b" "$work"/*.jsonl
}

case $mode in
  exact)
    for ranks in 1 2; do
      for precision in fp32 fp16; do
        batch=$((32 / ranks))
        exact_resume "$ranks" "${common[@]}" --batch-size "$batch" --precision "$precision" \
          --optimizer adamw --lr 0.001
        echo "exact resume: $ranks rank(s), $precision: identical"
      done
    done
    ;;
  gpt)
    docs=$(dirname "$0")/../../docs
    "$shard" text --src "$docs"/*.md --out "$work/text" --seq 32 --shards 2 >/dev/null
    for precision in fp32 fp16; do
      exact_resume 2 --data "$work/text/train" --model gpt-tiny --dropout 0.1 --seed 7 \
        --log-every 1000 --device cpu --batch-size 4 --precision "$precision" --optimizer adamw \
        --lr 0.001
      echo "exact resume: gpt-tiny, 2 ranks, $precision: identical"
    done
    # ZeRO-3: blocks gathered around their passes, embeddings and head resident.
    gpt=(--data "$work/text/train" --model gpt-tiny --dropout 0.1 --seed 7 --log-every 1000
      --device cpu --batch-size 4 --optimizer adamw --lr 0.001)
    exact_resume 2 "${gpt[@]}" --zero 3
    for stage in 0 3; do
      launch 2 "${gpt[@]}" --steps 6 --checkpoint-every 6 --checkpoint-dir "$work/g$stage" \
        --zero "$stage" >/dev/null
    done
    same_checkpoints "$work/g3/ckpt-6.h5" "$work/g0/ckpt-6.h5" 0
    echo "gpt-tiny --zero 3 on 2 ranks: exact resume, and the checkpoint --zero 0 writes"
    ;;
  checkpointing)
    "$shard" text --src "$(dirname "$0")"/../../docs/*.md --out "$work/text" --seq 32 >/dev/null
    gpt=(--data "$work/text/train" --model gpt-tiny --dropout 0.1 --seed 7 --log-every 1000
      --device cpu --batch-size 4 --optimizer adamw --lr 0.001 --steps 12)
    launch 1 "${gpt[@]}" --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/plain" >/dev/null
    launch 1 "${gpt[@]}" --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/ckpt" \
      --activation-checkpointing >/dev/null
    same_checkpoints "$work/plain/ckpt-6.h5" "$work/ckpt/ckpt-6.h5" 0
    same_checkpoints "$work/plain/ckpt-12.h5" "$work/ckpt/ckpt-12.h5" 0
    mkdir -p "$work/on" "$work/off"
    cp "$work"/plain/ckpt-6.h5* "$work/on/" && cp "$work"/ckpt/ckpt-6.h5* "$work/off/"
    launch 1 "${gpt[@]}" --checkpoint-dir "$work/on" --resume auto --activation-checkpointing \
      >/dev/null
    launch 1 "${gpt[@]}" --checkpoint-dir "$work/off" --resume auto >/dev/null
    same_checkpoints "$work/ckpt/ckpt-12.h5" "$work/on/ckpt-12.h5" 0
    same_checkpoints "$work/plain/ckpt-12.h5" "$work/off/ckpt-12.h5" 0
    echo "activation checkpointing: the plain run's checkpoints, resumed either way: identical"
    ;;
  channels-last)
    "$shard" synthetic --out "$work/images" --count 16 --shape 3,32,32 --dtype u8 --classes 10 \
      --seed 1 >/dev/null
    resnet=(--data "$work/images" --model resnet --width-divisor 16 --precision bf16 --seed 7
      --log-every 1000 --device cpu --batch-size 4 --steps 2 --checkpoint-every 1 --keep 10)
    launch 1 "${resnet[@]}" --checkpoint-dir "$work/nchw" >/dev/null
    launch 1 "${resnet[@]}" --checkpoint-dir "$work/nhwc" --channels-last >"$work/nhwc.out"
    grep -q "resnet, widths / 16, channels-last" "$work/nhwc.out"
    same_checkpoints "$work/nchw/ckpt-1.h5" "$work/nhwc/ckpt-1.h5" 0
    same_checkpoints "$work/nchw/ckpt-2.h5" "$work/nhwc/ckpt-2.h5" 0
    mkdir -p "$work/switched" && cp "$work"/nchw/ckpt-1.h5* "$work/switched/"
    launch 1 "${resnet[@]}" --checkpoint-dir "$work/switched" --resume auto --channels-last \
      >/dev/null
    same_checkpoints "$work/nchw/ckpt-2.h5" "$work/switched/ckpt-2.h5" 0
    echo "channels-last resnet: the NCHW run's checkpoints, and its resume, bit for bit"
    ;;
  world-size)
    launch 2 "${common[@]}" --batch-size 16 --steps 12 --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/a" >/dev/null
    mkdir -p "$work/b" && cp "$work"/a/ckpt-6.h5* "$work/b/"
    launch 1 "${common[@]}" --batch-size 32 --steps 12 --checkpoint-dir "$work/b" --resume auto >/dev/null
    # Same data and order; the sums over 32 rows differ only in order (two
    # halves allreduced vs one GEMM): f32 rounding after 6 SGD steps.
    same_checkpoints "$work/a/ckpt-12.h5" "$work/b/ckpt-12.h5" 1e-5
    ;;
  invariant)
    mode_flags=(--rank-invariant --global-batch 64 --batch-size 8 --clip 1.0 --keep 10
      --checkpoint-every 10)
    launch 4 "${common[@]}" "${mode_flags[@]}" --steps 30 --checkpoint-dir "$work/a" \
      --metrics "$work/a.jsonl" >/dev/null
    mkdir -p "$work/b" && cp "$work"/a/ckpt-10.h5* "$work/b/"
    launch 2 "${common[@]}" "${mode_flags[@]}" --steps 20 --zero 1 --checkpoint-dir "$work/b" \
      --resume auto --metrics "$work/b.jsonl" >/dev/null
    launch 1 "${common[@]}" "${mode_flags[@]}" --steps 30 --checkpoint-dir "$work/b" \
      --resume auto --metrics "$work/b.jsonl" >/dev/null
    same_checkpoints "$work/a/ckpt-20.h5" "$work/b/ckpt-20.h5" 0
    same_checkpoints "$work/a/ckpt-30.h5" "$work/b/ckpt-30.h5" 0
    # Steps 11-30's loss lines, lr, norm and samples included, timings left out.
    lines() { grep '"loss":' "$1" | sed 's/"samples_per_s.*//' | awk -F'"step": ' '$2 + 0 > 10'; }
    lines "$work/a.jsonl" >"$work/a.losses"
    lines "$work/b.jsonl" >"$work/b.losses"
    [ "$(wc -l <"$work/a.losses")" -eq 20 ] && cmp "$work/a.losses" "$work/b.losses"
    echo "--rank-invariant: 4 ranks, then 2 (--zero 1), then 1 == 4 ranks straight, bit for bit"
    if launch 3 "${common[@]}" "${mode_flags[@]}" --steps 1 >"$work/three.out" 2>&1; then
      echo "3 ranks of --global-batch 64 / --batch-size 8 were not refused" >&2
      exit 1
    fi
    grep -q "run 8 chunks on 1, 2, 4 or 8 ranks" "$work/three.out"
    ;;
  invariant-models)
    "$shard" synthetic --out "$work/images" --count 64 --shape 3,32,32 --dtype u8 --classes 10 \
      --shards 2 --seed 1 >/dev/null
    lines() { grep '"loss":' "$1" | sed 's/"samples_per_s.*//'; }
    for model in cnn resnet; do
      if [ "$model" = cnn ]; then
        flags=(--data "$work/data" --model cnn --precision bf16 --clip 0.5 --global-batch 32
          --batch-size 8 --steps 3)
      else
        flags=(--data "$work/images" --model resnet --precision fp16 --global-batch 8
          --batch-size 2 --steps 2)
      fi
      for ranks in 1 2 4; do
        zero=0
        [ "$model" = cnn ] && [ "$ranks" -eq 4 ] && zero=1
        launch "$ranks" "${flags[@]}" --rank-invariant --zero "$zero" --seed 7 --log-every 1000 \
          --device cpu --checkpoint-every 0 --checkpoint-dir "$work/$model$ranks" \
          --metrics "$work/$model$ranks.jsonl" >/dev/null
        lines "$work/$model$ranks.jsonl" >"$work/$model$ranks.losses"
      done
      last=$(ls "$work/${model}1"/ckpt-*.h5)
      for ranks in 2 4; do
        same_checkpoints "$last" "$work/$model$ranks/$(basename "$last")" 0
        cmp "$work/${model}1.losses" "$work/$model$ranks.losses"
      done
      echo "--rank-invariant $model: 1, 2 and 4 ranks, the same checkpoints and loss lines"
    done
    ;;
  zero)
    for stage in 1 2 3; do
      exact_resume 2 "${common[@]}" --batch-size 16 --optimizer adamw --lr 0.001 --zero "$stage"
      echo "exact resume: 2 ranks, --zero $stage: identical"
    done
    for stage in 0 1 2 3; do
      launch 2 "${common[@]}" --batch-size 16 --optimizer adamw --lr 0.001 --steps 12 \
        --checkpoint-every 6 --keep 10 --checkpoint-dir "$work/z$stage" --zero "$stage" >/dev/null
    done
    # Two summands add alike in an allreduce and a reduce-scatter: the same bits.
    same_checkpoints "$work/z1/ckpt-12.h5" "$work/z0/ckpt-12.h5" 0
    same_checkpoints "$work/z2/ckpt-12.h5" "$work/z0/ckpt-12.h5" 0
    same_checkpoints "$work/z3/ckpt-12.h5" "$work/z0/ckpt-12.h5" 0
    echo "--zero 3, --zero 2, --zero 1 and --zero 0 write the same checkpoint"
    # 0 -> 3 at a resume, and a --zero 3 checkpoint resumed without ZeRO.
    mkdir -p "$work/t" && cp "$work"/z0/ckpt-6.h5* "$work/t/"
    launch 2 "${common[@]}" --batch-size 16 --optimizer adamw --lr 0.001 --steps 12 \
      --checkpoint-dir "$work/t" --resume auto --zero 3 >/dev/null
    same_checkpoints "$work/z0/ckpt-12.h5" "$work/t/ckpt-12.h5" 0
    mkdir -p "$work/u" && cp "$work"/z3/ckpt-6.h5* "$work/u/"
    launch 2 "${common[@]}" --batch-size 16 --optimizer adamw --lr 0.001 --steps 12 \
      --checkpoint-dir "$work/u" --resume auto >/dev/null
    same_checkpoints "$work/z0/ckpt-12.h5" "$work/u/ckpt-12.h5" 0
    echo "--zero 0 -> 3 and 3 -> 0 at a resume end where --zero 0 ends"
    # A stage switched at a resume (0 -> 2) ends where the unswitched run ends.
    mkdir -p "$work/s" && cp "$work"/z0/ckpt-6.h5* "$work/s/"
    launch 2 "${common[@]}" --batch-size 16 --optimizer adamw --lr 0.001 --steps 12 \
      --checkpoint-dir "$work/s" --resume auto --zero 2 >/dev/null
    same_checkpoints "$work/z0/ckpt-12.h5" "$work/s/ckpt-12.h5" 0
    echo "a --zero 0 checkpoint resumed with --zero 2 ends where --zero 0 ends"
    mkdir -p "$work/b" && cp "$work"/z1/ckpt-6.h5* "$work/b/"
    launch 1 "${common[@]}" --batch-size 32 --optimizer adamw --lr 0.001 --steps 12 \
      --checkpoint-dir "$work/b" --resume auto >/dev/null
    same_checkpoints "$work/z1/ckpt-12.h5" "$work/b/ckpt-12.h5" 1e-5  # as world-size
    echo "a --zero 1 checkpoint of 2 ranks resumes on 1 rank without ZeRO"
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
  fingerprint)
    "$shard" text --src "$(dirname "$0")"/../../docs/*.md --out "$work/text" --seq 32 >/dev/null
    gpt=(--data "$work/text/train" --model gpt-tiny --seed 7 --log-every 1000 --device cpu
      --batch-size 4 --checkpoint-dir "$work/a")
    "$train" "${gpt[@]}" --dropout 0.1 --steps 2 >/dev/null
    if "$train" "${gpt[@]}" --steps 4 --resume auto >"$work/default.log" 2>&1; then
      echo "a checkpoint made with --dropout 0.1 resumed with the default dropout 0:"
      cat "$work/default.log"; exit 1
    fi
    grep -q "dropout was '0.1' and is now '0'" "$work/default.log" ||
      { echo "the dropout is not named:"; cat "$work/default.log"; exit 1; }
    "$train" "${gpt[@]}" --dropout 0.1 --steps 4 --resume auto >"$work/same.log" 2>&1 ||
      { echo "the same dropout did not resume:"; cat "$work/same.log"; exit 1; }
    grep -q "resumed from" "$work/same.log" || { echo "nothing resumed:"; cat "$work/same.log"; exit 1; }
    echo "fingerprint: a default left out is compared; the same dropout resumes"
    # Note [run fingerprint]: RunCheckpoints' own fields, named by the flag.
    rows=(--data "$work/text/train" --model gpt-tiny --seed 7 --log-every 1000 --device cpu
      --checkpoint-dir "$work/a" --dropout 0.1 --batch-size 2)
    if "$train" "${rows[@]}" --steps 6 --resume auto >"$work/batch.log" 2>&1; then
      echo "a checkpoint of global batch 4 resumed with 2 rows per step:"; cat "$work/batch.log"; exit 1
    fi
    grep -q "global_batch was '4' and is now '2' (set by --batch-size x ranks x --accum" \
      "$work/batch.log" || { echo "the global batch is not named:"; cat "$work/batch.log"; exit 1; }
    "$train" "${rows[@]}" --accum 2 --steps 6 --resume auto >"$work/accum.log" 2>&1 ||
      { echo "--batch-size 2 --accum 2 (the same global batch) did not resume:"; cat "$work/accum.log"; exit 1; }
    echo "fingerprint: the global batch is compared; --accum may change where it holds"
    ;;
  lock)
    "$train" "${common[@]}" --batch-size 32 --steps 100000 --checkpoint-every 20 \
      --checkpoint-dir "$work/c" >"$work/first.log" 2>&1 &
    first=$!
    for _ in $(seq 1 300); do
      grep -qs "pid $first " "$work/c/lockstep.lock" && break
      sleep 0.1
    done
    grep -qs "pid $first " "$work/c/lockstep.lock" ||
      { echo "the first run wrote no lock file:"; cat "$work/first.log"; kill -9 "$first"; exit 1; }
    for second in fresh resume; do
      extra=()
      [ "$second" = resume ] && extra=(--resume auto)
      rc=0
      timeout 60 "$train" "${common[@]}" --batch-size 32 --steps 4 --checkpoint-dir "$work/c" \
        "${extra[@]}" >"$work/second.log" 2>&1 || rc=$?
      if [ "$rc" -ne 1 ] || ! grep -q "host $(hostname) pid $first started 20" "$work/second.log"; then
        echo "a $second second run: exit $rc, not 1 naming the first run (pid $first):"
        cat "$work/second.log"
        kill -9 "$first"
        exit 1
      fi
    done
    kill -0 "$first" || { echo "the first run ended early:"; cat "$work/first.log"; exit 1; }
    kill -9 "$first"
    wait "$first" 2>/dev/null || true
    "$train" "${common[@]}" --batch-size 32 --steps 2 --checkpoint-dir "$work/c" --resume auto \
      >"$work/third.log" 2>&1 || { echo "after the kill, the directory stayed locked:"; cat "$work/third.log"; exit 1; }
    echo "lock: second runs refused naming the first; released by the kernel at its death"
    ;;
  ownership)
    launch 1 "${common[@]}" --batch-size 32 --steps 4 --checkpoint-every 2 --keep 5 --checkpoint-dir "$work/a" >/dev/null
    if launch 1 "${common[@]}" --batch-size 32 --steps 4 --checkpoint-dir "$work/a" >"$work/fresh.log" 2>&1; then
      echo "a fresh run accepted a directory holding checkpoints"; exit 1
    fi
    grep -q -- "--resume auto" "$work/fresh.log" || { echo "no advice in:"; cat "$work/fresh.log"; exit 1; }
    grep -q "ckpt-4.h5" "$work/fresh.log" || { echo "the newest checkpoint is not named:"; cat "$work/fresh.log"; exit 1; }
    # Directory b holds a later checkpoint (step 100); resuming from step 2 with
    # --keep 1 writes step 4 and must keep it.
    mkdir -p "$work/b"
    cp "$work/a/ckpt-4.h5" "$work/b/ckpt-100.h5" && cp "$work/a/ckpt-4.h5.crc32" "$work/b/ckpt-100.h5.crc32"
    launch 1 "${common[@]}" --batch-size 32 --steps 4 --checkpoint-every 2 --keep 1 --checkpoint-dir "$work/b" \
      --resume "$work/a/ckpt-2.h5" >/dev/null 2>&1
    [ -f "$work/b/ckpt-4.h5" ] || { echo "the checkpoint just written was deleted:"; ls "$work/b"; exit 1; }
    [ -f "$work/b/ckpt-100.h5" ] || { echo "a newer checkpoint was deleted:"; ls "$work/b"; exit 1; }
    echo "ownership: fresh run refused, new checkpoint kept beside a newer one"
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
