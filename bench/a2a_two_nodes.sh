#!/usr/bin/env bash
# Two "nodes" on this machine: two network namespaces joined by a veth pair whose both ends are
# shaped with tc (a rate limit and a bounded queue; a fixed delay too where the kernel has netem),
# so traffic between the nodes is slower than inside one (loopback within a namespace). Each
# namespace runs `tessel launch --nnodes 2` with its share of the ranks; the world learns the
# node of every rank from the launcher (GROUP_RANK), so all_to_all is hierarchical.
#
#   bench/a2a_two_nodes.sh [options]              flat vs hierarchical all_to_all (tessel bench comm)
#   bench/a2a_two_nodes.sh --check PROGRAM ARGS   run PROGRAM ARGS under the two launchers instead
#                                                  (the ctest: comm_launched conformance)
# Options (defaults in brackets):
#   --tessel PATH        the tessel binary [build/release/tessel]
#   --per-node N         ranks per namespace [4]
#   --rate RATE          tc rate of each direction of the link [1gbit]
#   --queue TIME         tbf's bound on a packet's wait in the link's queue [5ms]
#   --delay TIME         fixed one-way delay, needs netem (absent: reported and skipped) [0]
#   --min B, --max B     message sizes for the benchmark [64K, 16M]
#   --iters N            iterations per size (0: adaptive) [0]
#   --timeout S          the whole run is killed after S seconds [300]
#   --expect REGEX       fail (exit 1) unless the output matches REGEX (for the ctest)
# Exit status: the program's; 77 when namespaces cannot be made here (ctest: skipped).
#
# Servers listen only on the namespace addresses made here (the store on node 0's, each Gloo
# rank on its namespace's); nothing is reachable from outside the two namespaces. The
# namespaces (and with them the veth pair) are removed on every exit.
set -u

TESSEL=build/release/tessel
PER_NODE=4
RATE=1gbit
QUEUE=5ms
DELAY=0
MIN=65536
MAX=16777216
ITERS=0
TIMEOUT=300
CHECK=()
EXPECT=
while [ $# -gt 0 ]; do
  case "$1" in
    --tessel) TESSEL=$2; shift 2 ;;
    --per-node) PER_NODE=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --queue) QUEUE=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --expect) EXPECT=$2; shift 2 ;;
    --check) shift; CHECK=("$@"); break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "a2a_two_nodes.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
TESSEL=$(realpath "$TESSEL")
[ -x "$TESSEL" ] || { echo "a2a_two_nodes.sh: no tessel binary at $TESSEL (--tessel PATH)" >&2; exit 2; }

skip() { echo "a2a_two_nodes.sh: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs ip and tc (iproute2)"

# Names and a /24 of their own per run, so concurrent runs do not collide.
ID=$(( $$ % 100000 ))
NS0="tsl-a2a-$ID-0" NS1="tsl-a2a-$ID-1"
VA="tsla2a${ID}a" VB="tsla2a${ID}b"
NET="10.213.$(( $$ % 250 + 1 ))"
A0="$NET.1" A1="$NET.2"
WORK=$(mktemp -d)
PIDS=()
# Stops what this script started: the two launchers (through `timeout`, which passes SIGTERM on
# and whose launcher stops its ranks), then anything still inside the namespaces, by pid.
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for ns in "$NS0" "$NS1"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS0" 2>"$WORK/err" || skip "cannot create a network namespace: $(cat "$WORK/err")"
ip netns add "$NS1" 2>"$WORK/err" || skip "cannot create a network namespace: $(cat "$WORK/err")"
if ! ip link add "$VA" netns "$NS0" type veth peer name "$VB" netns "$NS1" 2>"$WORK/err"; then
  skip "cannot create a veth pair: $(cat "$WORK/err")"
fi
in0() { ip netns exec "$NS0" "$@"; }
in1() { ip netns exec "$NS1" "$@"; }
in0 ip link set lo up && in1 ip link set lo up || skip "cannot bring up loopback in the namespaces"
in0 ip addr add "$A0/24" dev "$VA" && in1 ip addr add "$A1/24" dev "$VB" || skip "cannot address the veth pair"
in0 ip link set "$VA" up && in1 ip link set "$VB" up || skip "cannot bring the veth pair up"

# The link: tbf (rate, with a queue bounded to --queue of waiting) on both ends; netem's delay
# under it where the kernel has netem.
BURST=64kb
shape() {  # namespace device
  ip netns exec "$1" tc qdisc add dev "$2" root handle 1: tbf rate "$RATE" burst "$BURST" latency "$QUEUE" || return 1
  if [ "$DELAY" != 0 ]; then
    ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 handle 10: netem delay "$DELAY" 2>/dev/null || return 2
  fi
}
shape "$NS0" "$VA"; s0=$?
shape "$NS1" "$VB"; s1=$?
[ $s0 = 1 ] || [ $s1 = 1 ] && skip "tc cannot shape the veth pair (tbf)"
DELAY_NOTE="no added delay"
[ "$DELAY" != 0 ] && DELAY_NOTE="one-way delay $DELAY"
if [ $s0 = 2 ] || [ $s1 = 2 ]; then DELAY_NOTE="no added delay: this kernel has no netem (--delay $DELAY skipped)"; fi
echo "# two nodes: namespaces $NS0 ($A0) and $NS1 ($A1), $PER_NODE ranks each; link: tbf rate $RATE, queue bound $QUEUE, burst $BURST each way, $DELAY_NOTE; TCP congestion control $(in0 sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null); inside a node: loopback"
ping_ms=$(command -v ping >/dev/null && in0 ping -c 3 -i 0.2 -q "$A1" 2>/dev/null | sed -n "s#.*= [0-9.]*/\([0-9.]*\)/.*#\1#p")
echo "# link round trip (ping, idle): ${ping_ms:-?} ms"

head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/token"
chmod 600 "$WORK/token"
PORT=29500  # inside fresh namespaces every port is free
launch() {  # namespace node-rank address program...
  local ns=$1 node=$2 addr=$3
  shift 3
  # exec: the background job's pid is `timeout`'s, so the cleanup's signal reaches it.
  exec ip netns exec "$ns" env TESSEL_GLOO_HOST="$addr" timeout -k 5 "$TIMEOUT" "$TESSEL" launch --nnodes 2 --node-rank "$node" \
    --master "$A0:$PORT" --token-file "$WORK/token" --rendezvous-timeout 60 --nproc-per-node "$PER_NODE" -- "$@"
}
if [ ${#CHECK[@]} -gt 0 ]; then
  PROGRAM=("${CHECK[@]}")
else
  PROGRAM=("$TESSEL" bench comm --op all_to_all --min "$MIN" --max "$MAX" --iters "$ITERS")
fi
launch "$NS0" 0 "$A0" "${PROGRAM[@]}" >"$WORK/out0" 2>&1 &
PIDS+=($!)
launch "$NS1" 1 "$A1" "${PROGRAM[@]}" >"$WORK/out1" 2>&1 &
PIDS+=($!)
wait "${PIDS[0]}"; rc0=$?
wait "${PIDS[1]}"; rc1=$?
PIDS=()
cat "$WORK/out0" "$WORK/out1"
for end in "$NS0 $VA" "$NS1 $VB"; do
  set -- $end
  echo "# link $2 ($1) tbf: $(ip netns exec "$1" tc -s qdisc show dev "$2" | sed -n 's/^ *\(Sent .*\)$/\1/p' | head -1)"
done
[ $rc0 = 0 ] || { echo "a2a_two_nodes.sh: node 0's launcher exited $rc0"; exit $rc0; }
[ $rc1 = 0 ] || { echo "a2a_two_nodes.sh: node 1's launcher exited $rc1"; exit $rc1; }
if [ -n "$EXPECT" ] && ! cat "$WORK/out0" "$WORK/out1" | grep -Eq -- "$EXPECT"; then
  echo "a2a_two_nodes.sh: the output does not match '$EXPECT'"
  exit 1
fi
exit 0
