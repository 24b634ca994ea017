"""same_checkpoints.py A B TOLERANCE: every dataset of checkpoint A equals B's
(bit for bit when TOLERANCE is 0, else within it). Used by the program tests
(resume.sh), the multi-host tests (tests/multihost) and the Slurm test."""
import sys

import h5py
import numpy as np

a, b, tol = h5py.File(sys.argv[1]), h5py.File(sys.argv[2]), float(sys.argv[3])
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
assert names, "no datasets"
for n in names:
    x, y = a[n][()], b[n][()]
    ok = np.array_equal(x, y) if tol == 0 else np.allclose(x, y, rtol=0, atol=tol)
    if not ok:
        sys.exit(f"{n} differs: largest difference {np.max(np.abs(x.astype(float) - y.astype(float)))}")
print(f"{len(names)} datasets match (tolerance {tol})")
