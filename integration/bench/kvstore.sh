#!/usr/bin/env bash
# kvstore benchmark, measured by cellium-kvstore-bench (integration/src/bin/kvstore_bench.rs)
# against a real etcd (Debian's etcd-server) started for the run in a throw-away network
# namespace with its own data directory:
#   - floor: SETS create-if-absent transactions (put only when the key's create revision
#     is 0) from one etcd client, all at once;
#   - alloc: SETS new label sets numbered by three nodes' kvstore cells at once, each node
#     asking for every set (Cellium's allocator: lock, lookup, create-if-absent transaction);
#     checked to give one number per set on every node;
#   - propagation: PODS times, an ip entry written by node 1's cell until both other nodes'
#     mirrors hold it as a remote endpoint (what their ipcache is fed from): p50 and p99.
# The three nodes are three kvstore cells in one process, each with its own client, lease and
# watches, not three full agents: the pod ADD and the ipcache write around them are not timed.
#
# Usage (root): integration/bench/kvstore.sh
#   SETS=1000 PODS=100 integration/bench/kvstore.sh
# Last line: RESULT kvstore alloc_1000_ms=<...> alloc_ratio_vs_txn=<alloc/floor> propagate_p99_ms=<...>
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}

if [ "$(id -u)" -ne 0 ]; then
  echo "kvstore.sh: run as root (it creates a network namespace)" >&2
  exit 1
fi
command -v etcd >/dev/null || { echo "kvstore.sh: etcd missing: run scripts/setup.sh" >&2; exit 1; }

cargo build --quiet --release --manifest-path "$root/Cargo.toml" \
  -p cellium-integration --bin cellium-kvstore-bench
SETS=${SETS:-1000} PODS=${PODS:-100} "$target/release/cellium-kvstore-bench"
