"""bench_loader_torchvision.py SRC WORKERS BATCH SIZE EPOCHS: images/s of torchvision's
ImageFolder and DataLoader (PIL decode, RandomResizedCrop(SIZE), RandomHorizontalFlip, ToTensor,
Normalize with ImageNet's mean and std) with WORKERS worker processes over the JPEG tree SRC,
shuffled; prints the median of EPOCHS epochs after one warm-up epoch as "images_per_s X".
bench_loader runs it under a torch venv (--torch-python); never part of CI."""
import statistics
import sys
import time

import torch
from torchvision import datasets, transforms

src, workers, batch, size, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
transform = transforms.Compose([
    transforms.RandomResizedCrop(size),
    transforms.RandomHorizontalFlip(),
    transforms.ToTensor(),
    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
])
data = datasets.ImageFolder(src, transform=transform)
loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers,
                                     persistent_workers=True, drop_last=True)
rates = []
for epoch in range(epochs + 1):
    start = time.perf_counter()
    images = 0
    for x, _ in loader:
        images += x.shape[0]
    if epoch > 0:
        rates.append(images / (time.perf_counter() - start))
print(f"images_per_s {statistics.median(rates):.1f}")
