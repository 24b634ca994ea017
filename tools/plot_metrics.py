#!/usr/bin/env python3
"""Plots a lockstep-train --metrics file: training loss per step and
evaluation loss and accuracy per epoch, into one PNG; prints the final accuracy.

usage: plot_metrics.py METRICS.jsonl OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(metrics_path, png_path):
    steps, losses, evals = [], [], []
    with open(metrics_path) as f:
        for line in f:
            row = json.loads(line)
            if "val_accuracy" in row:
                evals.append(row)
            elif "loss" in row:
                steps.append(row["step"])
                losses.append(row["loss"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(steps, losses, linewidth=0.8, label="training loss (global batch)")
    if evals:
        left.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", label="test loss")
        right.plot([e["epoch"] + 1 for e in evals], [100 * e["val_accuracy"] for e in evals], "o-")
    left.set_xlabel("step")
    left.set_ylabel("loss")
    left.legend()
    right.set_xlabel("epoch")
    right.set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    if evals:
        print(f"final test accuracy: {100 * evals[-1]['val_accuracy']:.2f}% "
              f"after {evals[-1]['step']} steps; curves in {png_path}")
    else:
        print(f"no evaluation in {metrics_path}; curves in {png_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
