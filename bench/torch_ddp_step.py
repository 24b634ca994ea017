#!/usr/bin/env python3
"""PyTorch DDP's data-parallel step on the CPU (gloo), the baseline beside
bench_scaling's for the contended case of docs/benchmarks.md ("Two ranks and
a busy process"): the same presets as bench/torch_step.py, SGD with momentum,
one thread per rank, the batch per rank given; rank 0 prints the median
milliseconds per step of --trials blocks of --steps steps, as JSON.

usage: torchrun --nproc-per-node 2 torch_ddp_step.py --model mlp --batch 128
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import make  # noqa: E402  the presets, defined once


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model, sample_shape, classes = make(args.model)
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, *sample_shape)
    y = torch.randint(0, classes, (args.batch,))
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    blocks = []
    for _ in range(args.trials):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        blocks.append((time.perf_counter() - start) / args.steps * 1e3)
    if dist.get_rank() == 0:
        print(json.dumps({"torch_version": torch.__version__, "ranks": dist.get_world_size(),
                          "model": args.model, "batch": args.batch,
                          "ms_per_step": statistics.median(blocks), "ms_per_step_blocks": blocks}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
