#!/usr/bin/env python3
"""Plots lockstep's JSON lines into PNGs (Debian's python3-matplotlib).

  plot.py metrics METRICS.jsonl -o curves.png   lockstep-train --metrics: training and val
                                                 loss, and val accuracy (a language model's
                                                 bits per token), all against the step;
                                                 titled with model, ranks, batch, precision
  plot.py bench FILE.jsonl... -o bench.png      bench/* --json: one panel per kind of record
                                                 (gemm, step, loader, allreduce,
                                                 scaling, scaling_profile, scaling_link)
  plot.py trace DIR --steps 3:5 -o gantt.png    --trace DIR: those steps as a Gantt chart,
                                                 one lane per rank and thread, clocks
                                                 aligned as tools/trace.py merge aligns them

One script so that both outputs share the input checks and the matplotlib setup.
"""
import argparse
import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display on build machines
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from matplotlib.ticker import MaxNLocator  # noqa: E402

from jsonl import InputError, metrics_kind, number, read_jsonl  # noqa: E402  (tools/jsonl.py)
import trace as trace_tool  # noqa: E402  (tools/trace.py, not the standard library's)


def field(where, row, key, numeric=True, optional=False):
    value = row.get(key)
    if value is None and optional:
        return None
    if numeric:
        number(where, row, key)  # a missing or non-numeric value is an InputError
    elif value is None:
        raise InputError(f"{where}: '{row.get('bench', 'metrics')}' record lacks '{key}'")
    return value


# ---------------------------------------------------------------------------------------
# metrics


def plot_title(runs):
    """The plot's title from the run's start record (Note [run records] in engine/run_report.h):
    model, ranks, global batch and precision; None when the file has no start record."""
    starts = [r for _, r in runs if r.get("run") == "start"]
    if not starts:
        return None
    first = starts[-1]  # a resumed run appends a start record: the latest describes the curves' end
    return (f"{first.get('model', '?')}: {first.get('ranks', '?')} rank(s), global batch "
            f"{first.get('global_batch', '?')}, {first.get('precision', '?')}")


def read_metrics(path):
    """(steps, losses, evals, runs) of a --metrics file. Each evaluation is one dict (step, epoch,
    val_loss, and val_accuracy and val_bits_per_token where recorded), in step order, one per
    step: a later record of a step replaces an earlier one (files written before 0.2.0 recorded
    an evaluation at the end of an epoch twice; a resume may evaluate a step again)."""
    steps, losses, by_step, runs = [], [], {}, []
    for where, row in read_jsonl(path):
        kind = metrics_kind(where, row)
        if kind == "run":
            runs.append((where, row))
        elif kind == "val":
            e = {k: field(where, row, k) for k in ("step", "epoch", "val_loss")}
            for k in ("val_accuracy", "val_bits_per_token"):
                e[k] = field(where, row, k, optional=True)
            by_step[e["step"]] = e
        else:
            steps.append(field(where, row, "step"))
            losses.append(field(where, row, "loss"))
    return steps, losses, [by_step[s] for s in sorted(by_step)], runs


def language_model(evals, runs):
    """Whether the run is a language model's: its evaluations give bits per token, or its start
    record tokens per sample (Note [run records])."""
    return (any(e["val_bits_per_token"] is not None for e in evals)
            or any(r.get("tokens_per_sample") for _, r in runs if r.get("run") == "start"))


def plot_metrics(path, png):
    """Draws the curves into `png` and returns the figure. Both panels are against the step, as
    evaluations come every --val-every steps as well as at each epoch's end: the training and val
    loss on the left; on the right a language model's val loss and bits per token (a loss axis),
    a classifier's val accuracy, or a loss without accuracy (regression) its val loss."""
    steps, losses, evals, runs = read_metrics(path)
    lm = language_model(evals, runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    left.plot(steps, losses, linewidth=0.8, label="training loss (global batch)")
    at = [e["step"] for e in evals]
    has_accuracy = evals and all(e["val_accuracy"] is not None for e in evals)
    if evals:
        left.plot(at, [e["val_loss"] for e in evals], "o-", label="val loss")
    if lm:
        right.plot(at, [e["val_loss"] for e in evals], "o-", label="val loss (nats per token)")
        if any(e["val_bits_per_token"] is not None for e in evals):
            right.plot(at, [e["val_bits_per_token"] for e in evals], "s--",
                       label="val bits per token (per byte for byte tokens)")
        right.set_ylabel("val loss (nats) and bits per token")
        right.legend()
    elif has_accuracy:
        right.plot(at, [100 * e["val_accuracy"] for e in evals], "o-")
        right.set_ylabel("val accuracy (%)")
    else:
        right.plot(at, [e["val_loss"] for e in evals], "o-")
        right.set_ylabel("val loss")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps count from 1, whole
    left.set_xlabel("step")
    left.set_ylabel("loss")
    left.legend()
    right.set_xlabel("step")
    title = plot_title(runs)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    if not evals:
        print(f"no evaluation in {path}; curves in {png}")
        return fig
    last = evals[-1]
    when = f"after epoch {last['epoch']} (step {last['step']}); curves in {png}"
    if lm:
        bits = last["val_bits_per_token"]
        print(f"final val loss: {last['val_loss']:.4f}"
              + (f" ({bits:.4f} bits per token)" if bits is not None else "") + f" {when}")
    elif has_accuracy:
        print(f"final val accuracy: {100 * last['val_accuracy']:.2f}% {when}")
    else:
        print(f"final val loss: {last['val_loss']:.4f} {when}")
    return fig


# ---------------------------------------------------------------------------------------
# bench: one function per record kind, each drawing into one axis


def ratio_bars(ax, labels, ratios, title, target=None):
    ax.barh(range(len(labels)), ratios, color="C0")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", linewidth=0.8)
    if target is not None:
        ax.axvline(target, color="C3", linestyle="--", linewidth=0.8, label=f"target {target}")
        ax.legend(fontsize=7)
    ax.set_xlabel("lockstep / baseline (higher is better)")
    ax.set_title(title, fontsize=9)


def tag(source, sources):
    """The file's name in a label, only when several files are plotted."""
    return f" [{os.path.basename(source)}]" if len(sources) > 1 else ""


def panel_gemm(ax, rows, sources):
    labels, ratios = [], []
    for where, src, r in rows:
        ratio = field(where, r, "ratio", optional=True)
        if ratio is None:  # f16/bf16 on the CPU have no baseline
            continue
        labels.append(f"{r.get('shape', '?')} {field(where, r, 'm')}x{field(where, r, 'n')}"
                      f"x{field(where, r, 'k')} {r.get('dtype', '')} {r.get('device', '')}"
                      + tag(src, sources))
        ratios.append(ratio)
    ratio_bars(ax, labels, ratios, "bench_gemm: GEMM vs BLAS (same buffers)", target=0.97)


def panel_step(ax, rows, sources):
    labels, ratios = [], []
    for where, src, r in rows:
        ratio = field(where, r, "ratio", optional=True)
        if ratio is None:
            continue
        labels.append(f"{field(where, r, 'model', numeric=False)} b{field(where, r, 'batch')} "
                      f"{r.get('precision', '')} {r.get('device', '')}" + tag(src, sources))
        ratios.append(ratio)
    ratio_bars(ax, labels, ratios, "bench_step: training step vs PyTorch (samples/s)")


def panel_loader(ax, rows, sources):
    labels, ratios = [], []
    for where, src, r in rows:
        ratio = field(where, r, "ratio", optional=True)
        if ratio is None:
            continue
        labels.append(f"{field(where, r, 'lockstep', numeric=False)} vs "
                      f"{field(where, r, 'baseline', numeric=False)}" + tag(src, sources))
        ratios.append(ratio)
    ratio_bars(ax, labels, ratios, "bench_loader: loader vs baseline (samples/s)")


def panel_allreduce(ax, rows, sources):
    series = {}
    for where, src, r in rows:
        key = (r.get("dtype", "?"), r.get("op", "?"), r.get("device", "?"), src)
        series.setdefault(key, []).append(
            (field(where, r, "size_bytes"), field(where, r, "lockstep_busbw_gbs"),
             field(where, r, "raw_busbw_gbs", optional=True)))
    for i, ((dtype, op, device, src), points) in enumerate(sorted(series.items())):
        points.sort()
        sizes = [p[0] for p in points]
        label = f"{dtype} {op} {device}{tag(src, sources)}"
        ax.plot(sizes, [p[1] for p in points], "o-", color=f"C{i}", markersize=3,
                label=f"lockstep {label}")
        raw = [(s, p[2]) for s, p in zip(sizes, points) if p[2] is not None]
        if raw:
            baseline = "NCCL" if device == "cuda" else "MPI"
            ax.plot([s for s, _ in raw], [b for _, b in raw], "x--", color=f"C{i}",
                    markersize=4, label=f"{baseline} {label}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message bytes")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests busbw)")
    ax.set_title("bench_allreduce: allreduce bus bandwidth", fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(True, alpha=0.3)


def panel_scaling(ax, rows, sources):
    series = {}
    for where, src, r in rows:
        key = (field(where, r, "model", numeric=False), r.get("mode", "weak"),
               r.get("device", "?"), src)
        series.setdefault(key, []).append((field(where, r, "ranks"),
                                           field(where, r, "efficiency")))
    for (model, mode, device, src), points in sorted(series.items()):
        points.sort()
        ax.plot([p[0] for p in points], [100 * p[1] for p in points],
                "o-" if mode == "weak" else "s--",
                label=f"{model} {mode} {device}{tag(src, sources)}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("efficiency (%)")
    ax.set_ylim(0, 105)
    ax.set_title("bench_scaling: scaling efficiency", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def panel_scaling_profile(ax, rows, sources):
    for i, (where, src, r) in enumerate(rows):
        buckets = r.get("buckets")
        if not isinstance(buckets, list) or not buckets:
            raise InputError(f"{where}: scaling_profile record needs a non-empty 'buckets' list")
        ready = [field(f"{where} buckets[{j}]", b, "ready_ms") for j, b in enumerate(buckets)]
        mib = [field(f"{where} buckets[{j}]", b, "bytes") / 2 ** 20 for j, b in enumerate(buckets)]
        backward = field(where, r, "backward_ms")
        # Fraction of backward done when each bucket is ready, against the bytes ready by then.
        cumulative = [sum(mib[:j + 1]) for j in range(len(mib))]
        ax.step([0] + [t / backward for t in ready], [0] + cumulative, where="post",
                color=f"C{i}", label=f"{field(where, r, 'model', numeric=False)} "
                f"{r.get('device', '')}{tag(src, sources)}")
    ax.set_xlabel("bucket ready time / backward time")
    ax.set_ylabel("gradient MiB ready")
    ax.set_title("bench_scaling: bucket readiness during backward", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def panel_scaling_link(ax, rows, sources):
    for i, (where, src, r) in enumerate(rows):
        sizes, times = r.get("sizes_bytes"), r.get("allreduce_ms")
        if not (isinstance(sizes, list) and isinstance(times, list) and len(sizes) == len(times)
                and sizes):
            raise InputError(f"{where}: scaling_link needs 'sizes_bytes' and 'allreduce_ms' "
                             "lists of the same length")
        alpha, bus, ranks = (field(where, r, k) for k in ("alpha_us", "bus_bandwidth_gbps",
                                                          "ranks"))
        if bus <= 0 or ranks < 2:
            raise InputError(f"{where}: scaling_link needs bus_bandwidth_gbps > 0 and ranks >= 2, "
                             f"got {bus:g} and {ranks:g} (rerun bench_scaling on 2 or more ranks)")
        ax.plot(sizes, times, "o", color=f"C{i}", markersize=3,
                label=f"measured, {ranks} ranks{tag(src, sources)}")
        factor = 2.0 * (ranks - 1) / ranks
        fit = [alpha * 1e-3 + factor * n / (bus * 1e6) for n in sizes]
        ax.plot(sizes, fit, "-", color=f"C{i}",
                label=f"fit: {alpha:g} us + {factor:g} n / {bus:g} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message bytes")
    ax.set_ylabel("allreduce ms")
    ax.set_title("bench_scaling: alpha-beta fit of the allreduce", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


PANELS = {
    "gemm": panel_gemm, "step": panel_step, "loader": panel_loader,
    "allreduce": panel_allreduce,
    "scaling": panel_scaling, "scaling_profile": panel_scaling_profile,
    "scaling_link": panel_scaling_link,
}


def plot_bench(paths, png):
    by_kind, unknown = {}, {}
    for path in paths:
        for where, row in read_jsonl(path):
            kind = row.get("bench")
            if kind is None:
                raise InputError(f"{where}: no 'bench' field; is this a bench --json file? "
                                 "(use 'plot.py metrics' for lockstep-train --metrics)")
            if kind in PANELS:
                by_kind.setdefault(kind, []).append((where, path, row))
            else:
                unknown[kind] = unknown.get(kind, 0) + 1
    for kind, count in sorted(unknown.items()):
        print(f"plot.py: skipping {count} '{kind}' record(s): no plot for that kind",
              file=sys.stderr)
    if not by_kind:
        raise InputError(f"no record of a known kind ({', '.join(PANELS)}) in {', '.join(paths)}")
    kinds = [k for k in PANELS if k in by_kind]
    cols = 1 if len(kinds) == 1 else 2
    rows = math.ceil(len(kinds) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.2 * rows), squeeze=False)
    for ax, kind in zip(axes.flat, kinds):
        PANELS[kind](ax, by_kind[kind], paths)
    for ax in list(axes.flat)[len(kinds):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    counts = ", ".join(f"{len(by_kind[k])} {k}" for k in kinds)
    print(f"{counts} record(s) plotted in {png}")


# ---------------------------------------------------------------------------------------
# trace: a Gantt chart of a few steps


# Colours by the trace's categories (engine/trainer.cpp, docs/tracing.md); others are grey.
CATEGORY_COLOURS = {"step": "#dddddd", "data": "#ff9f1c", "compute": "#3a86ff",
                    "module": "#8ecae6", "comm": "#e63946", "optimizer": "#2a9d8f",
                    "eval": "#9b5de5", "checkpoint": "#6d4c41"}


def parse_steps(text):
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise InputError(f"--steps '{text}' is not FIRST:LAST with 1 <= FIRST <= LAST (e.g. 3:5)")
    return int(m[1]), int(m[2])


def depths(spans):
    """Each span's nesting depth among `spans` (one thread's, sorted by start)."""
    open_ends, out = [], []
    for e in spans:
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        out.append(len(open_ends))
        open_ends.append(e["ts"] + e["dur"])
    return out


def trace_lanes(directory, first, last):
    """[(label, spans, instants)] of steps first..last, rank by rank, threads in tid order, with
    each event's ts on rank 0's clock (tools/trace.py's offsets)."""
    traces, offsets = trace_tool.load_dir(directory)
    lanes = []  # (label, spans, instants), rank by rank, threads in tid order
    for rank, t in traces.items():
        names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "thread_name"
                 and isinstance(e.get("args"), dict) and "name" in e["args"]}
        chosen = {}
        for e in t["traceEvents"]:
            step = trace_tool.step_of(e)
            if e["ph"] in ("X", "i") and isinstance(step, int) and first <= step <= last:
                chosen.setdefault(e["tid"], []).append(dict(e, ts=e["ts"] - offsets[rank]))
        for tid in sorted(chosen):
            events = sorted(chosen[tid], key=lambda e: (e["ts"], -e.get("dur", 0)))
            lanes.append((f"rank {rank} {names.get(tid, f'thread {tid}')}",
                          [e for e in events if e["ph"] == "X"],
                          [e for e in events if e["ph"] == "i"]))
    if not any(spans for _, spans, _ in lanes):
        raise InputError(f"{directory}: no span of steps {first}..{last} in the traces "
                         "(was --trace-steps narrower?)")
    return lanes


def plot_trace(directory, steps, png):
    first, last = parse_steps(steps)
    lanes = trace_lanes(directory, first, last)
    origin = min(e["ts"] for _, spans, _ in lanes for e in spans)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(lanes)))
    used = set()
    for row, (_, spans, instants) in enumerate(lanes):
        y = len(lanes) - 1 - row
        for e, depth in zip(spans, depths(spans)):
            height = max(0.25, 0.8 - 0.2 * depth)  # nested spans drawn thinner, on top
            colour = CATEGORY_COLOURS.get(e.get("cat"), "#999999")
            used.add(e.get("cat") if e.get("cat") in CATEGORY_COLOURS else "other")
            step = e.get("cat") == "step"  # outlined, so that steps are told apart
            ax.barh(y, e["dur"] / 1e3, left=(e["ts"] - origin) / 1e3, height=height,
                    color=colour, edgecolor="#555555" if step else "none",
                    linewidth=0.8 if step else 0, zorder=2 + depth)
        if instants:
            ax.plot([(e["ts"] - origin) / 1e3 for e in instants], [y + 0.42] * len(instants),
                    "v", color="black", markersize=3, zorder=10)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for label, _, _ in reversed(lanes)])
    ax.set_xlabel(f"ms from the start of step {first} (clocks aligned across ranks)")
    ax.set_title(f"{directory}: steps {first}..{last}" if first < last
                 else f"{directory}: step {first}")
    handles = [matplotlib.patches.Patch(color=CATEGORY_COLOURS.get(c, "#999999"), label=c)
               for c in list(CATEGORY_COLOURS) + ["other"] if c in used]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
              frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"{len(lanes)} lanes, steps {first}..{last}, in {png}")


def main(argv):
    ap = argparse.ArgumentParser(description="Plot lockstep's metrics and benchmark JSON lines.")
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("metrics", help="lockstep-train --metrics file: loss and accuracy curves")
    m.add_argument("file")
    m.add_argument("-o", "--output", required=True, metavar="PNG")
    b = sub.add_parser("bench", help="bench/* --json files: one panel per kind of record")
    b.add_argument("files", nargs="+")
    b.add_argument("-o", "--output", required=True, metavar="PNG")
    t = sub.add_parser("trace", help="--trace DIR: a few steps as a per-rank Gantt chart")
    t.add_argument("dir", help="the directory holding rank-<r>.json")
    t.add_argument("--steps", required=True, metavar="FIRST:LAST",
                   help="the steps to draw (a few: each is a slice of the chart)")
    t.add_argument("-o", "--output", required=True, metavar="PNG")
    args = ap.parse_args(argv)
    try:
        if args.command == "metrics":
            plot_metrics(args.file, args.output)
        elif args.command == "trace":
            plot_trace(args.dir, args.steps, args.output)
        else:
            plot_bench(args.files, args.output)
    except InputError as e:
        sys.exit(f"plot.py: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
