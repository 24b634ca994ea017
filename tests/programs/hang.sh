#!/usr/bin/env bash
# A hang in a real 2-rank lockstep-train run, found as docs/debugging.md says:
# rank 1 is stopped (SIGSTOP) mid-run; rank 0's watchdog ends the job (exit
# 70) within LOCKSTEP_COMM_TIMEOUT (5 s, so that a slow step on a loaded
# machine is not taken for the hang), its message names the rank that did not
# answer, the dump directory and the tools/flight.py command; the dumps are
# there and tools/flight.py names the stuck collective and rank 1, wherever
# rank 1 was stopped (Note [liveness check] in comm/watchdog.cpp); rank 0's
# --heartbeat stops advancing once rank 1 is stopped (Note [heartbeat]).
# Usage: hang.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
train=$build/examples/train/lockstep-train
work=$(mktemp -d)
stopped=""
mpirun_pid=""
cleanup() {  # a failed check must not leave a stopped rank behind
  [ -n "$stopped" ] && kill -CONT "$stopped" 2>/dev/null && kill -KILL "$stopped" 2>/dev/null
  [ -n "$mpirun_pid" ] && kill "$mpirun_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "hang.sh: $*" >&2; exit 1; }
source "$(dirname "$0")/synthetic_shards.sh"
synthetic_shards "$build" "$work" 512

LOCKSTEP_COMM_TIMEOUT=5 LOCKSTEP_FLIGHT_DIR="$work/fl" timeout 120 mpirun -np 2 --oversubscribe \
  "$train" --data "$work/train" --model mlp --device cpu --batch-size 32 --steps 1000000 \
  --log-every 1000000 --metrics "$work/m.jsonl" --heartbeat "$work/hb.json" >"$work/out" 2>&1 &
mpirun_pid=$!
for _ in $(seq 600); do  # up to 60 s for 20 steps
  [ -f "$work/m.jsonl" ] && [ "$(grep -c '"loss"' "$work/m.jsonl")" -ge 20 ] && break
  sleep 0.1
done
# Rank 1: the lockstep-train process of this job (its LOCKSTEP_FLIGHT_DIR) whose MPI rank is 1.
for proc in /proc/[0-9]*; do
  # A process may end between the glob and the read: its files are gone.
  [ "$({ tr '\0' '\n' <"$proc/cmdline"; } 2>/dev/null | head -n 1)" = "$train" ] || continue
  env=$({ tr '\0' '\n' <"$proc/environ"; } 2>/dev/null || true)
  if grep -qxF "LOCKSTEP_FLIGHT_DIR=$work/fl" <<<"$env" && grep -qx 'OMPI_COMM_WORLD_RANK=1' <<<"$env"; then
    stopped=${proc#/proc/}
  fi
done
[ -n "$stopped" ] || { cat "$work/out" >&2; fail "found no rank 1 to stop"; }
kill -STOP "$stopped" || { cat "$work/out" >&2; fail "rank 1 ended before it could be stopped"; }
heartbeat_step() { /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' "$work/hb.json"; }
sleep 1  # the step in flight when rank 1 stopped may still end on rank 0
beat_after_stop=$(heartbeat_step)
sleep 2
beat_later=$(heartbeat_step)
status=0
wait "$mpirun_pid" || status=$?
mpirun_pid=""
[ "$status" -eq 70 ] || { cat "$work/out" >&2; fail "exit status $status, expected 70 (the watchdog)"; }
expect() { grep -qE -- "$2" "$1" || { cat "$1" >&2; fail "no match for '$2' in $(basename "$1")"; }; }
expect "$work/out" "^\[rank 0\] watchdog: .* has not completed after [0-9.]+ s \(LOCKSTEP_COMM_TIMEOUT is 5 s\)"
expect "$work/out" "ranks that did not answer: 1$"
expect "$work/out" "run: python3 tools/flight.py $work/fl$"
[ -f "$work/fl/flight-rank-0.json" ] || fail "rank 0 left no flight dump"
/usr/bin/python3 "$src/tools/flight.py" "$work/fl" >"$work/report"
expect "$work/report" "^STUCK at (gradients|world)#[0-9]+: "
# Stopped between collectives, inside one its partner completed, or inside one both are still
# in: rank 0's liveness check names rank 1, and so does the stuck collective's section.
expect "$work/report" "^NO ANSWER: rank 1 did not answer the watchdog's liveness check of rank 0 in time"
expect "$work/report" "^  rank 1 (never reached|issued [a-z]+#[0-9]+ but did not answer|completed [a-z]+#[0-9]+ only) "
[ "$beat_after_stop" -ge 20 ] && [ "$beat_after_stop" = "$beat_later" ] ||
  fail "the heartbeat went from step $beat_after_stop to $beat_later while rank 1 was stopped"
echo "hang.sh: ok"
