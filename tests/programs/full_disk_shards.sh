#!/usr/bin/env bash
# lockstep-shard writing onto a full disk (Note [reserved shard] in
# io/shard_writer.cpp): on a small tmpfs, a dataset whose third shard does not
# fit, one a page short, one with no page free, and a text dataset whose train split fits and
# whose val split does not. Each must exit 1 (never a signal: a failed HDF5
# close once crashed at exit) with the shard and "No space left on device" in
# the message, leave no temporary and nothing under a final name in the
# directory it failed in, and leave the datasets written before intact. Needs
# root to mount the tmpfs; exits 77 (skipped) where mounting is not allowed.
# Usage: full_disk_shards.sh BUILD_DIR
set -uo pipefail
build=$1
shard=$build/examples/shard/lockstep-shard
source "$(dirname "$0")/small_tmpfs.sh"
small_tmpfs 32m
failures=0
fail() { echo "$*"; failures=$((failures + 1)); }
# Leaves `pages` 4 KiB pages of the tmpfs free.
fill_to() { head -c $(($(stat -f -c '%a * %S' "$disk") - $1 * 4096)) /dev/zero >"$disk/filler$2"; }
# What a dataset directory holds, to compare before and after.
contents() { /usr/bin/python3 -c '
import glob, hashlib, sys, h5py
for p in sorted(glob.glob(sys.argv[1] + "/*.h5")):
    with h5py.File(p, "r") as f:
        print(p.rsplit("/", 1)[1], *(f"{k}={f[k].shape}:{hashlib.sha256(f[k][()].tobytes()).hexdigest()}" for k in sorted(f)))
' "$1"; }
# Runs lockstep-shard; checks exit 1, the message's first line, the cause and what the failed
# directory holds.
expect_full() {
  local what=$1 dir=$2 regex=$3 rc=0
  shift 3
  timeout 120 "$shard" "$@" >"$work/out" 2>&1 || rc=$?
  if [ "$rc" -ne 1 ]; then
    fail "$what: exit $rc, not 1:"; cat "$work/out"
  elif ! grep -qE -- "$regex" "$work/out" || ! grep -q "No space left on device" "$work/out"; then
    fail "$what: no match for '$regex' and the cause:"; cat "$work/out"
  elif [ -n "$(find "$disk" -name '*.tmp')" ] || [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    fail "$what: left behind: $(find "$disk" -name '*.tmp') $(ls -A "$dir" 2>/dev/null)"
  else
    echo "$what: exit 1: $(grep -oE 'reserving .*|No space left on device' "$work/out" | head -n 1)"
  fi
}

"$shard" synthetic --out "$disk/before" --count 64 --shape 1,64,64 --dtype f32 --shards 2 \
  --seed 3 >/dev/null || exit 1
contents "$disk/before" >"$work/before.txt"
# Shards of 512 x 16 KiB = 8 MiB: shards 0 and 1 fit in 2.5 shards' pages, shard 2 does not.
fill_to 5120 1
expect_full "2.5 of 4 shards free" "$disk/s" \
  "^lockstep-shard: shard '$disk/s/shard-00002-of-00004.h5': reserving its [0-9]+ bytes on disk for '$disk/s/shard-00002-of-00004.h5.tmp' failed: No space left on device" \
  synthetic --out "$disk/s" --count 2048 --shape 1,64,64 --dtype f32 --shards 4 --seed 1
# One page short of the shard's 2050 (8 MiB of data, 2 KiB of metadata): HDF5's close met the
# full disk, and the process crashed at exit, before Note [reserved shard].
fill_to 2049 2
expect_full "one page short" "$disk/s" \
  "^lockstep-shard: shard '$disk/s/shard-00000-of-00001.h5': reserving its 8394752 bytes" \
  synthetic --out "$disk/s" --count 512 --shape 1,64,64 --dtype f32 --seed 1
rm -f "$disk/filler2"
fill_to 0 2
expect_full "no page free" "$disk/s" \
  "^lockstep-shard: cannot create shard '$disk/s/shard-00000-of-00001.h5.tmp' " \
  synthetic --out "$disk/s" --count 512 --shape 1,64,64 --dtype f32 --seed 1
rm -f "$disk"/filler*
contents "$disk/before" | cmp -s - "$work/before.txt" ||
  fail "the dataset written before changed: $(contents "$disk/before")"

# Text: 1 MiB of bytes, half held out; each split's shard is about 2 MiB of i32 windows.
/usr/bin/python3 -c 'import random, sys; random.seed(1); sys.stdout.buffer.write(random.randbytes(1 << 20))' >"$work/text"
"$shard" text --src "$work/text" --out "$work/ref" --seq 64 --val-fraction 0.5 >/dev/null || exit 1
fill_to 768 1  # 3 MiB: the train split fits, the val split does not
expect_full "train fits, val does not" "$disk/t/val" \
  "^lockstep-shard: shard '$disk/t/val/shard-00000-of-00001.h5': reserving .* failed: No space left on device" \
  text --src "$work/text" --out "$disk/t" --seq 64 --val-fraction 0.5
[ "$(contents "$disk/t/train")" = "$(contents "$work/ref/train")" ] ||
  fail "the train split written before the val split failed is not the one a roomy disk gets"
rm -f "$disk"/filler*
[ "$failures" -eq 0 ] && echo "full_disk_shards.sh: ok"
