"""photo_jpegs.py OUT COUNT [WIDTH HEIGHT]: COUNT photograph-like JPEGs of WIDTH x HEIGHT (default
500 x 375, ImageNet's typical size) for bench_loader's image mode (docs/benchmarks.md): windows of
the one photograph Debian ships as sample data (matplotlib's grace_hopper.jpg, 512 x 600, from
python-matplotlib-data), each at its own offset and scale (4:3, 384 to 512 pixels wide), some
mirrored, resized with PIL's Lanczos filter and encoded at quality 90 (4:2:0), in an ImageFolder
tree OUT/<i % 10>/<i>.jpg. Needs PIL (Debian's python3-pil)."""
import os
import random
import sys

from PIL import Image

out, count = sys.argv[1], int(sys.argv[2])
width, height = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (500, 375)
photo = Image.open("/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg").convert("RGB")
rng = random.Random(0)
for i in range(count):
    w = rng.randint(384, photo.width)
    h = min(photo.height, w * height // width)
    x, y = rng.randint(0, photo.width - w), rng.randint(0, photo.height - h)
    image = photo.crop((x, y, x + w, y + h)).resize((width, height), Image.LANCZOS)
    if i % 2:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    os.makedirs(f"{out}/{i % 10}", exist_ok=True)
    image.save(f"{out}/{i % 10}/{i:05d}.jpg", quality=90)
