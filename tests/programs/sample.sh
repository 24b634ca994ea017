#!/usr/bin/env bash
# lockstep-train's --sample-tokens with a prompt of bytes above 127 (UTF-8
# text, and a lone 0xff): the vocabulary of gpt-tiny covers all 256 bytes, so
# the prompt is continued and printed back byte for byte (issue: trust, third
# round: such bytes once became negative token ids and the run failed). A
# stopped run prints no sample; --eval-only refuses --sample-tokens.
# Usage: sample.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
export LC_ALL=C  # ${#prompt} counts bytes
build=$1
source=$2
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$shard" text --src "$source"/docs/*.md --out "$work/text" --seq 32 >/dev/null
for prompt in $'caf\xc3\xa9 na\xc3\xafve ' $'\xff\x80 '; do
  if ! "$train" --data "$work/text/train" --model gpt-tiny --steps 1 --batch-size 4 --device cpu \
    --sample-tokens 4 --prompt "$prompt" >"$work/out" 2>&1; then
    echo "the prompt $(printf %q "$prompt") failed:"
    cat "$work/out"
    exit 1
  fi
  # The sample line is the prompt and then what was generated.
  grep -A1 "^sample (greedy, 4 tokens after the prompt):" "$work/out" | tail -n 1 >"$work/sample"
  head -c "${#prompt}" "$work/sample" >"$work/printed"
  if ! printf %s "$prompt" | cmp -s - "$work/printed"; then
    echo "the prompt $(printf %q "$prompt") was not printed back byte for byte:"
    cat "$work/out"
    exit 1
  fi
  echo "prompt $(printf %q "$prompt"): continued and printed back"
done

# A stopped run has not finished training: no sample and no "done", but
# "stopped at step N" (issue #47). It is stopped after its second step record.
"$train" --data "$work/text/train" --model gpt-tiny --steps 1000000 --batch-size 4 --device cpu \
  --sample-tokens 4 --metrics "$work/m.jsonl" >"$work/out" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -f "$work/m.jsonl" ] && [ "$(wc -l <"$work/m.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid" || { echo "the stopped run exited $?:"; cat "$work/out"; exit 1; }
if grep -qE "^sample \(greedy|done at step" "$work/out" ||
  ! grep -qE "^lockstep-train: stopped at step [0-9]+ on request" "$work/out"; then
  echo "the stopped run printed a sample or 'done', or not where it stopped:"
  cat "$work/out"
  exit 1
fi
echo "a stopped run: 'stopped at step N', no sample, no 'done'"

# --eval-only trains nothing, so --sample-tokens would do nothing: refused by name.
if "$train" --eval-only --init-from "$work/none.h5" --val-data "$work/text/train" \
  --model gpt-tiny --device cpu --sample-tokens 4 >"$work/out" 2>&1 ||
  ! grep -qF "lockstep-train: --sample-tokens does nothing with --eval-only" "$work/out"; then
  echo "--eval-only --sample-tokens was not refused naming the flag:"
  cat "$work/out"
  exit 1
fi
echo "--eval-only --sample-tokens: refused"
