#!/usr/bin/env bash
# README's test command: installs the Debian packages, builds lockstep (with
# CUDA when nvcc is found) and runs the whole test suite with ctest.
# Extra arguments go to cmake's configure step (e.g. -DLOCKSTEP_WITH_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${LOCKSTEP_BUILD_DIR:-build}
# Note [BLAS kernels] (kernels/gemm.h): OpenBLAS's own kernels for this
# processor, where Debian's OpenBLAS does not recognise it.
coretype=$(scripts/openblas-coretype.sh)
if [ -n "$coretype" ]; then
  export OPENBLAS_CORETYPE=$coretype
  echo "OPENBLAS_CORETYPE=$coretype: Debian's OpenBLAS does not recognise this processor"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" --parallel "$(nproc)"
# The multi-host tests (root, network namespaces) are a CI stage of their own:
# ctest -L multihost.
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -LE multihost
