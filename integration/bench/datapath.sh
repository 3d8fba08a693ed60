#!/usr/bin/env bash
# Datapath benchmark: two pods on one node, measured in the same run
#   (a) plain kernel routing between the veths, no BPF attached, and
#   (b) through the Cellium datapath: programs on both host veths, policy
#       enforced in both directions with an allow policy, conntrack on.
# Throughput: iperf3, one TCP stream. Latency: sockperf TCP ping-pong p50.
# Each mode runs ROUNDS times, interleaved (a, b, a, b, ...) so that drift
# of the machine hits both alike; the medians are compared.
#
# Usage (root): integration/bench/datapath.sh
#   DURATION=4 ROUNDS=5 integration/bench/datapath.sh
# Last line: RESULT datapath throughput_ratio=<b/a> latency_ratio=<b/a>
set -euo pipefail

DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
name="bench$$"
bpf_root="/run/cellium-bench-$$"
pod1="cel-$name-pod1"
pod2="cel-$name-pod2"
server_ip=10.244.0.12
sockperf_pid=""

if [ "$(id -u)" -ne 0 ]; then
  echo "datapath.sh: run as root (it creates network namespaces and loads BPF)" >&2
  exit 1
fi
for tool in iperf3 sockperf; do
  command -v "$tool" >/dev/null || { echo "datapath.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

cargo build --quiet --release -p cellium-integration --bin cellium-testbed --manifest-path "$root/Cargo.toml"
testbed="$root/target/release/cellium-testbed"

cleanup() {
  [ -n "$sockperf_pid" ] && kill "$sockperf_pid" 2>/dev/null || true
  "$testbed" down --name "$name" --pods 2 || true
  if mountpoint -q "$bpf_root"; then umount -l "$bpf_root"; fi
  rmdir "$bpf_root" 2>/dev/null || true
}
trap cleanup EXIT

"$testbed" up --name "$name" --pods 2 >/dev/null

# Mbit/s of one iperf3 TCP stream pod1 -> pod2.
throughput() {
  ip netns exec "$pod2" iperf3 -s -1 -D -B "$server_ip" -p 5201 >/dev/null
  sleep 0.3
  ip netns exec "$pod1" iperf3 -c "$server_ip" -p 5201 -t "$DURATION" -f m \
    | awk '/receiver/ { print $7 }'
}

# p50 latency in microseconds of TCP ping-pong pod1 -> pod2.
latency() {
  ip netns exec "$pod1" sockperf ping-pong --tcp -i "$server_ip" -p 11111 -t "$DURATION" -m 64 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' | awk '/percentile 50.000/ { print $NF }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

ip netns exec "$pod2" sockperf server --tcp -i "$server_ip" -p 11111 >/dev/null 2>&1 &
sockperf_pid=$!
sleep 0.5

declare -a tput_a tput_b lat_a lat_b
for round in $(seq 1 "$ROUNDS"); do
  # (a) plain routing: nothing attached.
  "$testbed" detach --name "$name" --pods 2 --bpf-root "$bpf_root" >/dev/null 2>&1 || true
  t=$(throughput); l=$(latency)
  tput_a+=("$t"); lat_a+=("$l")
  echo "round $round routing:  throughput ${t} Mbit/s  latency p50 ${l} us"
  # (b) the datapath with conntrack and an allow policy in both directions.
  "$testbed" attach --name "$name" --pods 2 --bpf-root "$bpf_root" --policy allow >/dev/null
  t=$(throughput); l=$(latency)
  tput_b+=("$t"); lat_b+=("$l")
  echo "round $round datapath: throughput ${t} Mbit/s  latency p50 ${l} us"
done

ta=$(printf '%s\n' "${tput_a[@]}" | median)
tb=$(printf '%s\n' "${tput_b[@]}" | median)
la=$(printf '%s\n' "${lat_a[@]}" | median)
lb=$(printf '%s\n' "${lat_b[@]}" | median)
echo "median routing:  throughput ${ta} Mbit/s  latency p50 ${la} us"
echo "median datapath: throughput ${tb} Mbit/s  latency p50 ${lb} us"
awk -v ta="$ta" -v tb="$tb" -v la="$la" -v lb="$lb" \
  'BEGIN { printf "RESULT datapath throughput_ratio=%.3f latency_ratio=%.3f\n", tb / ta, lb / la }'
