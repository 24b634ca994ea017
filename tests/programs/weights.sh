#!/usr/bin/env bash
# Weights files in lockstep-train --init-from and --eval-only and in
# lockstep-export (Note [weights files] in engine/checkpoint.h), in fresh
# processes: a file with an entry the model lacks, or lacking one it has, is
# refused with exit 1 naming the entry and the file; --allow-partial-weights
# loads the rest and says what it skipped (the run header's start line, the
# --eval-only output, lockstep-export's output). The files are a checkpoint's
# /model datasets copied with h5copy into files of their own, laid out as
# h5py lays out a PyTorch state_dict.
# Usage: weights.sh BUILD_DIR (exits 77, skipped, without h5copy from hdf5-tools).
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
export_program=$build/examples/export/lockstep-export
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "weights.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
# refused TEXT COMMAND...: COMMAND exits 1 (an error, not a signal) saying TEXT.
refused() {
  local text=$1 rc=0
  shift
  "$@" >"$work/refused.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$work/refused.log" >&2; fail "exit $rc, not 1: $*"; }
  expect "$work/refused.log" "$text"
}
command -v h5copy >/dev/null || { echo "weights.sh: no h5copy (hdf5-tools): skipped"; exit 77; }
source "$(dirname "$0")/synthetic_shards.sh"
synthetic_shards "$build" "$work" 64 32

common=(--model mlp --device cpu --batch-size 16 --seed 3)
"$train" "${common[@]}" --data "$work/train" --steps 2 --checkpoint-dir "$work/a" >"$work/a.log"
ckpt=$work/a/ckpt-2.h5
# missing.h5: five of the mlp's six parameters; extra.h5: all six and head.bias.
for p in fc1.weight fc1.bias fc2.weight fc2.bias fc3.weight; do
  h5copy -p -i "$ckpt" -o "$work/missing.h5" -s "/model/$p" -d "/model/$p"
done
cp "$work/missing.h5" "$work/extra.h5"
h5copy -i "$ckpt" -o "$work/extra.h5" -s /model/fc3.bias -d /model/fc3.bias
h5copy -i "$ckpt" -o "$work/extra.h5" -s /model/fc3.bias -d /model/head.bias

eval_only=(--eval-only --val-data "$work/val" "${common[@]}")
all6="all 6 of the model's parameters and buffers loaded"
unused="the file's entries left unused: /model/head.bias"
refused "1 of the file's entries is unused: /model/head.bias" \
  "$train" "${eval_only[@]}" --init-from "$work/extra.h5"
expect "$work/refused.log" "weights file '$work/extra.h5'"
expect "$work/refused.log" "--allow-partial-weights"
refused "1 of the model's entries is missing: fc3.bias" \
  "$train" "${eval_only[@]}" --init-from "$work/missing.h5"
refused "1 of the file's entries is unused: /model/head.bias" \
  "$train" "${common[@]}" --data "$work/train" --steps 1 --init-from "$work/extra.h5"

# On purpose: the rest loads, and the output says what was skipped.
"$train" "${eval_only[@]}" --init-from "$work/missing.h5" --allow-partial-weights >"$work/p.log"
expect "$work/p.log" "weights of $work/missing.h5: partial load: 5 of the model's 6 parameters \
and buffers loaded; missing from the file, left as they were: fc3.bias"
expect "$work/p.log" "val_loss"
"$train" "${common[@]}" --data "$work/train" --steps 1 --init-from "$work/extra.h5" \
  --allow-partial-weights >"$work/t.log"
expect "$work/t.log" "start        weights of $work/extra.h5: partial load: $all6; $unused"
# A checkpoint loads whole (its /optimizer is not weights), and the header says so.
"$train" "${common[@]}" --data "$work/train" --steps 1 --init-from "$ckpt" >"$work/c.log"
expect "$work/c.log" "start        weights of $ckpt: $all6"
rc=0
"$train" "${common[@]}" --data "$work/train" --steps 1 --allow-partial-weights \
  >"$work/n.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] ||
  fail "--allow-partial-weights without --init-from: exit $rc"
expect "$work/n.log" "--init-from"

if [ -x "$export_program" ]; then
  refused "1 of the file's entries is unused: /model/head.bias" \
    "$export_program" --checkpoint "$work/extra.h5" --model mlp --out "$work/m.onnx"
  [ ! -e "$work/m.onnx" ] || fail "the refused export wrote $work/m.onnx"
  "$export_program" --checkpoint "$work/extra.h5" --model mlp --out "$work/m.onnx" \
    --allow-partial-weights >"$work/x.log"
  expect "$work/x.log" "lockstep-export: weights of $work/extra.h5: partial load: $all6; $unused"
  [ -s "$work/m.onnx" ] || fail "no $work/m.onnx"
fi
echo "weights.sh: refusals by name, --allow-partial-weights and its report: ok"
