#!/usr/bin/env bash
# lockstep-train's ranks agree before the first step, and stop together on
# non-finite values (issue: trust under faults). Each case launches two ranks
# with mpirun's MPMD form (rank 0 : rank 1) so that one rank gets another
# flag, dataset or checkpoint, and checks that the job fails at once with a
# message naming the field, the ranks and both values. A control run with the
# same flags on both ranks must succeed, so the checks cannot pass vacuously.
# Usage: agreement.sh BUILD_DIR
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LOCKSTEP_COMM_TIMEOUT=60
synthetic() {  # synthetic DIR COUNT SHARDS SEED
  "$shard" synthetic --out "$1" --count "$2" --shape 1,28,28 --dtype u8 --classes 10 \
    --shards "$3" --seed "$4" >/dev/null
}
synthetic "$work/data" 512 2 1
synthetic "$work/half" 256 2 1
synthetic "$work/four" 512 4 1

common=(--model mlp --batch-size 16 --seed 7 --log-every 1000 --device cpu)
# pair NAME RANK0_ARGS... -- RANK1_ARGS...: runs the two-rank job, output in $work/NAME.log.
pair() {
  local name=$1 a=() b=()
  shift
  while [ "$1" != -- ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  local start=$SECONDS status=0
  timeout 120 mpirun --oversubscribe -np 1 "$train" "${common[@]}" "${a[@]}" \
    : -np 1 "$train" "${common[@]}" "${b[@]}" >"$work/$name.log" 2>&1 || status=$?
  echo "$name: exit $status after $((SECONDS - start)) s"
  last_status=$status
}
# expect_failure NAME PATTERN...: the job failed (not killed by the timeout)
# and its output matches every extended regular expression given.
expect_failure() {
  local name=$1
  shift
  if [ "$last_status" -eq 0 ] || [ "$last_status" -eq 124 ]; then
    echo "FAIL $name: exit status $last_status, expected an error"; cat "$work/$name.log"; exit 1
  fi
  for pattern in "$@"; do
    grep -Eq -- "$pattern" "$work/$name.log" ||
      { echo "FAIL $name: no match for '$pattern' in:"; cat "$work/$name.log"; exit 1; }
  done
}

# The control: the same flags on both ranks train, and save a checkpoint.
pair same --data "$work/data" --steps 2 --checkpoint-dir "$work/a" \
  -- --data "$work/data" --steps 2 --checkpoint-dir "$work/a"
[ "$last_status" -eq 0 ] || { echo "FAIL same: the control run failed"; cat "$work/same.log"; exit 1; }

pair lr --data "$work/data" --steps 2 --lr 0.05 -- --data "$work/data" --steps 2 --lr 0.1
expect_failure lr "ranks disagree on 'optimizer': rank 0 has 'sgd lr=0.05 [^']*'; rank 1 has 'sgd lr=0.1 "

# ZeRO is not in the resume fingerprint, but ranks must share it: the
# Trainer's own fields carry it.
pair zero --data "$work/data" --steps 2 --zero 1 -- --data "$work/data" --steps 2
expect_failure zero "ranks disagree on 'step.zero_stage': rank 0 has '1'; rank 1 has '0'"

pair steps --data "$work/data" --steps 2 -- --data "$work/data" --steps 3
expect_failure steps "ranks disagree on 'step.schedule': rank 0 has 'constant [^']*total_steps=2 [^']*'; rank 1 has '[^']*total_steps=3 "

pair samples --data "$work/data" --steps 2 -- --data "$work/half" --steps 2
expect_failure samples "ranks disagree on 'dataset': rank 0 has '512 samples'; rank 1 has '256 samples'"

pair shards --data "$work/data" --steps 2 -- --data "$work/four" --steps 2
expect_failure shards "ranks disagree on 'dataset.shards': rank 0 has '2'; rank 1 has '4'"

pair val --data "$work/data" --val-data "$work/data" --steps 2 \
  -- --data "$work/data" --val-data "$work/half" --steps 2
expect_failure val "ranks disagree on 'val_dataset.samples': rank 0 has '512'; rank 1 has '256'"

# Rank 1's directory holds a ckpt-2.h5 of another run (other weights, other bytes).
"$train" "${common[@]}" --data "$work/data" --steps 2 --lr 0.2 --checkpoint-dir "$work/b" >/dev/null
pair checkpoint --data "$work/data" --steps 4 --checkpoint-dir "$work/a" --resume auto \
  -- --data "$work/data" --steps 4 --checkpoint-dir "$work/b" --resume auto
expect_failure checkpoint \
  "ranks disagree on 'checkpoint': rank 0 has 'ckpt-2.h5 \(crc32 [0-9a-f]{8} size [0-9]+\)'; rank 1 has 'ckpt-2.h5 \(crc32 [0-9a-f]{8} size [0-9]+\)'"
# Rank 1 has no copy of the checkpoint rank 0 chose.
mkdir -p "$work/empty"
pair missing --data "$work/data" --steps 4 --checkpoint-dir "$work/a" --resume auto \
  -- --data "$work/data" --steps 4 --checkpoint-dir "$work/empty" --resume auto
expect_failure missing "ranks disagree on 'checkpoint': rank 0 has 'ckpt-2.h5 \(crc32 " \
  "rank 1 has 'checkpoint '[^']*/empty/ckpt-2.h5' has no valid checksum file"

# Non-finite values: an lr of 1e6 overflows the weights after the first
# step; every later step is skipped on both ranks, and the second skip in a
# row stops the job with the step and the first parameter at fault.
pair diverge --data "$work/data" --steps 20 --lr 1e6 --max-consecutive-skips 2 \
  -- --data "$work/data" --steps 20 --lr 1e6 --max-consecutive-skips 2
expect_failure diverge \
  "step [0-9]+: 2 steps in a row were skipped for a non-finite loss or gradient \(max_consecutive_skips 2\); the first parameter, in backward order, whose gradient is not finite is '[a-z0-9.]+'"
echo "agreement: every mismatch stopped both ranks with a message naming it"
