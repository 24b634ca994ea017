#!/usr/bin/env python3
"""PyTorch baselines for the GPU check (tools/gpu-check.sh), and its summary.

  gpu_baseline.py gemm --json FILE     torch.matmul GFLOP/s for bench_gemm's CUDA shapes
  gpu_baseline.py summary --lockstep A --torch B   one table: lockstep, cuBLAS, PyTorch
  gpu_baseline.py steps FILE           bench_step's JSON lines as one table against PyTorch
  gpu_baseline.py runs LABEL A B       two training runs' losses step by step: the largest
                                       relative difference (run A against run B)
  gpu_baseline.py same LABEL A B       two runs' losses and gradient norms bit for bit; exits 1
                                       at the first step that differs
"""
import argparse
import json
import statistics


def gemm_shapes():
    # Keep in step with bench/bench_gemm.cpp's CUDA defaults.
    shapes = [("square", s, s, s, False, False) for s in (1024, 2048, 4096, 8192)]
    batch, fan_in, fan_out = 8192, 4096, 4096
    shapes += [("mlp-fwd", batch, fan_out, fan_in, False, True),
               ("mlp-dgrad", batch, fan_in, fan_out, False, False),
               ("mlp-wgrad", fan_out, fan_in, batch, True, False)]
    return shapes


def measure_gemm(path):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # lockstep's f32 GEMM is true f32
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    with open(path, "w") as out:
        for name, dtype in dtypes.items():
            for kind, m, n, k, ta, tb in gemm_shapes():
                a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=dtype)
                b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=dtype)
                op_a, op_b = (a.t() if ta else a), (b.t() if tb else b)
                c = torch.empty((m, n), device="cuda", dtype=dtype)
                torch.matmul(op_a, op_b, out=c)
                torch.cuda.synchronize()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                calls, times = 1, []
                while True:  # calibrate a batch of about 0.1 s
                    start.record()
                    for _ in range(calls):
                        torch.matmul(op_a, op_b, out=c)
                    stop.record()
                    stop.synchronize()
                    if start.elapsed_time(stop) > 100 or calls > 1 << 16:
                        break
                    calls *= 2
                for _ in range(5):
                    start.record()
                    for _ in range(calls):
                        torch.matmul(op_a, op_b, out=c)
                    stop.record()
                    stop.synchronize()
                    times.append(start.elapsed_time(stop) / 1e3 / calls)
                gflops = 2.0 * m * n * k / statistics.median(times) / 1e9
                print(f"{kind:<10} {m:>6} {n:>6} {k:>6} {name:>5} {gflops:10.1f} GF/s")
                out.write(json.dumps({"bench": "gemm", "shape": kind, "m": m, "n": n, "k": k,
                                      "dtype": name, "device": "cuda:0",
                                      "torch_gflops": gflops}) + "\n")


def read_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def summary_steps(path):
    rows = read_lines(path)
    if not rows:
        return
    print(f"\n{'model':<10} {'batch':>6} {'prec':>5} {'kernels':>8} {'baseline':>15} {'lockstep samp/s':>16}"
          f" {'torch samp/s':>13} {'ratio':>7} {'peak MiB':>9} {'torch MiB':>9}")
    for r in rows:
        torch_sps = r.get("torch_samples_per_s") or 0
        kernels = "fused" if r.get("fused_kernels", True) else "unfused"
        baseline = ("compile" if r.get("torch_compile") else "eager") + \
            (" NHWC" if r.get("torch_channels_last") else "")
        print(f"{r['model']:<10} {r['batch']:>6} {r['precision']:>5} {kernels:>8} {baseline:>15}"
              f" {r['samples_per_s']:16.0f} {torch_sps:13.0f} {r.get('ratio') or 0:7.3f}"
              f" {r['peak_bytes'] / 2**20:9.0f} {(r.get('torch_peak_bytes') or 0) / 2**20:9.0f}")


def step_records(path, field):
    return {r["step"]: r[field] for r in read_lines(path) if field in r and "step" in r}


def compare_training(label, path_a, path_b):
    a, b = step_records(path_a, "loss"), step_records(path_b, "loss")
    common = sorted(set(a) & set(b))
    if not common:
        print(f"{label}: no common steps")
        return
    worst = max(abs(a[s] - b[s]) / max(1e-6, abs(b[s])) for s in common)
    print(f"{label}: {len(common)} steps, final loss {a[common[-1]]:.4f} vs {b[common[-1]]:.4f},"
          f" largest relative difference {worst:.2e}")


def same_bits(label, path_a, path_b):
    differ = []
    for field in ("loss", "grad_norm"):
        a, b = step_records(path_a, field), step_records(path_b, field)
        if not a or set(a) != set(b):
            print(f"{label}: the runs' {field} steps differ ({len(a)} against {len(b)})")
            return 1
        differ += [(s, field, a[s], b[s]) for s in sorted(a) if a[s] != b[s]]
    if differ:
        s, field, x, y = differ[0]
        print(f"{label}: {len(differ)} values differ, first at step {s}: {field} {x!r} against {y!r}")
        return 1
    print(f"{label}: the same bits ({len(step_records(path_a, 'loss'))} steps of loss and gradient norm)")
    return 0


def summary(lockstep_path, torch_path):
    torch_by_key = {(r["shape"], r["m"], r["n"], r["k"], r["dtype"]): r["torch_gflops"]
                    for r in read_lines(torch_path)}
    print(f"{'shape':<10} {'m':>6} {'n':>6} {'k':>6} {'dtype':>5} {'lockstep':>10} {'cuBLAS':>10}"
          f" {'torch':>10} {'vs cuBLAS':>10} {'vs torch':>9}")
    for r in read_lines(lockstep_path):
        key = (r["shape"], r["m"], r["n"], r["k"], r["dtype"])
        torch_gf = torch_by_key.get(key)
        vs_torch = f"{r['lockstep_gflops'] / torch_gf:9.3f}" if torch_gf else f"{'-':>9}"
        raw = r.get("raw_gflops")
        print(f"{r['shape']:<10} {r['m']:>6} {r['n']:>6} {r['k']:>6} {r['dtype']:>5}"
              f" {r['lockstep_gflops']:10.1f} {raw or 0:10.1f} {torch_gf or 0:10.1f}"
              f" {r.get('ratio') or 0:10.3f} {vs_torch}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gemm = sub.add_parser("gemm")
    gemm.add_argument("--json", required=True)
    summ = sub.add_parser("summary")
    summ.add_argument("--lockstep", required=True)
    summ.add_argument("--torch", required=True)
    steps = sub.add_parser("steps")
    steps.add_argument("json")
    for name in ("runs", "same"):
        pair = sub.add_parser(name)
        pair.add_argument("label")
        pair.add_argument("a")
        pair.add_argument("b")
    args = parser.parse_args()
    if args.command == "gemm":
        measure_gemm(args.json)
    elif args.command == "summary":
        summary(args.lockstep, args.torch)
    elif args.command == "steps":
        summary_steps(args.json)
    elif args.command == "runs":
        compare_training(args.label, args.a, args.b)
    else:
        raise SystemExit(same_bits(args.label, args.a, args.b))


if __name__ == "__main__":
    main()
