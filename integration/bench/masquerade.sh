#!/usr/bin/env bash
# Masquerading benchmark, pod to world: a client pod on node 1 of a two-node cluster in
# network namespaces (cellium-cluster-bench up --world: node namespaces on an underlay bridge,
# the test API server, a real agent per node, pods through cellium-cni) and a "world"
# namespace on the underlay with no route to any pod CIDR, measured in the same run
#   (a) with iptables: the agents killed and their BPF roots unmounted, node 1 forwarding with
#       plain kernel routing and masquerading its pods to the world with iptables'
#       `MASQUERADE` (netfilter's conntrack and NAT, `iptables -V` says which backend), and
#   (b) through Cellium: the agents started again and the iptables rule removed, the pod's
#       packets masqueraded by the datapath (`enable-bpf-masquerade`, the default) and routed
#       past the node's stack,
# in native routing. Throughput: iperf3, one TCP stream pod -> world. New connections: the
# pod opens TCP connections to the world one after the other for DURATION seconds, each
# closed with a reset (every one a new masquerading entry), and counts them per second. The
# arms alternate ROUNDS times; the medians are compared.
#
# Everything runs in namespaces the benchmark creates and removes; the host network is not
# touched.
#
# Usage (root): integration/bench/masquerade.sh
#   DURATION=4 ROUNDS=5 integration/bench/masquerade.sh
# Last line: RESULT masquerade tput_ratio=<b/a> conn_rate_ratio=<b/a>
set -euo pipefail

DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
# The cargo profile of the binaries run: release unless told (PROFILE=dev for a quick try).
profile=${PROFILE:-release}
profile_dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
bench_pid=""
server_pids=()
to_bench=""

if [ "$(id -u)" -ne 0 ]; then
  echo "masquerade.sh: run as root (it creates network namespaces, runs agents and writes iptables rules in them)" >&2
  exit 1
fi
for tool in iperf3 iptables; do
  command -v "$tool" >/dev/null || { echo "masquerade.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

# The agent, CLI and plugin the benchmark runs are found next to it.
cargo build --quiet --profile "$profile" --manifest-path "$root/Cargo.toml" \
  -p cellium-agent -p cellium-cli -p cellium-cni
cargo build --quiet --profile "$profile" --manifest-path "$root/Cargo.toml" \
  -p cellium-integration --bin cellium-cluster-bench --bin cellium-testbed
bench="$target/$profile_dir/cellium-cluster-bench"
testbed="$target/$profile_dir/cellium-testbed"

cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
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
      client_ns=* | world_ns=*) eval "$line" ;;
    esac
  done
  echo "masquerade.sh: cellium-cluster-bench exited" >&2
  exit 1
}

# Mbit/s of one iperf3 TCP stream pod -> world.
throughput() {
  ip netns exec "$world_ns" iperf3 -s -1 -D -B "$world_ip" -p 5201 >/dev/null
  for _ in $(seq 1 100); do
    ip netns exec "$world_ns" ss -Hltn "sport = :5201" | grep -q . && break
    sleep 0.05
  done
  ip netns exec "$client_ns" iperf3 -c "$world_ip" -p 5201 -t "$DURATION" -f m \
    | awk '/receiver/ { print $7 }'
}

# New TCP connections per second pod -> world; a failed connection fails the benchmark.
conn_rate() {
  local out
  out=$(ip netns exec "$client_ns" "$testbed" connect-rate --to "$world_ip:8080" --duration "$DURATION")
  case "$out" in
    *" failed=0") ;;
    *) echo "masquerade.sh: connections to the world failed: $out" >&2; exit 1 ;;
  esac
  echo "$out" | sed -E 's/conn_per_s=([0-9.]+) .*/\1/'
}

fifo_dir=$(mktemp -d)
mkfifo "$fifo_dir/in" "$fifo_dir/out"
"$bench" up --routing-mode native --world <"$fifo_dir/in" >"$fifo_dir/out" &
bench_pid=$!
exec {to_bench}>"$fifo_dir/in" {from_bench}<"$fifo_dir/out"
rm -r "$fifo_dir"
client_ns="" world_ns="" world_ip=""
await_ready
ip netns exec "$world_ns" "$testbed" accept-server --addr "$world_ip:8080" &
server_pids+=($!)
echo "iptables arm: $(ip netns exec "$world_ns" iptables -V)"

tput_a=() tput_b=() rate_a=() rate_b=()
for round in $(seq 1 "$ROUNDS"); do
  echo plain >&"${to_bench}"; await_ready
  t=$(throughput); r=$(conn_rate); tput_a+=("$t"); rate_a+=("$r")
  echo "round $round iptables: throughput ${t} Mbit/s new connections ${r}/s"
  echo cellium >&"${to_bench}"; await_ready
  t=$(throughput); r=$(conn_rate); tput_b+=("$t"); rate_b+=("$r")
  echo "round $round cellium:  throughput ${t} Mbit/s new connections ${r}/s"
done

ta=$(m "${tput_a[@]}"); tb=$(m "${tput_b[@]}"); ra=$(m "${rate_a[@]}"); rb=$(m "${rate_b[@]}")
echo "median iptables: throughput ${ta} Mbit/s new connections ${ra}/s"
echo "median cellium:  throughput ${tb} Mbit/s new connections ${rb}/s"
awk -v ta="$ta" -v tb="$tb" -v ra="$ra" -v rb="$rb" \
  'BEGIN { printf "RESULT masquerade tput_ratio=%.3f conn_rate_ratio=%.3f\n", tb / ta, rb / ra }'
