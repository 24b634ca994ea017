#!/usr/bin/env python3
"""The PyTorch side of bench_step: the same presets (engine/models.cpp), the
same step (forward, cross-entropy, backward, SGD with momentum), timed the
same way; prints one JSON object per block it is asked to time. gpt-tiny and
gpt2 are nanoGPT's GPT with its fused attention path
(F.scaled_dot_product_attention, causal: what a PyTorch user writes; lockstep
computes the same masked softmax(QK^T / sqrt(D)) V); tied head.

usage: echo 50 | torch_step.py --model mlp --batch 128 --precision fp32 --device cpu --threads 1

ResNet-50 as NGC's users time it (NVIDIA DeepLearningExamples' "--amp
--memory-format nhwc"): --precision fp16 (torch.autocast with GradScaler) or
bf16 (autocast alone), --channels-last (the model's weights and the input
batch in torch.channels_last, so cuDNN runs NHWC kernels) and
--cudnn-benchmark (cuDNN autotunes each convolution in the warm-up steps).

--compile times torch.compile(model) instead of eager PyTorch (the optimizer
stays eager); compilation happens in the warm-up steps, which are not timed.
Where this machine's PyTorch cannot compile (no torch.compile, no C++ compiler
or Triton for Inductor, a Python that Dynamo does not support), it prints one
line saying so and exits with status 3.
"""
import argparse
import json
import math
import sys
import time
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F


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


class Bottleneck(nn.Module):
    # torchvision's, v1.5: the stride on the 3x3 conv.
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet50():
    # torchvision's resnet50(): the ImageNet stem, Bottleneck stages of 3, 4, 6, 3 blocks.
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, blocks in enumerate([3, 4, 6, 3]):
        width = 64 << stage
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if stage > 0 and b == 0 else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers), (3, 224, 224), 1000


class CausalSelfAttention(nn.Module):
    def __init__(self, c, h, t):
        super().__init__()
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.h = h

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        # The fused kernel a PyTorch user writes today (issue 27: the strongest baseline).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, c, h, t):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = CausalSelfAttention(c, h, t)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(c, 4 * c), gelu=nn.GELU(approximate="tanh"),
                                             c_proj=nn.Linear(4 * c, c)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, heads, c, t, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(t, c)
        self.h = nn.ModuleList(Block(c, heads, t) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # nanoGPT's initialisation, as lockstep's GPT::reset_parameters: every
        # weight N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2L)),
        # biases 0. PyTorch's defaults (an N(0, 1) embedding tied to the head)
        # start GPT-2 at a loss near 485 rather than ln(50304) = 10.8, and its
        # saturated softmax fills backward with subnormals, which slowed the
        # baseline's CPU step ninefold (docs/benchmarks.md).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


GPT_PRESETS = {"gpt-tiny": (4, 4, 128, 128, 256), "gpt2": (12, 12, 768, 1024, 50304)}


def make(name):
    if name in GPT_PRESETS:
        layers, heads, c, t, vocab = GPT_PRESETS[name]
        return GPT(layers, heads, c, t, vocab), (t,), vocab
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10)), (1, 28, 28), 10
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28), 10
    if name == "resnet":
        return resnet()
    if name == "resnet50":
        return resnet50()
    if name == "mlp-large":
        layers = []
        for _ in range(3):
            layers += [nn.Linear(4096, 4096), nn.GELU(approximate="tanh")]
        return nn.Sequential(*layers, nn.Linear(4096, 1000)), (4096,), 1000
    raise SystemExit(f"unknown model {name}")


def cannot_compile(reason):
    # One line, the last the bench reads before the exit (bench/torch_baseline.h).
    print(f"torch.compile is not usable with torch {torch.__version__} on this machine: {reason}", flush=True)
    raise SystemExit(3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--channels-last", action="store_true",
                   help="image models: weights and inputs in torch.channels_last (NHWC)")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True: cuDNN autotunes in the warm-up steps")
    p.add_argument("--compile", action="store_true", help="time torch.compile(model) (see above)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    model, sample_shape, classes = make(args.model)
    model = model.to(device)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if args.channels_last:  # before the optimizer and any compile see the parameters
        if len(sample_shape) != 3:
            raise SystemExit(f"--channels-last: --model {args.model} takes no images (a sample is {sample_shape})")
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    forward = model
    if args.compile:
        if not hasattr(torch, "compile"):
            cannot_compile(f"torch {torch.__version__} has no torch.compile")
        forward = torch.compile(model)
    if args.model in GPT_PRESETS:  # tokens and one target per position
        x = torch.randint(0, classes, (args.batch, *sample_shape), device=device)
        y = torch.randint(0, classes, (args.batch, *sample_shape), device=device)
    else:
        x = torch.randn(args.batch, *sample_shape, device=device)
        y = torch.randint(0, classes, (args.batch,), device=device)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.cuda.amp.GradScaler(enabled=args.precision == "fp16" and device.type == "cuda")
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)  # PyTorch's default since 2.0, and the faster
        if low is None:
            loss = loss_fn(forward(x).flatten(0, -2), y.flatten())
        else:
            with torch.autocast(device.type, dtype=low):
                loss = loss_fn(forward(x).flatten(0, -2), y.flatten())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(steps):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        return time.perf_counter() - start

    try:
        for _ in range(max(args.warmup, 2 if args.compile else 0)):  # compiles forward and backward
            step()
        sync()
    except Exception as e:  # noqa: BLE001 - any failure to compile ends the baseline with its reason
        if not args.compile:
            raise
        cannot_compile(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def peak():
        return torch.cuda.max_memory_allocated() if device.type == "cuda" else 0

    print(json.dumps({"ready": True, "torch_version": torch.__version__}), flush=True)
    for line in sys.stdin:
        seconds = timed(int(line))
        print(json.dumps({"seconds": seconds, "peak_bytes": peak()}), flush=True)



if __name__ == "__main__":
    main()
