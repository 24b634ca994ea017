#!/usr/bin/env bash
# Every program refuses every invalid flag value (issue: flags). Usage:
#   flags.sh BUILD_DIR with-bench|no-bench
# Each row of the table runs one program with one flag set to each of its
# invalid values (zero, negative, NaN, huge, empty, not a number, too large
# for the data) and requires: a non-zero exit below 128 (never a signal),
# within 60 s (never a hang), and a message line naming the flag and the value.
# Last, valid configurations the internal sizes once refused must train.
set -uo pipefail
build=$1
bench=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
"$shard" synthetic --out "$work/data" --count 2048 --shape 1,28,28 --dtype u8 --classes 10 \
  --shards 2 --seed 1 >/dev/null || exit 1

cases=0
failures=()
# refuses "PROGRAM ARGS" FLAG VALUE...: EMPTY stands for the empty string.
refuses() {
  local -a command
  read -r -a command <<<"$1"
  local flag=$2 value rc
  shift 2
  for value in "$@"; do
    [ "$value" = EMPTY ] && value=""
    cases=$((cases + 1))
    timeout 60 "${command[@]}" "$flag" "$value" >"$work/out" 2>&1
    rc=$?
    local what="${command[0]##*/} ${command[*]:1} $flag '$value'"
    if [ "$rc" -eq 0 ]; then
      failures+=("$what: accepted")
    elif [ "$rc" -eq 124 ]; then
      failures+=("$what: still running after 60 s")
    elif [ "$rc" -ge 128 ]; then
      failures+=("$what: ended by a signal (exit $rc)")
    elif ! grep -qF -- "$flag" "$work/out"; then
      failures+=("$what: the message does not name $flag: $(tail -n 3 "$work/out")")
    elif [ -n "$value" ] && ! grep -F -- "$flag" "$work/out" | grep -qwF -- "$value"; then
      # The value as a word on a line naming the flag: "0" must not pass on
      # the 0 of some other figure in the output.
      failures+=("$what: the message does not name the value: $(tail -n 3 "$work/out")")
    fi
  done
}

t="$train --data $work/data --device cpu"
ts="$t --steps 1"
refuses "$ts" --batch-size 0 -1 nan 1e12 1.5 abc EMPTY 4096
refuses "$ts" --accum 0 -1 nan inf 99999999999 EMPTY 2048
refuses "$ts" --lr -1 nan inf 1e300 EMPTY
refuses "$ts" --momentum -0.5 nan 2 EMPTY
refuses "$ts --optimizer adamw" --momentum 0.5  # AdamW has no momentum to set
refuses "$ts" --weight-decay -1 nan inf EMPTY
refuses "$ts" --clip -1 nan inf EMPTY
refuses "$ts" --zero -1 4 0.5 nan EMPTY
refuses "$ts" --warmup -1 nan 1e15 EMPTY
refuses "$ts" --threads 0 -1 100000 nan EMPTY
refuses "$ts" --keep 0 -1 1e9 EMPTY
refuses "$ts" --log-every 0 -1 nan EMPTY
refuses "$ts" --checkpoint-every -1 nan 1e15 EMPTY
refuses "$ts" --seed -1 nan 1e30 EMPTY
refuses "$t" --epochs 0 -1 nan 1e7 EMPTY
refuses "$t" --steps 0 -1 nan 1e15 EMPTY
refuses "$ts" --sample-tokens -1 nan 1e7 EMPTY 5  # 5: the default mlp generates no text
refuses "$ts --sample-tokens 5 --model gpt-tiny" --prompt EMPTY
refuses "$ts" --label-smoothing -0.1 1.5 nan EMPTY
refuses "$ts" --loss mse  # the shards hold labels, not float targets
for flag in --model --optimizer --schedule --precision --device --shuffle --log-level --loss; do
  refuses "$ts" "$flag" EMPTY nonsense
done
for flag in --val-data --checkpoint-dir --resume --init-from --metrics --heartbeat; do
  refuses "$ts" "$flag" EMPTY
done
refuses "$train --device cpu --steps 1" --data EMPTY
refuses "$ts" --augment EMPTY nonsense
refuses "$ts" --normalize EMPTY abc 0.5 1,2,3 0.5,0 0.5,nan 0.5,-1
refuses "$ts" --val-every 0 -1 nan EMPTY 5  # 5: there is no --val-data to evaluate
touch "$work/file"
refuses "$ts" --trace EMPTY "$work/file"
refuses "$ts --trace $work/t" --trace-steps EMPTY 0:1 5:2 x 3 nan

s="$shard synthetic --out $work/s"
refuses "$s" --count 0 -1 nan 1e15 EMPTY
refuses "$s --count 10" --shape 0 -3 nan 1e12 EMPTY 100000,100000,1000
refuses "$s --count 10" --dtype EMPTY f64
refuses "$s --count 10" --classes 0 -1 nan 1e15 EMPTY
refuses "$s --count 10" --shards 0 -1 1e9 EMPTY 11
refuses "$s --count 10" --seed -1 nan EMPTY
refuses "$shard synthetic --count 10" --out EMPTY
refuses "$shard fashion-mnist --out $work/f" --shards 0 -1 nan 1e9 EMPTY
refuses "$shard fashion-mnist --out $work/f" --src EMPTY
refuses "$shard fashion-mnist" --out EMPTY

# lockstep-export, where the ONNX export is built. Any existing file passes
# the parse-time checks of --checkpoint, so the flags after it are refused
# before a checkpoint is read.
export_program=$build/examples/export/lockstep-export
if [ -x "$export_program" ]; then
  e="$export_program --checkpoint $train --model mlp --out $work/m.onnx"
  refuses "$e" --opset 0 16 22 nan 1e9 EMPTY
  refuses "$e" --precision bf16 EMPTY
  refuses "$e" --io bf16 EMPTY
  refuses "$e" --batch 0 -1 nan 1e12 1.5 abc EMPTY
  refuses "$e" --seq 0 -1 nan 16 EMPTY  # 16: mlp takes no token sequence
  refuses "$export_program --checkpoint $train --model gpt-tiny --out $work/m.onnx" --seq 129
  refuses "$export_program --model mlp --out $work/m.onnx" --checkpoint EMPTY "$work/missing.h5"
  refuses "$export_program --checkpoint $train --out $work/m.onnx" --model EMPTY nope
  refuses "$export_program --checkpoint $train --model mlp" --out EMPTY
fi

# lockstep-predict: any existing file passes the parse-time check of
# --checkpoint, and --normalize is refused before the weights are read.
p="$build/examples/predict/lockstep-predict --checkpoint $train --model mlp --data $work/data"
p="$p --device cpu"
refuses "$p --out $work/p.jsonl" --batch-size 0 -1 nan 1e12 1.5 abc EMPTY
refuses "$p --out $work/p.jsonl" --outputs nope EMPTY
refuses "$p --out $work/p.jsonl" --threads 0 -1 100000 nan EMPTY
refuses "$p --out $work/p.jsonl" --loader-threads 0 -1 65 nan EMPTY
refuses "$p --out $work/p.jsonl" --normalize abc 0.5 0.5,0 0.5,nan EMPTY
refuses "$p --out $work/p.jsonl" --normalize 0.5,0.5,0.5,0.5  # mlp has 1 channel
refuses "$p" --out EMPTY
refuses "${p/--data $work\/data/} --out $work/p.jsonl" --data EMPTY "$work/missing"
refuses "${p/--checkpoint $train/} --out $work/p.jsonl" --checkpoint EMPTY "$work/missing.h5"

if [ "$bench" = with-bench ]; then
  b=$build/bench
  for program in "$b/bench_gemm --trials 1" "$b/bench_allreduce" "$b/bench_loader --data $work/data" \
    "$b/bench_step --baseline false --steps 1" "$b/bench_scaling --steps 1"; do
    refuses "$program" --device EMPTY tpu
    refuses "$program" --json EMPTY
  done
  refuses "$b/bench_scaling --steps 1" --trace EMPTY
  refuses "$b/bench_scaling --steps 1 --trace $work/t" --trace-steps EMPTY 0:1 5:2 x
  refuses "$b/bench_gemm --trials 1" --sizes 0 -1 nan 1e9 EMPTY
  refuses "$b/bench_gemm --trials 1" --threads 0 -1 1e6 EMPTY
  refuses "$b/bench_gemm --sizes 64" --trials 0 -1 nan EMPTY
  refuses "$b/bench_gemm --trials 1" --batch-seconds 0 -1 nan inf 1e9 EMPTY
  refuses "$b/bench_gemm --trials 1" --dtype EMPTY f64
  refuses "$b/bench_allreduce" --sizes 0 -1 nan 1e12 EMPTY
  refuses "$b/bench_allreduce" --trials 0 -1 nan EMPTY
  refuses "$b/bench_allreduce" --dtype EMPTY f64
  bl="$b/bench_loader --data $work/data --trials 1"
  refuses "$bl" --batch 0 -1 nan 1e12 EMPTY 4096
  refuses "$bl" --threads 0 -1 1e6 EMPTY
  refuses "$bl" --depth -1 nan 1e9 EMPTY
  refuses "$b/bench_loader --data $work/data" --trials 0 -1 nan EMPTY
  refuses "$bl" --seed -1 nan EMPTY
  refuses "$bl" --h5py-script EMPTY
  refuses "$b/bench_loader --trials 1" --data EMPTY
  bs="$b/bench_step --baseline false"
  refuses "$bs --steps 1" --batch 0 -1 nan 1e12 EMPTY
  refuses "$bs" --steps 0 -1 nan 1e9 EMPTY
  refuses "$bs --steps 1" --threads 0 -1 1e6 EMPTY
  refuses "$bs --steps 1" --model EMPTY nonsense
  refuses "$bs --steps 1" --trace EMPTY "$work/file"
  refuses "$bs --steps 1" --precision EMPTY fp8
  refuses "$bs --steps 1" --python EMPTY
  sc="$b/bench_scaling --steps 1"
  refuses "$sc" --batch 0 -1 nan 1e12 EMPTY
  refuses "$sc" --global-batch 0 -1 nan 1e12 EMPTY
  refuses "$sc" --threads 0 -1 1e6 EMPTY
  refuses "$sc" --bucket-cap-mib 0 -1 nan inf 1e12 EMPTY
  refuses "$sc" --first-bucket-cap-mib 0 -1 nan inf 1e12 EMPTY
  refuses "$b/bench_scaling" --steps 0 -1 nan 1e9 EMPTY
  refuses "$sc" --trials 0 -1 nan EMPTY
  refuses "$sc" --zero 4 -1 EMPTY
  refuses "$sc" --optimizer EMPTY adam
  # The rank-invariant step is timed with the scaling tables, which ZeRO-2's store cannot share.
  refuses "$sc --rank-invariant" --zero 2 3
  for flag in --model --precision --mode --host-overlap; do refuses "$sc" "$flag" EMPTY nonsense; done
fi

# A flag without a value: --cuda-graph on the CPU is refused by name (Note [step graph]).
cases=$((cases + 1))
timeout 60 "$train" --data "$work/data" --device cpu --steps 1 --cuda-graph >"$work/out" 2>&1
rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ] || ! grep -q -- "--cuda-graph: the run is on cpu" "$work/out"; then
  failures+=("lockstep-train --device cpu --cuda-graph: exit $rc, $(tail -n 2 "$work/out")")
fi

# Valid configurations: many micro-batches per step (the loader's pool
# follows --accum), and --accum times --batch-size exactly the dataset.
for config in "--batch-size 8 --accum 40" "--batch-size 1 --accum 64" "--batch-size 64 --accum 32"; do
  cases=$((cases + 1))
  # shellcheck disable=SC2086
  timeout 120 "$train" --data "$work/data" --device cpu --steps 2 $config >"$work/out" 2>&1 ||
    failures+=("lockstep-train $config: a valid configuration failed: $(tail -n 3 "$work/out")")
done

for f in "${failures[@]}"; do echo "FAIL $f"; done
echo "$cases cases, ${#failures[@]} failures"
[ "${#failures[@]}" -eq 0 ]
