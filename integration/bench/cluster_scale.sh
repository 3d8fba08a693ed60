#!/usr/bin/env bash
# Cluster benchmark at scale (cellium-cluster-bench scale): one real agent (release build,
# node n1, ipam: kubernetes) on the test API server, served in a node namespace the benchmark
# creates, which holds NODES synthetic nodes with PODS pods each: a CiliumNode per node
# (address, pod CIDR), a CiliumEndpoint per pod (address, identity, hosting node) and
# IDENTITIES CiliumIdentities the pods share. Measured:
#   - ingest: the time from the agent's exec until every one of the NODES * PODS remote pod
#     addresses resolves to its identity in the agent's BPF ipcache (cel_ipcache, read
#     through its pin), and the agent's VmRSS then;
#   - propagation: PROPAGATE new CiliumEndpoints created one at a time, each timed from the
#     API server's accepting it to the BPF ipcache holding it (p50, p99).
#
# Usage (root): integration/bench/cluster_scale.sh
#   NODES=1000 PODS=30 IDENTITIES=300 PROPAGATE=100 integration/bench/cluster_scale.sh
# Last line: RESULT cluster_scale ingest_30k_ms=<…> rss_mib=<…> propagate_p50_ms=<…> propagate_p99_ms=<…>
set -euo pipefail

NODES=${NODES:-1000}
PODS=${PODS:-30}
IDENTITIES=${IDENTITIES:-300}
PROPAGATE=${PROPAGATE:-100}
. "$(dirname "$0")/common.sh"
# The cargo profile of the binaries run: release unless told (PROFILE=dev for a quick try).
profile=${PROFILE:-release}
profile_dir=$([ "$profile" = dev ] && echo debug || echo "$profile")

require_root cluster_scale.sh "it creates network namespaces and runs the agent"

build_bench "$profile" cellium-cluster-bench

# The benchmark removes everything it created when it ends, also when it is told to stop
# (SIGINT or SIGTERM, which this script passes on).
run_bench "$target/$profile_dir/cellium-cluster-bench" scale \
  --nodes "$NODES" --pods "$PODS" --identities "$IDENTITIES" --propagate "$PROPAGATE"
