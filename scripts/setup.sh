#!/usr/bin/env bash
# Installs what Cellium needs to build, test and demo on Debian 12, as root.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

packages=(
  # Build: BPF objects (clang), vendored libbpf (libelf, zlib), gRPC codegen (protoc).
  clang make pkg-config gcc libc6-dev libelf-dev zlib1g-dev linux-libc-dev protobuf-compiler
  # Network namespaces, veths, probes; iptables to show what bypasses a node's netfilter.
  iproute2 iputils-ping iptables
  # Rendering `cellium-agent hive --dot`.
  graphviz
  # A real CNI runtime, the reference plugins (tests and benchmarks), and the static busybox
  # the podman test builds its containers' root filesystem from.
  podman runc containernetworking-plugins busybox-static
  # Benchmarks.
  iperf3 sockperf
  # kvstore mode: a real etcd (3.4) that the tests and benchmarks start with their own data
  # directories and ports, and etcdctl to look at what agents wrote.
  etcd-server etcd-client
  # The etcd client crate compiles etcd's protos, which import protobuf's well-known types.
  libprotobuf-dev
  # HTTP servers and clients inside the demo's pods, and a container rootfs for podman tests.
  busybox-static
)

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages and later creates network namespaces)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CI machine has no rustfmt or clippy component unless rustup adds them.
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >/dev/null 2>&1 || true
  done
fi
