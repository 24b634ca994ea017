#!/usr/bin/env bash
# What lockstep-train says at the start and end of a run (issue: first hour), in
# fresh processes: --help shows --epochs' default and each preset's input shape;
# the header states the length chosen when neither --epochs nor --steps is given,
# and "deterministic on" only with --deterministic (read back from the kernels'
# state, so it shows the flag was applied); an error found before the first step
# comes alone, without a header; on 2 ranks the header maps ranks to the host, the
# summary names the best val figure and the last checkpoint, epochs count from 1,
# and tools/plot.py reads the metrics; each evaluation is recorded once, the
# train loss says which steps it is the mean of (after a resume too), and the
# memory split counts an evaluation's activations (issue #47).
# Usage: run_report.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
train=$build/examples/train/lockstep-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "run_report.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
source "$(dirname "$0")/synthetic_shards.sh"
synthetic_shards "$build" "$work" 512 128

"$train" --help >"$work/help"
expect "$work/help" "default: 1 when --steps is not given either"
expect "$work/help" "mlp (input [1, 28, 28])"

common=(--data "$work/train" --model mlp --device cpu --log-every 1000)
"$train" "${common[@]}" --batch-size 64 >"$work/plain"
expect "$work/plain" "steps        8 (8 per epoch): 1 epoch, as neither --epochs nor --steps was given"
expect "$work/plain" "deterministic off"
"$train" "${common[@]}" --batch-size 64 --steps 2 --deterministic --metrics "$work/det.jsonl" >"$work/det"
expect "$work/det" "deterministic on"
head -n 1 "$work/det.jsonl" | grep -qF '"run": "start"' || fail "metrics do not open with the run record"
head -n 1 "$work/det.jsonl" | grep -qF '"deterministic": true' || fail "the run record lacks deterministic"
# Note [kernel paths]: which fused paths ran, said once after the first step
# (the CPU runs the unfused ops) and in that step's record alone.
expect "$work/det" "  kernels      cpu: unfused ops"
[ "$(grep -c "kernels      " "$work/det")" = 1 ] || fail "the kernels line is not said once"
sed -n 2p "$work/det.jsonl" | grep -qF '"kernels": {"cpu": "unfused ops"}' ||
  fail "the first step record lacks kernels"
[ "$(grep -c '"kernels"' "$work/det.jsonl")" = 1 ] || fail "kernels recorded more than once"

# Note [CPU GEMM libraries]: the header names the library in use, the build's
# default or LOCKSTEP_CPU_GEMM's; a name the build lacks is refused, naming
# what it has.
grep -qE "^  cpu gemm     (oneDNN|OpenBLAS) " "$work/plain" || fail "no cpu gemm line in the header"
if LOCKSTEP_CPU_GEMM=mkl "$train" "${common[@]}" --steps 1 >"$work/mkl" 2>&1; then
  fail "LOCKSTEP_CPU_GEMM=mkl did not fail"
fi
expect "$work/mkl" "LOCKSTEP_CPU_GEMM 'mkl' is not a CPU GEMM library; this build has"
expect "$work/mkl" "openblas"
# Note [BLAS kernels]: with OpenBLAS, the header names the kernels it runs,
# and its generic ones on a processor with AVX2 bring the warning that names
# the fix.
export LOCKSTEP_CPU_GEMM=openblas
OPENBLAS_CORETYPE=Prescott "$train" "${common[@]}" --batch-size 64 --steps 1 >"$work/generic" 2>&1
expect "$work/generic" "cpu gemm     OpenBLAS"
expect "$work/generic" "Prescott kernels"
if grep -qw avx2 /proc/cpuinfo; then
  expect "$work/generic" "start the program with OPENBLAS_CORETYPE="
fi
if [ -n "$(OPENBLAS_CORETYPE= "$src/scripts/openblas-coretype.sh")" ]; then
  # This processor is one OpenBLAS does not recognise: its own choice warns too.
  env -u OPENBLAS_CORETYPE "$train" "${common[@]}" --batch-size 64 --steps 1 >"$work/own" 2>&1
  expect "$work/own" "does not recognise this processor"
else
  grep -qF "does not recognise" "$work/plain" && fail "a warning about OpenBLAS's own choice"
fi
unset LOCKSTEP_CPU_GEMM

# An error before the first step: the message alone, no header.
if "$train" "${common[@]}" --resume auto >"$work/err.out" 2>"$work/err"; then
  fail "--resume auto without --checkpoint-dir did not fail"
fi
expect "$work/err" "--resume auto needs --checkpoint-dir"
[ ! -s "$work/err.out" ] || { cat "$work/err.out" >&2; fail "output before the error"; }

mpirun -np 2 --oversubscribe "$train" "${common[@]}" --batch-size 32 --val-data "$work/val" \
  --epochs 2 --checkpoint-dir "$work/ck" --metrics "$work/m.jsonl" >"$work/two"
expect "$work/two" "ranks        2 on 1 host"
expect "$work/two" ": ranks 0 1 on cpu cpu"
expect "$work/two" "32 per rank x 1 accumulation x 2 ranks = global batch 64"
expect "$work/two" "epoch 1: val_loss"
expect "$work/two" "epoch 2: val_loss"
expect "$work/two" "lockstep-train: done at step 16"
expect "$work/two" "skipped      0 of 16 steps"
expect "$work/two" "best val     accuracy"
expect "$work/two" "checkpoint   $work/ck/ckpt-16.h5"
grep -q '"epoch": 0' "$work/m.jsonl" && fail "an epoch counted from 0 in the metrics"
tail -n 1 "$work/m.jsonl" | grep -qF '"run": "end"' || fail "metrics do not end with the run record"
/usr/bin/python3 "$src/tools/plot.py" metrics "$work/m.jsonl" -o "$work/c.png" >"$work/plot"
expect "$work/plot" "after epoch 2 (step 16)"

# Note [one record per evaluation]: --val-every 4 over 2 epochs of 8 steps
# evaluates at steps 4, 8, 12 and 16, each recorded once (the evaluation at an
# epoch's last step is that epoch's). Note [train loss of a part]: the summary's
# train loss is the mean of the step records it names, all of epoch 2 here and
# only steps 13 to 16 after a resume from step 12; the end record says neither
# run was stopped. Note [memory kinds]: on 1 rank with --rank-invariant, the
# evaluation's 64-row batch outgrows the step's chunks of 8, so the peak is
# reached while evaluating, and its split counts the evaluation's activations:
# at least fc1's output, 64 rows x 512 features x 4 bytes.
ve=("${common[@]}" --batch-size 64 --val-data "$work/val" --epochs 2 --val-every 4)
"$train" "${ve[@]}" --checkpoint-dir "$work/ve" --checkpoint-every 12 \
  --metrics "$work/ve.jsonl" >"$work/ve.out"
mkdir "$work/ve2" && cp "$work"/ve/ckpt-12.h5* "$work/ve2/"
"$train" "${ve[@]}" --checkpoint-dir "$work/ve2" --resume auto --metrics "$work/ve2.jsonl" \
  >"$work/ve2.out"
"$train" "${common[@]}" --batch-size 8 --rank-invariant --global-batch 64 --val-data "$work/val" \
  --steps 2 --metrics "$work/mem.jsonl" >"$work/mem.out"
/usr/bin/python3 - "$work" <<'PY' || fail "the records above are not as documented"
import json, sys
work = sys.argv[1]
def records(name):
    return [json.loads(line) for line in open(f"{work}/{name}")]
def check(what, ok, got):
    if not ok:
        sys.exit(f"run_report.sh: {what}: got {got}")
for name, first, whole in (("ve", 9, True), ("ve2", 13, False)):
    rs = records(f"{name}.jsonl")
    evals = [r["step"] for r in rs if "val_loss" in r and "run" not in r]
    check(f"{name}: each evaluation recorded once", evals == ([4, 8, 12, 16] if whole else [16]),
          evals)
    end = rs[-1]
    check(f"{name}: end record not stopped", end["run"] == "end" and end["stopped"] is False
          and end["stop_reason"] is None, end)
    check(f"{name}: train loss over steps {first} to 16", end["train_loss_steps"] == [first, 16]
          and end["train_loss_whole_epoch"] is whole, end)
    losses = [r["loss"] for r in rs if "loss" in r and first <= r["step"] <= 16]
    mean = sum(losses) / len(losses)  # the step records, summed again here
    check(f"{name}: train loss the mean of steps {first} to 16 ({mean})",
          len(losses) == 17 - first and abs(end["train_loss"] - mean) <= 1e-12 * abs(mean),
          end["train_loss"])
split = records("mem.jsonl")[-1]["peak_memory_by_kind"][0]
check("activations of the evaluation at the peak", split["activations"] >= 64 * 512 * 4, split)
PY
expect "$work/ve.out" "(mean of the last epoch's steps, 9 to 16)"
expect "$work/ve2.out" "(mean of steps 13 to 16, the part of the last epoch this process ran)"
echo "run_report.sh: header, summary, --deterministic and metrics as documented"
