#!/usr/bin/env bash
# What a rank holds between steps at each ZeRO stage, as bench_scaling's
# comparison measures it from the memory counters (Note [zero comparison]),
# against the ZeRO paper's arithmetic for lockstep's f32 AdamW (P parameters,
# N ranks; bytes): parameters 4P (ZeRO-3: 4P/N), gradients 4P (ZeRO-2 and 3:
# 4P/N), optimizer state 8P (ZeRO-1 to 3: 8P/N); plain data parallelism 16P.
# Shards are whole 64-element chunks, so a figure may exceed its share by at
# most a chunk per bucket: 1% here. Bytes, not times: nothing here is timed.
# Usage: zero_memory.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "zero_memory.sh: $*" >&2; exit 1; }

for ranks in 2 3; do
  for zero in 1 2 3; do
    json=$work/z$zero-n$ranks.json
    mpirun -np "$ranks" --oversubscribe "$build/bench/bench_scaling" --model gpt-tiny --batch 2 \
      --optimizer adamw --zero "$zero" --steps 1 --trials 1 --json "$json" >"$work/out" 2>&1 ||
      { cat "$work/out" >&2; fail "bench_scaling --zero $zero on $ranks ranks"; }
    python3 - "$json" "$zero" "$ranks" <<'PY' || fail "--zero $zero on $ranks ranks: see above"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
row = next(r for r in rows if r["bench"] == "scaling_zero")
zero, n = int(sys.argv[2]), int(sys.argv[3])
p = row["params"]
expected = {
    "parameter_bytes": 4 * p / (n if zero >= 3 else 1),
    "gradient_bytes": 4 * p / (n if zero >= 2 else 1),
    "optimizer_state_bytes": 8 * p / n,
    "plain_model_state_bytes": 16 * p,
}
bad = [f"{k} {row[k]} against {v:.0f}" for k, v in expected.items() if not v <= row[k] <= 1.01 * v]
if zero == 3 and not 0 < row["gathered_bytes"] < 4 * p:
    bad.append(f"gathered_bytes {row['gathered_bytes']}: not within (0, {4 * p}) for ZeRO-3")
if zero < 3 and row["gathered_bytes"] != 0:
    bad.append(f"gathered_bytes {row['gathered_bytes']} at ZeRO-{zero}")
if row["model_state_bytes"] != row["parameter_bytes"] + row["gradient_bytes"] + row["optimizer_state_bytes"]:
    bad.append("model_state_bytes is not the sum of its parts")
if bad:
    sys.exit(f"ZeRO-{zero}, {n} ranks, P = {p}: " + "; ".join(bad))
print(f"ZeRO-{zero}, {n} ranks: model state {row['model_state_ratio']:.3f} of plain data parallelism")
PY
  done
done
echo "zero_memory.sh: passed"
