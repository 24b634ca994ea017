# Sourced by the programs tests: synthetic_shards BUILD_DIR DIR TRAIN_ROWS [VAL_ROWS]
# writes DIR/train (two shards, seed 1) and, given VAL_ROWS, DIR/val (one
# shard, seed 2) of 1x28x28 u8 images in 10 classes, as the mlp preset reads.
synthetic_shards() {
  local build=$1 dir=$2 train_rows=$3 val_rows=${4:-}
  "$build"/examples/shard/lockstep-shard synthetic --out "$dir/train" --count "$train_rows" \
    --shape 1,28,28 --dtype u8 --classes 10 --shards 2 --seed 1 >/dev/null
  [ -z "$val_rows" ] && return 0
  "$build"/examples/shard/lockstep-shard synthetic --out "$dir/val" --count "$val_rows" \
    --shape 1,28,28 --dtype u8 --classes 10 --shards 1 --seed 2 >/dev/null
}
