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
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}

if [ "$(id -u)" -ne 0 ]; then
  echo "policy.sh: run as root (it creates network namespaces and runs the agent)" >&2
  exit 1
fi

# The agent, CLI and plugin the benchmark runs are found next to it.
cargo build --quiet --release --manifest-path "$root/Cargo.toml" \
  -p cellium-agent -p cellium-cli -p cellium-cni
cargo build --quiet --release --manifest-path "$root/Cargo.toml" \
  -p cellium-integration --bin cellium-policy-bench

# The benchmark removes everything it created when it ends, also when it is told to stop
# (SIGINT or SIGTERM, which this script passes on).
"$target/release/cellium-policy-bench" \
  --pods "$PODS" --policies "$POLICIES" --rounds "$ROUNDS" --samples "$SAMPLES" &
bench_pid=$!
trap 'kill -TERM "$bench_pid" 2>/dev/null || true' INT TERM
status=0
wait "$bench_pid" || status=$?
# A trapped signal ends the first wait early: wait for the clean-up too.
if kill -0 "$bench_pid" 2>/dev/null; then wait "$bench_pid" || status=$?; fi
exit "$status"
