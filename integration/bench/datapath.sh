#!/usr/bin/env bash
# Datapath benchmark: two dual-stack pods on one node, measured in the same run
#   (a) plain kernel routing between the veths, no BPF attached, and
#   (b) through the Cellium datapath: programs on both host veths, policy
#       enforced in both directions with an allow policy, conntrack on,
#   (c) as (b) with trace events of new connections on (`bpf-events-trace-enabled`),
#   (f) the floor of any datapath on veths: a program that only matches the
#       destination, rewrites the MACs and redirects to the peer (floor.bpf.c),
# in IPv4 and in IPv6.
# Throughput: iperf3, one TCP stream. Latency: TCP ping-pong p50 of 64-byte
# messages (sockperf for IPv4; cellium-testbed's own ping-pong for IPv6, which
# the sockperf of Debian 12 does not speak).
# Each mode runs ROUNDS times, interleaved (a, b, c, a, b, c, ...) so that drift
# of the machine hits all alike; the medians are compared within a family.
# Then the flows reader alone (`cellium-testbed observe`: the flows cell's
# enrichment, ring and counters) reads the trace events of CONNECTIONS new
# UDP connections; its CPU per event is the agent's cost of observing.
#
# Usage (root): integration/bench/datapath.sh
#   DURATION=4 ROUNDS=5 integration/bench/datapath.sh
# Last line: RESULT datapath throughput_ratio=<b/a> latency_ratio=<b/a>
#            throughput_ratio_v6=<b/a> latency_ratio_v6=<b/a>
#            trace_on_tput_ratio=<c/b> events_per_cpu_s=<events / reader CPU s>
#            floor_latency_ratio=<f/a> floor_latency_ratio_v6=<f/a>
set -euo pipefail

DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-5}
CONNECTIONS=${CONNECTIONS:-100000}
root=$(cd "$(dirname "$0")/../.." && pwd)
name="bench$$"
bpf_root="/run/cellium-bench-$$"
pod1="cel-$name-pod1"
pod2="cel-$name-pod2"
server_ip=10.244.0.12
server_ip6=fd00:10:244::12
sockperf_pid=""
pingpong_pid=""
observe_pid=""

if [ "$(id -u)" -ne 0 ]; then
  echo "datapath.sh: run as root (it creates network namespaces and loads BPF)" >&2
  exit 1
fi
for tool in iperf3 sockperf clang tc; do
  command -v "$tool" >/dev/null || { echo "datapath.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

cargo build --quiet --release -p cellium-integration --bin cellium-testbed --manifest-path "$root/Cargo.toml"
testbed="${CARGO_TARGET_DIR:-$root/target}/release/cellium-testbed"

cleanup() {
  [ -n "$sockperf_pid" ] && kill "$sockperf_pid" 2>/dev/null || true
  [ -n "$pingpong_pid" ] && kill "$pingpong_pid" 2>/dev/null || true
  [ -n "$observe_pid" ] && kill "$observe_pid" 2>/dev/null || true
  [ -n "${floor_dir:-}" ] && rm -rf "$floor_dir"
  "$testbed" down --name "$name" --pods 2 || true
  if mountpoint -q "$bpf_root"; then umount -l "$bpf_root"; fi
  rmdir "$bpf_root" 2>/dev/null || true
}
trap cleanup EXIT

"$testbed" up --name "$name" --pods 2 --ipv6 >/dev/null
node="cel-$name-node"

# The floor program of each direction, built with the pods' devices and addresses.
floor_dir=$(mktemp -d)
libbpf_include=$(ls -d "${CARGO_TARGET_DIR:-$root/target}"/release/build/libbpf-sys-*/out/include | head -1)
mac() { ip -n "$1" -j link show "$2" | sed -n 's/.*"address":"\([0-9a-f:]*\)".*/\1/p' | sed 's/^/0x/; s/:/,0x/g'; }
ifindex() { ip -n "$node" -j link show "$1" | sed -n 's/^\[{"ifindex":\([0-9]*\).*/\1/p'; }
floor_build() { # $1 the destination pod's number, $2 its IPv4 as hex
  clang -O2 -target bpf -I"$libbpf_include" -I/usr/include/"$(uname -m)"-linux-gnu \
    -DDST4="$2" -DDST6_LAST="0x1$1" -DTARGET="$(ifindex "lxc$1")" \
    -DDMAC="$(mac "cel-$name-pod$1" eth0)" -DSMAC="$(mac "$node" "lxc$1")" \
    -c "$root/integration/bench/floor.bpf.c" -o "$floor_dir/to$1.o"
}
floor_build 2 0x0af4000c
floor_build 1 0x0af4000b
floor_attach() {
  for i in 1 2; do
    ip netns exec "$node" tc qdisc add dev "lxc$i" clsact
  done
  ip netns exec "$node" tc filter add dev lxc1 ingress bpf da obj "$floor_dir/to2.o" sec tc
  ip netns exec "$node" tc filter add dev lxc2 ingress bpf da obj "$floor_dir/to1.o" sec tc
}
floor_detach() {
  for i in 1 2; do
    ip netns exec "$node" tc qdisc del dev "lxc$i" clsact 2>/dev/null || true
  done
}

# Mbit/s of one iperf3 TCP stream pod1 -> pod2 at address $1.
throughput() {
  ip netns exec "$pod2" iperf3 -s -1 -D -B "$1" -p 5201 >/dev/null
  sleep 0.3
  ip netns exec "$pod1" iperf3 -c "$1" -p 5201 -t "$DURATION" -f m \
    | awk '/receiver/ { print $7 }'
}

# p50 latency in microseconds of TCP ping-pong pod1 -> pod2 over IPv4.
latency() {
  ip netns exec "$pod1" sockperf ping-pong --tcp -i "$server_ip" -p 11111 -t "$DURATION" -m 64 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' | awk '/percentile 50.000/ { print $NF }'
}

# The same over IPv6.
latency6() {
  ip netns exec "$pod1" "$testbed" pingpong --addr "[$server_ip6]:11112" --duration "$DURATION" --size 64
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

ip netns exec "$pod2" sockperf server --tcp -i "$server_ip" -p 11111 >/dev/null 2>&1 &
sockperf_pid=$!
ip netns exec "$pod2" "$testbed" pingpong-server --addr "[$server_ip6]:11112" >/dev/null 2>&1 &
pingpong_pid=$!
sleep 0.5

declare -a tput_a tput_b tput_c lat_a lat_b lat_c tput6_a tput6_b tput6_c lat6_a lat6_b lat6_c lat_f lat6_f
for round in $(seq 1 "$ROUNDS"); do
  # (a) plain routing: nothing attached.
  "$testbed" detach --name "$name" --pods 2 --bpf-root "$bpf_root" >/dev/null 2>&1 || true
  t=$(throughput "$server_ip"); l=$(latency)
  t6=$(throughput "$server_ip6"); l6=$(latency6)
  tput_a+=("$t"); lat_a+=("$l"); tput6_a+=("$t6"); lat6_a+=("$l6")
  echo "round $round routing:  IPv4 throughput ${t} Mbit/s latency p50 ${l} us  IPv6 throughput ${t6} Mbit/s latency p50 ${l6} us"
  # (f) the floor: the least a program must do.
  floor_attach
  l=$(latency); l6=$(latency6)
  floor_detach
  lat_f+=("$l"); lat6_f+=("$l6")
  echo "round $round floor:    IPv4 latency p50 ${l} us  IPv6 latency p50 ${l6} us"
  # (b) the datapath with conntrack and an allow policy in both directions.
  "$testbed" attach --name "$name" --pods 2 --bpf-root "$bpf_root" --policy allow --trace off >/dev/null
  t=$(throughput "$server_ip"); l=$(latency)
  t6=$(throughput "$server_ip6"); l6=$(latency6)
  tput_b+=("$t"); lat_b+=("$l"); tput6_b+=("$t6"); lat6_b+=("$l6")
  echo "round $round datapath: IPv4 throughput ${t} Mbit/s latency p50 ${l} us  IPv6 throughput ${t6} Mbit/s latency p50 ${l6} us"
  # (c) the same with trace events of new connections on.
  "$testbed" attach --name "$name" --pods 2 --bpf-root "$bpf_root" --policy allow --trace on >/dev/null
  t=$(throughput "$server_ip"); l=$(latency)
  t6=$(throughput "$server_ip6"); l6=$(latency6)
  tput_c+=("$t"); lat_c+=("$l"); tput6_c+=("$t6"); lat6_c+=("$l6")
  echo "round $round tracing:  IPv4 throughput ${t} Mbit/s latency p50 ${l} us  IPv6 throughput ${t6} Mbit/s latency p50 ${l6} us"
done

# The flows reader: trace events of CONNECTIONS new connections, read as the agent does.
"$testbed" attach --name "$name" --pods 2 --bpf-root "$bpf_root" --policy allow --trace on >/dev/null
observe_out=$(mktemp)
"$testbed" observe --bpf-root "$bpf_root" --duration 120 >"$observe_out" &
observe_pid=$!
for _ in $(seq 50); do grep -q observing "$observe_out" && break; sleep 0.1; done
ip netns exec "$pod1" "$testbed" connections --addr "$server_ip" --count "$CONNECTIONS"
wait "$observe_pid" || true
observe_pid=""
cat "$observe_out"
events_per_cpu_s=$(awk -F'events_per_cpu_s=' '/events_per_cpu_s=/ { print $2 }' "$observe_out")
rm -f "$observe_out"

m() { printf '%s\n' "$@" | median; }
ta=$(m "${tput_a[@]}"); tb=$(m "${tput_b[@]}"); la=$(m "${lat_a[@]}"); lb=$(m "${lat_b[@]}")
t6a=$(m "${tput6_a[@]}"); t6b=$(m "${tput6_b[@]}"); l6a=$(m "${lat6_a[@]}"); l6b=$(m "${lat6_b[@]}")
tc=$(m "${tput_c[@]}"); lc=$(m "${lat_c[@]}"); t6c=$(m "${tput6_c[@]}"); l6c=$(m "${lat6_c[@]}")
lf=$(m "${lat_f[@]}"); l6f=$(m "${lat6_f[@]}")
echo "median routing:  IPv4 throughput ${ta} Mbit/s latency p50 ${la} us  IPv6 throughput ${t6a} Mbit/s latency p50 ${l6a} us"
echo "median datapath: IPv4 throughput ${tb} Mbit/s latency p50 ${lb} us  IPv6 throughput ${t6b} Mbit/s latency p50 ${l6b} us"
echo "median tracing:  IPv4 throughput ${tc} Mbit/s latency p50 ${lc} us  IPv6 throughput ${t6c} Mbit/s latency p50 ${l6c} us"
echo "median floor:    IPv4 latency p50 ${lf} us  IPv6 latency p50 ${l6f} us"
awk -v ta="$ta" -v tb="$tb" -v la="$la" -v lb="$lb" -v t6a="$t6a" -v t6b="$t6b" -v l6a="$l6a" -v l6b="$l6b" \
  -v tc="$tc" -v eps="${events_per_cpu_s:-0}" -v lf="$lf" -v l6f="$l6f" \
  'BEGIN { printf "RESULT datapath throughput_ratio=%.3f latency_ratio=%.3f throughput_ratio_v6=%.3f latency_ratio_v6=%.3f trace_on_tput_ratio=%.3f events_per_cpu_s=%d floor_latency_ratio=%.3f floor_latency_ratio_v6=%.3f\n", tb / ta, lb / la, t6b / t6a, l6b / l6a, tc / tb, eps, lf / la, l6f / l6a }'
