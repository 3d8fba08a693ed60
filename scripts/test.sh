#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, lints, one build, unit tests, then the
# privileged integration tests one at a time (they create network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

step() { printf '\n== %s\n' "$*"; }

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build"
cargo build --workspace --all-targets --locked

step "unit tests"
cargo test --workspace --locked --exclude cellium-integration

if cargo metadata --format-version 1 --no-deps | grep -q '"name":"cellium-integration"'; then
  step "integration tests (root, network namespaces, serial)"
  cargo test -p cellium-integration --locked -- --test-threads=1
fi
