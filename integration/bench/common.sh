# Sourced by the benchmark scripts, after `set -euo pipefail`: where the workspace and its build
# are, the root check, the build of what a benchmark runs, and the run of a benchmark program.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}

# require_root SCRIPT WHY: exits unless run as root; WHY says what SCRIPT does that needs it.
require_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$1: run as root ($2)" >&2
    exit 1
  fi
}

# build_bench PROFILE BIN...: the agent, CLI and plugin a benchmark runs (found next to it),
# and the binaries BIN of cellium-integration, in cargo profile PROFILE.
build_bench() {
  local profile=$1 bins=()
  shift
  for bin in "$@"; do bins+=(--bin "$bin"); done
  cargo build --quiet --profile "$profile" --manifest-path "$root/Cargo.toml" \
    -p cellium-agent -p cellium-cli -p cellium-cni
  cargo build --quiet --profile "$profile" --manifest-path "$root/Cargo.toml" \
    -p cellium-integration "${bins[@]}"
}

# run_bench PROGRAM ARG...: runs the benchmark in the background, passes SIGINT and SIGTERM on
# to it (it removes everything it created when it ends, also when told to stop), and exits
# with its status once it has cleaned up.
run_bench() {
  "$@" &
  bench_pid=$!
  trap 'kill -TERM "$bench_pid" 2>/dev/null || true' INT TERM
  local status=0
  wait "$bench_pid" || status=$?
  # A trapped signal ends the first wait early: wait for the clean-up too.
  if kill -0 "$bench_pid" 2>/dev/null; then wait "$bench_pid" || status=$?; fi
  exit "$status"
}
