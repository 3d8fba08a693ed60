#!/usr/bin/env bash
# Services benchmark: new TCP connections from a pod through ClusterIPs, with 1, 1,000 and
# 10,000 services programmed, on two identical node-and-pods test beds built in the same run:
#   (kp)  kube-proxy's iptables mode: no BPF, the node's iptables `nat` table as kube-proxy
#         writes it for the same services (Debian's iptables; `iptables -V` says which
#         backend), one KUBE-SERVICES rule per service walked in order by each new connection;
#   (cel) the Cellium datapath on both pods' host veths (conntrack, an allow policy enforced
#         both ways), the services programmed by the svc-lb cell's planner and programmer.
# Every service has its own cluster IP (10.96.0.1 and on), port 80, one backend (pod2:8080).
# The client in pod1 opens connections one after the other, each to a service chosen at
# random (the same sequence in both beds), closes each with a reset, and reports connections
# per second and the median connect() time (the handshake, its first packet's translation
# included). The beds alternate ROUNDS times per service count; medians are compared.
#
# Usage (root): integration/bench/services.sh
#   DURATION=3 ROUNDS=3 COUNTS="1 1000 10000" integration/bench/services.sh
# Last line: RESULT services conn_rate_ratio_10k=<cel/kp at 10,000>
#            flatness_1_to_10k=<cel at 10,000 / cel at 1>
set -euo pipefail

DURATION=${DURATION:-3}
ROUNDS=${ROUNDS:-3}
COUNTS=${COUNTS:-1 1000 10000}
root=$(cd "$(dirname "$0")/../.." && pwd)
kp="svckp$$"
cel="svccel$$"
bpf_root="/run/cellium-bench-$$"
backend=10.244.0.12:8080
pids=()

if [ "$(id -u)" -ne 0 ]; then
  echo "services.sh: run as root (it creates network namespaces, loads BPF and writes iptables rules)" >&2
  exit 1
fi
command -v iptables-restore >/dev/null || { echo "services.sh: iptables is missing (scripts/setup.sh installs it)" >&2; exit 1; }

cargo build --quiet --release -p cellium-integration --bin cellium-testbed --manifest-path "$root/Cargo.toml"
testbed="${CARGO_TARGET_DIR:-$root/target}/release/cellium-testbed"

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  "$testbed" down --name "$kp" --pods 2 || true
  "$testbed" down --name "$cel" --pods 2 || true
  if mountpoint -q "$bpf_root"; then umount -l "$bpf_root"; fi
  rmdir "$bpf_root" 2>/dev/null || true
}
trap cleanup EXIT

"$testbed" up --name "$kp" --pods 2 >/dev/null
"$testbed" up --name "$cel" --pods 2 >/dev/null
mkdir -p "$bpf_root"
mount -t bpf bpf "$bpf_root"
"$testbed" attach --name "$cel" --pods 2 --bpf-root "$bpf_root" --policy allow >/dev/null
for bed in "$kp" "$cel"; do
  ip netns exec "cel-$bed-pod2" "$testbed" accept-server --addr "$backend" &
  pids+=($!)
done
sleep 0.3
echo "kube-proxy arm: $(iptables -V)"

# Sets r (conn/s) and l (connect p50 us) from one run in bed $1's pod1 over services 0..$2;
# a failed connection fails the benchmark.
measure() {
  local out
  out=$(ip netns exec "cel-$1-pod1" "$testbed" connect-rate --services "$2" --duration "$DURATION")
  case "$out" in
    *" failed=0") ;;
    *) echo "services.sh: connections failed in $1 with $2 services: $out" >&2; exit 1 ;;
  esac
  read -r r l <<<"$(echo "$out" | sed -E 's/conn_per_s=([0-9.]+) connect_p50_us=([0-9.]+).*/\1 \2/')"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A rate lat
for count in $COUNTS; do
  "$testbed" kube-proxy-rules --count "$count" --backend "$backend" | ip netns exec "cel-$kp-node" iptables-restore
  "$testbed" services --bpf-root "$bpf_root" --count "$count" --backend "$backend" >/dev/null
  kp_rates=(); kp_lats=(); cel_rates=(); cel_lats=()
  for round in $(seq 1 "$ROUNDS"); do
    measure "$kp" "$count"; kp_rates+=("$r"); kp_lats+=("$l")
    echo "services $count round $round kube-proxy: ${r} conn/s connect p50 ${l} us"
    measure "$cel" "$count"; cel_rates+=("$r"); cel_lats+=("$l")
    echo "services $count round $round cellium:    ${r} conn/s connect p50 ${l} us"
  done
  rate[kp,$count]=$(printf '%s\n' "${kp_rates[@]}" | median)
  lat[kp,$count]=$(printf '%s\n' "${kp_lats[@]}" | median)
  rate[cel,$count]=$(printf '%s\n' "${cel_rates[@]}" | median)
  lat[cel,$count]=$(printf '%s\n' "${cel_lats[@]}" | median)
  echo "median services $count: kube-proxy ${rate[kp,$count]} conn/s p50 ${lat[kp,$count]} us; cellium ${rate[cel,$count]} conn/s p50 ${lat[cel,$count]} us"
done

first=${COUNTS%% *}
last=${COUNTS##* }
awk -v kl="${lat[kp,$last]}" -v cl="${lat[cel,$last]}" -v n="$last" \
  'BEGIN { printf "first-packet (connect) p50 at %d services: cellium/kube-proxy %.3f\n", n, cl / kl }'
awk -v kr="${rate[kp,$last]}" -v cr="${rate[cel,$last]}" -v c1="${rate[cel,$first]}" \
  'BEGIN { printf "RESULT services conn_rate_ratio_10k=%.3f flatness_1_to_10k=%.3f\n", cr / kr, cr / c1 }'
