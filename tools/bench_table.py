#!/usr/bin/env python3
"""README's benchmark table, measured rather than typed (docs/benchmarks.md):

  tools/bench_table.py run --build build --out out/bench [--python PY] [--note "..."]
      runs the README's benchmarks on the CPU at 1 thread (bench_gemm, bench_step for mlp,
      cnn and gpt-tiny against the PyTorch under PY, and bench_scaling on 2 ranks under
      mpiexec; a few minutes on 2 cores), keeps their --json output and the date and
      processor in out/bench/, then prints the table;
  tools/bench_table.py table out/bench
      prints the markdown table again from what `run` kept.

Each row names its command, lockstep's figure, the baseline's (or why there is none) and the
ratio, whose direction the row says.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsonl import InputError, read_jsonl  # noqa: E402  (tools/jsonl.py)

# (file kept in --out, command line after the build folder's bench/)
RUNS = [
    ("gemm.jsonl", ["bench_gemm", "--device", "cpu", "--threads", "1", "--sizes", "1024",
                    "--dtype", "f32"]),
    ("step.jsonl", ["bench_step", "--model", "mlp", "--batch", "128", "--threads", "1",
                    "--device", "cpu"]),
    ("step_cnn.jsonl", ["bench_step", "--model", "cnn", "--batch", "64", "--threads", "1",
                        "--device", "cpu"]),
    ("step_gpt.jsonl", ["bench_step", "--model", "gpt-tiny", "--batch", "16", "--threads", "1",
                        "--device", "cpu"]),
    ("scaling_mlp.jsonl", ["mpiexec", "-n", "2", "--bind-to", "none", "bench_scaling", "--model",
                           "mlp", "--batch", "128", "--mode", "weak", "--device", "cpu"]),
    ("scaling_cnn.jsonl", ["mpiexec", "-n", "2", "--bind-to", "none", "bench_scaling", "--model",
                           "cnn", "--batch", "64", "--mode", "weak", "--device", "cpu"]),
]
MACHINE = "machine.json"


def command_text(args):
    return " ".join(args)


def processor_description(cpuinfo_lines):
    """'AMD EPYC (family 23, model 1; AVX2)' from /proc/cpuinfo's first processor: a VM's
    model name alone ('Intel(R) Xeon(R) Processor') does not say which processor it is."""
    info = {}
    for line in cpuinfo_lines:
        if not line.strip():
            break  # the first processor's block
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    name = info.get("model name", platform.processor() or platform.machine())
    flags = info.get("flags", "").split()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    details = [f"family {info['cpu family']}, model {info['model']}"] if "cpu family" in info \
        and "model" in info else []
    if vector:
        details.append(vector)
    return f"{name} ({'; '.join(details)})" if details else name


def machine_description():
    try:
        with open("/proc/cpuinfo") as f:
            cpu = processor_description(f.readlines())
    except OSError:
        cpu = processor_description([])
    return {"date": datetime.date.today().isoformat(), "host": platform.node(), "cpu": cpu,
            "cores": os.cpu_count()}


def run(build, out, note, python):
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    if os.geteuid() == 0:  # OpenMPI refuses root unless told it is on purpose
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for name, args in RUNS:
        argv = [os.path.join(build, "bench", a) if a.startswith("bench_") else a for a in args]
        if args[0] == "bench_step":
            argv += ["--python", python]
        path = os.path.join(out, name)
        print(f"bench_table.py: {command_text(args)}", file=sys.stderr)
        subprocess.run(argv + ["--json", path], check=True, env=env, stdout=sys.stderr)
    meta = machine_description()
    meta["note"] = note
    with open(os.path.join(out, MACHINE), "w") as f:
        json.dump(meta, f)


def records(out, name, bench):
    path = os.path.join(out, name)
    rows = [r for _, r in read_jsonl(path) if r.get("bench") == bench]
    if not rows:
        raise InputError(f"{path}: no '{bench}' record (run: tools/bench_table.py run)")
    return rows


def fmt_ratio(value, digits=3):
    return "—" if value is None else f"{value:.{digits}f}"


def table(out):
    """The markdown table (a list of lines) from the files `run` kept in `out`."""
    try:
        with open(os.path.join(out, MACHINE)) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{os.path.join(out, MACHINE)}: {e} (run: tools/bench_table.py run)")
    cmd = {name: command_text(args) for name, args in RUNS}
    lines = []
    shared = f", {meta['note']}" if meta.get("note") else ""
    lines.append(f"Measured {meta['date']} on {meta['host']} ({meta['cpu']}, {meta['cores']} "
                 f"cores{shared}), 1 thread per rank, by `tools/bench_table.py run`. Ratios are "
                 "lockstep / baseline (higher is better) unless the row says otherwise.")
    lines.append("")
    lines.append("| benchmark | command | lockstep | baseline | ratio |")
    lines.append("|---|---|---|---|---|")
    for r in records(out, "gemm.jsonl", "gemm"):
        if r.get("dtype") != "f32" or r.get("shape") not in ("square", "mlp-fwd"):
            continue
        what = ("GEMM f32 {m}×{n}×{k}" if r["shape"] == "square"
                else "GEMM f32 Linear forward {m}×{n}×{k}").format(**r)
        base = "—" if r.get("raw_gflops") is None else f"{r.get('baseline') or 'OpenBLAS'} {r['raw_gflops']:.1f} GF/s"
        lines.append(f"| {what} | `{cmd['gemm.jsonl']}` | {r['lockstep_gflops']:.1f} GF/s | "
                     f"{base} | {fmt_ratio(r.get('ratio'))} |")
    step_files = [name for name, args in RUNS if args[0] == "bench_step"]
    for name in step_files:
        for r in records(out, name, "step"):
            lines += step_rows(r, cmd[name])
    for name in ("scaling_mlp.jsonl", "scaling_cnn.jsonl"):
        for r in records(out, name, "scaling"):
            lines.append(f"| weak scaling, {r['model']} batch {r['batch_per_rank']}, "
                         f"{r['ranks']} ranks | `{cmd[name]}` | {r['synced_ms']:.2f} ms/step | "
                         f"one rank alone, same run: {r['solo_ms']:.2f} ms | "
                         f"{fmt_ratio(r.get('efficiency'), 2)} (efficiency) |")
    return same_commands(lines)


def step_rows(r, command):
    """bench_step's rows: the step against PyTorch (its version, and the block-by-block
    spread of the ratio), and where bench_step measured it (mlp, the GPTs) the step over
    its GEMMs alone, with PyTorch's step over the same GEMMs."""
    if r.get("torch_samples_per_s") is None:
        base = f"none: {r.get('no_baseline') or 'PyTorch did not run'}"
    else:
        first = (r.get("baselines") or [{}])[0]
        version = first.get("torch_version")
        base = (f"PyTorch{' ' + version if version else ''} {r['torch_samples_per_s']:,.0f} "
                "samples/s")
    ratio = fmt_ratio(r.get("ratio"))
    if r.get("ratio_low") is not None and r.get("ratio_high") is not None:
        ratio += f" ({r['ratio_low']:.3f}–{r['ratio_high']:.3f} block by block)"
    rows = [f"| {r['model']} training step, batch {r['batch']} | `{command}` | "
            f"{r['samples_per_s']:,.0f} samples/s | {base} | {ratio} |"]
    if r.get("gemm_ms") is not None:
        library = r.get("cpu_gemm") or "the CPU GEMM library's"
        ceiling = ""
        if r.get("torch_over_gemm") is not None:
            ceiling = (f"; PyTorch's step / these GEMMs {r['torch_over_gemm']:.3f}, "
                       "the highest ratio they allow")
        rows.append(f"| {r['model']} step over its GEMMs alone | `{command}` | "
                    f"{r['ms_per_step']:.2f} ms | GEMMs alone ({library}) {r['gemm_ms']:.2f} ms | "
                    f"{fmt_ratio(r.get('step_over_gemm'))} (step / GEMMs, lower is better"
                    f"{ceiling}) |")
    return rows


def same_commands(lines):
    """A row whose command is the previous row's says "same", as a person would write it."""
    out, previous = [], None
    for line in lines:
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) == 5 and cells[1].startswith("`"):
            if cells[1] == previous:
                cells[1] = "same"
                line = " | ".join(cells)
            else:
                previous = cells[1]
        out.append(line)
    return out


def main(argv):
    ap = argparse.ArgumentParser(description="Run README's benchmarks and print their table.")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the benchmarks, keep their output, print the table")
    r.add_argument("--build", default="build", help="the build folder (with bench/)")
    r.add_argument("--out", required=True, help="where the JSON lines and machine.json go")
    r.add_argument("--note", default="", help="said after the machine, e.g. 'shared with "
                   "other builds'")
    r.add_argument("--python", default="/usr/bin/python3",
                   help="the Python with torch for bench_step's baseline (docs/benchmarks.md: "
                   "PyTorch from PyPI in a virtual environment)")
    t = sub.add_parser("table", help="print the table from a `run` output folder")
    t.add_argument("out")
    args = ap.parse_args(argv)
    try:
        if args.command == "run":
            run(args.build, args.out, args.note, args.python)
        print("\n".join(table(args.out)))
    except InputError as e:
        sys.exit(f"bench_table.py: {e}")
    except subprocess.CalledProcessError as e:
        sys.exit(f"bench_table.py: {command_text(e.cmd)} exited {e.returncode}")


if __name__ == "__main__":
    main(sys.argv[1:])
