#!/usr/bin/env bash
# Every program's outputs go through one writer (Note [one way to write a
# file] in engine/core/output_file.h) and every JSON record through one
# library (Note [JSON by a library] in engine/core/json.h): a symlink
# planted at an output's name (the metrics, heartbeat, trace, ONNX file,
# benchmark JSON, classes.txt) never writes through to what it points at (a
# checkpoint here); an output that names one of the run's inputs (the
# checkpoint being exported or evaluated, a data shard) is refused with the
# input untouched; and a run whose gradients are not finite, with quotes,
# backslashes and a newline in its paths, writes records that Python's strict
# JSON parser reads. Usage: outputs.sh BUILD_DIR
set -uo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
export_bin=$build/examples/export/lockstep-export
gemm=$build/bench/bench_gemm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $1"
  [ -f "$work/out" ] && cat "$work/out" "$work/err"
  exit 1
}
"$shard" synthetic --out "$work/data" --count 256 --shape 1,28,28 --dtype u8 --classes 10 \
  --seed 1 >/dev/null || fail "synthetic shards"
common=(--data "$work/data" --model mlp --seed 7 --batch-size 16 --device cpu --threads 1)
"$train" "${common[@]}" --steps 2 --checkpoint-dir "$work/ck" >/dev/null 2>&1 ||
  fail "the run that makes a checkpoint"
victim=$work/ck/ckpt-2.h5
sum=$(sha256sum "$victim" | cut -d' ' -f1)
intact() { [ "$(sha256sum "$victim" | cut -d' ' -f1)" = "$sum" ] || fail "$1 changed the checkpoint"; }

# --metrics: a planted link is refused (the file is appended to, so it is
# opened, not renamed over), and so is a data shard.
ln -s "$victim" "$work/metrics-link.jsonl"
rc=0
"$train" "${common[@]}" --steps 1 --metrics "$work/metrics-link.jsonl" >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -ne 0 ] || fail "--metrics through a symlink was accepted"
grep -q "symbolic link" "$work/err" || fail "the --metrics refusal does not say why"
intact "--metrics through a symlink"
data_shard=$(ls "$work"/data/*.h5 | head -n 1)
data_sum=$(sha256sum "$data_shard" | cut -d' ' -f1)
rc=0
"$train" "${common[@]}" --steps 1 --metrics "$data_shard" >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -ne 0 ] || fail "--metrics naming a data shard was accepted"
grep -q "one of this run's inputs" "$work/err" || fail "the input refusal does not say why"
[ "$(sha256sum "$data_shard" | cut -d' ' -f1)" = "$data_sum" ] || fail "the data shard changed"
echo "--metrics: a planted link and a data shard refused, both untouched"

# Two outputs at one name, and an output with a checkpoint's name in the
# checkpoint directory, are refused before anything starts.
rc=0
"$train" "${common[@]}" --steps 1 --metrics "$work/same" --heartbeat "$work/./same" \
  >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "both name" "$work/err" || fail "--metrics and --heartbeat at one name"
rc=0
"$train" "${common[@]}" --steps 1 --checkpoint-dir "$work/ck2" --heartbeat "$work/ck2/ckpt-1.h5" \
  >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "checkpoint's name" "$work/err" || fail "--heartbeat CKPT_DIR/ckpt-1.h5"
echo "two outputs at one name, and a heartbeat named as a checkpoint, refused"

# --heartbeat and --trace: the link at the name is replaced, never followed.
ln -s "$victim" "$work/heartbeat.json"
mkdir "$work/trace" && ln -s "$victim" "$work/trace/rank-0.json"
"$train" "${common[@]}" --steps 2 --heartbeat "$work/heartbeat.json" --trace "$work/trace" \
  >"$work/out" 2>"$work/err" || fail "the run with --heartbeat and --trace"
intact "--heartbeat and --trace through symlinks"
[ -L "$work/heartbeat.json" ] && fail "the heartbeat link is still there"
[ -L "$work/trace/rank-0.json" ] && fail "the trace link is still there"
echo "--heartbeat, --trace: planted links replaced, the checkpoint untouched"

# --eval-only on a checkpoint with --metrics naming that checkpoint.
rc=0
"$train" --eval-only --init-from "$victim" --val-data "$work/data" --model mlp --device cpu \
  --batch-size 16 --metrics "$victim" >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -ne 0 ] || fail "--metrics naming the evaluated checkpoint was accepted"
intact "--eval-only --metrics CHECKPOINT"
echo "--eval-only: --metrics naming the checkpoint refused"

# lockstep-export: --out naming the checkpoint, directly or by a link.
if [ -x "$export_bin" ]; then
  for out in "$victim" "$work/alias.h5"; do
    [ "$out" = "$work/alias.h5" ] && ln -s "$victim" "$out"
    rc=0
    "$export_bin" --checkpoint "$victim" --model mlp --out "$out" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -ne 0 ] || fail "lockstep-export --out $out (the checkpoint) was accepted"
    grep -q "one of this run's inputs" "$work/err" || fail "the export refusal does not say why"
    intact "lockstep-export --out $out"
  done
  # A link to a file that is not an input (the checkpoint's copy) is
  # replaced; one to the input itself was refused above.
  cp "$victim" "$work/copy.h5"
  ln -s "$work/copy.h5" "$work/model.onnx"
  "$export_bin" --checkpoint "$victim" --model mlp --out "$work/model.onnx" >"$work/out" 2>"$work/err" ||
    fail "lockstep-export through a planted link"
  cmp -s "$victim" "$work/copy.h5" || fail "lockstep-export wrote through a planted link"
  [ -L "$work/model.onnx" ] && fail "the ONNX link is still there"
  echo "lockstep-export: --out naming the checkpoint refused; a planted link replaced"
fi

# A benchmark's --json and lockstep-shard's classes.txt.
ln -s "$victim" "$work/gemm.json"
"$gemm" --sizes 16 --dtype f32 --trials 1 --batch-seconds 0.01 --json "$work/gemm.json" \
  >"$work/out" 2>"$work/err" || fail "bench_gemm --json through a planted link"
intact "bench_gemm --json"
/usr/bin/python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$work/gemm.json" ||
  fail "bench_gemm's JSON lines do not parse"
mkdir -p "$work/images/cat" "$work/images/dog" "$work/imgout"
/usr/bin/python3 - "$work/images" <<'EOF'
import sys
from PIL import Image
for name, colour in (("cat", (200, 10, 10)), ("dog", (10, 10, 200))):
    Image.new("RGB", (8, 8), colour).save(f"{sys.argv[1]}/{name}/a.png")
EOF
ln -s "$victim" "$work/imgout/classes.txt"
"$shard" images --src "$work/images" --out "$work/imgout" --shards 1 >"$work/out" 2>"$work/err" ||
  fail "lockstep-shard images with a planted classes.txt link"
intact "lockstep-shard images' classes.txt"
[ "$(cat "$work/imgout/classes.txt")" = "$(printf 'cat\ndog')" ] || fail "classes.txt is wrong"
echo "bench_gemm --json, lockstep-shard classes.txt: planted links replaced"

# Non-finite numbers and hostile strings: an lr of 10^6 that sends the loss to inf,
# paths with a quote, a backslash and a newline; every record parses strictly.
odd=$work/$'odd "name\\\nx'
mkdir -p "$odd" && cp -r "$work/data" "$odd/data"
rc=0
"$train" --data "$odd/data" --val-data "$odd/data" --model mlp --seed 7 --batch-size 16 \
  --device cpu --threads 1 --steps 3 --lr 1e6 --max-consecutive-skips 100 \
  --metrics "$odd/m.jsonl" --heartbeat "$odd/hb.json" --trace "$odd/trace" \
  >"$work/out" 2>"$work/err" || rc=$?
[ -s "$odd/m.jsonl" ] || fail "the diverging run wrote no metrics (exit $rc)"
"$train" --eval-only --init-from "$victim" --val-data "$odd/data" --model mlp --device cpu \
  --batch-size 16 --metrics "$odd/m.jsonl" >"$work/out" 2>"$work/err" || fail "the --eval-only run"
/usr/bin/python3 - "$odd" <<'EOF' || fail "a record is not strict JSON"
import json, sys
def strict(text, where):
    def refuse(constant):
        raise ValueError(f"{where}: {constant} is not JSON")
    return json.loads(text, parse_constant=refuse)
d = sys.argv[1]
records = [strict(line, "metrics") for line in open(f"{d}/m.jsonl")]
steps = [r for r in records if "loss" in r and "run" not in r]
assert any(r["grad_norm"] is None or r["loss"] is None for r in steps), steps
assert any("non_finite" in r for r in steps), steps
assert any(r.get("eval_only", "").endswith("ckpt-2.h5") and r["val_data"] == f"{d}/data"
           for r in records), records
strict(open(f"{d}/hb.json").read(), "heartbeat")
strict(open(f"{d}/trace/rank-0.json").read(), "trace")
print(f"{len(records)} metrics records, the heartbeat and the trace parse strictly;",
      "non-finite values are null and named")
EOF
echo "outputs: ok"
