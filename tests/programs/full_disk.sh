#!/usr/bin/env bash
# lockstep-train saving onto a full disk (Note [checkpoint image] in
# engine/checkpoint_file.cpp): a small tmpfs, filled to leave 0 pages, half a
# checkpoint and exactly a checkpoint (the checksum file is what fails) free.
# Each save must fail with exit 1 (never a signal: a failed HDF5 close once
# crashed at exit) and the message, leave no temporary, and keep the earlier
# checkpoint, which a resume loads once space is freed. Needs root to mount
# the tmpfs; exits 77 (skipped) where mounting is not allowed.
# Usage: full_disk.sh BUILD_DIR
set -uo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
source "$(dirname "$0")/small_tmpfs.sh"
small_tmpfs 64m
"$shard" synthetic --out "$work/data" --count 512 --shape 1,28,28 --dtype u8 --classes 10 \
  --seed 1 >/dev/null || exit 1
common=(--data "$work/data" --model mlp --seed 7 --batch-size 32 --device cpu
  --checkpoint-dir "$disk/c" --checkpoint-every 1 --keep 10)
"$train" "${common[@]}" --steps 2 >"$work/first.log" 2>&1 ||
  { echo "the first run failed:"; cat "$work/first.log"; exit 1; }
checkpoint_bytes=$(stat -c %s "$disk/c/ckpt-2.h5")
pages=$(((checkpoint_bytes + 4095) / 4096))
failures=0
for free in 0 $((pages / 2)) "$pages"; do
  avail=$(($(stat -f -c '%a * %S' "$disk")))
  head -c $((avail - free * 4096)) /dev/zero >"$disk/filler" 2>/dev/null
  rc=0
  timeout 120 "$train" "${common[@]}" --steps 4 --resume auto >"$work/full.log" 2>&1 || rc=$?
  what="$free of the checkpoint's $pages pages free"
  if [ "$rc" -ne 1 ]; then
    echo "$what: exit $rc, not 1:"; cat "$work/full.log"; failures=$((failures + 1))
  elif ! grep -q "saving checkpoint ckpt-3.h5 in .* failed; earlier checkpoints are untouched: .*No space left on device" "$work/full.log"; then
    echo "$what: no message naming the save and the full disk:"; cat "$work/full.log"; failures=$((failures + 1))
  elif ls -A "$disk/c" | grep -q tmp; then
    echo "$what: temporaries left:"; ls -A "$disk/c"; failures=$((failures + 1))
  else
    echo "$what: exit 1: $(grep -o 'untouched: .*' "$work/full.log" | cut -c 12-)"
  fi
  rm -f "$disk/filler"
done
# Space freed: the resume loads the checkpoint the failed saves left alone.
"$train" "${common[@]}" --steps 4 --resume auto >"$work/resume.log" 2>&1 ||
  { echo "the resume after freeing space failed:"; cat "$work/resume.log"; exit 1; }
grep -q "resumed from $disk/c/ckpt-2.h5 at step 2" "$work/resume.log" ||
  { echo "the resume did not start from ckpt-2.h5:"; cat "$work/resume.log"; exit 1; }
[ -f "$disk/c/ckpt-4.h5" ] || { echo "the resumed run saved no ckpt-4.h5"; exit 1; }
echo "space freed: resumed from ckpt-2.h5 and saved ckpt-4.h5"
[ "$failures" -eq 0 ]
