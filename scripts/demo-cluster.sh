#!/usr/bin/env bash
# The cluster demo: three node namespaces joined by an underlay, the test API server (the
# Kubernetes API this machine can run), cellium-operator handing each node a pod CIDR from a
# cluster pool, a cellium-agent per node (routing-mode tunnel: VXLAN with the source's identity
# in the VNI; pass --routing-mode native for routes instead), pods on every node through
# cellium-cni, traffic across the nodes, a NetworkPolicy applied with kubectl, and a ClusterIP
# service over pods of two other nodes. Everything it creates is removed at the end, even on
# failure. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cargo build --workspace --locked --quiet
exec "${CARGO_TARGET_DIR:-$PWD/target}/debug/cellium-cluster-demo" "$@"
