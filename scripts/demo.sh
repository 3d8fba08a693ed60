#!/usr/bin/env bash
# The demo: the Cellium agent on its embedded default configuration in a throw-away node network
# namespace, pods created through the cellium-cni plugin exactly as a container runtime calls it,
# traffic between them, a ClusterIP service balancing over two of them, and a network policy
# enforced on it all. Everything it creates is removed at the end, even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cargo build --workspace --locked --quiet
bin="$PWD/target/debug"

run_id="cel-demo-$$"
node="$run_id-node"
work=$(mktemp -d /tmp/cellium-demo.XXXXXX)
sock="$work/cellium.sock"
agent_pid=""
pods=()
servers=()

cleanup() {
  set +e
  for p in "${pods[@]}"; do ip netns del "$run_id-$p" 2>/dev/null; done
  for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null; done
  if [ -n "$agent_pid" ]; then kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; fi
  ip netns del "$node" 2>/dev/null
  umount "$work/bpf" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m# %s\033[0m\n' "$*"; }
cellium() { "$bin/cellium" --socket "$sock" "$@"; }

# The CNI call a runtime makes: the verb and the pod in the environment, the network
# configuration on stdin.
cni() {
  local verb=$1 pod=$2
  printf '{"cniVersion":"1.0.0","name":"demo","type":"cellium-cni","socket":"%s"}' "$sock" |
    CNI_COMMAND=$verb CNI_CONTAINERID="$run_id-$pod" CNI_NETNS="/run/netns/$run_id-$pod" \
      CNI_IFNAME=eth0 CNI_PATH="$bin" \
      CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=$pod" "$bin/cellium-cni"
}

in_pod() { local pod=$1; shift; ip netns exec "$run_id-$pod" "$@"; }
pod_ip() { in_pod "$1" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1; }

# An HTTP server in a pod, answering with the pod's name.
serve() {
  local pod=$1 dir="$work/www-$1"
  mkdir -p "$dir" && echo "hello from $pod" >"$dir/index.html"
  # Not through in_pod: a function in the background runs in a subshell, and $! must be the
  # server itself for the cleanup to stop it.
  ip netns exec "$run_id-$pod" busybox httpd -f -p 80 -h "$dir" &
  servers+=($!)
}

# GET / from a pod over bash's /dev/tcp (no HTTP client needed); prints the answer's body or
# "blocked" when no answer comes within a second.
get() {
  local from=$1 ip=$2 answer
  answer=$(in_pod "$from" timeout 1 bash -c \
    "exec 3<>/dev/tcp/$ip/80 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && cat <&3" 2>/dev/null | tail -n 1) || true
  echo "$from -> $ip:80: ${answer:-blocked}"
}

say "a node: network namespace $node"
ip netns add "$node"
ip -n "$node" link set lo up

say "the agent, on its defaults (only its paths moved into $work)"
# nsenter enters the node's network namespace only, so the bpffs the agent mounts at its BPF
# root lives in the host's mount namespace and outlives an agent restart.
nsenter --net="/run/netns/$node" -- "$bin/cellium-agent" run \
  --state-dir "$work/state" --api-socket "$sock" --bpf-root "$work/bpf" >"$work/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 300); do cellium status >/dev/null 2>&1 && break; sleep 0.1; done
cellium status || { cat "$work/agent.log"; exit 1; }

say "pods: cellium-cni ADD, as a container runtime calls it"
cat >"$work/pods.yaml" <<YAML
apiVersion: v1
kind: Namespace
metadata: { name: demo }
---
apiVersion: v1
kind: Pod
metadata: { name: web-1, namespace: demo, labels: { app: web } }
spec: { containers: [ { name: web, image: web, ports: [ { name: http, containerPort: 80 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: web-2, namespace: demo, labels: { app: web } }
spec: { containers: [ { name: web, image: web, ports: [ { name: http, containerPort: 80 } ] } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: client, namespace: demo, labels: { app: client } }
spec: { containers: [ { name: client, image: client } ] }
---
apiVersion: v1
kind: Pod
metadata: { name: other, namespace: demo, labels: { app: other } }
spec: { containers: [ { name: other, image: other } ] }
---
apiVersion: v1
kind: Service
metadata: { name: web, namespace: demo }
spec:
  selector: { app: web }
  ports: [ { name: http, port: 80, targetPort: http } ]
YAML
cellium apply -f "$work/pods.yaml"
for pod in web-1 web-2 client other; do
  ip netns add "$run_id-$pod"
  pods+=("$pod")
  cni ADD "$pod" >"$work/$pod.result"
  echo "$pod: $(pod_ip "$pod")"
done

say "cellium endpoint list"
cellium endpoint list

say "cellium ipam list"
cellium ipam list

say "the pods reach each other and the node"
for from in client other; do
  for to in web-1 web-2 client other; do
    [ "$from" = "$to" ] && continue
    in_pod "$from" ping -c 1 -W 1 "$(pod_ip "$to")" >/dev/null && echo "$from -> $to: ok"
  done
done
in_pod client ping -c 1 -W 1 "$(cellium ipam list -o json | awk -F'"' '/"router"/ && !found { print $4; found = 1 }')" >/dev/null &&
  echo "client -> node: ok"

say "HTTP servers in web-1 and web-2; everyone may reach them"
serve web-1
serve web-2
sleep 0.3
web_ip=$(pod_ip web-1)
get client "$web_ip"
get other "$web_ip"

say "the Service web: a ClusterIP balancing over the web pods (cellium service list)"
cellium service list
vip=$(cellium service list -o json | awk -F'"' '/"vip"/ && !found { print $4; found = 1 }')
for _ in 1 2 3 4 5 6; do get client "$vip"; done

say "a NetworkPolicy: the web pods accept HTTP from client only"
cat >"$work/policy.yaml" <<YAML
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: web-from-client, namespace: demo }
spec:
  podSelector: { matchLabels: { app: web } }
  ingress:
  - from: [ { podSelector: { matchLabels: { app: client } } } ]
    ports: [ { port: http } ]
YAML
cat "$work/policy.yaml"
cellium apply -f "$work/policy.yaml"
sleep 0.5
get client "$vip"
get other "$vip"
get other "$web_ip"
in_pod client ping -c 1 -W 1 "$web_ip" >/dev/null && echo "client -> web-1 (ping): ok" ||
  echo "client -> web-1 (ping): blocked (only TCP/80 is allowed)"

say "cellium endpoint get (web-1): its identity, policy revision and allowed peers"
cellium endpoint get "$(cellium endpoint list | awk '$3 == "demo/web-1" { print $1 }')"

say "cellium policy get"
cellium policy get

say "the policy deleted: other reaches the web pods again"
cellium delete -f "$work/policy.yaml"
sleep 0.5
get other "$vip"

say "cellium status --verbose"
cellium status --verbose

say "pods removed: cellium-cni DEL"
for pod in "${pods[@]}"; do cni DEL "$pod" && echo "$pod: deleted"; done
cellium endpoint list

say "stopping the agent (SIGTERM)"
kill -TERM "$agent_pid"; wait "$agent_pid"; agent_pid=""
tail -n 3 "$work/agent.log"
