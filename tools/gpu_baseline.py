#!/usr/bin/env python3
"""PyTorch baselines for the GPU check (tools/gpu-check.sh), and its summary.

  gpu_baseline.py gemm --json FILE     torch.matmul GFLOP/s for bench_gemm's CUDA shapes
  gpu_baseline.py summary --lockstep A --torch B   one table: lockstep, cuBLAS, PyTorch
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
    print(f"\n{'model':<10} {'batch':>6} {'prec':>5} {'lockstep samp/s':>16} {'torch samp/s':>13} {'ratio':>7}"
          f" {'peak MiB':>9} {'torch MiB':>9}")
    for r in rows:
        torch_sps = r.get("torch_samples_per_s") or 0
        print(f"{r['model']:<10} {r['batch']:>6} {r['precision']:>5} {r['samples_per_s']:16.0f} {torch_sps:13.0f}"
              f" {r.get('ratio') or 0:7.3f} {r['peak_bytes'] / 2**20:9.0f} {(r.get('torch_peak_bytes') or 0) / 2**20:9.0f}")


def compare_training(gpu_path, cpu_path):
    gpu = {r["step"]: r["loss"] for r in read_lines(gpu_path) if "loss" in r}
    cpu = {r["step"]: r["loss"] for r in read_lines(cpu_path) if "loss" in r}
    common = sorted(set(gpu) & set(cpu))
    if not common:
        print("\ntraining comparison: no common steps")
        return
    worst = max(abs(gpu[s] - cpu[s]) / max(1e-6, abs(cpu[s])) for s in common)
    print(f"\ntraining cuda vs cpu: {len(common)} steps, final loss {gpu[common[-1]]:.4f} vs {cpu[common[-1]]:.4f},"
          f" largest relative difference {worst:.2e}")


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
    summ.add_argument("--steps", default="")
    summ.add_argument("--train", nargs=2, default=None)
    args = parser.parse_args()
    if args.command == "gemm":
        measure_gemm(args.json)
    else:
        summary(args.lockstep, args.torch)
        summary_steps(args.steps)
        if args.train:
            compare_training(*args.train)


if __name__ == "__main__":
    main()
