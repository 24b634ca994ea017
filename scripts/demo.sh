#!/usr/bin/env bash
# README's demo command. Until the training demo lands, it builds lockstep and
# runs its most complete program: bench_gemm, lockstep's GEMM against
# OpenBLAS on this machine's CPU (and against cuBLAS on a GPU when one is usable).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${LOCKSTEP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target bench_gemm
"$build"/bench/bench_gemm --device cpu --threads 1 --dtype f32 --sizes 256,512,1024 --trials 3
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$build"/bench/bench_gemm --device cuda
fi
