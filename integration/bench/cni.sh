#!/usr/bin/env bash
# CNI benchmark: ADD+DEL latency of cellium-cni (release build, against a running
# cellium-agent) and of the reference bridge + host-local plugins (/usr/lib/cni), measured
# in the same run:
#   - sequential: PODS pods one after another, each ADD then DEL, timed per pod
#     (p50 and p99 of ADD+DEL); the two plugins alternate in ROUNDS blocks so that drift
#     of the machine hits both alike;
#   - concurrent: BURST ADDs started at once, then BURST DELs at once (wall time).
# Each plugin runs in a throw-away node network namespace of its own (the agent in one,
# the bridge in another), pods are further namespaces: the host network is not touched.
# The plugins are executed directly by a shell inside the node namespace, so the times are
# a runtime's view: process start, the plugin's work, exit.
#
# Usage (root): integration/bench/cni.sh
#   PODS=100 BURST=50 ROUNDS=10 WARMUP=5 integration/bench/cni.sh
#   BIN_DIR=/some/release integration/bench/cni.sh   (cellium-agent, cellium, cellium-cni from there)
# Last line: RESULT cni add_del_p50_ratio=<cellium/bridge> add_del_p99_ratio=<...> concurrent50_s=<...>
set -euo pipefail

# The timing loop, run by this script inside a node namespace:
#   cni.sh __measure seq|burst <plugin> <conf> <first pod> <count> <out file>
if [ "${1:-}" = "__measure" ]; then
  mode=$2 plugin=$3 conf=$4 first=$5 count=$6 out=$7
  us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
  call() { # verb pod-index
    CNI_COMMAND=$1 CNI_CONTAINERID="$tag-c$2" CNI_NETNS="/run/netns/$tag-p$2" CNI_IFNAME=eth0 \
      "$plugin" <"$conf" >/dev/null
  }
  if [ "$mode" = seq ]; then
    for ((i = first; i < first + count; i++)); do
      t0=$(us); call ADD "$i"; t1=$(us); call DEL "$i"; t2=$(us)
      echo "$((t1 - t0)) $((t2 - t1))" >>"$out"
    done
  else
    for verb in ADD DEL; do
      t0=$(us); pids=()
      for ((i = first; i < first + count; i++)); do call "$verb" "$i" & pids+=($!); done
      for p in "${pids[@]}"; do wait "$p"; done
      t1=$(us)
      echo "$verb $((t1 - t0))" >>"$out"
    done
  fi
  exit 0
fi

PODS=${PODS:-100}
BURST=${BURST:-50}
ROUNDS=${ROUNDS:-10}
WARMUP=${WARMUP:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
self="$root/integration/bench/cni.sh"
export tag="cb$$"
work=$(mktemp -d /tmp/cel-cnibench-XXXXXX)
node_c="$tag-cel"
node_b="$tag-br"
agent_pid=""
npods=$((PODS > BURST ? PODS : BURST))

if [ "$(id -u)" -ne 0 ]; then
  echo "cni.sh: run as root (it creates network namespaces and runs the agent)" >&2
  exit 1
fi
for p in bridge host-local; do
  [ -x "/usr/lib/cni/$p" ] || { echo "cni.sh: /usr/lib/cni/$p is missing (scripts/setup.sh installs containernetworking-plugins)" >&2; exit 1; }
done

cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
  for ((i = 0; i < npods + WARMUP; i++)); do ip netns del "$tag-p$i" 2>/dev/null || true; done
  ip netns del "$node_c" 2>/dev/null || true
  ip netns del "$node_b" 2>/dev/null || true
  if mountpoint -q "$work/bpf"; then umount -l "$work/bpf"; fi
  rm -rf "$work"
}
trap cleanup EXIT

# BIN_DIR: binaries built elsewhere (another revision, to compare with), not built here.
if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR
else
  cargo build --quiet --release -p cellium-cni -p cellium-agent -p cellium-cli --manifest-path "$root/Cargo.toml"
  bin="${CARGO_TARGET_DIR:-$root/target}/release"
fi

for ns in "$node_c" "$node_b"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
for ((i = 0; i < npods + WARMUP; i++)); do ip netns add "$tag-p$i"; done

# The agent in its node namespace (nsenter, not `ip netns exec`: its bpffs must live in the
# host's mount namespace, as in production).
nsenter --net="/run/netns/$node_c" -- "$bin/cellium-agent" run \
  --state-dir "$work/state" --api-socket "$work/api.sock" --bpf-root "$work/bpf" \
  --metrics-addr 127.0.0.1:9962 --pod-cidr 10.244.0.0/24 >"$work/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 600); do
  "$bin/cellium" --socket "$work/api.sock" status >/dev/null 2>&1 && break
  kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.log" >&2; exit 1; }
  sleep 0.1
done

cat >"$work/cellium.json" <<EOF
{"cniVersion": "1.0.0", "name": "cellium", "type": "cellium-cni", "socket": "$work/api.sock"}
EOF
cat >"$work/bridge.json" <<EOF
{"cniVersion": "1.0.0", "name": "bench", "type": "bridge", "bridge": "celbr0",
 "isGateway": true, "ipMasq": false,
 "ipam": {"type": "host-local", "subnet": "10.245.0.0/24", "dataDir": "$work/host-local"}}
EOF

measure() { # node plugin conf mode first count out
  CNI_PATH=/usr/lib/cni ip netns exec "$1" bash "$self" __measure "$4" "$2" "$3" "$5" "$6" "$7"
}
cellium() { measure "$node_c" "$bin/cellium-cni" "$work/cellium.json" "$@"; }
bridge() { measure "$node_b" /usr/lib/cni/bridge "$work/bridge.json" "$@"; }

# Warm-up, not counted: the bridge plugin creates its bridge on the first ADD, the agent
# faults in its code paths.
cellium seq "$npods" "$WARMUP" "$work/warmup"
bridge seq "$npods" "$WARMUP" "$work/warmup"

per_round=$(((PODS + ROUNDS - 1) / ROUNDS))
for ((first = 0; first < PODS; first += per_round)); do
  count=$((first + per_round > PODS ? PODS - first : per_round))
  cellium seq "$first" "$count" "$work/seq-cellium"
  bridge seq "$first" "$count" "$work/seq-bridge"
done
cellium burst 0 "$BURST" "$work/burst-cellium"
bridge burst 0 "$BURST" "$work/burst-bridge"

# Nearest-rank percentile of column $2 (1 = ADD, 2 = DEL, 0 = their sum), in ms.
pct() { # file column percentile
  awk -v c="$2" '{ print (c == 0 ? $1 + $2 : $c) }' "$1" | sort -n |
    awk -v p="$3" '{ v[NR] = $1 } END { i = int((p * NR + 99) / 100); if (i < 1) i = 1; printf "%.2f", v[i] / 1000 }'
}
burst() { awk -v v="$2" '$1 == v { printf "%.3f", $2 / 1e6 }' "$1"; }

printf '%-10s %9s %9s %9s %9s %9s %9s\n' plugin "add p50" "del p50" "a+d p50" "a+d p99" "50 ADD s" "50 DEL s"
for p in cellium bridge; do
  printf '%-10s %9s %9s %9s %9s %9s %9s\n' "$p" \
    "$(pct "$work/seq-$p" 1 50)" "$(pct "$work/seq-$p" 2 50)" \
    "$(pct "$work/seq-$p" 0 50)" "$(pct "$work/seq-$p" 0 99)" \
    "$(burst "$work/burst-$p" ADD)" "$(burst "$work/burst-$p" DEL)"
done
echo "(latencies in ms over $PODS sequential pods; bursts of $BURST at once, wall time)"

c50=$(pct "$work/seq-cellium" 0 50); b50=$(pct "$work/seq-bridge" 0 50)
c99=$(pct "$work/seq-cellium" 0 99); b99=$(pct "$work/seq-bridge" 0 99)
cadd=$(burst "$work/burst-cellium" ADD); cdel=$(burst "$work/burst-cellium" DEL)
awk -v c50="$c50" -v b50="$b50" -v c99="$c99" -v b99="$b99" -v a="$cadd" -v d="$cdel" \
  'BEGIN { printf "RESULT cni add_del_p50_ratio=%.3f add_del_p99_ratio=%.3f concurrent50_s=%.3f\n", c50 / b50, c99 / b99, a + d }'
