# Hosts made of Linux network namespaces, for the multi-host tests (sourced by
# tests/multihost/*.sh). Each host is a namespace with loopback and one
# interface, eth0, on a bridge in a namespace of its own, so that the ranks
# of a job reach each other over TCP through that bridge only. mpirun starts
# in host 0 and reaches the others through a launch agent that enters their
# namespace, as ssh would enter another machine. Needs root and iproute2.
#
#   hosts_make N          makes hosts 0..N-1 (HOST_NS[i], HOST_ADDR[i]) or
#                         exits 77 (ctest's skip) saying why it cannot
#   hosts_mpirun N ARGS   mpirun of N ranks, one per host, over TCP only
#   hosts_mpirun_slots N SLOTS ARGS  mpirun of N x SLOTS ranks, SLOTS on each
#                         of hosts 0..N-1, each host with a hostname of its
#                         own (its address, in a UTS namespace): with one
#                         hostname for all, OpenMPI 4.1's TCP transport
#                         crashes in the MPI_Comm_dup after
#                         MPI_Comm_split_type when a host runs two ranks
#   hosts_pids            the processes still running in any host
#   hosts_skip REASON     prints the reason and exits 77
#   hosts_remove          kills what runs in the hosts, removes them (EXIT trap)
# shellcheck shell=bash disable=SC2016
HOSTS_SKIP=77
HOSTS_SUBNET=10.99.0.0/24
HOSTS_PREFIX="lsmh$$"
HOST_NS=()
HOST_ADDR=()
hosts_work=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

hosts_remove() {
  local ns
  for ns in "${HOST_NS[@]}" "$HOSTS_PREFIX-switch"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$hosts_work"
}
trap hosts_remove EXIT
trap 'exit 1' TERM INT HUP  # the EXIT trap runs on these too

# Namespaces left by a test that was killed outright (SIGKILL, ctest's
# timeout): their shell is gone, so they go now.
hosts_remove_stale() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | grep -o '^lsmh[0-9]*-[a-z0-9]*'); do
    owner=${ns#lsmh}
    owner=${owner%%-*}
    kill -0 "$owner" 2>/dev/null && continue
    ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

hosts_skip() {
  echo "SKIPPED: $*"
  exit "$HOSTS_SKIP"
}

hosts_make() {
  local n=$1 i ns
  [ "$(id -u)" -eq 0 ] || hosts_skip "network namespaces need root (this test runs as uid $(id -u))"
  command -v ip >/dev/null || hosts_skip "iproute2's ip is not installed"
  command -v mpirun >/dev/null || hosts_skip "mpirun is not installed"
  hosts_remove_stale
  local switch="$HOSTS_PREFIX-switch"
  ip netns add "$switch" 2>"$hosts_work/err" ||
    hosts_skip "cannot make a network namespace: $(cat "$hosts_work/err")"
  ip -n "$switch" link add br0 type bridge 2>"$hosts_work/err" ||
    hosts_skip "cannot make a bridge in a namespace: $(cat "$hosts_work/err")"
  ip -n "$switch" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns="$HOSTS_PREFIX-h$i"
    HOST_NS+=("$ns")
    HOST_ADDR+=("10.99.0.$((i + 1))")
    ip netns add "$ns"
    ip -n "$switch" link add "port$i" type veth peer name eth0 netns "$ns"
    ip -n "$switch" link set "port$i" master br0 up
    ip -n "$ns" addr add "${HOST_ADDR[$i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  # The launch agent: "agent [options] HOST COMMAND" runs COMMAND in HOST's namespace.
  {
    echo '#!/bin/sh'
    echo 'while [ "${1#-}" != "$1" ]; do shift; done'
    echo 'host=$1; shift'
    echo 'case $host in'
    for ((i = 0; i < n; i++)); do echo "  ${HOST_ADDR[$i]}) ns=${HOST_NS[$i]} ;;"; done
    echo '  *) echo "launch agent: unknown host $host" >&2; exit 1 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
  } >"$hosts_work/agent"
  # The same, each host with its own hostname (hosts_mpirun_slots).
  sed 's|^exec ip netns exec "$ns" /bin/sh -c "$\*"$|exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $host; $*"|' \
    "$hosts_work/agent" >"$hosts_work/agent-uts"
  chmod +x "$hosts_work/agent" "$hosts_work/agent-uts"
}

hosts_mpirun() {
  local n=$1 i list=""
  shift
  for ((i = 0; i < n; i++)); do list+="${list:+,}${HOST_ADDR[$i]}:1"; done
  ip netns exec "${HOST_NS[0]}" mpirun --mca plm_rsh_agent "$hosts_work/agent" \
    --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include "$HOSTS_SUBNET" \
    --mca oob_tcp_if_include "$HOSTS_SUBNET" -H "$list" -np "$n" "$@"
}

hosts_mpirun_slots() {
  local n=$1 slots=$2 i list=""
  shift 2
  for ((i = 0; i < n; i++)); do list+="${list:+,}${HOST_ADDR[$i]}:$slots"; done
  ip netns exec "${HOST_NS[0]}" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' \
    "${HOST_ADDR[0]}" mpirun --mca plm_rsh_agent "$hosts_work/agent-uts" \
    --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include "$HOSTS_SUBNET" \
    --mca oob_tcp_if_include "$HOSTS_SUBNET" -H "$list" -np "$((n * slots))" "$@"
}

hosts_pids() {
  local ns
  for ns in "${HOST_NS[@]}"; do ip netns pids "$ns"; done
}
