# The program of main.cpp in PyTorch DDP, for the line counts in
# docs/custom-training.md: the same data, model, AdamW, cosine schedule,
# clipping and held-out check. Run: torchrun --nproc-per-node 2 pytorch_ddp.py
# (run here with Debian's torch 1.13, each rank started with MASTER_ADDR,
# MASTER_PORT, RANK and WORLD_SIZE set: held-out mse 0.0003 on 2 ranks)
import sys
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
    y = (np.sin(3 * x[:, :1]) + x[:, 1:] ** 2).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train, held_out = make_data(4096, 7), make_data(1024, 8)
    sampler = DistributedSampler(train, seed=1, drop_last=True)
    loader = DataLoader(train, batch_size=32, sampler=sampler, drop_last=True)
    torch.manual_seed(1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    epochs = 12
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * len(loader))
    loss_fn, step = torch.nn.MSELoss(), 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if rank == 0 and step % 100 == 0:
                print(f"step {step}: mse {mean.item() / dist.get_world_size():.5f}")
    with torch.no_grad():
        x, y = held_out.tensors
        shard = slice(rank, None, dist.get_world_size())
        total = torch.tensor([loss_fn(model(x[shard]), y[shard]).item() * len(y[shard]), len(y[shard])])
        dist.all_reduce(total)
    mse = (total[0] / total[1]).item()
    if rank == 0:
        print(f"regression: held-out mse {mse:.5f} after {step} steps")
    dist.destroy_process_group()
    return 0 if mse < 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
