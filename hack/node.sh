# The real node, real-node-0: containerd, kubelet and kube-proxy inside the
# cluster's network namespace, beside the kwok node. Sourced by hack/cluster.sh,
# which starts it in `up` (unless VWS_REAL_NODE=0) and stops it in `down`; uses
# cluster.sh's helpers (start, stop_component, running, in_netns, kubectl_).
#
# Shape, and why (docs/development/local-cluster.md#the-real-node):
# - The components enter only the network namespace (nsenter --net), not the mount
#   namespace `ip netns exec` makes: that one remounts /sys (hiding /sys/fs/cgroup) and
#   would give kubelet and containerd different views of the pod volume mounts.
# - The node's InternalIP is 10.99.0.1, an address on the netns' `lo` (kubelet refuses a
#   loopback node IP). kube-apiserver listens on it too and advertises it, so the
#   `kubernetes` Service has a real endpoint and pods use in-cluster config.
# - Pods get 10.88.0.0/24 on the bridge vwsbr0 inside the netns. The namespace then holds
#   lo, that bridge and one veth per pod, and no route leaves it (no default route).
# - The node registers with the taint vws.dev/real-node=true:NoSchedule: a pod lands there
#   only if it asks (toleration + nodeSelector kubernetes.io/hostname: real-node-0); the
#   kwok node keeps everything else, so the kwok-based tests and benchmarks do not change.
# - kubelet, kube-proxy and the API server's kubelet client each have their own
#   certificate signed by the cluster CA (system:node:real-node-0, system:kube-proxy,
#   kube-apiserver-kubelet-client), so the Node authorizer, NodeRestriction and RBAC apply
#   as on a real cluster.
# - cgroup v1 (this machine): failCgroupV1: false, cgroupfs on both sides.

NODE_NAME=real-node-0
NODE_IP=10.99.0.1
POD_SUBNET=10.88.0.0/24
POD_GATEWAY=10.88.0.1
SERVICE_CIDR=10.96.0.0/16
CLUSTER_DNS=10.96.0.10
NODE_BRIDGE=vwsbr0
NODE_TAINT_KEY=vws.dev/real-node
NODE_COMPONENTS=(node-containerd node-kubelet node-kube-proxy)
ND="$CLUSTER_DIR/node"          # the node's state: containerd, kubelet, CNI, volumes
NODE_SOCK="$ND/containerd/containerd.sock"
# The node's own cgroup root (kubelet's cgroupRoot; pods go to $NODE_CGROUP_ROOT/kubepods),
# so that kubelets of two clusters never see, or clean up, each other's pod cgroups.
NODE_CGROUP_ROOT="/vws-node-$CLUSTER_ID"

real_node_enabled() { [[ ${VWS_REAL_NODE:-1} != 0 && $PROFILE == full ]]; }
ctr_() { in_netns "$NODE_DIR/bin/ctr" --address "$NODE_SOCK" -n k8s.io "$@"; }

# sign NAME SUBJECT EXT: a key and a certificate signed by the cluster CA, in $CLUSTER_DIR/pki.
sign_cert() {
  local name=$1 subject=$2 ext=$3 p=$CLUSTER_DIR/pki
  mkdir -p "$p"
  [[ -f $p/$name.crt ]] && return
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$p/$name.key" -out "$p/$name.csr" 2>/dev/null
  openssl x509 -req -in "$p/$name.csr" -CA "$CLUSTER_DIR/ca.crt" -CAkey "$CLUSTER_DIR/ca.key" \
    -CAcreateserial -days 3650 -out "$p/$name.crt" -extfile <(printf '%b' "$ext") 2>/dev/null
  rm -f "$p/$name.csr"
}
client_ext='extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n'

# Certificates the node needs; the API server's kubelet client is made in gen_certs
# (cluster.sh), because the API server starts before the node.
node_certs() {
  sign_cert kubelet "/CN=system:node:$NODE_NAME/O=system:nodes" "$client_ext"
  sign_cert kubelet-serving "/CN=system:node:$NODE_NAME/O=system:nodes" \
    "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
  sign_cert kube-proxy "/CN=system:kube-proxy" "$client_ext"
  local who
  for who in kubelet kube-proxy; do
    cat > "$ND/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: vws-e2e, cluster: {server: "$APISERVER", certificate-authority: $CLUSTER_DIR/ca.crt}}]
users: [{name: $who, user: {client-certificate: $CLUSTER_DIR/pki/$who.crt, client-key: $CLUSTER_DIR/pki/$who.key}}]
contexts: [{name: vws-e2e, context: {cluster: vws-e2e, user: $who}}]
current-context: vws-e2e
EOF
  done
}

# The netns side of the node's network, before any pod: the bridge with its gateway
# address, and a route for the Service range through it. Without that route a connect()
# to a ClusterIP from the netns fails (network unreachable) before kube-proxy's DNAT in
# OUTPUT applies. br_netfilter (built into this kernel, per netns) makes replies that stay
# on the bridge (pod to a Service backed by a pod) pass through conntrack.
node_network() {
  [[ -n $(in_netns ip -o addr show dev lo to "$NODE_IP/32") ]] || in_netns ip addr add "$NODE_IP/32" dev lo
  if ! in_netns ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    in_netns ip link add "$NODE_BRIDGE" type bridge
    in_netns ip addr add "$POD_GATEWAY/24" dev "$NODE_BRIDGE"
  fi
  in_netns ip link set "$NODE_BRIDGE" up
  in_netns ip route replace "$SERVICE_CIDR" dev "$NODE_BRIDGE"
  in_netns sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.ipv4.ip_forward=1
}

node_write_configs() {
  mkdir -p "$ND/containerd" "$ND/cni/net.d" "$ND/cni/ipam" "$ND/kubelet/root" "$ND/pod-logs" "$ND/storage"
  cat > "$ND/containerd/config.toml" <<EOF
version = 3
root = '$ND/containerd/root'
state = '$ND/containerd/state'

[grpc]
  address = '$NODE_SOCK'
[ttrpc]
  address = '$NODE_SOCK.ttrpc'
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
  # bridge + host-local + portmap (containerd adds loopback itself). The bridge exists
  # already (node_network); the plugin adopts it.
  cat > "$ND/cni/net.d/10-vws.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vws-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$POD_GATEWAY"}]],
               "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$ND/cni/ipam"}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat > "$ND/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 (hybrid); kubelet >= 1.35 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $NODE_CGROUP_ROOT
containerRuntimeEndpoint: unix://$NODE_SOCK
imageServiceEndpoint: unix://$NODE_SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $CLUSTER_DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $CLUSTER_DIR/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CLUSTER_DIR/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$CLUSTER_DNS]
# Pods must not inherit the machine's resolvers (unreachable from the netns).
resolvConf: $ND/resolv.conf
failSwapOn: false
podLogsDir: $ND/pod-logs
registerWithTaints:
- {key: $NODE_TAINT_KEY, value: "true", effect: NoSchedule}
# The disk and the memory are shared with the builds (a cold target/ grows by gigabytes
# while the node runs): the kubelet must not count them against the node's pods. Every
# eviction signal is off ("0%" disables one: pkg/kubelet/eviction/helpers.go), so no
# DiskPressure or MemoryPressure condition taints the node, rejects new pods or deletes
# images; image GC is off too.
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  : > "$ND/resolv.conf"
  cat > "$ND/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $ND/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
mode: iptables
clusterCIDR: $POD_SUBNET
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
EOF
}

# Debian's iptables and conntrack, for kube-proxy (and portmap); installed when missing.
node_packages() {
  command -v iptables >/dev/null && command -v conntrack >/dev/null && return
  log "installing Debian packages iptables conntrack (kube-proxy)"
  "$HACK_DIR/apt-install.sh" iptables conntrack
}

# import_images FILE...: OCI archives into the node's containerd (k8s.io namespace).
import_images() {
  local f
  # Output only on failure: ctr warns on every call that cgroup v1 is deprecated.
  local out
  for f in "$@"; do
    out=$(ctr_ images import --all-platforms "$f" 2>&1) || die "importing $f into the node failed: $out"
  done
}

# The cgroup root in every v1 hierarchy (kubelet requires it to exist); cpuset needs its
# cpus and mems set before a process may join a child.
node_cgroup_root() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ $h == */unified/ || ! -e $h/cgroup.procs ]] && continue
    mkdir -p "$h$NODE_CGROUP_ROOT"
  done
  local cs=/sys/fs/cgroup/cpuset
  if [[ -d $cs$NODE_CGROUP_ROOT ]]; then
    cat "$cs/cpuset.cpus" > "$cs$NODE_CGROUP_ROOT/cpuset.cpus"
    cat "$cs/cpuset.mems" > "$cs$NODE_CGROUP_ROOT/cpuset.mems"
  fi
}

# Every process in the node's cgroup root: the containers. A run killed without `down`
# leaves them behind (their shims die, they do not).
node_kill_pods() {
  local f pid
  for f in /sys/fs/cgroup/pids"$NODE_CGROUP_ROOT" /sys/fs/cgroup/memory"$NODE_CGROUP_ROOT"; do
    [[ -d $f ]] || continue
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < <(find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null)
  done
}

node_up() {
  local t0=$SECONDS
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh")
  node_packages
  node_cgroup_root
  node_network
  mkdir -p "$ND"
  node_certs
  node_write_configs
  start node-containerd env PATH="$NODE_DIR/bin:$PATH" "$NODE_DIR/bin/containerd" --config "$ND/containerd/config.toml"
  local deadline=$((SECONDS + 60))
  until ctr_ version >/dev/null 2>&1; do
    running node-containerd || { tail -n 30 "$LOG_DIR/node-containerd.log" >&2; die "containerd exited"; }
    (( SECONDS < deadline )) || { tail -n 30 "$LOG_DIR/node-containerd.log" >&2; die "containerd not ready after 60s"; }
    sleep 0.3
  done
  import_images "$NODE_DIR"/images/*.oci.tar
  start node-kubelet "$NODE_DIR/bin/kubelet" --config="$ND/kubelet/config.yaml" \
    --kubeconfig="$ND/kubelet.kubeconfig" --root-dir="$ND/kubelet/root" --cert-dir="$ND/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
  start node-kube-proxy "$NODE_DIR/bin/kube-proxy" --config "$ND/kube-proxy.yaml" --v=1
  deadline=$((SECONDS + 120))
  until [[ $(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; do
    running node-kubelet || { tail -n 40 "$LOG_DIR/node-kubelet.log" >&2; die "kubelet exited; see $LOG_DIR/node-kubelet.log"; }
    if (( SECONDS > deadline )); then
      kubectl_ get node "$NODE_NAME" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
      grep -E '^E[0-9]{4}' "$LOG_DIR/node-kubelet.log" | tail -n 20 >&2 || true
      die "node $NODE_NAME not Ready after 120s; see $LOG_DIR/node-kubelet.log and node-containerd.log"
    fi
    sleep 0.5
  done
  kubectl_ label node "$NODE_NAME" --overwrite type=real >/dev/null
  log "node $NODE_NAME Ready in $((SECONDS - t0))s"
  node_addons
  node_velero
}

# Velero's node-agent on the real node, for file-system backups of pod volumes (Kopia, to
# moto): the DaemonSet `velero install --use-node-agent` writes (v1.18), with the node's
# kubelet pod directory as /host_pods, the credentials the server uses, and placement on
# real-node-0. The Velero server stays out of cluster; restores take the restore helper
# image from the scaled-to-zero Deployment, which this import also puts on the node.
node_velero() {
  local t0=$SECONDS images
  images=$(VWS_IMAGES=velero "$HACK_DIR/build-images.sh" "$ND/images-velero")
  import_images "$images/velero.oci.tar"
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f - >/dev/null <<EOF || die "applying Velero's node-agent failed"
apiVersion: v1
kind: ServiceAccount
metadata: {name: velero, namespace: $VELERO_NS, labels: {component: velero}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: velero, labels: {component: velero}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: velero, namespace: $VELERO_NS}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-agent, namespace: $VELERO_NS, labels: {component: velero}}
spec:
  selector: {matchLabels: {name: node-agent}}
  template:
    metadata: {labels: {component: velero, name: node-agent, role: node-agent}}
    spec:
      serviceAccountName: velero
      securityContext: {runAsUser: 0}
      nodeSelector: {kubernetes.io/hostname: $NODE_NAME}
      tolerations: [{key: $NODE_TAINT_KEY, operator: Exists, effect: NoSchedule}]
      containers:
      - name: node-agent
        image: velero/velero:$VELERO_VERSION
        imagePullPolicy: Never
        command: [/velero]
        args: [node-agent, server, --features=]
        env:
        - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        - {name: VELERO_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: VELERO_SCRATCH_DIR, value: /scratch}
        - {name: AWS_SHARED_CREDENTIALS_FILE, value: /credentials/cloud}
        - {name: AWS_EC2_METADATA_DISABLED, value: "true"}
        ports: [{containerPort: 8085, name: metrics}]
        volumeMounts:
        - {name: host-pods, mountPath: /host_pods, mountPropagation: HostToContainer}
        - {name: scratch, mountPath: /scratch}
        - {name: cloud-credentials, mountPath: /credentials}
      volumes:
      - {name: host-pods, hostPath: {path: $ND/kubelet/root/pods}}
      - {name: scratch, emptyDir: {}}
      - {name: cloud-credentials, secret: {secretName: cloud-credentials}}
EOF
  kubectl_ rollout status --timeout=120s -n "$VELERO_NS" daemonset/node-agent >/dev/null ||
    die "Velero's node-agent not Available after 120s (kubectl -n $VELERO_NS logs ds/node-agent)"
  log "Velero node-agent Available on $NODE_NAME in $((SECONDS - t0))s"
}

# Cluster add-ons on the real node: CoreDNS (Service kube-dns, 10.96.0.10) and the
# local-path provisioner with the default StorageClass. Manifests in hack/node/, images
# from the node cache; the provisioner's helper pods use the busybox image that
# hack/build-images.sh writes (group `test`: busybox and the test charts' images, a few
# MB, so those are on the node too).
node_addons() {
  local images busybox f
  images=$(VWS_IMAGES=test "$HACK_DIR/build-images.sh" "$ND/images")
  import_images "$images"/*.oci.tar
  busybox=$(awk '$1 == "busybox.oci.tar" {print $2; exit}' "$images/images.txt")
  [[ -n $busybox ]] || die "no busybox image in $images/images.txt"
  for f in "$HACK_DIR"/node/*.yaml; do
    sed -e "s|@NODE_STORAGE_DIR@|$ND/storage|g" -e "s|@BUSYBOX_IMAGE@|$busybox|g" "$f" |
      kubectl_ apply --server-side --field-manager=vws-cluster-up -f - >/dev/null || die "applying $f failed"
  done
  local t0=$SECONDS
  kubectl_ rollout status --timeout=120s -n kube-system deployment/coredns >/dev/null ||
    die "CoreDNS not Available after 120s (kubectl -n kube-system describe pods -l k8s-app=kube-dns)"
  kubectl_ rollout status --timeout=120s -n local-path-storage deployment/local-path-provisioner >/dev/null ||
    die "local-path-provisioner not Available after 120s (kubectl -n local-path-storage logs deploy/local-path-provisioner)"
  log "CoreDNS and local-path-provisioner Available in $((SECONDS - t0))s"
}

node_status() {
  local c
  for c in "${NODE_COMPONENTS[@]}"; do
    if running "$c"; then printf '%-24s running (pid %s)\n' "$c" "$(pid_of "$c")"; else printf '%-24s stopped\n' "$c"; fi
  done
}

node_down() {
  NODE_DIR=$("$HACK_DIR/build-node-bins.sh" --no-build) || true
  local any=0 c
  for c in "${NODE_COMPONENTS[@]}"; do running "$c" && any=1; done
  [[ -d $ND ]] || (( any )) || return 0
  if (( any )) && [[ -e /run/netns/$NETNS ]] && kubectl_ get --raw /readyz >/dev/null 2>&1; then
    # Let kubelet tear its pods down (volumes, sandboxes, CNI) while it still runs.
    kubectl_ delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  fi
  if running node-kube-proxy; then
    stop_component node-kube-proxy
    in_netns "$NODE_DIR/bin/kube-proxy" --cleanup >/dev/null 2>&1 || true   # its iptables rules
  fi
  stop_component node-kubelet
  if running node-containerd; then
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 0.5
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$t" >/dev/null 2>&1 || true; done
  fi
  stop_component node-containerd
  # Shims outlive containerd by design; ours name our containerd's socket (-address).
  local p
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $NODE_SOCK( |\$)" || true); do kill -9 "$p" 2>/dev/null || true; done
  node_kill_pods
  # Mounts kubelet and containerd left (pod volumes, rootfs, netns files), deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v d="$ND" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  # The node's cgroups (cgroupfs driver, cgroup v1), now empty: deepest first.
  sleep 0.2
  find /sys/fs/cgroup/*"$NODE_CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
  if [[ -e /run/netns/$NETNS ]]; then
    kubectl_ delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  if awk -v d="$ND" 'index($5, d) == 1' /proc/self/mountinfo | grep -q .; then
    log "WARNING: mounts left under $ND; not deleting it"
  else
    rm -rf "$ND"
  fi
  log "node $NODE_NAME down"
}
