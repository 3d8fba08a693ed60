#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, lints, one build, the unit tests in parallel, then
# every test target (the privileged ones create network namespaces and run agents) one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# A one-shot build gains nothing from incremental state, which would double the disk it takes.
export CARGO_INCREMENTAL=0

step() { printf '\n== %s\n' "$*"; }

# Every step selects the whole workspace: the same selection unifies dependency features the
# same way, so nothing built once is built again.
step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build"
cargo build --workspace --all-targets --locked

step "unit tests"
cargo test --workspace --locked --lib --bins

step "test targets (root, network namespaces and agents: serial)"
cargo test --workspace --locked --test '*' -- --test-threads=1

step "doc tests"
cargo test --workspace --locked --doc
