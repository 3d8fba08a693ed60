#!/usr/bin/env bash
# Kubernetes-mode benchmark: how fast the agent is back from a restart on a cluster of real
# size, and its memory, against the floor of a bare kube-runtime program listing the same
# kinds, measured by cellium-k8s-bench (integration/src/bin/k8s_bench/) in one run:
#   the test API server, served in a throw-away node namespace, holding NAMESPACES
#   namespaces, PODS pods on NODES nodes (PODS/NODES of them on this node), POLICIES
#   NetworkPolicies and SERVICES Services with one EndpointSlice each; a real cellium-agent
#   (release build, ipam: kubernetes) started on it once and this node's pods created through
#   cellium-cni; then ROUNDS times: the agent stopped (SIGTERM), the floor
#   (cellium-k8s-reflector-floor: one kube-runtime reflector per kind the agent watches,
#   exiting when every store is ready) timed from exec to exit FLOOR_RUNS times (the round's
#   figure is their median; each followed by a run with the agent's decoding, --dynamic,
#   shown but not in the ratio), and the agent executed again,
#   timed from exec until every kind is synced and every endpoint of this node is restored
#   and enforcing at the repository's policy revision; its VmRSS read then.
# Everything runs in namespaces the benchmark creates and removes; the host network is not
# touched.
#
# Usage (root): integration/bench/k8s.sh
#   NAMESPACES=1000 PODS=10000 NODES=100 POLICIES=2000 SERVICES=2000 ROUNDS=5 FLOOR_RUNS=3 \
#     integration/bench/k8s.sh
# Last line: RESULT k8s sync_ms=<median> sync_ratio_vs_reflector=<median / floor's median> rss_mib=<median>
set -euo pipefail

NAMESPACES=${NAMESPACES:-1000}
PODS=${PODS:-10000}
NODES=${NODES:-100}
POLICIES=${POLICIES:-2000}
SERVICES=${SERVICES:-2000}
ROUNDS=${ROUNDS:-5}
FLOOR_RUNS=${FLOOR_RUNS:-3}
. "$(dirname "$0")/common.sh"

require_root k8s.sh "it creates network namespaces and runs the agent"

build_bench release cellium-k8s-bench cellium-k8s-reflector-floor

# The benchmark removes everything it created when it ends, also when it is told to stop
# (SIGINT or SIGTERM, which this script passes on).
run_bench "$target/release/cellium-k8s-bench" \
  --namespaces "$NAMESPACES" --pods "$PODS" --nodes "$NODES" \
  --policies "$POLICIES" --services "$SERVICES" --rounds "$ROUNDS" --floor-runs "$FLOOR_RUNS"
