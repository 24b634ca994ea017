#!/usr/bin/env bash
# lockstep-train --heartbeat FILE (Note [heartbeat] in engine/heartbeat.h):
# the file is one whole line of JSON at every look, its step advances while
# training, it is rewritten with phase "saving" and a newer time during a
# slow save (LOCKSTEP_TEST_SAVE_DELAY), and says "done" at the end.
# Usage: heartbeat.sh BUILD_DIR
set -uo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
trap 'kill -9 "${run:-0}" 2>/dev/null; rm -rf "$work"' EXIT
"$shard" synthetic --out "$work/data" --count 512 --shape 1,28,28 --dtype u8 --classes 10 \
  --seed 1 >/dev/null || exit 1
hb=$work/heartbeat.json
fail() {
  echo "$1"
  cat "$work/log"
  exit 1
}
field() {  # field NAME: the value of NAME in the heartbeat (the file is read once)
  /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$hb" "$1" 2>/dev/null ||
    echo "unreadable"
}
# A slow save at step 1500: the heartbeat goes on during it. 3000 steps take
# a few seconds (about 1 ms a step), so that the polling below, a few Python
# starts per look, sees the step advance before and after the save (a CI run
# of 60 steps saw only the save's step and the last).
LOCKSTEP_TEST_SAVE_DELAY=4 "$train" --data "$work/data" --model mlp --batch-size 16 --device cpu \
  --steps 3000 --checkpoint-every 1500 --checkpoint-dir "$work/c" --heartbeat "$hb" --log-every 1000 \
  >"$work/log" 2>&1 &
run=$!
steps=() saving_times=()
for _ in $(seq 1 600); do
  kill -0 "$run" 2>/dev/null || break
  if [ -f "$hb" ]; then
    line=$(cat "$hb")
    /usr/bin/python3 -c 'import json, sys; json.loads(sys.argv[1])' "$line" 2>/dev/null ||
      fail "the heartbeat held a partial line: '$line'"
    phase=$(/usr/bin/python3 -c 'import json, sys; print(json.loads(sys.argv[1])["phase"])' "$line")
    step=$(/usr/bin/python3 -c 'import json, sys; print(json.loads(sys.argv[1])["step"])' "$line")
    steps+=("$step")
    if [ "$phase" = saving ]; then
      saving_times+=("$(/usr/bin/python3 -c 'import json, sys; print(json.loads(sys.argv[1])["unix_time"])' "$line")")
    fi
  fi
  sleep 0.1
done
wait "$run" || fail "the run failed"
[ "$(field phase)" = done ] || fail "the last heartbeat is '$(cat "$hb")', not phase done"
[ "$(field step)" = 3000 ] || fail "the last heartbeat is '$(cat "$hb")', not step 3000"
distinct=$(printf '%s\n' "${steps[@]}" | sort -un | wc -l)
[ "$distinct" -ge 3 ] || fail "the step seen in the heartbeat took only $distinct values: ${steps[*]}"
printf '%s\n' "${steps[@]}" | sort -nc || fail "the step went backwards: ${steps[*]}"
[ "${#saving_times[@]}" -ge 2 ] || fail "no heartbeat with phase saving seen during the 4 s save"
first=${saving_times[0]} last=${saving_times[-1]}
/usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) >= 2 else 1)' \
  "$first" "$last" || fail "during the 4 s save the heartbeat's time moved only from $first to $last"
echo "heartbeat: $distinct steps seen advancing, rewritten during the save ($first .. $last), done at step 3000"
