#!/usr/bin/env bash
# Two "nodes" on this machine: two network namespaces joined by a link with a rate, a fixed
# one-way delay and a bounded queue, so traffic between the nodes is slower than inside one
# (loopback within a namespace). The link is bench/link_emulator (a TUN device in each
# namespace, packets relayed in userspace through a delay line and a rate limit: works without
# netem), or with --link veth a veth pair shaped by tc tbf (rate and queue; delay only where
# the kernel has netem). Each
# namespace runs `tessel launch --nnodes 2` with its share of the ranks; the world learns the
# node of every rank from the launcher (GROUP_RANK), so all_to_all is hierarchical.
#
#   bench/a2a_two_nodes.sh [options]              flat vs hierarchical all_to_all (tessel bench comm)
#   bench/a2a_two_nodes.sh --check PROGRAM ARGS   run PROGRAM ARGS under the two launchers instead
#                                                  (the ctest: comm_launched conformance)
# Options (defaults in brackets):
#   --tessel PATH        the tessel binary [build/release/tessel]
#   --per-node N         ranks per namespace [4]
#   --link emu|veth      the link emulator, or a tc-shaped veth pair [emu]
#   --emulator PATH      the link emulator [bench/link_emulator beside the tessel binary]
#   --rate RATE          rate of each direction of the link (tc units: mbit, gbit) [1gbit]
#   --queue TIME         bound on a packet's wait in the link's queue (beyond it: dropped) [5ms]
#   --delay TIME         fixed one-way delay (veth: needs netem, else reported and skipped) [0]
#   --mtu BYTES          the emulated link's MTU (emu only) [9000]
#   --cc NAME            TCP congestion control inside the namespaces, one of the host's
#                        net.ipv4.tcp_allowed_congestion_control (reno, bbr, ...) [the host's default]
#   --min B, --max B     message sizes for the benchmark [64K, 16M]
#   --iters N            iterations per size (0: adaptive) [0]
#   --timeout S          the whole run is killed after S seconds [300]
#   --expect REGEX       fail (exit 1) unless the output matches REGEX (for the ctest)
# Exit status: the program's; 77 when namespaces cannot be made here (ctest: skipped).
#
# Servers listen only on the namespace addresses made here (the store on node 0's, each Gloo
# rank on its namespace's); nothing is reachable from outside the two namespaces. The
# namespaces (and with them the link's devices) are removed on every exit, the emulator stopped first.
set -u

TESSEL=build/release/tessel
PER_NODE=4
RATE=1gbit
QUEUE=5ms
DELAY=0
LINK=emu
EMU=
MTU=9000
CC=
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
    --link) LINK=$2; shift 2 ;;
    --emulator) EMU=$2; shift 2 ;;
    --mtu) MTU=$2; shift 2 ;;
    --cc) CC=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --queue) QUEUE=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --expect) EXPECT=$2; shift 2 ;;
    --check) shift; CHECK=("$@"); break ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "a2a_two_nodes.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
TESSEL=$(realpath "$TESSEL")
[ -x "$TESSEL" ] || { echo "a2a_two_nodes.sh: no tessel binary at $TESSEL (--tessel PATH)" >&2; exit 2; }
case "$LINK" in
  emu)
    EMU=$(realpath "${EMU:-$(dirname "$TESSEL")/bench/link_emulator}")
    [ -x "$EMU" ] || { echo "a2a_two_nodes.sh: no link emulator at $EMU (--emulator PATH, or --link veth)" >&2; exit 2; } ;;
  veth) ;;
  *) echo "a2a_two_nodes.sh: --link '$LINK': expected emu or veth" >&2; exit 2 ;;
esac

skip() { echo "a2a_two_nodes.sh: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs ip (iproute2)"
[ "$LINK" = emu ] || command -v tc >/dev/null || skip "needs tc (iproute2) for --link veth"
[ "$LINK" = veth ] || [ -c /dev/net/tun ] || skip "needs /dev/net/tun for the link emulator (or --link veth)"

# Names and a /24 of their own per run, so concurrent runs do not collide.
ID=$(( $$ % 100000 ))
NS0="tsl-a2a-$ID-0" NS1="tsl-a2a-$ID-1"
VA="tsla2a${ID}a" VB="tsla2a${ID}b"
NET="10.213.$(( $$ % 250 + 1 ))"
A0="$NET.1" A1="$NET.2"
WORK=$(mktemp -d)
PIDS=()
EMU_PID=
# Stops the link emulator (by pid) and prints its counters.
stop_emulator() {
  [ -n "$EMU_PID" ] || return 0
  kill -TERM "$EMU_PID" 2>/dev/null
  wait "$EMU_PID" 2>/dev/null
  EMU_PID=
  sed 's/^link_emulator: /# link /' "$WORK/emu.err"
}
# Stops what this script started: the two launchers (through `timeout`, which passes SIGTERM on
# and whose launcher stops its ranks), the link emulator, then anything still inside the
# namespaces, by pid.
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  stop_emulator >/dev/null
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
in0() { ip netns exec "$NS0" "$@"; }
in1() { ip netns exec "$NS1" "$@"; }
in0 ip link set lo up && in1 ip link set lo up || skip "cannot bring up loopback in the namespaces"
if [ -n "$CC" ]; then
  for ns in "$NS0" "$NS1"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$CC" ||
      { echo "a2a_two_nodes.sh: --cc $CC: a namespace may only use net.ipv4.tcp_allowed_congestion_control: $(sysctl -n net.ipv4.tcp_allowed_congestion_control)" >&2; exit 2; }
  done
fi
if [ "$LINK" = emu ]; then
  # A TUN device in each namespace ($VA, $VB), the emulator relaying between them. It lives no
  # longer than this script (its parent), the namespaces, or the run's timeout.
  "$EMU" --ns "$NS0" --ns "$NS1" --dev "$VA" --dev "$VB" --rate "$RATE" --delay "$DELAY" --queue "$QUEUE" \
    --mtu "$MTU" --lifetime $(( TIMEOUT + 30 )) >"$WORK/emu.out" 2>"$WORK/emu.err" &
  EMU_PID=$!
  for _ in $(seq 100); do
    grep -q ready "$WORK/emu.out" 2>/dev/null && break
    kill -0 "$EMU_PID" 2>/dev/null || skip "the link emulator could not start: $(cat "$WORK/emu.err")"
    sleep 0.05
  done
  grep -q ready "$WORK/emu.out" || skip "the link emulator did not come up: $(cat "$WORK/emu.err")"
  for end in "$NS0 $VA $A0" "$NS1 $VB $A1"; do
    set -- $end
    ip netns exec "$1" ip addr add "$3/24" dev "$2" && ip netns exec "$1" ip link set "$2" mtu "$MTU" up ||
      skip "cannot address the emulated link's device $2 in $1"
  done
  LINK_NOTE="link_emulator: rate $RATE, one-way delay $DELAY, queue bound $QUEUE, MTU $MTU each way"
else
  if ! ip link add "$VA" netns "$NS0" type veth peer name "$VB" netns "$NS1" 2>"$WORK/err"; then
    skip "cannot create a veth pair: $(cat "$WORK/err")"
  fi
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
  LINK_NOTE="veth: tbf rate $RATE, queue bound $QUEUE, burst $BURST each way, $DELAY_NOTE"
fi
echo "# two nodes: namespaces $NS0 ($A0) and $NS1 ($A1), $PER_NODE ranks each; link: $LINK_NOTE; TCP congestion control $(in0 sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null); inside a node: loopback"
ping_ms=$(command -v ping >/dev/null && in0 ping -c 3 -i 0.2 -q "$A1" 2>/dev/null | sed -n "s#.*= [0-9.]*/\([0-9.]*\)/.*#\1#p")
[ -n "$ping_ms" ] && echo "# link round trip (ping, idle): $ping_ms ms"

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
if [ "$LINK" = emu ]; then
  stop_emulator
else
  for end in "$NS0 $VA" "$NS1 $VB"; do
    set -- $end
    echo "# link $2 ($1) tbf: $(ip netns exec "$1" tc -s qdisc show dev "$2" | sed -n 's/^ *\(Sent .*\)$/\1/p' | head -1)"
  done
fi
[ $rc0 = 0 ] || { echo "a2a_two_nodes.sh: node 0's launcher exited $rc0"; exit $rc0; }
[ $rc1 = 0 ] || { echo "a2a_two_nodes.sh: node 1's launcher exited $rc1"; exit $rc1; }
if [ -n "$EXPECT" ] && ! cat "$WORK/out0" "$WORK/out1" | grep -Eq -- "$EXPECT"; then
  echo "a2a_two_nodes.sh: the output does not match '$EXPECT'"
  exit 1
fi
exit 0
