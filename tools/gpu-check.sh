#!/usr/bin/env bash
# The GPU check, in two halves (../shared/gpu.md has the background):
#   tools/gpu-check.sh pack   on the build machine: a Release build for sm_90,
#                             the test and bench binaries and the Debian
#                             libraries they need, as .gpu-pack/lockstep-gpu.tar.gz
#   tools/gpu-check.sh run    on the GPU machine (device tool, carry .gpu-pack):
#                             [gpu] tests, unit tests, bench_gemm, the PyTorch
#                             baseline, bench_scaling's GPU profiles and the
#                             scaling model on them; logs and JSON under $OUT;
#                             a table last.
# Record what `run` printed in docs/gpu-results.md.
set -uo pipefail
cd "$(dirname "$0")/.."

binaries=(tests/lockstep_gpu_tests tests/comm/lockstep_comm_gpu_tests tests/io/lockstep_io_gpu_tests
          tests/engine/lockstep_engine_gpu_tests tests/lockstep_unit_tests bench/bench_gemm
          bench/bench_step bench/bench_scaling examples/train/lockstep-train examples/shard/lockstep-shard)

pack() {
  set -e
  local build=build-gpu stage=.gpu-pack/stage
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$build" --target lockstep_gpu_tests lockstep_comm_gpu_tests lockstep_io_gpu_tests \
    lockstep_engine_gpu_tests lockstep_unit_tests bench_gemm bench_step bench_scaling lockstep-train \
    lockstep-shard
  rm -rf .gpu-pack && mkdir -p "$stage/bin" "$stage/lib"
  for b in "${binaries[@]}"; do cp "$build/$b" "$stage/bin/"; done
  cp -L "$build"/kernels/liblockstep_*.so "$build"/engine/core/liblockstep_*.so "$build"/comm/liblockstep_*.so \
    "$build"/io/liblockstep_*.so "$build"/engine/liblockstep_*.so "$stage/lib/"
  # Every library the binaries load, except what the GPU machine has: glibc,
  # the compiler runtime, and the CUDA libraries (its own, or its nvidia wheels').
  local skip='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn[^/]*|libnccl)\.so'
  for f in "$stage"/bin/* "$stage"/lib/*; do
    LD_LIBRARY_PATH="$stage/lib" ldd "$f" | awk '/=> \// {print $1, $3}'
  done | sort -u | while read -r soname path; do
    [[ "$path" =~ $skip ]] && continue
    [ -e "$stage/lib/$soname" ] || cp -L "$path" "$stage/lib/$soname"
  done
  tar czf .gpu-pack/lockstep-gpu.tar.gz -C "$stage" .
  rm -rf "$stage"
  echo "packed: $(du -h .gpu-pack/lockstep-gpu.tar.gz | cut -f1) .gpu-pack/lockstep-gpu.tar.gz" \
       "(commit $(git rev-parse --short HEAD))"
}

# step NAME TIMEOUT_S COMMAND...: runs one step with its output in $OUT/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS rc
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local verdict=passed
  case $rc in 0) ;; 77) verdict="skipped (no GPU)" ;; 124) verdict="timed out" ;; *) verdict="failed (exit $rc)" ;; esac
  printf '%-16s %-20s %4ss  %s\n' "$name" "$verdict" $((SECONDS - start)) "$(grep -v '^[[:space:]]*$' "$OUT/$name.log" | tail -n 1)" \
    | tee -a "$OUT/steps.txt"
}

run() {
  OUT=${OUT:-out/gpu}
  mkdir -p "$OUT"
  local work
  work=$(mktemp -d)
  tar xzf .gpu-pack/lockstep-gpu.tar.gz -C "$work" || { echo "no pack: run 'tools/gpu-check.sh pack' first"; exit 1; }
  local python=/opt/torch/.venv/bin/python3 wheel_libs=""
  if [ -x "$python" ]; then
    local nvidia_root
    nvidia_root=$("$python" -c "import nvidia, os; print(nvidia.__path__[0])" 2>/dev/null)
    [ -n "$nvidia_root" ] && wheel_libs=$(find "$nvidia_root" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
  else
    python=python3
  fi
  export LD_LIBRARY_PATH="$work/lib${wheel_libs:+:$wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  { date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi 2>&1; } >"$OUT/machine.txt"
  : >"$OUT/steps.txt"
  step gpu_tests 240 "$work/bin/lockstep_gpu_tests" "[gpu]" --durations yes
  step comm_gpu_tests 120 "$work/bin/lockstep_comm_gpu_tests" "[gpu]"
  step io_gpu_tests 120 "$work/bin/lockstep_io_gpu_tests" "[gpu]"
  step engine_gpu_tests 240 "$work/bin/lockstep_engine_gpu_tests" "[gpu]" --durations yes
  step unit_tests 240 "$work/bin/lockstep_unit_tests"
  step bench_gemm 240 "$work/bin/bench_gemm" --device cuda --json "$OUT/bench_gemm.json"
  step torch_gemm 240 "$python" tools/gpu_baseline.py gemm --json "$OUT/torch_gemm.json"
  for run in "mlp-large 1024 bf16" "mlp-large 1024 fp16" "resnet 256 fp16" "cnn 256 fp32"; do
    set -- $run
    step "step_$1_$3" 180 "$work/bin/bench_step" --device cuda --model "$1" --batch "$2" --precision "$3" \
      --steps 20 --python "$python" --json "$OUT/bench_step_$1_$3.json"
  done
  cat "$OUT"/bench_step_*.json >"$OUT/bench_step.json" 2>/dev/null
  # One rank (no mpirun here): the GPU backward profiles that tools/scaling_model.py
  # extrapolates from, in place of CPU profiles scaled by GEMM rate.
  for run in "mlp-large 1024 bf16" "resnet 256 fp16"; do
    set -- $run
    step "scaling_$1" 180 "$work/bin/bench_scaling" --device cuda --model "$1" --batch "$2" \
      --precision "$3" --steps 10 --trials 3 --json "$OUT/bench_scaling_$1.json"
  done
  cat "$OUT"/bench_scaling_*.json >"$OUT/bench_scaling.json" 2>/dev/null
  step scaling_model 60 "$python" tools/scaling_model.py --profile "$OUT/bench_scaling.json" \
    --json "$OUT/scaling_model.json"
  # A few hundred steps on the GPU and on the CPU from the same seed: the
  # losses must agree within autocast-free f32 tolerance (tools/gpu_baseline.py compare).
  "$work/bin/lockstep-shard" synthetic --out "$OUT/data" --count 8192 --shape 1,28,28 --dtype u8 \
    --classes 10 --shards 2 --seed 1 >"$OUT/shard.log" 2>&1
  for device in cuda cpu; do
    step "train_$device" 240 "$work/bin/lockstep-train" --data "$OUT/data" --model mlp --steps 300 \
      --batch-size 64 --device "$device" --seed 3 --log-every 100 --metrics "$OUT/train_$device.jsonl"
  done
  echo
  "$python" tools/gpu_baseline.py summary --lockstep "$OUT/bench_gemm.json" --torch "$OUT/torch_gemm.json" \
    --steps "$OUT/bench_step.json" --train "$OUT/train_cuda.jsonl" "$OUT/train_cpu.jsonl" | tee "$OUT/summary.txt"
  grep -E "test cases|assertions|passed|failed" "$OUT/gpu_tests.log" | tail -n 3
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: tools/gpu-check.sh pack|run" >&2; exit 2 ;;
esac
