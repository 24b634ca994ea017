#!/usr/bin/env bash
# What a batch script sees when a run is stopped by a signal (issue: a clean
# stop), as docs/communication.md states it. Usage: stop.sh BUILD_DIR
#   one process      SIGINT, SIGTERM, SIGUSR1: saves, says how to continue,
#                    exits 0
#   mpirun -np 2     SIGUSR1: forwarded, every rank saves, mpirun exits 0;
#                    SIGINT, SIGTERM: mpirun aborts the job (SIGTERM to the
#                    ranks, then SIGKILL) and exits 1; with a grace period
#                    (odls_base_sigkill_timeout) the ranks still save
# Each stopped run is then resumed, the same way, with --resume auto from the
# step it saved. A stop that lets rank 0 finish (exit 0) ends with "stopped at
# step N" in the summary, never "done", the end record's "stopped": true and
# its reason, and the heartbeat's phase "stopped" (issue #47).
set -euo pipefail
build=$1
train=$build/examples/train/lockstep-train
shard=$build/examples/shard/lockstep-shard
work=$(mktemp -d)
pid=
# On failure: SIGTERM, so that mpirun takes its ranks down with it.
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid"; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$shard" synthetic --out "$work/data" --count 2048 --shape 1,28,28 --dtype u8 --classes 10 \
  --shards 2 --seed 1 >/dev/null
args=(--data "$work/data" --model mlp --device cpu --batch-size 16 --log-every 100000)
continue_line="to continue, run the same command with --resume auto"

fail() {
  echo "FAIL: $*"
  cat "$work/out"
  exit 1
}

# stop NAME SIGNAL EXPECTED_RC LAUNCHER...: starts a long run, waits for its
# third step, sends SIGNAL to the launched process, and checks the exit
# status, the saved checkpoint, the message, and a resume from it.
stop() {
  local name=$1 signal=$2 expected=$3
  shift 3
  rm -rf "$work/ckpt" "$work/metrics"
  "$@" "$train" "${args[@]}" --steps 1000000 --checkpoint-dir "$work/ckpt" \
    --metrics "$work/metrics" --heartbeat "$work/heartbeat" >"$work/out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    [ -f "$work/metrics" ] && [ "$(wc -l <"$work/metrics")" -ge 3 ] && break
    sleep 0.1
  done
  kill -s "$signal" "$pid"
  local rc=0 waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 600 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -0 "$pid" 2>/dev/null && fail "$name: still running 60 s after SIG$signal"
  wait "$pid" || rc=$?
  pid=
  [ "$rc" -eq "$expected" ] || fail "$name: exit status $rc, expected $expected"
  local step
  step=$(sed -n 's/^stopped at step \([0-9]*\) on request.*/\1/p' "$work/out")
  [ -n "$step" ] || fail "$name: no 'stopped at step' line"
  grep -qF "$continue_line" "$work/out" || fail "$name: the stop does not say how to continue"
  grep -qx "saved $work/ckpt/ckpt-$step.h5" "$work/out" || fail "$name: step $step not saved"
  if [ "$expected" -eq 0 ]; then
    grep -qx "lockstep-train: stopped at step $step on request (a signal)" "$work/out" ||
      fail "$name: the summary does not say it stopped at step $step"
    grep -qF "done at step" "$work/out" && fail "$name: 'done' after a stop"
    tail -n 1 "$work/metrics" | grep -qF '"stopped": true, "stop_reason": "on request (a signal)"' ||
      fail "$name: the end record '$(tail -n 1 "$work/metrics")' does not say why it stopped"
    grep -qF '"phase": "stopped"' "$work/heartbeat" ||
      fail "$name: the heartbeat '$(cat "$work/heartbeat")' does not say stopped"
  fi
  "$@" "$train" "${args[@]}" --steps $((step + 1)) --checkpoint-dir "$work/ckpt" --resume auto \
    >"$work/out" 2>&1 || fail "$name: resuming failed"
  grep -q "resumed from $work/ckpt/ckpt-$step.h5 at step $step" "$work/out" ||
    fail "$name: did not resume from step $step"
  echo "$name: exit status $rc as documented"
}

stop "one process, SIGINT" INT 0
stop "one process, SIGTERM" TERM 0
stop "one process, SIGUSR1" USR1 0
mpi=(mpirun -np 2 --oversubscribe)
stop "mpirun, SIGUSR1" USR1 0 "${mpi[@]}"
# mpirun's abort: SIGCONT, SIGTERM a grace period later, SIGKILL one more
# grace period later. 3 s lets the ranks finish the step and save on a busy
# machine; the default of 1 s usually does too.
stop "mpirun, SIGINT" INT 1 "${mpi[@]}" --mca odls_base_sigkill_timeout 3
stop "mpirun, SIGTERM" TERM 1 "${mpi[@]}" --mca odls_base_sigkill_timeout 3
