#!/usr/bin/env bash
# Policy benchmark: how fast policy follows changes at scale, measured by
# cellium-policy-bench (integration/src/bin/policy_bench/) in one run:
#   1. a real cellium-agent (release build) in a throw-away node namespace with PODS real
#      pods created through cellium-cni (one network namespace and one identity each) and
#      POLICIES NetworkPolicies of two rules each; a policy that changes every endpoint is
#      applied and deleted ROUNDS times, each timed from the Apply call until
#      Endpoints.List reports every endpoint at the new revision; baseline: the same for a
#      policy that selects no endpoint;
#   2. a new identity that 100 cached selectors select, handed to the policy repository
#      (in process, same cluster), SAMPLES times; baseline: every selector recomputed;
#   3. the agent's resident memory with everything loaded; baseline: just after its start.
# Everything runs in namespaces the benchmark creates and removes; the host network is not
# touched.
#
# Usage (root): integration/bench/policy.sh
#   PODS=1000 POLICIES=250 ROUNDS=5 SAMPLES=50 integration/bench/policy.sh
# Last line: RESULT policy apply_<PODS>_ms=<median> identity_add_us=<median> rss_mib=<loaded>
set -euo pipefail

PODS=${PODS:-1000}
POLICIES=${POLICIES:-250}
ROUNDS=${ROUNDS:-5}
SAMPLES=${SAMPLES:-50}
. "$(dirname "$0")/common.sh"

require_root policy.sh "it creates network namespaces and runs the agent"

build_bench release cellium-policy-bench

# The benchmark removes everything it created when it ends, also when it is told to stop
# (SIGINT or SIGTERM, which this script passes on).
run_bench "$target/release/cellium-policy-bench" \
  --pods "$PODS" --policies "$POLICIES" --rounds "$ROUNDS" --samples "$SAMPLES"
