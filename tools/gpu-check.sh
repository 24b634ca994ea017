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
#   tools/gpu-check.sh run-bench   second call: bench_step against PyTorch eager
#                                  with AMP (gpt2 bf16 at batch 8 and 16 with
#                                  SDPA; resnet50 fp16 and bf16 and the CIFAR
#                                  resnet with PyTorch in channels-last)
#   tools/gpu-check.sh run-compare third call: gpt2 against torch.compile, the
#                                  fused kernels against the unfused (bench_step
#                                  --unfused), training runs held to the packed
#                                  cpu runs (mlp, gpt-tiny), gpt2 fused against
#                                  unfused for 100 steps, and --deterministic
#                                  twice with the same bits
#   tools/gpu-check.sh run-graph   fourth call: the CUDA graph step's [gpu]
#                                  tests, gpt2 bench_step with and without
#                                  --cuda-graph, gpt-tiny --deterministic the
#                                  same bits with and without
#   tools/gpu-check.sh run-nhwc    fifth call: the channels-last kernels' and
#                                  layers' [gpu] tests, resnet50 and resnet
#                                  bench_step --channels-last beside PyTorch
#                                  in channels-last
#   tools/gpu-check.sh run-profile optional call: where gpt2's and resnet50's
#                                  steps spend their time, fused and unfused
#                                  (bench_step --trace, tools/trace.py top; nsys
#                                  where present), and the JPEG pipeline's
#                                  loader threads for one GPU (bench_loader
#                                  --threads-sweep)
#   tools/gpu-check.sh run-scaling optional call: bench_scaling profiles
#                                  (feed them to tools/scaling_model.py here),
#                                  the GEMM sweep against torch.matmul
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
# The training comparisons: the same data, model, seed and steps on both devices.
shard_args=(synthetic --count 8192 --shape 1,28,28 --dtype u8 --classes 10 --shards 2 --seed 1)
train_args=(--model mlp --steps 300 --batch-size 64 --seed 3 --log-every 100)
# gpt-tiny on byte-level text (the packed fortunes' windows), bf16 on both
# devices: the cpu composes the unfused ops, the GPU runs the fused kernels.
gpt_tiny_common=(--model gpt-tiny --batch-size 16 --seed 3 --optimizer adamw --lr 0.002
                 --precision bf16)
gpt_tiny_args=("${gpt_tiny_common[@]}" --steps 300 --log-every 100)
# gpt2 at T 1024 for 100 steps, fused against --unfused-kernels on the GPU.
gpt2_args=(--model gpt2 --steps 100 --batch-size 8 --seed 3 --log-every 25 --optimizer adamw
           --lr 0.0006 --precision bf16)
# JPEGs for the loader's thread sweep: photograph-sized, few enough to travel.
photo_count=160

pack() {
  set -e
  # LOCKSTEP_GPU_BUILD: an existing Release build for sm_90 to reuse (here,
  # saving a full build); the pack's own folder by default.
  local build=${LOCKSTEP_GPU_BUILD:-build-gpu} stage=.gpu-pack/stage
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$build" --target "${targets[@]}"
  # The fused attention is the largest part of the GPT step's gain: a pack
  # without it would measure the wrong thing.
  [ -f "$build/kernels/CMakeFiles/lockstep_kernels.dir/cuda/sdpa_cudnn.cpp.o" ] || {
    echo "pack: built without cudnn-frontend (scripts/install-deps.sh fetches it)" >&2
    exit 1
  }
  rm -rf .gpu-pack && mkdir -p "$stage/bin" "$stage/lib" "$stage/ref"
  for b in "${binaries[@]}"; do cp "$build/$b" "$stage/bin/"; done
  cp -L "$build"/kernels/liblockstep_*.so "$build"/engine/core/liblockstep_*.so "$build"/comm/liblockstep_*.so \
    "$build"/io/liblockstep_*.so "$build"/engine/liblockstep_*.so "$stage/lib/"
  # Every library the binaries load, except what the GPU machine has: glibc,
  # the compiler runtime, and the CUDA libraries (its own, or its nvidia wheels').
  local skip='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libresolv|libnsl|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn[^/]*|libnccl|libnvrtc[^/]*|libnvJitLink)\.so'
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
  local texts=()
  mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
  "$build/examples/shard/lockstep-shard" text --src "${texts[@]}" --out "$stage/text128" --seq 128 \
    >/dev/null
  "$build/examples/shard/lockstep-shard" text --src "${texts[@]}" --out "$stage/text1024" \
    --seq 1024 >/dev/null
  "$build/examples/train/lockstep-train" --data "$stage/text128/train" "${gpt_tiny_args[@]}" \
    --device cpu --metrics "$stage/ref/train_gpt_tiny_cpu.jsonl" >/dev/null
  local photos
  photos=$(mktemp -d)
  /usr/bin/python3 bench/photo_jpegs.py "$photos" "$photo_count"
  "$build/examples/shard/lockstep-shard" images --src "$photos" --out "$stage/photos" --shards 4 \
    >/dev/null
  rm -rf "$photos"
  git rev-parse HEAD >"$stage/ref/commit"
  tar czf "$pack_file" -C "$stage" .
  rm -rf "$stage"
  local bytes
  # The device tool carries the working tree's files with the pack, within one limit.
  local tree_bytes
  bytes=$(stat -c %s "$pack_file")
  tree_bytes=$(git ls-files -z | du -cb --files0-from=- | tail -n 1 | cut -f1)
  if [ $((bytes + tree_bytes)) -ge "$pack_limit_bytes" ]; then
    echo "pack is $bytes bytes and the tree $tree_bytes, over the device tool's 64 MiB carry limit" >&2
    exit 1
  fi
  echo "packed: $((bytes >> 20)) MiB $pack_file and $((tree_bytes >> 20)) MiB of tracked files" \
    "(commit $(git rev-parse --short HEAD))"
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
  # The smoke step also prints the run-time cuDNN version and whether its
  # fused attention supports gpt2's shape (forward, backward, deterministic).
  if ! step smoke 30 "$bin/lockstep-gpu-smoke"; then
    echo "smoke failed: see $OUT/smoke.log; nothing else ran"
    verdicts
    return
  fi
  # The kernels binary now holds the fused cross-entropy at 8192 x 50304,
  # the LayerNorms and the GEMM epilogues at gpt2's shapes; the engine's the
  # fused attention, fused BatchNorm at resnet50's, GPT blocks, embedding.
  step gpu_tests 70 "$bin/lockstep_gpu_tests" "[gpu]~[nhwc]" --durations yes
  step comm_gpu_tests 20 "$bin/lockstep_comm_gpu_tests" "[gpu]"
  step io_gpu_tests 30 "$bin/lockstep_io_gpu_tests" "[gpu]"
  step engine_gpu_tests 110 "$bin/lockstep_engine_gpu_tests" "[gpu]~[gpt2]~[nhwc]~[graph]" \
    --durations yes
  # GPT-2's real widths: a one-block step against the cpu, then each kernel
  # family at 16K tokens checked and timed (tests/engine/gpu/test_gpt2_shape_gpu.cpp).
  step gpt2_shape 40 "$bin/lockstep_engine_gpu_tests" "[gpt2]" --durations yes
  [ -n "${PLAN:-}" ] && return 0
  grep -hE "^(test cases|All tests)" "$OUT"/*_gpu_tests.log "$OUT/gpt2_shape.log"
  # The gpt2-shaped times, for docs/gpu-results.md.
  grep -hE "^(gpt2-shaped step|kernel family|  .* [0-9]+\.[0-9]{3}$)" "$OUT/gpt2_shape.log"
  verdicts
}

# bench_step STEP_NAME TIMEOUT_S MODEL BATCH PRECISION [FLAGS...]: one
# bench_step run, its JSON in $OUT/bench_step_STEP_NAME.json.
bench_step() {
  local name=$1 limit=$2 model=$3 batch=$4 precision=$5
  shift 5
  step "$name" "$limit" "$work/bin/bench_step" --device cuda --model "$model" --batch "$batch" \
    --precision "$precision" --steps 20 --python "$python" --json "$OUT/bench_step_$name.json" "$@"
}

run_bench() {
  [ -z "${PLAN:-}" ] && prepare bench
  # Issue 44: gpt2 against PyTorch eager with AMP and scaled_dot_product_attention.
  bench_step gpt2_8 55 gpt2 8 bf16
  bench_step gpt2_16 70 gpt2 16 bf16
  # Issue 45: PyTorch as NGC runs ResNet-50, channels-last with AMP, cuDNN autotuned.
  local torch_nhwc=(--torch-channels-last --torch-cudnn-benchmark)
  bench_step resnet50_fp16 60 resnet50 256 fp16 "${torch_nhwc[@]}"
  bench_step resnet50_bf16 60 resnet50 256 bf16 "${torch_nhwc[@]}"
  bench_step resnet_fp16 45 resnet 256 fp16 "${torch_nhwc[@]}"
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_step_*.json >"$OUT/bench_step.json" 2>/dev/null
  echo
  "$python" tools/gpu_baseline.py steps "$OUT/bench_step.json" | tee "$OUT/summary.txt"
  verdicts
}

# train NAME TIMEOUT_S DATA METRICS [FLAGS...]: one lockstep-train run on the GPU.
train() {
  local name=$1 limit=$2 data=$3 metrics=$4
  shift 4
  step "$name" "$limit" "$work/bin/lockstep-train" --data "$data" --device cuda \
    --metrics "$metrics" "$@"
}

run_compare() {
  [ -z "${PLAN:-}" ] && prepare compare
  # torch.compile's warm-up compiles the model (tens of seconds).
  bench_step gpt2_compile 100 gpt2 8 bf16 --torch-compile
  bench_step gpt2_unfused 40 gpt2 8 bf16 --unfused --baseline false
  step shard 5 "$work/bin/lockstep-shard" "${shard_args[@]}" --out "$work/data"
  train train_mlp 20 "$work/data" "$OUT/train_mlp_cuda.jsonl" "${train_args[@]}"
  train train_gpt_tiny 30 "$work/text128/train" "$OUT/train_gpt_tiny_cuda.jsonl" \
    "${gpt_tiny_args[@]}"
  train train_gpt2 35 "$work/text1024/train" "$OUT/train_gpt2_fused.jsonl" "${gpt2_args[@]}"
  train train_gpt2_unfused 35 "$work/text1024/train" "$OUT/train_gpt2_unfused.jsonl" \
    "${gpt2_args[@]}" --unfused-kernels
  local run
  for run in 1 2; do
    train "deterministic_$run" 15 "$work/text128/train" "$OUT/train_deterministic_$run.jsonl" \
      "${gpt_tiny_common[@]}" --steps 100 --log-every 50 --deterministic
  done
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_step_gpt2_*.json >"$OUT/bench_step_compare.json" 2>/dev/null
  echo
  {
    "$python" tools/gpu_baseline.py steps "$OUT/bench_step_compare.json"
    "$python" tools/gpu_baseline.py runs "mlp cuda vs cpu" "$OUT/train_mlp_cuda.jsonl" \
      "$work/ref/train_cpu.jsonl"
    "$python" tools/gpu_baseline.py runs "gpt-tiny bf16 cuda vs cpu" \
      "$OUT/train_gpt_tiny_cuda.jsonl" "$work/ref/train_gpt_tiny_cpu.jsonl"
    "$python" tools/gpu_baseline.py runs "gpt2 bf16 fused vs unfused" \
      "$OUT/train_gpt2_fused.jsonl" "$OUT/train_gpt2_unfused.jsonl"
    "$python" tools/gpu_baseline.py same "gpt-tiny --deterministic twice" \
      "$OUT/train_deterministic_1.jsonl" "$OUT/train_deterministic_2.jsonl"
  } | tee "$OUT/summary.txt"
  verdicts
}

# Issue 44's CUDA graph step (Note [step graph]) beside the eager step: its
# [gpu] tests (the same bits as eager), gpt2's step time with and without,
# and gpt-tiny --deterministic trained both ways to the same bits.
run_graph() {
  [ -z "${PLAN:-}" ] && prepare graph
  step graph_tests 40 "$work/bin/lockstep_engine_gpu_tests" "[graph]" --durations yes
  bench_step gpt2_eager 45 gpt2 8 bf16 --baseline false
  bench_step gpt2_graph 45 gpt2 8 bf16 --baseline false --cuda-graph
  local mode
  for mode in eager graph; do
    local flags=(--deterministic)
    [ "$mode" = graph ] && flags+=(--cuda-graph)
    train "deterministic_$mode" 15 "$work/text128/train" "$OUT/train_deterministic_$mode.jsonl" \
      "${gpt_tiny_common[@]}" --steps 100 --log-every 50 "${flags[@]}"
  done
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_step_gpt2_*.json >"$OUT/bench_step_graph.json" 2>/dev/null
  echo
  {
    "$python" tools/gpu_baseline.py steps "$OUT/bench_step_graph.json"
    "$python" tools/gpu_baseline.py same "gpt-tiny --deterministic, CUDA graph vs eager" \
      "$OUT/train_deterministic_eager.jsonl" "$OUT/train_deterministic_graph.jsonl"
  } | tee "$OUT/summary.txt"
  verdicts
}

# Issue 45's channels-last layers (Note [channels-last layers]): the NHWC
# kernels' and layers' [gpu] tests (against the CPU and the NCHW kernels),
# then resnet50 and resnet --channels-last beside PyTorch in channels-last.
run_nhwc() {
  [ -z "${PLAN:-}" ] && prepare nhwc
  step nhwc_kernel_tests 90 "$work/bin/lockstep_gpu_tests" "[nhwc]" --durations yes
  step nhwc_engine_tests 45 "$work/bin/lockstep_engine_gpu_tests" "[nhwc]" --durations yes
  local torch_nhwc=(--torch-channels-last --torch-cudnn-benchmark)
  bench_step resnet50_nhwc_fp16 60 resnet50 256 fp16 --channels-last "${torch_nhwc[@]}"
  bench_step resnet_nhwc_fp16 45 resnet 256 fp16 --channels-last "${torch_nhwc[@]}"
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_step_resnet*_nhwc_*.json >"$OUT/bench_step_nhwc.json" 2>/dev/null
  echo
  "$python" tools/gpu_baseline.py steps "$OUT/bench_step_nhwc.json" | tee "$OUT/summary.txt"
  verdicts
}

# Where the GPU steps' time goes: each module's forward and backward and the
# optimizer on the compute stream (bench_step --trace, summed per span name by
# tools/trace.py top), fused and unfused, and per kernel where nsys is installed.
run_profile() {
  [ -z "${PLAN:-}" ] && prepare profile
  local bin=$work/bin config
  for config in "gpt2 8 bf16 40 gpt2" "gpt2 8 bf16 40 gpt2_unfused --unfused" \
    "resnet50 256 fp16 45 resnet50" "resnet50 256 fp16 45 resnet50_unfused --unfused"; do
    set -- $config
    step "trace_$5" "$4" "$bin/bench_step" --device cuda --model "$1" --batch "$2" \
      --precision "$3" --steps 3 --baseline false --trace "$work/trace_$5" "${@:6}"
  done
  if [ -n "${PLAN:-}" ] || command -v nsys >/dev/null; then
    step nsys_gpt2 60 nsys profile --force-overwrite true -o "$work/gpt2" "$bin/bench_step" \
      --device cuda --model gpt2 --batch 8 --precision bf16 --steps 3 --baseline false
  else
    echo "nsys: not on this machine; per-kernel times from the trace spans only" | tee "$OUT/nsys.txt"
  fi
  # The JPEG pipeline at 224 (RandomResizedCrop, flip, normalised on the GPU):
  # how many loader threads reach ResNet-50's rate on one GPU.
  step loader_sweep 60 "$bin/bench_loader" --data "$work/photos" --batch 64 --device cuda \
    --threads-sweep 1,2,4,8,12 --trials 2 --python "" --json "$OUT/bench_loader.json"
  [ -n "${PLAN:-}" ] && return 0
  local trace
  for trace in gpt2 gpt2_unfused resnet50 resnet50_unfused; do
    [ -d "$work/trace_$trace" ] && "$python" tools/trace.py top "$work/trace_$trace" --count 40 \
      >"$OUT/top_$trace.txt" 2>&1
  done
  [ -f "$work/gpt2.nsys-rep" ] && nsys stats --report cuda_gpu_kern_sum --format column \
    "$work/gpt2.nsys-rep" >"$OUT/nsys_gpt2_kernels.txt" 2>&1
  head -n 45 "$OUT"/top_*.txt
  [ -f "$OUT/nsys_gpt2_kernels.txt" ] && head -n 40 "$OUT/nsys_gpt2_kernels.txt" | cut -c1-200
  tail -n 12 "$OUT/loader_sweep.log"
  verdicts
}

# One rank (no mpirun there): the GPU backward profiles tools/scaling_model.py
# extrapolates from, in place of CPU profiles scaled by GEMM rate; and the
# GEMM sweep against torch.matmul.
run_scaling() {
  [ -z "${PLAN:-}" ] && prepare scaling
  local bin=$work/bin
  for config in "mlp-large 1024 bf16" "resnet 256 fp16"; do
    set -- $config
    step "scaling_$1" 90 "$bin/bench_scaling" --device cuda --model "$1" --batch "$2" \
      --precision "$3" --steps 10 --trials 3 --json "$OUT/bench_scaling_$1.json"
  done
  step bench_gemm 80 "$bin/bench_gemm" --device cuda --json "$OUT/bench_gemm.json"
  step torch_gemm 40 "$python" tools/gpu_baseline.py gemm --json "$OUT/torch_gemm.json"
  [ -n "${PLAN:-}" ] && return 0
  cat "$OUT"/bench_scaling_*.json >"$OUT/bench_scaling.json" 2>/dev/null
  "$python" tools/gpu_baseline.py summary --lockstep "$OUT/bench_gemm.json" \
    --torch "$OUT/torch_gemm.json" | tee "$OUT/summary.txt"
  verdicts
}

# Lists each call's steps and timeouts, checks each stays within the device
# tool's 600 s per command, and that the pack holds every binary.
plan() {
  PLAN=1
  local call status=0
  for call in run_tests run_bench run_compare run_graph run_nhwc run_profile run_scaling; do
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
    for b in ref/train_cpu.jsonl ref/train_gpt_tiny_cpu.jsonl text128/train text1024/train photos; do
      grep -qE "^\./$b/?$" <<<"$listing" || { echo "pack lacks $b" >&2; status=1; }
    done
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
  run-compare) run_compare ;;
  run-graph) run_graph ;;
  run-nhwc) run_nhwc ;;
  run-profile) run_profile ;;
  run-scaling) run_scaling ;;
  plan) plan ;;
  *) echo "usage: tools/gpu-check.sh pack|run-tests|run-bench|run-compare|run-graph|run-nhwc|run-profile|run-scaling|plan" >&2; exit 2 ;;
esac
