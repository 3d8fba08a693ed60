#!/usr/bin/env bash
# Cluster benchmark, pod to pod across two nodes: a client pod on node 1 and a server pod on
# node 2 of a cluster in network namespaces (cellium-cluster-bench up: node namespaces on an
# underlay bridge, the test API server, a real agent per node, pods through cellium-cni),
# measured in the same run
#   (a) with plain kernel routing: the agents killed and their BPF roots unmounted, so that
#       the same devices, addresses and routes carry the traffic without any BPF program (in
#       tunnel mode the pod CIDRs routed via the other node, as native routing does), and
#   (b) through Cellium: the agents started again, the datapath on both nodes,
# for each routing mode of MODES (one more mode is one more word). Throughput: iperf3, one
# TCP stream. Latency: TCP ping-pong p50 of 64-byte messages (sockperf). Each mode runs
# ROUNDS times, interleaved (a, b, a, b, ...) so that drift of the machine hits both alike;
# the medians are compared. integration/bench/cluster_scale.sh measures the cluster at scale.
#
# Everything runs in namespaces the benchmark creates and removes; the host network is not
# touched.
#
# Usage (root): integration/bench/cluster.sh
#   MODES="native tunnel" DURATION=4 ROUNDS=5 integration/bench/cluster.sh
# Last line: RESULT cluster native_tput_ratio=<b/a> native_lat_ratio=<b/a>
#            tunnel_tput_ratio=<b/a> tunnel_lat_ratio=<b/a>
set -euo pipefail

MODES=${MODES:-native tunnel}
DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
# The cargo profile of the binaries run: release unless told (PROFILE=dev for a quick try).
profile=${PROFILE:-release}
profile_dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
bench_pid=""
sockperf_pid=""
to_bench=""

if [ "$(id -u)" -ne 0 ]; then
  echo "cluster.sh: run as root (it creates network namespaces and runs agents)" >&2
  exit 1
fi
for tool in iperf3 sockperf; do
  command -v "$tool" >/dev/null || { echo "cluster.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

# The agent, CLI and plugin the benchmark runs are found next to it.
cargo build --quiet --profile "$profile" --manifest-path "$root/Cargo.toml" \
  -p cellium-agent -p cellium-cli -p cellium-cni
cargo build --quiet --profile "$profile" --manifest-path "$root/Cargo.toml" \
  -p cellium-integration --bin cellium-cluster-bench
bench="$target/$profile_dir/cellium-cluster-bench"

cleanup() {
  [ -n "$sockperf_pid" ] && kill "$sockperf_pid" 2>/dev/null || true
  # The end of its stdin, or a signal, makes the cluster remove everything it created.
  if [ -n "$to_bench" ]; then exec {to_bench}>&-; fi
  [ -n "$bench_pid" ] && wait "$bench_pid" 2>/dev/null || true
}
trap cleanup EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m() { printf '%s\n' "$@" | median; }

# Waits for the cluster's next "ready" (or fails when it exits).
await_ready() {
  local line
  while read -r line <&"${from_bench}"; do
    case "$line" in
      ready) return 0 ;;
      client_ns=*) eval "$line" ;;
    esac
  done
  echo "cluster.sh: cellium-cluster-bench exited" >&2
  exit 1
}

# Mbit/s of one iperf3 TCP stream client -> server.
throughput() {
  ip netns exec "$server_ns" iperf3 -s -1 -D -B "$server_ip" -p 5201 >/dev/null
  sleep 0.3
  ip netns exec "$client_ns" iperf3 -c "$server_ip" -p 5201 -t "$DURATION" -f m \
    | awk '/receiver/ { print $7 }'
}

# p50 latency in microseconds of TCP ping-pong client -> server.
latency() {
  ip netns exec "$client_ns" sockperf ping-pong --tcp -i "$server_ip" -p 11111 -t "$DURATION" -m 64 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' | awk '/percentile 50.000/ { print $NF }'
}

result="RESULT cluster"
for mode in $MODES; do
  fifo_dir=$(mktemp -d)
  mkfifo "$fifo_dir/in" "$fifo_dir/out"
  "$bench" up --routing-mode "$mode" <"$fifo_dir/in" >"$fifo_dir/out" &
  bench_pid=$!
  exec {to_bench}>"$fifo_dir/in" {from_bench}<"$fifo_dir/out"
  rm -r "$fifo_dir"
  client_ns="" server_ns="" server_ip=""
  await_ready
  ip netns exec "$server_ns" sockperf server --tcp -i "$server_ip" -p 11111 >/dev/null 2>&1 &
  sockperf_pid=$!
  sleep 0.5

  tput_a=() tput_b=() lat_a=() lat_b=()
  for round in $(seq 1 "$ROUNDS"); do
    echo plain >&"${to_bench}"; await_ready
    t=$(throughput); l=$(latency); tput_a+=("$t"); lat_a+=("$l")
    echo "$mode round $round routing: throughput ${t} Mbit/s latency p50 ${l} us"
    echo cellium >&"${to_bench}"; await_ready
    t=$(throughput); l=$(latency); tput_b+=("$t"); lat_b+=("$l")
    echo "$mode round $round cellium: throughput ${t} Mbit/s latency p50 ${l} us"
  done
  kill "$sockperf_pid" 2>/dev/null || true
  sockperf_pid=""
  exec {to_bench}>&-
  to_bench=""
  wait "$bench_pid"
  bench_pid=""

  ta=$(m "${tput_a[@]}"); tb=$(m "${tput_b[@]}"); la=$(m "${lat_a[@]}"); lb=$(m "${lat_b[@]}")
  echo "$mode median routing: throughput ${ta} Mbit/s latency p50 ${la} us"
  echo "$mode median cellium: throughput ${tb} Mbit/s latency p50 ${lb} us"
  result+=$(awk -v m="$mode" -v ta="$ta" -v tb="$tb" -v la="$la" -v lb="$lb" \
    'BEGIN { printf " %s_tput_ratio=%.3f %s_lat_ratio=%.3f", m, tb / ta, m, lb / la }')
done

echo "$result"
