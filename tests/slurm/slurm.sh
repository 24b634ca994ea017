#!/usr/bin/env bash
# examples/slurm/train.sbatch on a one-node Slurm cluster that this test starts
# (munged, slurmctld, slurmd: configuration, state and sockets in a temporary
# directory, every daemon stopped on exit): a 2-rank job preempted with USR1
# saves, requeues and resumes, and ends with the parameters, optimizer state
# and loss sequence of an uninterrupted job, bit for bit (fp32).
# Usage: slurm.sh BUILD_DIR (as root, with Debian's slurmctld, slurmd, munge).
set -euo pipefail
build=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "slurm.sh: needs root (munged and slurmd)"; exit 77; }
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "slurm.sh: $tool not installed (apt-get install slurmctld slurmd slurm-client munge)"; exit 77; }
done

work=$(mktemp -d)
chmod 755 "$work"  # munged wants its socket's directory open to everyone
export SLURM_CONF=$work/slurm.conf
jobs_submitted=()

stop_daemon() {  # stop_daemon PIDFILE: TERM, then KILL after 10 s
  [ -f "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  if [ ${#jobs_submitted[@]} -gt 0 ]; then
    scancel "${jobs_submitted[@]}" 2>/dev/null || true
    for _ in $(seq 1 30); do
      [ -z "$(squeue -h -j "$(IFS=,; echo "${jobs_submitted[*]}")" 2>/dev/null)" ] && break
      sleep 1
    done
  fi
  if [ "$rc" -ne 0 ] && [ -d "$work/log" ]; then
    tail -n 20 "$work"/log/*.log "$work"/job-*.out 2>/dev/null || true
  fi
  stop_daemon "$work/slurmd.pid"
  stop_daemon "$work/slurmctld.pid"
  stop_daemon "$work/munged.pid"
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# Ports in the unprivileged range, different per run, so that concurrent runs
# on one machine do not meet.
port=$((20000 + RANDOM % 20000))
mkdir -p "$work"/{state,spool,log}
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge.key"
munged --key-file="$work/munge.key" --socket="$work/munge.sock" --pid-file="$work/munged.pid" \
  --log-file="$work/log/munged.log" --seed-file="$work/munge.seed"

# cred_expire (how long a requeued job waits before it may start again,
# default 120 s) and the schedulers' intervals (default 60 s and 30 s) are
# short, so that the requeued job starts again within seconds.
cat >"$SLURM_CONF" <<CONF
ClusterName=lockstep-test
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SchedulerParameters=sched_interval=5,bf_interval=5
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=lockstep0 NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=lockstep0 Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N lockstep0
for _ in $(seq 1 60); do
  [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break
  sleep 0.5
done
[ "$(sinfo -h -o %t)" = idle ] || { echo "slurm.sh: the node did not come up"; exit 1; }
echo "slurm.sh: cluster up ($SECONDS s)"

"$build/examples/shard/lockstep-shard" synthetic --out "$work/data" --count 2048 --shape 1,28,28 \
  --dtype u8 --classes 10 --shards 2 --seed 1 >/dev/null
# The batch script as a user submits it, with this cluster's shape (one node,
# two CPU ranks, no GPUs) given on the command line instead of its #SBATCH lines.
export PATH=$build/examples/train:$PATH
submit() {  # submit NAME EXTRA_SBATCH_ARGS...: prints the job id
  local name=$1
  shift
  CHECKPOINT_DIR=$work/$name sbatch --parsable --job-name="$name" --nodes=1 --ntasks-per-node=2 \
    --cpus-per-task=1 --gpus-per-node=0 --time=10 --output="$work/job-$name.out" "$@" \
    "$root/examples/slurm/train.sbatch" --data "$work/data" --model mlp --seed 7 --device cpu \
    --batch-size 16 --optimizer adamw --lr 0.001 --steps 300 --log-every 1000 \
    --metrics "$work/$name.jsonl"
}
job_state() { scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

straight=$(submit straight --wait)
jobs_submitted+=("$straight")
[ "$(job_state "$straight")" = COMPLETED ] || { echo "uninterrupted job: $(job_state "$straight")"; exit 1; }
echo "slurm.sh: uninterrupted job done ($SECONDS s)"

preempted=$(submit preempted)
jobs_submitted+=("$preempted")
# Preempt once the job has trained some steps (its metrics file has 20 lines).
for _ in $(seq 1 600); do
  [ -f "$work/preempted.jsonl" ] && [ "$(wc -l <"$work/preempted.jsonl")" -ge 20 ] && break
  sleep 0.5
done
scancel --batch --signal=USR1 "$preempted"
echo "slurm.sh: USR1 sent ($SECONDS s)"
for _ in $(seq 1 600); do
  state=$(job_state "$preempted")
  [ "$state" = COMPLETED ] || [ "$state" = FAILED ] || [ "$state" = CANCELLED ] && break
  sleep 1
done
[ "$state" = COMPLETED ] || { echo "preempted job: $state"; exit 1; }
echo "slurm.sh: preempted job done ($SECONDS s)"

# The job stopped early, was requeued, and the requeued run resumed.
out=$work/job-preempted.out
grep -q "stopped at step [0-9]* on request" "$out" || { echo "the job was not preempted:"; cat "$out"; exit 1; }
grep -q "restart 1" "$out" || { echo "the job was not requeued:"; cat "$out"; exit 1; }
grep -q "resumed from" "$out" || { echo "the requeued job did not resume:"; cat "$out"; exit 1; }
stopped_at=$(grep -m 1 -o "stopped at step [0-9]*" "$out" | grep -o "[0-9]*$")
[ "$stopped_at" -lt 300 ] || { echo "stopped at step $stopped_at, not before the end"; exit 1; }

/usr/bin/python3 "$root/tests/programs/same_checkpoints.py" \
  "$work/straight/ckpt-300.h5" "$work/preempted/ckpt-300.h5" 0
# Every step's loss, lr and gradient norm, across the stop (the step records;
# timings and the run records left out).
grep '"loss":' "$work/straight.jsonl" | sed 's/, "samples_per_s.*//' >"$work/straight.losses"
grep '"loss":' "$work/preempted.jsonl" | sed 's/, "samples_per_s.*//' >"$work/preempted.losses"
diff "$work/straight.losses" "$work/preempted.losses"
echo "slurm: preempted at step $stopped_at, requeued, resumed; identical to the uninterrupted job"
