#!/usr/bin/python3
# The h5py side of bench_loader: reads the same batches with h5py's sorted
# fancy indexing (the usual PyTorch-Dataset way of reading HDF5 shards) and
# prints "<samples/s> <GB/s>". Run by bench_loader under Debian's python3.
import argparse
import glob
import os
import time

import h5py
import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="directory of *.h5 shards")
    parser.add_argument("--order", required=True, help="the permutation, little-endian int64")
    parser.add_argument("--batch", type=int, required=True)
    args = parser.parse_args()

    files = sorted(glob.glob(os.path.join(args.data, "*.h5")))
    inputs = [h5py.File(f, "r")["inputs"] for f in files]
    ends = np.cumsum([d.shape[0] for d in inputs])
    starts = ends - [d.shape[0] for d in inputs]
    order = np.fromfile(args.order, dtype="<i8")
    batches = len(order) // args.batch
    sample_shape, dtype = inputs[0].shape[1:], inputs[0].dtype
    out = np.empty((args.batch,) + sample_shape, dtype)

    start = time.perf_counter()
    for b in range(batches):
        rows = np.sort(order[b * args.batch:(b + 1) * args.batch])
        shard = np.searchsorted(ends, rows, side="right")
        filled = 0
        for s in np.unique(shard):
            local = rows[shard == s] - starts[s]
            out[filled:filled + len(local)] = inputs[s][local]
            filled += len(local)
    seconds = time.perf_counter() - start
    samples = batches * args.batch
    print(f"{samples / seconds} {samples * out[0].nbytes / seconds / 1e9}")


if __name__ == "__main__":
    main()
