#!/usr/bin/env bash
# Restart benchmark: how fast an agent restart gives back every endpoint, and what a live TCP
# stream loses across it, measured by cellium-restart-bench
# (integration/src/bin/restart_bench/) in one run:
#   a real cellium-agent (release build) in a throw-away node namespace with PODS real pods
#   created through cellium-cni (one network namespace and one identity each) and POLICIES
#   NetworkPolicies of two rules each (the policy benchmark's cluster), a TCP stream of
#   sequence-numbered records and a pod opening new connections to a named port, restarted
#   ROUNDS times with SIGTERM and ROUNDS times with SIGKILL; each restart timed from the exec
#   of the new agent until Endpoints.List reports every endpoint ready at the repository's
#   policy revision; TCP retransmissions of the stream's pods and datapath drops counted from
#   the signal until AFTER_MS after that; baseline: an agent with no endpoint restarted the
#   same way, timed from exec until its API answers.
# Everything runs in namespaces the benchmark creates and removes; the host network is not
# touched.
#
# Usage (root): integration/bench/restart.sh
#   PODS=1000 POLICIES=250 ROUNDS=5 AFTER_MS=1000 integration/bench/restart.sh
# Last line: RESULT restart ready_<PODS>_ms=<median, slower of SIGTERM and SIGKILL> lost_packets=<sum>
set -euo pipefail

PODS=${PODS:-1000}
POLICIES=${POLICIES:-250}
ROUNDS=${ROUNDS:-5}
AFTER_MS=${AFTER_MS:-1000}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}

if [ "$(id -u)" -ne 0 ]; then
  echo "restart.sh: run as root (it creates network namespaces and runs the agent)" >&2
  exit 1
fi

# The agent, CLI and plugin the benchmark runs are found next to it.
cargo build --quiet --release --manifest-path "$root/Cargo.toml" \
  -p cellium-agent -p cellium-cli -p cellium-cni
cargo build --quiet --release --manifest-path "$root/Cargo.toml" \
  -p cellium-integration --bin cellium-restart-bench

# The benchmark removes everything it created when it ends, also when it is told to stop
# (SIGINT or SIGTERM, which this script passes on).
"$target/release/cellium-restart-bench" \
  --pods "$PODS" --policies "$POLICIES" --rounds "$ROUNDS" --after-ms "$AFTER_MS" &
bench_pid=$!
trap 'kill -TERM "$bench_pid" 2>/dev/null || true' INT TERM
status=0
wait "$bench_pid" || status=$?
# A trapped signal ends the first wait early: wait for the clean-up too.
if kill -0 "$bench_pid" 2>/dev/null; then wait "$bench_pid" || status=$?; fi
exit "$status"
