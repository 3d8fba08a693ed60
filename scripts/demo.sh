#!/usr/bin/env bash
# The demo: the agent on its embedded default configuration, in a throw-away network namespace,
# and what `cellium status --verbose` says about it. Everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cargo build --workspace --locked --quiet
bin=target/debug

node="cellium-demo-$$"
work=$(mktemp -d /tmp/cellium-demo.XXXXXX)
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  ip netns del "$node" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m# %s\033[0m\n' "$*"; }

say "a node: network namespace $node"
ip netns add "$node"
ip -n "$node" link set lo up

say "the agent, on its defaults (only the paths moved into $work)"
sock="$work/cellium.sock"
ip netns exec "$node" "$bin/cellium-agent" run \
  --state-dir "$work/state" --api-socket "$sock" >"$work/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$work/agent.log"; echo "the agent did not start" >&2; exit 1; }

say "cellium status --verbose"
"$bin/cellium" --socket "$sock" status --verbose

say "stopping the agent (SIGTERM)"
kill -TERM "$agent_pid"; wait "$agent_pid"; agent_pid=""
tail -n 5 "$work/agent.log"
