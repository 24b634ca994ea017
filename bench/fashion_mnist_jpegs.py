"""fashion_mnist_jpegs.py OUT COUNT [SIZE]: the first COUNT images of Debian's Fashion-MNIST
test set (dataset-fashion-mnist) upscaled bilinearly to SIZE x SIZE (default 224), made RGB and
encoded as JPEG (quality 90) in an ImageFolder tree OUT/<label>/<index>.jpg, for bench_loader's
image mode (docs/benchmarks.md). Needs PIL (Debian's python3-pil)."""
import gzip
import os
import sys

from PIL import Image

out, count = sys.argv[1], int(sys.argv[2])
size = int(sys.argv[3]) if len(sys.argv) > 3 else 224
src = "/usr/share/datasets/fashion-mnist"
with gzip.open(f"{src}/t10k-images-idx3-ubyte.gz") as f:
    pixels = f.read()[16:]
with gzip.open(f"{src}/t10k-labels-idx1-ubyte.gz") as f:
    labels = f.read()[8:]
for i in range(count):
    image = Image.frombytes("L", (28, 28), pixels[i * 784:(i + 1) * 784])
    image = image.resize((size, size), Image.BILINEAR).convert("RGB")
    os.makedirs(f"{out}/{labels[i]}", exist_ok=True)
    image.save(f"{out}/{labels[i]}/{i:05d}.jpg", quality=90)
