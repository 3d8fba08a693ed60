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
. "$(dirname "$0")/common.sh"

require_root restart.sh "it creates network namespaces and runs the agent"

build_bench release cellium-restart-bench

# The benchmark removes everything it created when it ends, also when it is told to stop
# (SIGINT or SIGTERM, which this script passes on).
run_bench "$target/release/cellium-restart-bench" \
  --pods "$PODS" --policies "$POLICIES" --rounds "$ROUNDS" --after-ms "$AFTER_MS"
