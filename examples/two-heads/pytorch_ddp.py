# The program of main.cpp in PyTorch DDP, for the line counts in
# docs/custom-training.md: the same data, two-head model, cross-entropy plus
# MSE under bf16 autocast, AdamW, cosine schedule, clipping and held-out
# check. Run: torchrun --nproc-per-node 2 pytorch_ddp.py
import sys
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.ReLU())
        self.classes, self.value = torch.nn.Linear(64, 4), torch.nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.classes(h), self.value(h)


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
    label = (x[:, 0] > 0) + 2 * (x[:, 1] > 0)
    value = (np.sin(3 * x[:, :1]) + x[:, 1:] ** 2).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(label).long(), torch.from_numpy(value))


def main():
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    train, held_out = make_data(4096, 7), make_data(1024, 8)
    sampler = DistributedSampler(train, seed=1, drop_last=True)
    loader = DataLoader(train, batch_size=32, sampler=sampler, drop_last=True)
    torch.manual_seed(1)
    model = DDP(TwoHeads())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    epochs = 12
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * len(loader))
    ce, mse = torch.nn.CrossEntropyLoss(), torch.nn.MSELoss()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, label, value in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, predicted = model(x)
            loss = ce(logits.float(), label) + mse(predicted.float(), value)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        x, label, value = (t[rank::size] for t in held_out.tensors)
        logits, predicted = model(x)
        loss = ce(logits.float(), label) + mse(predicted.float(), value)
        totals = torch.tensor([loss.item() * len(x), (logits.argmax(1) == label).sum().item(), len(x)])
    dist.all_reduce(totals)
    loss, accuracy = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()
    if rank == 0:
        print(f"two-heads: held-out loss {loss:.4f} (cross-entropy + mse), accuracy {accuracy:.3f}")
    dist.destroy_process_group()
    return 0 if loss < 0.15 and accuracy > 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
