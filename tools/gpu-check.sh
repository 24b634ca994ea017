#!/usr/bin/env bash
# The GPU check, prepared here and run on the GPU machine in two device calls
# (docs/gpu-results.md records each run):
#   tools/gpu-check.sh pack        on the build machine: a Release build for sm_90,
#                                  the smoke, [gpu] test and bench binaries, the
#                                  Debian libraries they need, and the cpu run the
#                                  training comparison is held to, in
#                                  .gpu-pack/lockstep-gpu.tar.gz (under 64 MiB)
#   tools/gpu-check.sh run-tests   first device call (carry .gpu-pack): a 30 s
#                                  smoke step, stopping there if it fails, then
#                                  the [gpu] test binaries (among them ZeRO-1's
#                                  NCCL reduce-scatter and gather, the packed
#                                  optimizer state, the data-parallel step on CUDA),
#                                  and a gpt2-shaped step with per-kernel times
#   tools/gpu-check.sh run-bench   second call: bench_gemm and torch.matmul,
#                                  bench_step against PyTorch (mlp-large, resnet,
#                                  gpt2 bf16), and a 300-step training run held
#                                  to the packed cpu run
#   tools/gpu-check.sh run-profile optional call: the whole GEMM sweep, where
#                                  gpt2's and resnet's steps spend their time
#                                  (bench_step --trace, tools/trace.py top; nsys
#                                  where present), and the loader's batches to
#                                  the device against cudaMemcpyAsync (bench_loader)
#   tools/gpu-check.sh run-scaling optional call: bench_scaling profiles
#                                  (feed them to tools/scaling_model.py here)
#   tools/gpu-check.sh plan        here: each call's steps, their timeouts and
#                                  total, and whether the pack holds the binaries
# Every step has a timeout; a call's timeouts add up to well under the device
# tool's 600 s per command. Logs and JSON go to $OUT. A call prints one verdict
# line per step last and exits with the number of steps that did not pass
# (failed, timed out, or skipped for want of a GPU), so 0 means every step passed.
# tests/tools/gpu_check_steps.sh sources this file to test that counting.
set -uo pipefail

pack_file=.gpu-pack/lockstep-gpu.tar.gz
pack_limit_bytes=$((64 << 20))
targets=(lockstep-gpu-smoke lockstep_gpu_tests lockstep_comm_gpu_tests lockstep_io_gpu_tests
         lockstep_engine_gpu_tests bench_gemm bench_step bench_scaling bench_loader lockstep-train
         lockstep-shard)
binaries=(tests/lockstep-gpu-smoke tests/lockstep_gpu_tests tests/comm/lockstep_comm_gpu_tests
          tests/io/lockstep_io_gpu_tests tests/engine/lockstep_engine_gpu_tests bench/bench_gemm
          bench/bench_step bench/bench_scaling bench/bench_loader examples/train/lockstep-train
          examples/shard/lockstep-shard)
# The training comparison: the same data, model, seed and steps on both devices.
shard_args=(synthetic --count 8192 --shape 1,28,28 --dtype u8 --classes 10 --shards 2 --seed 1)
train_args=(--model mlp --steps 300 --batch-size 64 --seed 3 --log-every 100)

pack() {
  set -e
  local build=build-gpu stage=.gpu-pack/stage
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$build" --target "${targets[@]}"
  rm -rf .gpu-pack && mkdir -p "$stage/bin" "$stage/lib" "$stage/ref"
  for b in "${binaries[@]}"; do cp "$build/$b" "$stage/bin/"; done
  cp -L "$build"/kernels/liblockstep_*.so "$build"/engine/core/liblockstep_*.so "$build"/comm/liblockstep_*.so \
    "$build"/io/liblockstep_*.so "$build"/engine/liblockstep_*.so "$stage/lib/"
  # Every library the binaries load, except what the GPU machine has: glibc,
  # the compiler runtime, and the CUDA libraries (its own, or its nvidia wheels').
  local skip='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libresolv|libnsl|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn[^/]*|libnccl)\.so'
  for f in "$stage"/bin/* "$stage"/lib/*; do
    LD_LIBRARY_PATH="$stage/lib" ldd "$f" | awk '/=> \// {print $1, $3}'
  done | sort -u | while read -r soname path; do
    [[ "$path" =~ $skip ]] && continue
    [ -e "$stage/lib/$soname" ] || cp -L "$path" "$stage/lib/$soname"
  done
  # The cpu half of the training comparison runs here, not on device time.
  local data
  data=$(mktemp -d)
  "$build/examples/shard/lockstep-shard" "${shard_args[@]}" --out "$data" >/dev/null
  "$build/examples/train/lockstep-train" --data "$data" "${train_args[@]}" --device cpu \
    --metrics "$stage/ref/train_cpu.jsonl" >/dev/null
  rm -rf "$data"
  git rev-parse HEAD >"$stage/ref/commit"
  tar czf "$pack_file" -C "$stage" .
  rm -rf "$stage"
  local bytes
  bytes=$(stat -c %s "$pack_file")
  if [ "$bytes" -ge "$pack_limit_bytes" ]; then
    echo "pack is $bytes bytes, over the device tool's 64 MiB carry limit" >&2
    exit 1
  fi
  echo "packed: $((bytes >> 20)) MiB $pack_file (commit $(git rev-parse --short HEAD))"
}

plan_total=0
steps_failed=0  # steps of this call that did not pass (the call's exit status)
verdicts=()     # one line per step run, printed again by `verdicts` at the end
OUT=${OUT:-out/gpu}
work=pack         # where the pack was unpacked (prepare); its name under `plan`
python=python3    # the python with torch (prepare)
# step NAME TIMEOUT_S COMMAND...: runs one step with its output in $OUT/NAME.log
# (under `plan`, lists it instead). Returns the step's exit status.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${PLAN:-}" ]; then
    plan_total=$((plan_total + limit))
    printf '  %-22s %4ss  %s\n' "$name" "$limit" "$*"
    return 0
  fi
  local start=$SECONDS rc line_buffered=()
  # Line-buffered, so that a step killed at its timeout keeps what it printed.
  command -v stdbuf >/dev/null && line_buffered=(stdbuf -oL)
  timeout -k 5 "$limit" "${line_buffered[@]}" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local verdict=passed
  case $rc in 0) ;; 77) verdict="skipped (no GPU)" ;; 124 | 137) verdict="timed out" ;; *) verdict="failed (exit $rc)" ;; esac
  [ "$rc" -eq 0 ] || steps_failed=$((steps_failed + 1))
  local line
  line=$(printf '%-22s %-20s %4ss  %s' "$name" "$verdict" $((SECONDS - start)) \
    "$(grep -v '^[[:space:]]*$' "$OUT/$name.log" | tail -n 1)")
  verdicts+=("$line")
  echo "$line" | tee -a "$OUT/steps.txt"
  return "$rc"
}

# Prints each step's verdict again, last, with the count of steps that did not
# pass; returns that count (capped at 255 as an exit status must be).
verdicts() {
  echo
  echo "verdicts:"
  local line
  for line in "${verdicts[@]}"; do echo "  $line"; done
  echo "steps not passed: $steps_failed of ${#verdicts[@]}"
  return $((steps_failed > 255 ? 255 : steps_failed))
}

# Unpacks into $work and sets up the libraries and python the steps use.
prepare() {
  mkdir -p "$OUT"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar xzf "$pack_file" -C "$work" || { echo "no pack: run 'tools/gpu-check.sh pack' first"; exit 1; }
  python=/opt/torch/.venv/bin/python3
  local wheel_libs="" nvidia_root
  if [ -x "$python" ]; then
    nvidia_root=$("$python" -c "import nvidia, os; print(nvidia.__path__[0])" 2>/dev/null)
    [ -n "$nvidia_root" ] && wheel_libs=$(find "$nvidia_root" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
  else
    python=python3
  fi
  export LD_LIBRARY_PATH="$work/lib${wheel_libs:+:$wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NCCL_SOCKET_IFNAME=lo  # one rank on one machine: no network to pick
  # bench_step's PyTorch baseline script, from this copy of the tree (the
  # binaries hold the build machine's path to it).
  export LOCKSTEP_BENCH_DIR=$PWD/bench
  { date -u; echo "pack of commit $(cat "$work/ref/commit")"; nvidia-smi 2>&1; } >"$OUT/machine-$1.txt"
  : >>"$OUT/steps.txt"
}

run_tests() {
  [ -z "${PLAN:-}" ] && prepare tests
  local bin=$work/bin
  if ! step smoke 30 "$bin/lockstep-gpu-smoke"; then
    echo "smoke failed: see $OUT/smoke.log; nothing else ran"
    verdicts
    return
  fi
  step gpu_tests 60 "$bin/lockstep_gpu_tests" "[gpu]" --durations yes
  step comm_gpu_tests 30 "$bin/lockstep_comm_gpu_tests" "[gpu]"
  step io_gpu_tests 30 "$bin/lockstep_io_gpu_tests" "[gpu]"
  step engine_gpu_tests 90 "$bin/lockstep_engine_gpu_tests" "[gpu]~[gpt2]" --durations yes
  # GPT-2's real widths: a one-block step against the cpu, then each kernel
  # family at 16K tokens checked and timed (tests/engine/gpu/test_gpt2_shape_gpu.cpp).
  step gpt2_shape 60 "$bin/lockstep_engine_gpu_tests" "[gpt2]" --durations yes
  [ -n "${PLAN:-}" ] && return 0
  grep -hE "^(test cases|All tests)" "$OUT"/*_gpu_tests.log "$OUT/gpt2_shape.log"
  # The gpt2-shaped times, for docs/gpu-results.md.
  grep -hE "^(gpt2-shaped step|kernel family|  .* [0-9]+\.[0-9]{3}$)" "$OUT/gpt2_shape.log"
  verdicts
}

run_bench() {
  [ -z "${PLAN:-}" ] && prepare bench
  local bin=$work/bin
  # 300 s in all, from the first run's times (docs/gpu-results.md, 2026-12-04):
  # bench_gemm's sweep did not end in 50 s, torch.matmul's took 27, the steps
  # 31 to 38 s, the shard and the 300 training steps a second each.
  step bench_gemm 80 "$bin/bench_gemm" --device cuda --json "$OUT/bench_gemm.json"
  step torch_gemm 40 "$python" tools/gpu_baseline.py gemm --json "$OUT/torch_gemm.json"
  for config in "mlp-large 1024 bf16 45" "resnet 256 fp16 45" "gpt2 8 bf16 55"; do
    set -- $config
    step "step_$1_$3" "$4" "$bin/bench_step" --device cuda --model "$1" --batch "$2" \
      --precision "$3" --steps 20 --python "$python" --json "$OUT/bench_step_$1_$3.json"
  done
  step shard 10 "$bin/lockstep-shard" "${shard_args[@]}" --out "$work/data"
  step train_cuda 25 "$bin/lockstep-train" --data "$work/data" "${train_args[@]}" --device cuda \
    --metrics "$OUT/train_cuda.jsonl"
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_step_*.json >"$OUT/bench_step.json" 2>/dev/null
  echo
  "$python" tools/gpu_baseline.py summary --lockstep "$OUT/bench_gemm.json" --torch "$OUT/torch_gemm.json" \
    --steps "$OUT/bench_step.json" --train "$OUT/train_cuda.jsonl" "$work/ref/train_cpu.jsonl" \
    | tee "$OUT/summary.txt"
  verdicts
}

# Where the GPU steps' time goes: each module's forward and backward and the
# optimizer on the compute stream (bench_step --trace, summed per span name by
# tools/trace.py top), and per kernel where nsys is installed.
run_profile() {
  [ -z "${PLAN:-}" ] && prepare profile
  local bin=$work/bin
  step bench_gemm 80 "$bin/bench_gemm" --device cuda --json "$OUT/bench_gemm.json"
  for config in "gpt2 8 bf16 45" "resnet 256 fp16 40"; do
    set -- $config
    step "trace_$1" "$4" "$bin/bench_step" --device cuda --model "$1" --batch "$2" \
      --precision "$3" --steps 3 --baseline false --trace "$work/trace_$1"
  done
  if [ -n "${PLAN:-}" ] || command -v nsys >/dev/null; then
    step nsys_gpt2 60 nsys profile --force-overwrite true -o "$work/gpt2" "$bin/bench_step" \
      --device cuda --model gpt2 --batch 8 --precision bf16 --steps 3 --baseline false
  else
    echo "nsys: not on this machine; per-kernel times from the trace spans only" | tee "$OUT/nsys.txt"
  fi
  # 4096 images of 3 x 224 x 224 u8 (616 MB), batches of 256 to GPU memory.
  step loader_shards 20 "$bin/lockstep-shard" synthetic --count 4096 --shape 3,224,224 --dtype u8 \
    --classes 10 --shards 4 --seed 1 --out "$work/images"
  step loader_cuda 40 "$bin/bench_loader" --data "$work/images" --batch 256 --threads 4 --trials 3 \
    --device cuda --python "" --json "$OUT/bench_loader.json"
  [ -n "${PLAN:-}" ] && return 0
  local model
  for model in gpt2 resnet; do
    [ -d "$work/trace_$model" ] && "$python" tools/trace.py top "$work/trace_$model" --count 40 \
      >"$OUT/top_$model.txt" 2>&1
  done
  [ -f "$work/gpt2.nsys-rep" ] && nsys stats --report cuda_gpu_kern_sum --format column \
    "$work/gpt2.nsys-rep" >"$OUT/nsys_gpt2_kernels.txt" 2>&1
  head -n 45 "$OUT"/top_*.txt
  [ -f "$OUT/nsys_gpt2_kernels.txt" ] && head -n 40 "$OUT/nsys_gpt2_kernels.txt" | cut -c1-200
  tail -n 12 "$OUT/loader_cuda.log"
  verdicts
}

# One rank (no mpirun there): the GPU backward profiles tools/scaling_model.py
# extrapolates from, in place of CPU profiles scaled by GEMM rate.
run_scaling() {
  [ -z "${PLAN:-}" ] && prepare scaling
  local bin=$work/bin
  for config in "mlp-large 1024 bf16" "resnet 256 fp16"; do
    set -- $config
    step "scaling_$1" 90 "$bin/bench_scaling" --device cuda --model "$1" --batch "$2" \
      --precision "$3" --steps 10 --trials 3 --json "$OUT/bench_scaling_$1.json"
  done
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_scaling_*.json >"$OUT/bench_scaling.json" 2>/dev/null
  verdicts
}

# Lists each call's steps and timeouts, checks each stays within the device
# tool's 600 s per command, and that the pack holds every binary.
plan() {
  PLAN=1
  local call status=0
  for call in run_tests run_bench run_profile run_scaling; do
    plan_total=0
    echo "${call//_/-}:"
    "$call"
    echo "  total of timeouts: ${plan_total}s"
    [ "$plan_total" -le 300 ] || { echo "  over the 300 s a call may plan for" >&2; status=1; }
  done
  if [ -f "$pack_file" ]; then
    local listing b
    listing=$(tar tzf "$pack_file")
    for b in "${binaries[@]}"; do
      grep -qx "./bin/$(basename "$b")" <<<"$listing" || { echo "pack lacks $b" >&2; status=1; }
    done
    grep -qx "./ref/train_cpu.jsonl" <<<"$listing" || { echo "pack lacks the cpu training run" >&2; status=1; }
    echo "pack: $(($(stat -c %s "$pack_file") >> 20)) MiB, every binary present"
  else
    echo "no pack yet (tools/gpu-check.sh pack)"
  fi
  return "$status"
}

# Sourced (by tests/tools/gpu_check_steps.sh), this file only defines its functions.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
cd "$(dirname "$0")/.." || exit 2
case "${1:-}" in
  pack) pack ;;
  run-tests) run_tests ;;
  run-bench) run_bench ;;
  run-profile) run_profile ;;
  run-scaling) run_scaling ;;
  plan) plan ;;
  *) echo "usage: tools/gpu-check.sh pack|run-tests|run-bench|run-profile|run-scaling|plan" >&2; exit 2 ;;
esac
