#!/usr/bin/env bash
# Failed writes beside the checkpoints are never silent (Note [write failures]
# in engine/core/log.h): a --metrics file on a full disk (/dev/full) is named
# once on the console with the reason and again in the summary, and stops the
# run at the next step boundary after saving, exit 1, on 1 and on 2 ranks; a
# resume continues. A trace file that cannot be written is named likewise and
# the run goes on (exit 0). Usage: write_failures.sh BUILD_DIR
set -uo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$shard" synthetic --out "$work/data" --count 512 --shape 1,28,28 --dtype u8 --classes 10 \
  --seed 1 >/dev/null || exit 1
common=(--data "$work/data" --model mlp --seed 7 --batch-size 16 --device cpu --steps 20)
fail() {
  echo "$1:"
  cat "$work/out" "$work/err"
  exit 1
}
for ranks in 1 2; do
  launch=("$train")
  [ "$ranks" -eq 2 ] && launch=(mpirun -np 2 --oversubscribe "$train")
  rc=0
  timeout 120 "${launch[@]}" "${common[@]}" --metrics /dev/full --checkpoint-dir "$work/c$ranks" \
    >"$work/out" 2>"$work/err" || rc=$?
  [ "$rc" -eq 1 ] || fail "$ranks rank(s), --metrics /dev/full: exit $rc, not 1"
  said=$(grep -c "cannot write the metrics file /dev/full: No space left on device" "$work/err")
  [ "$said" -eq 1 ] || fail "$ranks rank(s): the failure was said $said times on the console, not once"
  grep -q "^stopped at step 1 as the --metrics file cannot be written" "$work/out" ||
    fail "$ranks rank(s): the run did not stop at the next step boundary"
  grep -q "^  not written  the metrics file /dev/full: No space left on device" "$work/out" ||
    fail "$ranks rank(s): the summary does not name the metrics file"
  [ -f "$work/c$ranks/ckpt-1.h5" ] || fail "$ranks rank(s): nothing saved before stopping"
  echo "$ranks rank(s): --metrics /dev/full stopped the run at step 1 after saving, exit 1"
done
"$train" "${common[@]}" --metrics "$work/metrics.jsonl" --checkpoint-dir "$work/c1" \
  --resume auto >"$work/out" 2>"$work/err" || fail "the resume with a writable --metrics failed"
grep -q "resumed from $work/c1/ckpt-1.h5" "$work/out" || fail "the resume did not start from ckpt-1.h5"
grep -q '"step": 20' "$work/metrics.jsonl" || fail "the resumed run's metrics lack step 20"
echo "a resume with a writable --metrics continued to step 20"
# The trace's file is a directory: it cannot be written, and the run goes on.
mkdir -p "$work/trace/rank-0.json"
rc=0
"$train" "${common[@]}" --trace "$work/trace" >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -eq 0 ] || fail "a trace that cannot be written: exit $rc, not 0"
grep -q "cannot write the trace file $work/trace/rank-0.json: Is a directory" "$work/err" ||
  fail "the trace failure is not on the console"
grep -q "^  not written  the trace file $work/trace/rank-0.json: Is a directory" "$work/out" ||
  fail "the summary does not name the trace file"
echo "a trace that cannot be written is named on the console and in the summary; exit 0"
