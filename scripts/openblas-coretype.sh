#!/usr/bin/env bash
# Prints the OPENBLAS_CORETYPE this processor should have when Debian's
# OpenBLAS does not recognise it and would use its generic SSE3 kernels
# (Note [BLAS kernels] in kernels/gemm.h: the same rule), and nothing when
# OpenBLAS's own choice stands or OPENBLAS_CORETYPE is already set.
# Usage: export OPENBLAS_CORETYPE=$(scripts/openblas-coretype.sh) (when not empty)
set -euo pipefail
[ -n "${OPENBLAS_CORETYPE:-}" ] && exit 0
/usr/bin/python3 - <<'PY'
import ctypes
try:
    blas = ctypes.CDLL("libopenblas.so.0")
except OSError:
    raise SystemExit(0)
blas.openblas_get_corename.restype = ctypes.c_char_p
kernels = blas.openblas_get_corename().decode()
generic = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
           "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona"}
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
if kernels in generic:
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        print("SkylakeX")
    elif {"avx2", "fma"} <= flags:
        print("Haswell")
PY
