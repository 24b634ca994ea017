#!/usr/bin/env bash
# Multi-host jobs on one machine (label "multihost"): lockstep-train across
# hosts made of network namespaces (hosts.sh), over TCP only. Usage:
# multihost.sh BUILD_DIR MODE, MODE one of
#   equivalence  2 hosts x 1 rank == 2 ranks on one host, bit for bit: every
#                step's metrics and every step's checkpoint (fp32, cnn)
#   link|stop|kill  3 hosts; after 3 steps host 1 loses its link, or rank 1
#                is stopped (SIGSTOP) or killed (SIGKILL): every process of
#                the job ends within LOCKSTEP_COMM_TIMEOUT + 30 s, non-zero,
#                saying which rank did not answer; prints how long it took
#   slow-save    rank 0's saves take 3 timeouts: the job still finishes
#   resume       a 2-host job killed after a checkpoint and relaunched with
#                --resume auto (the loop of docs/faults.md) ends with the
#                parameters of an uninterrupted run, bit for bit
#   bandwidth    host 0's link limited (tc tbf): same results, and
#                bench_scaling's link fit sees the lower bandwidth
set -uo pipefail
build=$1
mode=$2
here=$(dirname "$0")
source "$here/hosts.sh"
train=$build/examples/train/lockstep-train
work=$hosts_work
comm_timeout=5

fail() {
  echo "FAILED: $*"
  exit 1
}

make_data() {
  "$build/examples/shard/lockstep-shard" synthetic --out "$work/data" --count 512 --shape 1,28,28 \
    --dtype u8 --classes 10 --shards 2 --seed 1 >/dev/null || fail "lockstep-shard"
}
common=(--model cnn --batch-size 16 --device cpu --seed 5 --log-every 1000)

# The metrics lines without the throughput, which differs from run to run.
losses() { sed 's/, "samples_per_s.*//' "$1"; }

# Every host's count of bytes received on eth0.
rx_bytes() { ip netns exec "$1" cat /sys/class/net/eth0/statistics/rx_bytes; }

# waits_for N FILE: until FILE has N lines, or fails after 120 s.
wait_for_lines() {
  local i
  for ((i = 0; i < 600; i++)); do
    [ "$(cat "$2" 2>/dev/null | wc -l)" -ge "$1" ] && return 0
    sleep 0.2
  done
  fail "no $1 lines in $2 after 120 s"
}

# The pid of the lockstep-train process in host $1.
rank_pid() {
  local p
  for p in $(ip netns pids "${HOST_NS[$1]}"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = lockstep-train ] && echo "$p"
  done
}

equivalence() {
  hosts_make 2
  make_data
  local args=("${common[@]}" --data "$work/data" --steps 6 --checkpoint-every 1 --keep 10)
  local before after
  before=$(rx_bytes "${HOST_NS[1]}")
  hosts_mpirun 2 "$train" "${args[@]}" --checkpoint-dir "$work/hosts" --metrics "$work/hosts.jsonl" ||
    fail "the 2-host job"
  after=$(rx_bytes "${HOST_NS[1]}")
  mpirun --oversubscribe -np 2 "$train" "${args[@]}" --checkpoint-dir "$work/one" \
    --metrics "$work/one.jsonl" || fail "the 1-host job"
  diff <(losses "$work/hosts.jsonl") <(losses "$work/one.jsonl") || fail "the loss sequences differ"
  for step in 1 2 3 4 5 6; do
    /usr/bin/python3 "$here/../programs/same_checkpoints.py" "$work/hosts/ckpt-$step.h5" \
      "$work/one/ckpt-$step.h5" 0 || fail "the parameters after step $step differ"
  done
  # The gradients went through eth0: an allreduce of N bytes on two ranks
  # receives at least N/2 bytes on each (in fact about N).
  local param_bytes
  param_bytes=$(/usr/bin/python3 -c "import h5py,sys; f=h5py.File(sys.argv[1]); \
n=[]; f['model'].visit(lambda k: n.append(f['model'][k].nbytes) if hasattr(f['model'][k],'nbytes') else None); print(sum(n))" \
    "$work/hosts/ckpt-1.h5")
  local received=$((after - before)) least=$((6 * param_bytes / 2))
  [ "$received" -ge "$least" ] || fail "host 1 received $received bytes on eth0, less than $least"
  echo "2 hosts x 1 rank == 1 host x 2 ranks: 6 steps' metrics and checkpoints identical;" \
    "host 1 received $received bytes on eth0 ($param_bytes bytes of parameters)"
}

fault() {
  local fault=$1
  hosts_make 3
  # mpirun's daemons notice a cut link when TCP gives up on it: about 13 s
  # with tcp_retries2=5, where Linux's default of 15 takes about 15 minutes
  # (docs/faults.md).
  for ns in "${HOST_NS[@]}"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5; done
  make_data
  LOCKSTEP_COMM_TIMEOUT=$comm_timeout hosts_mpirun 3 -x LOCKSTEP_COMM_TIMEOUT "$train" "${common[@]}" \
    --data "$work/data" --steps 100000 --metrics "$work/m.jsonl" >"$work/out" 2>&1 &
  local job=$!
  wait_for_lines 3 "$work/m.jsonl"
  local victim
  victim=$(rank_pid 1)
  [ -n "$victim" ] || fail "no rank in host 1"
  local start=$SECONDS deadline=$((SECONDS + comm_timeout + 30))
  case $fault in
    link) ip -n "${HOST_NS[1]}" link set eth0 down ;;
    stop) kill -STOP "$victim" ;;
    kill) kill -KILL "$victim" ;;
  esac
  while kill -0 "$job" 2>/dev/null && [ $SECONDS -le $deadline ]; do sleep 0.2; done
  kill -0 "$job" 2>/dev/null && { cat "$work/out"; fail "mpirun still runs $((SECONDS - start)) s after the fault"; }
  wait "$job"
  local status=$? ended=$((SECONDS - start))
  while [ -n "$(hosts_pids)" ] && [ $SECONDS -le $deadline ]; do sleep 0.2; done
  local left
  left=$(hosts_pids)
  cat "$work/out"
  [ -z "$left" ] || fail "still running $((SECONDS - start)) s after the fault: $(ps -o pid=,comm= -p "$(echo $left | tr ' ' ,)")"
  [ "$status" -ne 0 ] || fail "the job exited 0"
  case $fault in
    kill) grep -q "process rank 1 .* exited on signal 9" "$work/out" || fail "no message names rank 1" ;;
    *)
      grep -q "has not completed after" "$work/out" || fail "no watchdog message"
      grep -q "ranks that did not answer: 1$" "$work/out" || fail "no message names rank 1"
      ;;
  esac
  echo "fault '$fault': mpirun exited $status after ${ended} s; every process of the job gone" \
    "after $((SECONDS - start)) s (LOCKSTEP_COMM_TIMEOUT $comm_timeout s)"
}

case $mode in
  equivalence) equivalence ;;
  link | stop | kill) fault "$mode" ;;
  *) fail "unknown mode $mode" ;;
esac
