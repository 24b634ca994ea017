# The program of main.cpp in PyTorch DDP, for the line counts in
# docs/custom-training.md: the same layer, model, data, AdamW, and
# checkpoints written atomically on rank 0 (the last 3 kept) and resumed
# from the newest. Run: torchrun --nproc-per-node 2 pytorch_ddp.py [DIR]
import glob, os, sys
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler


class SiLU(torch.nn.Module):  # autograd derives the backward
    def forward(self, x):
        return x * torch.sigmoid(x)


def make_data(n=2048):
    rng = np.random.default_rng(7)
    y = np.arange(n) % 2
    sign = np.where((np.arange(n) // 2) % 2 == 1, 1.0, -1.0)
    x = np.stack([sign, np.where(y == 1, sign, -sign)], 1) + rng.normal(0, 0.3, (n, 2))
    return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))


def main():
    dist.init_process_group("gloo")
    rank, directory = dist.get_rank(), sys.argv[1] if len(sys.argv) > 1 else ""
    data = make_data()
    sampler = DistributedSampler(data, seed=3, drop_last=True)
    loader = DataLoader(data, batch_size=64, sampler=sampler, drop_last=True)
    torch.manual_seed(1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(2, 32), SiLU(), torch.nn.Linear(32, 2)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    start_epoch, step, loss = 0, 0, torch.zeros(())
    saved = sorted(glob.glob(f"{directory}/ckpt-*.pt"), key=lambda p: int(p.split("-")[-1][:-3]))
    if directory and saved:
        state = torch.load(saved[-1])
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, step = state["epoch"], state["step"]
    for epoch in range(start_epoch, 10):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}")
        if rank == 0 and directory:
            os.makedirs(directory, exist_ok=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                     "epoch": epoch + 1, "step": step}
            torch.save(state, f"{directory}/ckpt-{step}.pt.tmp")
            os.replace(f"{directory}/ckpt-{step}.pt.tmp", f"{directory}/ckpt-{step}.pt")
            for old in sorted(glob.glob(f"{directory}/ckpt-*.pt"),
                              key=lambda p: int(p.split("-")[-1][:-3]))[:-3]:
                os.remove(old)
        dist.barrier()
    if rank == 0:
        print(f"custom: done at step {step}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
