#!/usr/bin/env python3
"""The PyTorch side of bench_step: the same presets (engine/models.cpp), the
same step (forward, cross-entropy, backward, SGD with momentum), timed the
same way; prints one JSON object.

usage: torch_step.py --model mlp --batch 128 --precision fp32 --device cpu --steps 50 --threads 1
"""
import argparse
import json
import time

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet():
    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for stage in range(4):
        cout = 64 << stage
        layers += [BasicBlock(cin, cout, 1 if stage == 0 else 2), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers), (3, 32, 32), 10


def make(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10)), (1, 28, 28), 10
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28), 10
    if name == "resnet":
        return resnet()
    if name == "mlp-large":
        layers = []
        for _ in range(3):
            layers += [nn.Linear(4096, 4096), nn.GELU(approximate="tanh")]
        return nn.Sequential(*layers, nn.Linear(4096, 1000)), (4096,), 1000
    raise SystemExit(f"unknown model {name}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, sample_shape, classes = make(args.model)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, *sample_shape, device=device)
    y = torch.randint(0, classes, (args.batch,), device=device)
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.cuda.amp.GradScaler(enabled=args.precision == "fp16" and device.type == "cuda")
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        if low is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast(device.type, dtype=low):
                loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / args.steps
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    print(json.dumps({"model": args.model, "batch": args.batch, "precision": args.precision,
                      "device": args.device, "threads": args.threads, "ms_per_step": 1e3 * seconds,
                      "samples_per_s": args.batch / seconds, "peak_bytes": peak,
                      "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
