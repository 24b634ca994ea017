#!/usr/bin/env bash
# lockstep-shard fashion-mnist on crafted IDX headers (Note [IDX sizes] in
# examples/shard/idx_file.cpp): item dimensions whose product wraps past 2^64
# to 0 (once SIGFPE), a dimension of 0 (the same division), items x count past
# 2^63, and a header declaring more items than the file holds. Each must exit
# 1, never by a signal, within 60 s, with a message naming the file.
# Usage: shard_inputs.sh BUILD_DIR
set -uo pipefail
shard=$1/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# idx FILE DIM...: an IDX header of unsigned bytes with these dimensions, then 16 bytes.
idx() {
  local file=$1
  shift
  /usr/bin/python3 -c '
import struct, sys
dims = [int(d) for d in sys.argv[2:]]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack(">I", 0x0800 | len(dims)) + b"".join(struct.pack(">I", d) for d in dims))
    f.write(bytes(16))' "$file" "$@"
}

failures=0
# refused NAME DIM...: the images file of the train split has these dimensions.
refused() {
  local name=$1
  shift
  rm -rf "$work/src" "$work/out" && mkdir -p "$work/src"
  idx "$work/src/train-images-idx3-ubyte.gz" "$@"
  idx "$work/src/train-labels-idx1-ubyte.gz" "$1"
  timeout 60 "$shard" fashion-mnist --src "$work/src" --out "$work/out" >"$work/log" 2>&1
  local rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "train-images-idx3-ubyte.gz" "$work/log"; then
    echo "$name (dimensions $*): exit $rc, not 1 with a message naming the file:"
    cat "$work/log"
    failures=$((failures + 1))
  else
    echo "$name: exit 1: $(tail -n 1 "$work/log")"
  fi
}
refused "item bytes wrap to 0" 1 65536 65536 65536 65536
refused "a dimension of 0" 2 0 28
refused "items x count overflow" 4294967295 4294967295 2147483647
refused "more items than the file holds" 60000 28 28
[ "$failures" -eq 0 ]
