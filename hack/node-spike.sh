#!/usr/bin/env bash
# SPIKE (issue 15, in progress): one real node, real-node-0, beside the kwok
# node of a running local cluster. Not used by `hack/cluster.sh up`,
# `hack/e2e.sh`, the demo or CI.
#
#   hack/cluster.sh up            first: the control plane
#   hack/node-spike.sh up         build (cached, hack/build-node-bins.sh), start containerd and
#                                 kubelet inside the cluster's netns, wait for the node to be Ready
#   hack/node-spike.sh pod        run a pod of the pause image on the node (a container really runs)
#   hack/node-spike.sh web        a busybox httpd pod (image from Debian's busybox-static, written by
#                                 hack/oci-image.py) and one HTTP GET to its pod IP from the netns
#   hack/node-spike.sh proxy      after `web`: kube-proxy (iptables mode) in the netns, a Service for
#                                 spike-web, and a GET to its ClusterIP from the netns
#   hack/node-spike.sh status     the node, its pods, containerd's containers
#   hack/node-spike.sh down       stop both, clean mounts, cgroups and state (run BEFORE
#                                 `hack/cluster.sh down`, which does not know about the node)
#
# Shape, and why (docs/development/local-cluster.md#real-node-in-progress):
# - containerd and kubelet enter only the network namespace (nsenter --net), not the mount
#   namespace `ip netns exec` makes: that one remounts /sys (hiding /sys/fs/cgroup) and would give
#   kubelet and containerd different views of the pod volume mounts.
# - The node's InternalIP is 10.99.0.1, an address on the netns' `lo` (kubelet refuses a loopback
#   node IP, and the netns must keep `lo` as its only interface). Pods get 10.88.0.0/24 on the
#   bridge vwsbr0 inside the netns; nothing leaves it.
# - The node registers with the taint vws.dev/real-node=spike:NoSchedule, so nothing of the tests
#   or the demo lands there; kubelet uses a node certificate (system:node:real-node-0), so the
#   Node authorizer and NodeRestriction apply as on a real cluster.
# - cgroup v1 (this machine): failCgroupV1: false, cgroupfs on both sides.
source "$(dirname "$0")/lib.sh"

NETNS="${VWS_NETNS:-vws-e2e}"
NODE_NAME=real-node-0
NODE_IP=10.99.0.1
POD_SUBNET=10.88.0.0/24
BRIDGE=vwsbr0
TAINT_KEY=vws.dev/real-node
ND="$CLUSTER_DIR/node"          # the node's state: containerd, kubelet, CNI config
PID_DIR="$CLUSTER_DIR/pids"
LOG_DIR="$CLUSTER_DIR/logs"
SOCK="$ND/containerd/containerd.sock"

[[ $EUID -eq 0 ]] || die "run as root (the node enters the cluster's network namespace)"
in_netns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }
kubectl_() { in_netns "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
ctr_() { in_netns "$NODE_DIR/bin/ctr" --address "$SOCK" -n k8s.io "$@"; }

pid_of() { local f="$PID_DIR/$1.pid"; [[ -f $f ]] && cat "$f"; }
is_ours() { # pid: alive and its command line points into the node cache or the cluster dir
  [[ -n $1 && -r /proc/$1/cmdline ]] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -q -e "$NODE_DIR" -e "$CLUSTER_DIR"
}
running() { local p; p=$(pid_of "$1") && is_ours "$p"; }

start() { # name cmd...: in the netns only (host mount namespace), own session, pidfile, log
  local name=$1; shift
  if running "$name"; then log "$name already running"; return; fi
  mkdir -p "$PID_DIR" "$LOG_DIR"
  in_netns setsid bash -c 'echo $$ > "$0"; exec "$@"' "$PID_DIR/$name.pid" "$@" \
    >> "$LOG_DIR/$name.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [[ -s $PID_DIR/$name.pid ]] && break; sleep 0.1; done
  log "started $name (pid $(pid_of "$name"), log $LOG_DIR/$name.log)"
}
stop() { # name: SIGTERM, then SIGKILL after 10 s
  local name=$1 pid
  pid=$(pid_of "$name") || return 0
  if is_ours "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $name"
  fi
  rm -f "$PID_DIR/$name.pid"
}

node_certs() {
  local d=$ND/kubelet
  mkdir -p "$d/pki"
  if [[ ! -f $d/pki/node.crt ]]; then
    openssl req -newkey rsa:2048 -nodes -subj "/CN=system:node:$NODE_NAME/O=system:nodes" \
      -keyout "$d/pki/node.key" -out "$d/pki/node.csr" 2>/dev/null
    openssl x509 -req -in "$d/pki/node.csr" -CA "$CLUSTER_DIR/ca.crt" -CAkey "$CLUSTER_DIR/ca.key" \
      -CAcreateserial -days 3650 -out "$d/pki/node.crt" \
      -extfile <(printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n') 2>/dev/null
    rm -f "$d/pki/node.csr"
  fi
  cat > "$d/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: vws-e2e, cluster: {server: "https://127.0.0.1:6443", certificate-authority: $CLUSTER_DIR/ca.crt}}]
users: [{name: $NODE_NAME, user: {client-certificate: $d/pki/node.crt, client-key: $d/pki/node.key}}]
contexts: [{name: vws-e2e, context: {cluster: vws-e2e, user: $NODE_NAME}}]
current-context: vws-e2e
EOF
}

write_configs() {
  mkdir -p "$ND/containerd" "$ND/cni/net.d" "$ND/cni/ipam" "$ND/kubelet/root" "$ND/pod-logs"
  cat > "$ND/containerd/config.toml" <<EOF
version = 3
root = '$ND/containerd/root'
state = '$ND/containerd/state'

[grpc]
  address = '$SOCK'
[ttrpc]
  address = '$SOCK.ttrpc'
[debug]
  address = '$ND/containerd/debug.sock'
  level = 'info'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$PAUSE_IMAGE'
  [plugins.'io.containerd.cri.v1.runtime']
    # Pod network namespaces under the state dir, not /var/run/netns (keeps \`ip netns list\` clean).
    netns_mounts_under_state_dir = true
    # This machine withholds CAP_SYS_RESOURCE (bit 24 of CapEff 000001fffeffffff), so no
    # process may lower its oom_score_adj; kubelet asks -998 for sandboxes, and runc init
    # then fails with "failed to update /proc/self/oom_score_adj: Permission denied".
    # This clamps every requested value to containerd's own (as for rootless containerd).
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$NODE_DIR/bin/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$NODE_DIR/cni/bin']
      conf_dir = '$ND/cni/net.d'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
EOF
  # bridge + host-local (loopback is added by containerd itself). No portmap in the chain:
  # it needs iptables, which this machine does not have (nor does kube-proxy yet).
  cat > "$ND/cni/net.d/10-vws.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vws-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]],
               "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$ND/cni/ipam"}
    }
  ]
}
EOF
  cat > "$ND/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 (hybrid); kubelet >= 1.35 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CLUSTER_DIR/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
failSwapOn: false
podLogsDir: $ND/pod-logs
registerWithTaints:
- {key: $TAINT_KEY, value: spike, effect: NoSchedule}
# The disk is shared with the build caches: do not let image GC or eviction act on it.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
}

cmd_up() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build) || die "no cluster binaries; run hack/cluster.sh up first"
  [[ -e /run/netns/$NETNS ]] || die "netns $NETNS does not exist; run hack/cluster.sh up first"
  kubectl_ get --raw /readyz >/dev/null 2>&1 || die "the cluster's API server is not ready; run hack/cluster.sh up first"
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh")
  log "node binaries: $NODE_DIR"

  # The node's address on lo: kubelet refuses 127.0.0.1 as a node IP.
  in_netns ip addr show dev lo | grep -q "inet $NODE_IP/" || in_netns ip addr add "$NODE_IP/32" dev lo
  node_certs
  write_configs

  local t0=$SECONDS
  start node-containerd env PATH="$NODE_DIR/bin:$PATH" "$NODE_DIR/bin/containerd" --config "$ND/containerd/config.toml"
  local deadline=$((SECONDS + 60))
  until ctr_ version >/dev/null 2>&1; do
    running node-containerd || { tail -n 30 "$LOG_DIR/node-containerd.log" >&2; die "containerd exited"; }
    (( SECONDS < deadline )) || { tail -n 30 "$LOG_DIR/node-containerd.log" >&2; die "containerd not ready after 60s"; }
    sleep 0.5
  done
  log "containerd ready in $((SECONDS - t0))s"
  ctr_ images import --all-platforms "$NODE_DIR/images/pause.oci.tar" >&2
  ctr_ images ls -q >&2

  start node-kubelet "$NODE_DIR/bin/kubelet" --config="$ND/kubelet/config.yaml" \
    --kubeconfig="$ND/kubelet/kubeconfig" --root-dir="$ND/kubelet/root" --cert-dir="$ND/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=2
  deadline=$((SECONDS + 120))
  until [[ $(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; do
    running node-kubelet || { tail -n 40 "$LOG_DIR/node-kubelet.log" >&2; die "kubelet exited; see $LOG_DIR/node-kubelet.log"; }
    if (( SECONDS > deadline )); then
      kubectl_ get node "$NODE_NAME" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
      grep -E '^E[0-9]{4}' "$LOG_DIR/node-kubelet.log" | tail -n 20 >&2 || true
      die "node $NODE_NAME not Ready after 120s; see $LOG_DIR/node-kubelet.log and node-containerd.log"
    fi
    sleep 1
  done
  log "node $NODE_NAME Ready $((SECONDS - t0))s after containerd started"
  kubectl_ get nodes -o wide >&2
}

cmd_pod() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build)
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh" --no-build) || die "no node binaries; run hack/node-spike.sh up"
  kubectl_ apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: spike-pause, namespace: default, labels: {app: node-spike}}
spec:
  nodeName: $NODE_NAME
  tolerations: [{key: $TAINT_KEY, operator: Exists, effect: NoSchedule}]
  automountServiceAccountToken: true
  containers:
  - name: pause
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
    securityContext:
      runAsNonRoot: true
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
EOF
  kubectl_ wait --for=condition=Ready --timeout=90s pod/spike-pause || {
    kubectl_ describe pod spike-pause | tail -n 25 >&2; die "pod spike-pause not Ready"; }
  kubectl_ get pod spike-pause -o wide >&2
  ctr_ containers ls >&2
}

cmd_web() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build)
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh" --no-build) || die "no node binaries; run hack/node-spike.sh up"
  if ! file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then
    apt-get update -qq && apt-get install -y -qq busybox-static >/dev/null
  fi
  local img=localhost/vws/busybox:spike tar=$ND/busybox.oci.tar
  mkdir -p "$ND/web"
  printf 'hello from %s\n' "$NODE_NAME" > "$ND/web/index.html"
  python3 "$HACK_DIR/oci-image.py" --out "$tar" --name "$img" --user 65532:65532 \
    --entrypoint /bin/busybox /bin/busybox:/bin/busybox "$ND/web/index.html:/www/index.html:0644" >&2
  ctr_ images import "$tar" >&2
  kubectl_ apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: spike-web, namespace: default, labels: {app: node-spike}}
spec:
  nodeName: $NODE_NAME
  tolerations: [{key: $TAINT_KEY, operator: Exists, effect: NoSchedule}]
  containers:
  - name: httpd
    image: $img
    imagePullPolicy: Never
    args: [httpd, -f, -p, "8080", -h, /www]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /index.html, port: 8080}, periodSeconds: 2}
    securityContext:
      runAsNonRoot: true
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
EOF
  kubectl_ wait --for=condition=Ready --timeout=90s pod/spike-web || {
    kubectl_ describe pod spike-web | tail -n 25 >&2; die "pod spike-web not Ready"; }
  local ip; ip=$(kubectl_ get pod spike-web -o 'jsonpath={.status.podIP}')
  log "spike-web Ready (readiness probe by kubelet passed), pod IP $ip; GET from the netns:"
  in_netns curl -fsS "http://$ip:8080/index.html"
}

cmd_proxy() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build)
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh" --no-build) || die "no node binaries; run hack/node-spike.sh up"
  in_netns ip link show "$BRIDGE" >/dev/null 2>&1 || die "no bridge $BRIDGE yet; run hack/node-spike.sh web first"
  if ! command -v iptables >/dev/null || ! command -v conntrack >/dev/null; then
    apt-get update -qq && apt-get install -y -qq iptables conntrack >/dev/null
  fi
  # Spike shortcut: the admin kubeconfig (a real node would use system:kube-proxy / system:node-proxier).
  cat > "$ND/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG_PATH}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_SUBNET
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
EOF
  start node-kube-proxy "$NODE_DIR/bin/kube-proxy" --config "$ND/kube-proxy.yaml" --v=2
  # The netns has no default route: without a route to the Service range, a connect() to a
  # ClusterIP fails (network unreachable) before kube-proxy's DNAT in OUTPUT can apply.
  in_netns ip route replace 10.96.0.0/16 dev "$BRIDGE"
  kubectl_ label pod spike-web --overwrite role=web >/dev/null
  kubectl_ apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: spike-web, namespace: default}
spec:
  selector: {role: web}
  ports: [{port: 80, targetPort: 8080}]
EOF
  local ip deadline=$((SECONDS + 30))
  ip=$(kubectl_ get svc spike-web -o 'jsonpath={.spec.clusterIP}')
  until in_netns curl -fsS -m 2 "http://$ip/index.html"; do
    (( SECONDS < deadline )) || { tail -n 20 "$LOG_DIR/node-kube-proxy.log" >&2; die "ClusterIP $ip does not answer"; }
    sleep 1
  done
  log "Service spike-web: ClusterIP $ip answers through kube-proxy"
}

cmd_status() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build)
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh" --no-build) || true
  local c; for c in node-containerd node-kubelet node-kube-proxy; do
    if running "$c"; then echo "$c: running (pid $(pid_of "$c"))"; else echo "$c: stopped"; fi
  done
  kubectl_ get nodes -o wide || true
  kubectl_ get pods -A -o wide --field-selector "spec.nodeName=$NODE_NAME" || true
  running node-containerd && ctr_ containers ls || true
}

cmd_down() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build) || true
  # NODE_DIR as lib.sh computes it: the same directory `up` used, built or not.
  if [[ -e /run/netns/$NETNS ]] && kubectl_ get --raw /readyz >/dev/null 2>&1; then
    # Let kubelet tear its pods down (volumes, sandboxes, CNI) while it still runs.
    kubectl_ delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=2 --wait=true --timeout=60s >/dev/null 2>&1 || true
  fi
  if running node-kube-proxy; then
    stop node-kube-proxy
    in_netns "$NODE_DIR/bin/kube-proxy" --cleanup >/dev/null 2>&1 || true   # its iptables rules
    kubectl_ delete svc spike-web -n default --ignore-not-found >/dev/null 2>&1 || true
  fi
  stop node-kubelet
  if running node-containerd; then
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$t" >/dev/null 2>&1 || true; done
  fi
  stop node-containerd
  # Shims outlive containerd by design; they are ours if their command line points into the node cache.
  local p
  for p in $(pgrep -f "$NODE_DIR/bin/containerd-shim-runc-v2" || true); do is_ours "$p" && kill -9 "$p" 2>/dev/null || true; done
  # Mounts kubelet and containerd left (pod volumes, rootfs, netns), deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v d="$ND" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  # Cgroups kubelet created (cgroupfs driver, cgroup v1): empty ones only, deepest first.
  find /sys/fs/cgroup/*/kubepods* -depth -type d -exec rmdir {} + 2>/dev/null || true
  if [[ -e /run/netns/$NETNS ]]; then
    in_netns ip link del "$BRIDGE" 2>/dev/null || true
    in_netns ip addr del "$NODE_IP/32" dev lo 2>/dev/null || true
    kubectl_ delete node "$NODE_NAME" --ignore-not-found >/dev/null 2>&1 || true
  fi
  if awk -v d="$ND" 'index($5, d) == 1' /proc/self/mountinfo | grep -q .; then
    log "WARNING: mounts left under $ND; not deleting it"
  else
    rm -rf "$ND"
  fi
  log "node $NODE_NAME down"
}

case "${1:-}" in
  up) cmd_up ;;
  pod) cmd_pod ;;
  web) cmd_web ;;
  proxy) cmd_proxy ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) echo "usage: $0 up|pod|web|proxy|status|down" >&2; exit 2 ;;
esac
