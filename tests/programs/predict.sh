#!/usr/bin/env bash
# lockstep-predict (examples/predict) in fresh processes: after a few steps
# of training with --normalize, its accuracy equals lockstep-train
# --eval-only's on the same checkpoint and shards (both read the checkpoint's
# input record); its JSON lines hold every sample once, in order, with the
# logits' argmax as the class, and recount to the accuracy it printed;
# --outputs probabilities gives rows that sum to 1 with the same classes;
# --normalize overrides the record; bad uses exit 1 with a message.
# Usage: predict.sh BUILD_DIR
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
predict=$build/examples/predict/lockstep-predict
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "predict.sh: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE has a line containing TEXT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $(basename "$1")"; }
}
# refused TEXT COMMAND...: COMMAND exits 1 (an error, not a signal) saying TEXT.
refused() {
  local text=$1 rc=0
  shift
  "$@" >"$work/refused.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$work/refused.log" >&2; fail "exit $rc, not 1: $*"; }
  expect "$work/refused.log" "$text"
}
source "$(dirname "$0")/synthetic_shards.sh"
synthetic_shards "$build" "$work" 64 50

"$predict" --help >"$work/help.log"
expect "$work/help.log" "--checkpoint"
"$train" --model mlp --device cpu --batch-size 16 --seed 3 --data "$work/train" --steps 4 \
  --normalize 0.5,0.25 --checkpoint-dir "$work/a" >"$work/train.log"
ckpt=$work/a/ckpt-4.h5

"$train" --eval-only --init-from "$ckpt" --val-data "$work/val" --model mlp --device cpu \
  --batch-size 16 >"$work/eval.log"
want=$(grep -o 'val_accuracy [0-9.]*%' "$work/eval.log" | cut -d' ' -f2)
[ -n "$want" ] || { cat "$work/eval.log" >&2; fail "no val_accuracy in --eval-only's output"; }

"$predict" --checkpoint "$ckpt" --model mlp --data "$work/val" --out "$work/p.jsonl" \
  --device cpu --batch-size 7 >"$work/p.log"
expect "$work/p.log" "normalize 0.5,0.25"
expect "$work/p.log" "(the checkpoint's)"
expect "$work/p.log" "lockstep-predict: 50/50 samples"
got=$(grep -o '^accuracy [0-9.]*%' "$work/p.log" | cut -d' ' -f2)
[ "$got" = "$want" ] || fail "lockstep-predict's accuracy '$got', --eval-only's '$want'"

"$predict" --checkpoint "$ckpt" --model mlp --data "$work/val" --out "$work/q.jsonl" \
  --device cpu --outputs probabilities >"$work/q.log"
"$predict" --checkpoint "$ckpt" --model mlp --data "$work/val" --out "$work/n.jsonl" \
  --device cpu --normalize none >"$work/n.log"
expect "$work/n.log" "normalize none"
expect "$work/n.log" "(--normalize)"

python3 - "$work" "$got" <<'PY' || fail "the JSON lines do not hold what was printed"
import json, math, sys
work, printed = sys.argv[1], sys.argv[2]
def rows(name):
    with open("%s/%s" % (work, name)) as f:
        return [json.loads(line) for line in f]
logits, probs, plain = rows("p.jsonl"), rows("q.jsonl"), rows("n.jsonl")
assert [r["sample"] for r in logits] == list(range(50)), [r["sample"] for r in logits]
correct = 0
for r, q, n in zip(logits, probs, plain):
    v = r["logits"]
    assert len(v) == 10, r
    assert r["class"] == max(range(10), key=lambda c: (v[c], -c)), r
    assert q["class"] == r["class"] and q["label"] == r["label"], (q, r)
    assert abs(sum(q["probabilities"]) - 1) < 1e-9, q
    # softmax of the logits (f32 values, so 1e-6 relative)
    top = max(v)
    e = [math.exp(x - top) for x in v]
    assert all(abs(p - x / sum(e)) <= 1e-6 for p, x in zip(q["probabilities"], e)), q
    correct += r["class"] == r["label"]
assert "%.2f%%" % (100.0 * correct / 50) == printed, (correct, printed)
# Without the normalisation the model sees other inputs: other logits.
assert any(n["logits"] != r["logits"] for n, r in zip(plain, logits))
print("predict.sh: %d of 50 correct, as printed (%s)" % (correct, printed))
PY

# A language model is refused while the flags are parsed (CLI11's exit 105).
rc=0
"$predict" --checkpoint "$ckpt" --model gpt-tiny --data "$work/val" --out "$work/g.jsonl" \
  --device cpu >"$work/refused.log" 2>&1 || rc=$?
[ "$rc" -eq 105 ] || { cat "$work/refused.log" >&2; fail "--model gpt-tiny: exit $rc, not 105"; }
expect "$work/refused.log" "gpt-tiny is a language model"
refused "conv1.weight" "$predict" --checkpoint "$ckpt" --model cnn --data "$work/val" \
  --out "$work/c.jsonl" --device cpu
refused "--normalize 0.5: 1 numbers" "$predict" --checkpoint "$ckpt" --model mlp \
  --data "$work/val" --out "$work/x.jsonl" --device cpu --normalize 0.5
before=$(cksum <"$ckpt")
refused "$ckpt" "$predict" --checkpoint "$ckpt" --model mlp --data "$work/val" --out "$ckpt" \
  --device cpu
[ "$(cksum <"$ckpt")" = "$before" ] || fail "--out naming the checkpoint changed it"
for f in g c x; do [ ! -e "$work/$f.jsonl" ] || fail "a refused run left $f.jsonl"; done
echo "predict.sh: ok"
