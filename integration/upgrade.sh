#!/usr/bin/env bash
# An upgrade from a previous release (a git tag, v0.1.0 by default) to this tree, and the
# downgrade back, with traffic running: builds the release's programs beside this tree (a git
# worktree under the target directory, with a target directory of its own: cargo's
# fingerprints go by modification times, so two trees must not share one), then runs
# integration/tests/upgrade.rs with CELLIUM_PREVIOUS_BIN naming them. Root. Not part of the
# test suite, which the second build would slow; docs/deploy.md ("Upgrades") has its last
# result.
#
#   bash integration/upgrade.sh [TAG]
set -euo pipefail
cd "$(dirname "$0")/.."
from=${1:-v0.1.0}

bash scripts/setup.sh
git rev-parse --verify --quiet "$from^{commit}" >/dev/null ||
  { echo "upgrade.sh: no release $from here (git fetch --tags)" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-$PWD/target}
tree="$target/upgrade/$from"
bin="$target/upgrade/$from-bin"

echo "# the previous release, $from ($(git rev-parse --short "$from^{commit}")), in $tree"
[ -d "$tree" ] || git worktree add --detach "$tree" "$from"
(cd "$tree" && CARGO_TARGET_DIR="$tree/target" cargo build --locked --quiet \
  -p cellium-agent -p cellium-cli -p cellium-cni --bins)
mkdir -p "$bin"
for p in cellium-agent cellium cellium-cni; do cp -f "$tree/target/debug/$p" "$bin/$p"; done

echo "# this tree"
cargo build --locked --quiet -p cellium-agent -p cellium-cli -p cellium-cni --bins

CELLIUM_PREVIOUS_BIN="$bin" cargo test --locked -p cellium-integration --test upgrade -- \
  --ignored --nocapture --test-threads=1 2>&1 | tee "$target/upgrade/$from.log"
grep '^RESULT upgrade' "$target/upgrade/$from.log"
