#!/usr/bin/env bash
# Multi-host jobs on one machine (label "multihost"): lockstep-train across
# hosts made of network namespaces (hosts.sh), over TCP only. Usage:
# multihost.sh BUILD_DIR MODE, MODE one of
#   equivalence  2 hosts x 1 rank == 2 ranks on one host, bit for bit: every
#                step's metrics and every step's checkpoint (fp32, cnn)
#   invariant    --rank-invariant: 2 hosts x 2 ranks == 1 rank, bit for bit:
#                every step's metrics and the last checkpoint, for the cnn
#                preset (bf16, clipping) and resnet (BatchNorm, fp16)
#   link|stop|kill  3 hosts; after 3 steps host 1 loses its link, or rank 1
#                is stopped (SIGSTOP) or killed (SIGKILL): every process of
#                the job ends within LOCKSTEP_COMM_TIMEOUT + 30 s, non-zero,
#                saying which rank did not answer; prints how long it took
#   slow-save    rank 0's saves take 3 timeouts: the job still finishes
#   resume       a 2-host job killed after a checkpoint and relaunched with
#                --resume auto (the loop of docs/faults.md) ends with the
#                parameters of an uninterrupted run, bit for bit
#   bandwidth    both hosts' links limited to 100 Mbit/s (tc tbf): same
#                results, and bench_scaling's link fit sees a lower bandwidth
#   latency      10 ms added each way (tc netem): same results, and the fit's
#                alpha grows; skipped where the kernel has no sch_netem
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
losses() { grep '"loss":' "$1" | sed 's/, "samples_per_s.*//'; }  # the step records

# The bytes that host namespace $1 received on eth0.
rx_bytes() { ip netns exec "$1" cat /sys/class/net/eth0/statistics/rx_bytes; }

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
  param_bytes=$(/usr/bin/python3 -c "import h5py, sys
print(sum(d.nbytes for d in h5py.File(sys.argv[1])['model'].values()))" "$work/hosts/ckpt-1.h5")
  local received=$((after - before)) least=$((6 * param_bytes / 2))
  [ "$received" -ge "$least" ] || fail "host 1 received $received bytes on eth0, less than $least"
  echo "2 hosts x 1 rank == 1 host x 2 ranks: 6 steps' metrics and checkpoints identical;" \
    "host 1 received $received bytes on eth0 ($param_bytes bytes of parameters)"
}

invariant() {
  hosts_make 2
  make_data
  "$build/examples/shard/lockstep-shard" synthetic --out "$work/images" --count 64 \
    --shape 3,32,32 --dtype u8 --classes 10 --shards 2 --seed 1 >/dev/null || fail "lockstep-shard"
  local model args
  for model in cnn resnet; do
    if [ "$model" = cnn ]; then
      args=(--data "$work/data" --precision bf16 --clip 0.5 --global-batch 64 --batch-size 16
        --steps 3)
    else
      args=(--data "$work/images" --precision fp16 --global-batch 8 --batch-size 2 --steps 2)
    fi
    args+=(--model "$model" --rank-invariant --device cpu --seed 5 --log-every 1000
      --checkpoint-every 0)
    hosts_mpirun_slots 2 2 "$train" "${args[@]}" --checkpoint-dir "$work/$model-hosts" \
      --metrics "$work/$model-hosts.jsonl" >/dev/null || fail "the 2 x 2-rank $model job"
    "$train" "${args[@]}" --checkpoint-dir "$work/$model-one" --metrics "$work/$model-one.jsonl" \
      >/dev/null || fail "the 1-rank $model job"
    diff <(losses "$work/$model-hosts.jsonl") <(losses "$work/$model-one.jsonl") ||
      fail "$model: the loss sequences differ"
    local last
    last=$(basename "$(ls "$work/$model-one"/ckpt-*.h5)")
    /usr/bin/python3 "$here/../programs/same_checkpoints.py" "$work/$model-hosts/$last" \
      "$work/$model-one/$last" 0 || fail "$model: the checkpoints differ"
    echo "--rank-invariant $model: 2 hosts x 2 ranks == 1 rank, metrics and checkpoint identical"
  done
}

fault() {
  local fault=$1
  hosts_make 3
  # mpirun's daemons notice a cut link when TCP gives up on it: about 13 s
  # with tcp_retries2=5, where Linux's default of 15 takes about 15 minutes
  # (docs/faults.md).
  for ns in "${HOST_NS[@]}"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5; done
  make_data
  # Note [launch retry]: about one launch in five of a 3-host job here never
  # reaches its first step (no rank prints, no watchdog fires: the processes
  # wait in OpenMPI's start-up across the namespaces, before lockstep runs).
  # That is the harness's launcher, not the fault under test, so a launch that
  # shows no step within 60 s is killed and made again, up to three times in
  # all, and says so (two in a row failed once, in a fresh-clone CI run).
  local job attempt
  for attempt in 1 2 3; do
    LOCKSTEP_COMM_TIMEOUT=$comm_timeout hosts_mpirun 3 -x LOCKSTEP_COMM_TIMEOUT "$train" \
      "${common[@]}" --data "$work/data" --steps 100000 --metrics "$work/m.jsonl" \
      >"$work/out" 2>&1 &
    job=$!
    local i
    for ((i = 0; i < 300; i++)); do
      [ -f "$work/m.jsonl" ] && [ "$(grep -c '"loss":' "$work/m.jsonl")" -ge 3 ] && break 2
      sleep 0.2
    done
    [ "$attempt" -eq 3 ] && { cat "$work/out"; fail "no 3 steps in $work/m.jsonl after 60 s, three times"; }
    echo "launch $attempt showed no step in 60 s (Note [launch retry]); its output:"
    cat "$work/out"
    kill -KILL "$job" $(hosts_pids) 2>/dev/null || true
    wait "$job" || true
    rm -f "$work/m.jsonl"
  done
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

slow_save() {
  hosts_make 2
  make_data
  # Each save of rank 0 takes three timeouts longer (the test hook of
  # docs/faults.md, as a slow disk would), while rank 1 waits for it.
  LOCKSTEP_COMM_TIMEOUT=2 LOCKSTEP_TEST_SAVE_DELAY=6 hosts_mpirun 2 -x LOCKSTEP_COMM_TIMEOUT \
    -x LOCKSTEP_TEST_SAVE_DELAY "$train" "${common[@]}" --data "$work/data" --steps 4 \
    --checkpoint-every 2 --checkpoint-dir "$work/c" >"$work/out" 2>&1
  local status=$?
  cat "$work/out"
  [ "$status" -eq 0 ] || fail "the job failed ($status)"
  grep -q "waiting another 2 s" "$work/out" || fail "rank 1 never waited for the save"
  grep -q "rank 0 (saving the checkpoint of step 2" "$work/out" || fail "the wait names no save"
  [ -f "$work/c/ckpt-4.h5" ] || fail "no checkpoint of step 4"
  echo "saves of 6 s under a 2 s timeout: the job finished"
}

# The relaunch loop of docs/faults.md: up to 3 restarts, each from the newest
# good checkpoint.
relaunch_loop() {
  local attempt
  for attempt in 0 1 2 3; do
    hosts_mpirun 2 "$train" "$@" --resume auto && return 0
    echo "attempt $attempt failed; relaunching from the newest good checkpoint"
  done
  return 1
}

resume() {
  hosts_make 2
  make_data
  local args=("${common[@]}" --data "$work/data" --steps 40 --checkpoint-every 10 --keep 10)
  hosts_mpirun 2 "$train" "${args[@]}" --checkpoint-dir "$work/a" >/dev/null || fail "uninterrupted run"
  # Kills rank 1 once, after the first checkpoint; the loop relaunches the job.
  (
    for ((i = 0; i < 1200; i++)); do
      [ -f "$work/b/ckpt-10.h5" ] && break # renamed into place last
      sleep 0.1
    done
    kill -KILL "$(rank_pid 1)"
  ) &
  local killer=$!
  relaunch_loop "${args[@]}" --checkpoint-dir "$work/b" >"$work/out" 2>&1
  local status=$?
  wait "$killer"
  cat "$work/out"
  [ "$status" -eq 0 ] || fail "the relaunch loop gave up"
  grep -q "attempt 0 failed" "$work/out" || fail "the first attempt was not killed"
  grep -q "resumed from $work/b/ckpt-[1-3]0.h5" "$work/out" || fail "the relaunch did not resume"
  /usr/bin/python3 "$here/../programs/same_checkpoints.py" "$work/a/ckpt-40.h5" "$work/b/ckpt-40.h5" 0 ||
    fail "the resumed run's parameters differ"
  echo "killed after a checkpoint, relaunched with --resume auto: parameters identical"
}

# link_fit NAME: bench_scaling's link fit between the two hosts, as
# "alpha_us bus_bandwidth_gbps".
link_fit() {
  hosts_mpirun 2 "$build/bench/bench_scaling" --model cnn --device cpu --mode weak --steps 1 \
    --trials 1 --json "$work/$1.json" >/dev/null || fail "bench_scaling ($1)"
  /usr/bin/python3 -c "import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r['bench'] == 'scaling_link': print(r['alpha_us'], r['bus_bandwidth_gbps'])" "$work/$1.json"
}

# shaped KIND QDISC...: a slower link (tc on both hosts' eth0) changes the
# speed, not the results: the same metrics and parameters as without it; and
# bench_scaling's link fit sees it (CHECK: "alpha" or "bandwidth").
shaped() {
  local check=$1
  shift
  [ -x "$build/bench/bench_scaling" ] || hosts_skip "bench_scaling is not built (LOCKSTEP_BUILD_BENCH)"
  make_data
  local args=("${common[@]}" --data "$work/data" --steps 3)
  hosts_mpirun 2 "$train" "${args[@]}" --checkpoint-dir "$work/free" --metrics "$work/free.jsonl" \
    >/dev/null || fail "the job on a free link"
  local free
  free=$(link_fit free)
  for ns in "${HOST_NS[@]}"; do ip netns exec "$ns" tc qdisc add dev eth0 root "$@" || exit 1; done
  hosts_mpirun 2 "$train" "${args[@]}" --checkpoint-dir "$work/slow" --metrics "$work/slow.jsonl" \
    >/dev/null || fail "the job on a shaped link"
  local slow
  slow=$(link_fit slow)
  diff <(losses "$work/free.jsonl") <(losses "$work/slow.jsonl") || fail "the loss sequences differ"
  /usr/bin/python3 "$here/../programs/same_checkpoints.py" "$work/free/ckpt-3.h5" \
    "$work/slow/ckpt-3.h5" 0 || fail "the parameters differ"
  echo "link fit (alpha us, bus GB/s): free $free; with tc qdisc $*: $slow"
  # Wide margins: the shaping is 10 to 100 times what it is checked against.
  read -r free_alpha free_bw <<<"$free"
  read -r slow_alpha slow_bw <<<"$slow"
  case $check in
    bandwidth)
      /usr/bin/python3 -c "import sys; sys.exit(not float(sys.argv[2]) < float(sys.argv[1]) / 2)" \
        "$free_bw" "$slow_bw" || fail "the fit's bandwidth did not fall"
      ;;
    alpha)
      /usr/bin/python3 -c "import sys; sys.exit(not float(sys.argv[2]) > float(sys.argv[1]) + 5000)" \
        "$free_alpha" "$slow_alpha" || fail "the fit's alpha did not grow by the added 10 ms"
      ;;
  esac
  echo "same results; the fit sees the slower link"
}

latency() {
  hosts_make 2
  ip netns exec "${HOST_NS[0]}" tc qdisc add dev eth0 root netem delay 1ms 2>"$work/err" ||
    hosts_skip "tc netem is not available (the kernel has no sch_netem): $(cat "$work/err")"
  ip netns exec "${HOST_NS[0]}" tc qdisc del dev eth0 root
  # 10 ms each way: an allreduce's round trip takes 20 ms more, at least.
  shaped alpha netem delay 10ms
}

case $mode in
  equivalence) equivalence ;;
  invariant) invariant ;;
  bandwidth)
    hosts_make 2
    shaped bandwidth tbf rate 100mbit burst 64kb latency 200ms
    ;;
  latency) latency ;;
  link | stop | kill) fault "$mode" ;;
  slow-save) slow_save ;;
  resume) resume ;;
  *) fail "unknown mode $mode" ;;
esac
