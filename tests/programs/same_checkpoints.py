"""same_checkpoints.py A B TOLERANCE: checkpoints A and B hold the same datasets, of the same
shapes and types, equal bit for bit when TOLERANCE is 0, else within it. Used by the program
tests (resume.sh), the multi-host tests (tests/multihost) and the Slurm test."""
import sys

import h5py
import numpy as np


def datasets(f):
    names = []
    f.visit(lambda n: names.append(n) if isinstance(f[n], h5py.Dataset) else None)
    return names


a, b, tol = h5py.File(sys.argv[1]), h5py.File(sys.argv[2]), float(sys.argv[3])
names = datasets(a)
assert names, "no datasets"
if sorted(names) != sorted(datasets(b)):
    sys.exit(f"the checkpoints hold different datasets: {sorted(set(names) ^ set(datasets(b)))}")
for n in names:
    x, y = a[n][()], b[n][()]
    if x.shape != y.shape or x.dtype != y.dtype:
        sys.exit(f"{n}: {x.dtype} {x.shape} against {y.dtype} {y.shape}")
    ok = np.array_equal(x, y) if tol == 0 else np.allclose(x, y, rtol=0, atol=tol)
    if not ok:
        sys.exit(f"{n} differs: largest difference {np.max(np.abs(x.astype(float) - y.astype(float)))}")
print(f"{len(names)} datasets match (tolerance {tol})")
