#!/usr/bin/env bash
# Local Kubernetes with real Flux and real Velero (S3 served by moto), as local
# processes inside a network namespace whose only interface is loopback.
#
#   hack/cluster.sh up       build (cached) + start everything, wait for readiness
#   hack/cluster.sh down     stop our processes, delete state and the netns
#   hack/cluster.sh status   show processes and health
#   hack/cluster.sh exec CMD run CMD inside the cluster's network namespace
#   hack/cluster.sh env      print the environment for tools (KUBECONFIG, ...)
#   hack/cluster.sh restart-flux  restart only source-controller and helm-controller
#                            (e.g. to pick up new flags on a running cluster)
#   hack/cluster.sh stop-flux     stop only source-controller and helm-controller
#   hack/cluster.sh start-helm-controller  start helm-controller alone (after just chaos killed it)
#   hack/cluster.sh load-images ARCHIVE...  OCI archives into the real node's containerd
#   hack/cluster.sh start-registries  start (or restart) the OCI registry and the HTTPS chart
#                            repository on a running cluster, and push the test charts
#   hack/cluster.sh start-argocd  start real Argo CD (redis, repo-server, application controller)
#                            on demand; idempotent, also from inside `exec` (hack/argocd.sh)
#   hack/cluster.sh stop-argocd   stop it again (`down` stops it too)
#
# `up` starts one real node (real-node-0: containerd, kubelet, kube-proxy, CoreDNS and a
# volume provisioner; hack/node.sh) beside the kwok node, unless VWS_REAL_NODE=0.
#
# `up` also starts a peer cluster (etcd and kube-apiserver only, our CRDs) in a
# second loopback-only netns, for the tests that prove two clusters stay apart;
# `down` stops it too. VWS_CLUSTER_PROFILE=apiserver is that minimal profile.
#
# Recipe and pitfalls: docs/development/local-cluster.md.
source "$(dirname "$0")/lib.sh"

# One cluster per directory, each in its own network namespace and (real node) cgroup root,
# named after the directory: a clean clone's CI run and a developer's cluster on the same
# machine share nothing but the binary cache (ports are per namespace).
CLUSTER_ID=$(printf '%s' "$CLUSTER_DIR" | sha256sum | cut -c1-8)
NETNS="${VWS_NETNS:-vws-e2e-$CLUSTER_ID}"
PROFILE="${VWS_CLUSTER_PROFILE:-full}"
[[ $PROFILE == full || $PROFILE == apiserver ]] || die "VWS_CLUSTER_PROFILE must be full or apiserver, not $PROFILE"
PEER_NETNS="$NETNS-peer"
PEER_CLUSTER_DIR="$CLUSTER_DIR-peer"
PID_DIR="$CLUSTER_DIR/pids"
LOG_DIR="$CLUSTER_DIR/logs"
CHART_PORT=18879
# Authenticated chart sources (TLS with a private CA, basic auth), for the chart-source tests:
# an OCI registry (CNCF distribution) holding every test chart as a Helm OCI artifact under
# charts/<chart>:<version>, and a Helm repository over HTTPS serving the same charts. One CA,
# one user and password per cluster directory, in $REG_STATE (ca.crt, username, password).
REGISTRY_PORT=18881
HTTPS_CHART_PORT=18882
REG_STATE=$CLUSTER_DIR/registry
APISERVER=https://127.0.0.1:6443
# Velero and its object store (docs/development/local-cluster.md#velero-and-s3).
# Velero's controller-runtime manager also listens on :8080 (not configurable).
S3_PORT=18900
S3_URL=http://127.0.0.1:$S3_PORT
# What the BackupStorageLocation names: the node's address (on the netns' lo, where moto
# listens on every address), which the server out of cluster and the node-agent in a pod
# both reach.
S3_URL_FOR_VELERO=http://10.99.0.1:$S3_PORT
VELERO_METRICS_PORT=18901
VELERO_PROFILER_PORT=18902
VELERO_NS=velero
VELERO_BUCKET=velero
# The real node (containerd, kubelet, kube-proxy, CoreDNS, local-path-provisioner).
source "$HACK_DIR/node.sh"
# Argo CD, on demand only (start-argocd): `up` neither builds nor starts it.
source "$HACK_DIR/argocd.sh"

# Components; stopped in reverse order of this list.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok chart-server registry https-chart-server source-controller helm-controller moto velero)
if [[ $PROFILE == apiserver ]]; then COMPONENTS=(etcd kube-apiserver); fi

# The same script for the peer cluster: its own netns and directory, etcd and kube-apiserver only.
peer() { VWS_NETNS="$PEER_NETNS" VWS_CLUSTER_DIR="$PEER_CLUSTER_DIR" VWS_CLUSTER_PROFILE=apiserver "$0" "$@"; }

# Only the network namespace (nsenter --net), not the mount namespace `ip netns exec` makes:
# the real node's kubelet and containerd must see /sys/fs/cgroup and share the host's view
# of pod volume mounts (hack/node.sh). `exec` (tests, tools) still uses `ip netns exec`.
in_netns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

ensure_netns() {
  [[ $EUID -eq 0 ]] || die "the cluster runs in a network namespace; run as root (CI and dev machines are root)"
  if ! ip netns list | grep -qw "^$NETNS"; then
    ip netns add "$NETNS"
  fi
  in_netns ip link set lo up
  # Client sockets take ports 40000-60999 only: 20000-39999 stay for the listeners the tests
  # start (e2e::process::TEST_PORTS), which a client's source port could otherwise hold.
  in_netns sysctl -qw net.ipv4.ip_local_port_range="40000 60999"
  # The node IP (hack/node.sh) lives on lo; the API server advertises it, so it exists first.
  [[ -n $(in_netns ip -o addr show dev lo to "$NODE_IP/32") ]] || in_netns ip addr add "$NODE_IP/32" dev lo
  assert_contained
}

# Nothing may leave the namespace: its interfaces are lo, the real node's bridge and the
# veths of that node's pods (each enslaved to the bridge), and it has no default route.
# Anything else means someone added an interface or a way out: refuse.
# Name and master come from one listing: a pod's veth may go between two calls (a pod
# terminating while `exec` runs), and asking for it by name would then fail.
assert_contained() {
  local name master
  while read -r name master; do
    name=${name%%@*}
    [[ $name == lo || $name == "$NODE_BRIDGE" ]] && continue
    [[ $name == veth* && $master == "$NODE_BRIDGE" ]] && continue
    die "netns $NETNS has an interface other than lo, $NODE_BRIDGE and its veths: $name"
  done < <(in_netns ip -o link show | awk -F': ' '{
    master = ""
    if (match($0, / master [^ ]+/)) master = substr($0, RSTART + 8, RLENGTH - 8)
    print $2, master
  }')
  local default; default=$(in_netns ip route show default)
  [[ -z $default ]] || die "netns $NETNS has a default route: $default"
}

pid_of() { local f="$PID_DIR/$1.pid"; [[ -f $f ]] && cat "$f"; }
# A pid is ours only if it is alive and its command line points into our bin dir or cluster dir.
is_ours() {
  local pid=$1
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -e "$CACHE_ROOT" -e "$CLUSTER_DIR"
}
running() { local pid; pid=$(pid_of "$1") && is_ours "$pid"; }

start() { # name cmd...: start in background inside the netns, log to a file, record pid
  local name=$1; shift
  if running "$name"; then log "$name already running"; return; fi
  mkdir -p "$PID_DIR" "$LOG_DIR"
  # A pidfile left by a killed process would pass for the new one's until it is rewritten.
  rm -f "$PID_DIR/$name.pid"
  in_netns setsid bash -c 'echo $$ > "$0"; exec "$@"' "$PID_DIR/$name.pid" "$@" \
    >> "$LOG_DIR/$name.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [[ -s $PID_DIR/$name.pid ]] && break; sleep 0.1; done
  log "started $name (pid $(pid_of "$name"), log $LOG_DIR/$name.log)"
}

wait_for() { # name seconds cmd...: poll cmd inside the netns until it succeeds
  local name=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until in_netns "$@" >/dev/null 2>&1; do
    if ! running "$name"; then
      tail -n 30 "$LOG_DIR/$name.log" >&2 || true
      die "$name exited; see $LOG_DIR/$name.log"
    fi
    if (( SECONDS > deadline )); then
      tail -n 30 "$LOG_DIR/$name.log" >&2 || true
      die "$name not ready after ${secs}s; see $LOG_DIR/$name.log"
    fi
    sleep 0.5
  done
  log "$name ready"
}

gen_certs() {
  local d=$CLUSTER_DIR
  # Certificates from before the real node lack its SANs: make them again.
  if [[ -f $d/admin.crt && -f $d/apiserver.crt && -f $d/sa.key && -f $d/pki/apiserver-kubelet-client.crt ]] &&
     [[ $(openssl x509 -noout -ext subjectAltName -in "$d/apiserver.crt" 2>/dev/null) == *"IP Address:$NODE_IP"* ]]; then
    return
  fi
  rm -rf "$d/pki" "$d/node"
  log "generating certificates in $d"
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=vws-e2e-ca" -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    # 10.96.0.1 and kubernetes.default.svc: the `kubernetes` Service, for pods on the real node.
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' "$NODE_IP" > apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out apiserver.crt -extfile apiserver.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=vws-admin/O=system:masters" -keyout admin.key -out admin.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > client.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out admin.crt -extfile client.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr
  )
  # The API server's client identity towards kubelets (logs, exec, port-forward).
  sign_cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" "$client_ext"
  cat > "$KUBECONFIG_PATH" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: vws-e2e, cluster: {server: "$APISERVER", certificate-authority: $d/ca.crt}}]
users: [{name: admin, user: {client-certificate: $d/admin.crt, client-key: $d/admin.key}}]
contexts: [{name: vws-e2e, context: {cluster: vws-e2e, user: admin}}]
current-context: vws-e2e
EOF
}

# Things that need the module proxy happen before entering the netns.
prepare_assets() {
  local assets=$CLUSTER_DIR/assets
  mkdir -p "$assets/flux-crds"
  local hc sc kw
  hc=$(cd "$HACK_DIR/tools/helm-controller" && go_mod_dir "github.com/fluxcd/helm-controller@$HELM_CONTROLLER_VERSION")
  sc=$(cd "$HACK_DIR/tools/source-controller" && go_mod_dir "github.com/fluxcd/source-controller@$SOURCE_CONTROLLER_VERSION")
  kw=$(cd "$HACK_DIR/tools/kwok" && go_mod_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
  cp "$hc"/config/crd/bases/*.yaml "$sc"/config/crd/bases/*.yaml "$assets/flux-crds/"
  chmod u+w "$assets"/flux-crds/*.yaml
  # CSI snapshot CRDs only (no snapshot controller): Velero's CSI support and
  # the engines read these types.
  local snap
  snap=$(cd / && go_mod_dir "github.com/kubernetes-csi/external-snapshotter/client/v8@$EXTERNAL_SNAPSHOTTER_VERSION")
  mkdir -p "$assets/snapshot-crds"
  cp "$snap"/config/crd/snapshot.storage.k8s.io_*.yaml "$assets/snapshot-crds/"
  chmod u+w "$assets"/snapshot-crds/*.yaml
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo '---'; cat "$kw/kustomize/stage/$f.yaml"
  done > "$assets/kwok-stages.yaml"
  rm -rf "$CLUSTER_DIR/charts"
  # Our own chart too: the e2e installs it through Flux (a HelmRelease of the operator).
  python3 "$HACK_DIR/package-charts.py" "$REPO_ROOT/e2e/charts" "$CLUSTER_DIR/charts" \
    --chart "$REPO_ROOT/deploy/chart/vworkspace-operator" >/dev/null
}

kubectl_() { in_netns "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# Until every CRD is Established. One list per poll: `kubectl wait crd --all`
# takes about 0.1 s per CRD, 2.5 s for the 25 of this cluster.
wait_crds_established() {
  local deadline=$((SECONDS + 60)) out
  local fmt='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Established")].status}{"\n"}{end}'
  while :; do
    # stderr dropped: while a CRD has no conditions yet, kubectl prints every CRD in full.
    out=$(kubectl_ get crd -o "jsonpath=$fmt" 2>/dev/null) && ! grep -v '=True$' <<<"$out" | grep -q . && return
    (( SECONDS > deadline )) && die "CRDs not Established after 60s: $(grep -v '=True$' <<<"$out" | tr '\n' ' ')"
    sleep 0.2
  done
}

start_all() {
  local d=$CLUSTER_DIR B=$BIN_DIR
  start etcd "$B/etcd" --name vws-e2e --data-dir "$d/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster vws-e2e=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
  wait_for etcd 60 curl -fsS http://127.0.0.1:2379/health
  # moto (S3) takes a moment to import; let it do so while the apiserver starts.
  if [[ $PROFILE == full ]]; then start moto "$VELERO_DIR/moto/bin/moto_server" -H 0.0.0.0 -p "$S3_PORT"; fi

  start kube-apiserver "$B/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=6443 \
    --advertise-address="$NODE_IP" \
    --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority="$d/ca.crt" \
    --kubelet-client-certificate="$d/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$d/pki/apiserver-kubelet-client.key" \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" --client-ca-file="$d/ca.crt" \
    --service-account-issuer=https://127.0.0.1:6443 --service-account-key-file="$d/sa.pub" \
    --service-account-signing-key-file="$d/sa.key" --service-cluster-ip-range=10.96.0.0/16 \
    --authorization-mode=Node,RBAC --allow-privileged=true --cert-dir="$d/apiserver-certs"
  wait_for kube-apiserver 120 curl -fsS --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" "$APISERVER/readyz"
  if [[ $PROFILE == apiserver ]]; then
    kubectl_ apply --server-side --field-manager=vws-cluster-up -f "$REPO_ROOT/deploy/crds/" >/dev/null
    wait_crds_established
    return
  fi

  # Velero's part (its CRDs, bucket, BackupStorageLocation, server) runs alongside
  # everything below; the server is waited for last.
  start_velero &
  local velero_setup=$!

  # The API server's kubelet client may use the kubelet API (logs, exec) and nothing else.
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f - >/dev/null <<'EOF'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: vws-apiserver-kubelet-client}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
EOF
  # CRDs before the controllers that watch them.
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f "$d/assets/flux-crds/" >/dev/null
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f "$REPO_ROOT/deploy/crds/" >/dev/null
  wait_crds_established

  start kube-controller-manager "$B/kube-controller-manager" --kubeconfig="$KUBECONFIG_PATH" \
    --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10257 --cert-dir="$d/kcm" \
    --service-account-private-key-file="$d/sa.key" --root-ca-file="$d/ca.crt" --use-service-account-credentials=true \
    --kube-api-qps=100 --kube-api-burst=200
  start kube-scheduler "$B/kube-scheduler" --kubeconfig="$KUBECONFIG_PATH" \
    --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259
  start kwok "$B/kwok" --kubeconfig="$KUBECONFIG_PATH" --config="$d/assets/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --manage-nodes-with-label-selector= --manage-single-node= \
    --cidr=10.244.0.0/16 --node-ip=10.0.0.1 --node-lease-duration-seconds=40 --server-address=127.0.0.1:10247
  wait_for kube-controller-manager 90 curl -fsSk https://127.0.0.1:10257/healthz
  wait_for kube-scheduler 90 curl -fsSk https://127.0.0.1:10259/healthz

  # The fake node, without kwok's NoSchedule taint so chart pods land on it.
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/os: linux, kubernetes.io/arch: amd64, kubernetes.io/hostname: kwok-node-0, type: kwok}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "250"}
  capacity: {cpu: "32", memory: 256Gi, pods: "250"}
EOF
  kubectl_ wait --for=condition=Ready --timeout=60s node/kwok-node-0 >/dev/null
  log "kwok node Ready"

  # On every address of the netns: pods on the real node fetch charts from $NODE_IP.
  start chart-server python3 -m http.server "$CHART_PORT" --bind 0.0.0.0 --directory "$d/charts"
  wait_for chart-server 30 curl -fsS "http://127.0.0.1:$CHART_PORT/index.yaml"
  start_registries

  start_flux
  wait "$velero_setup" || die "setting up Velero failed (see above)"
  # Velero validates the BackupStorageLocation against moto shortly after it starts.
  wait_for velero 90 bash -c '[[ $("$0" --kubeconfig "$1" -n "$2" get backupstoragelocations.velero.io default \
    -o "jsonpath={.status.phase}") == Available ]]' "$BIN_DIR/kubectl" "$KUBECONFIG_PATH" "$VELERO_NS"
}

# Once per cluster directory: a private CA, a server certificate for 127.0.0.1 and localhost
# signed by it, a test user with a random password, and its bcrypt htpasswd line (the only
# hash distribution accepts). Kept by `down`, so a cluster's credentials stay put.
gen_registry_credentials() {
  local r=$REG_STATE
  [[ -s $r/ca.crt && -s $r/server.crt && -s $r/server.key && -s $r/username && -s $r/password && -s $r/htpasswd ]] && return
  log "generating the registry's CA, certificate and credentials in $r"
  rm -rf "$r"; mkdir -p "$r"; chmod 700 "$r"
  (
    cd "$r"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=vws-e2e-registry-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out server.crt \
      -extfile server.ext 2>/dev/null
    rm -f server.csr
    umask 077
    echo vws-charts > username
    openssl rand -hex 20 > password
    "$REGISTRY_DIR/bin/htpasswd" "$(cat username)" < password > htpasswd
  ) || die "generating the registry's credentials failed"
}

# The OCI registry (TLS, htpasswd basic auth, storage in $REG_STATE/storage) and the HTTPS Helm
# repository, both on 127.0.0.1 only (source-controller runs in this netns, out of cluster);
# then every chart of $CLUSTER_DIR/charts is pushed to the registry (idempotent). A running
# instance is restarted, so a changed configuration or new charts take effect.
start_registries() {
  local r=$REG_STATE
  gen_registry_credentials
  cat > "$r/config.yml" <<EOF
version: 0.1
log: {level: info, formatter: text, accesslog: {disabled: false}}
storage: {filesystem: {rootdirectory: $r/storage}, delete: {enabled: true}}
http:
  addr: 127.0.0.1:$REGISTRY_PORT
  tls: {certificate: $r/server.crt, key: $r/server.key}
auth:
  htpasswd: {realm: vws-e2e-registry, path: $r/htpasswd}
EOF
  stop_component registry
  stop_component https-chart-server
  # OTEL_TRACES_EXPORTER=none: distribution exports traces over OTLP by default, to nothing here.
  start registry env OTEL_TRACES_EXPORTER=none "$REGISTRY_DIR/bin/registry" serve "$r/config.yml"
  start https-chart-server python3 "$HACK_DIR/https-chart-server.py" --port "$HTTPS_CHART_PORT" --bind 127.0.0.1 \
    --cert "$r/server.crt" --key "$r/server.key" --username-file "$r/username" --password-file "$r/password" \
    "$CLUSTER_DIR/charts"
  # Unauthenticated probes: 401 proves TLS works and the server answers.
  wait_for registry 30 bash -c '[[ $(curl -sS -o /dev/null -w "%{http_code}" --cacert "$0" "$1") == 401 ]]' \
    "$r/ca.crt" "https://127.0.0.1:$REGISTRY_PORT/v2/"
  wait_for https-chart-server 30 bash -c '[[ $(curl -sS -o /dev/null -w "%{http_code}" --cacert "$0" "$1") == 401 ]]' \
    "$r/ca.crt" "https://127.0.0.1:$HTTPS_CHART_PORT/index.yaml"
  in_netns python3 "$HACK_DIR/push-oci-charts.py" --registry "https://127.0.0.1:$REGISTRY_PORT" --ca "$r/ca.crt" \
    --username-file "$r/username" --password-file "$r/password" "$CLUSTER_DIR/charts" > "$LOG_DIR/push-oci-charts.log" \
    || die "pushing the charts to the registry failed (see above)"
  log "pushed $(wc -l < "$LOG_DIR/push-oci-charts.log") charts to the registry (list in $LOG_DIR/push-oci-charts.log)"
}

cmd_start_registries() {
  REGISTRY_DIR=$("$HACK_DIR/build-registry-bins.sh")
  running kube-apiserver || die "the cluster is not running; run hack/cluster.sh up"
  [[ -s $CLUSTER_DIR/charts/index.yaml ]] || die "no charts in $CLUSTER_DIR/charts; run hack/cluster.sh up"
  start_registries
}

# Flux, locked down for multi-tenancy as the bundle ships it (hack/gen-flux-manifests.sh):
# helm-controller refuses cross-namespace chart sources and applies a HelmRelease without
# serviceAccountName as vworkspace-no-rights, a ServiceAccount nothing binds. Both run with
# the admin kubeconfig (which may impersonate); a release gets only what its ServiceAccount
# is bound to, normally the release ClusterRole applied here (the bundle's, from
# deploy/base/release-rbac) through the app controller's RoleBindings.
# source-controller v1.9 has no --no-cross-namespace-refs (its HelmChart sourceRef is local).
apply_release_role() {
  kubectl_ apply --server-side --field-manager=vws-cluster-up \
    -f "$REPO_ROOT/deploy/base/release-rbac/clusterrole.yaml" >/dev/null
}
start_flux() {
  local d=$CLUSTER_DIR B=$BIN_DIR
  apply_release_role
  mkdir -p "$d/flux-artifacts"
  start source-controller env KUBECONFIG="$KUBECONFIG_PATH" "$B/source-controller" \
    --storage-path="$d/flux-artifacts" --storage-addr=127.0.0.1:19090 --storage-adv-addr=127.0.0.1:19090 \
    --metrics-addr=127.0.0.1:18080 --health-addr=127.0.0.1:19440 \
    --watch-all-namespaces=true --log-encoding=console --requeue-dependency=5s
  start_helm_controller
  wait_for source-controller 90 curl -fsS http://127.0.0.1:19440/readyz
  wait_for helm-controller 90 curl -fsS http://127.0.0.1:19441/readyz
}
# --concurrent=5, Flux Operator's "small" size (Flux's default is 4, as the bundle keeps): an
# install here is mostly helm-controller's wait, which polls the release's objects every 5 s
# (internal/action/wait.go), so a fifth worker overlaps one more wait rather than adding CPU.
start_helm_controller() {
  start helm-controller env KUBECONFIG="$KUBECONFIG_PATH" "$BIN_DIR/helm-controller" \
    --metrics-addr=127.0.0.1:18081 --health-addr=127.0.0.1:19441 \
    --watch-all-namespaces=true --log-encoding=console --requeue-dependency=5s --concurrent=5 \
    --no-cross-namespace-refs=true --default-service-account=vworkspace-no-rights
}

# stop_component NAME: stop one of our components by its pidfile (SIGTERM, then SIGKILL after 5 s).
stop_component() {
  local name=$1 pid
  pid=$(pid_of "$name") || return 0
  if is_ours "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $name"
  fi
  rm -f "$PID_DIR/$name.pid"
}

# Restarts Flux alone on a running cluster (new flags, or a crashed controller); the rest of
# the cluster and everything running on it stays up. Flux resumes from the API server's state.
cmd_restart_flux() {
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build)
  [[ -x $BIN_DIR/helm-controller ]] || die "no cluster binaries in $BIN_DIR; run hack/cluster.sh up"
  running kube-apiserver || die "the cluster is not running; run hack/cluster.sh up"
  apply_release_role # before stopping anything: a failure leaves Flux running
  stop_component helm-controller
  stop_component source-controller
  start_flux
}

# Velero's CRDs, the bucket in moto (started earlier), Velero's namespace,
# credentials and BackupStorageLocation, then `velero server` out of cluster
# with the AWS object-store plugin. No node-agent and no volume snapshot
# location: backups of resources only (snapshotVolumes: false).
start_velero() {
  local d=$CLUSTER_DIR V=$VELERO_DIR
  # Velero's CRDs (from its own `velero install --crds-only`) and the CSI snapshot CRDs.
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f "$V/crds/velero.yaml" \
    -f "$d/assets/snapshot-crds/" >/dev/null
  wait_crds_established

  mkdir -p "$d/velero/tmp"
  wait_for moto 30 curl -fsS -o /dev/null "$S3_URL/moto-api/"
  # moto accepts unsigned requests and any credentials; re-creating the bucket is a no-op.
  in_netns curl -fsS -o /dev/null -X PUT "$S3_URL/$VELERO_BUCKET" || die "creating bucket $VELERO_BUCKET in moto failed"

  # What the AWS plugin authenticates with (AWS_SHARED_CREDENTIALS_FILE below), also as the
  # Secret `velero install` creates, for BackupStorageLocations that set spec.credential.
  # The Deployment is the one `velero install` creates, scaled to zero, as in Velero's own
  # "run locally" setup: the server runs out of cluster, but every restore reads it (the
  # pod-volume restore action takes the restore-helper image from it) and fails with
  # 'deployments.apps "velero" not found' without it.
  printf '[default]\naws_access_key_id = vws-velero\naws_secret_access_key = vws-velero-secret\n' \
    > "$d/velero/credentials"
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $VELERO_NS}
---
apiVersion: v1
kind: Secret
metadata: {name: cloud-credentials, namespace: $VELERO_NS}
stringData:
  cloud: |
$(sed 's/^/    /' "$d/velero/credentials")
---
apiVersion: velero.io/v1
kind: BackupStorageLocation
metadata: {name: default, namespace: $VELERO_NS}
spec:
  provider: aws
  default: true
  objectStorage: {bucket: $VELERO_BUCKET}
  config: {region: us-east-1, s3ForcePathStyle: "true", s3Url: "$S3_URL_FOR_VELERO"}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: velero
  namespace: $VELERO_NS
  labels: {component: velero, deploy: velero}
spec:
  replicas: 0
  selector: {matchLabels: {deploy: velero}}
  template:
    metadata: {labels: {component: velero, deploy: velero}}
    spec:
      containers:
      - name: velero
        image: velero/velero:$VELERO_VERSION
        command: [/velero]
        args: [server]
EOF

  # Out of cluster, like Velero's own "run locally" development setup. HOME and
  # TMPDIR keep ~/.config/velero and the credential files Velero writes for its
  # plugins (<tmp>/credentials) inside this cluster's directory. The backup sync from the
  # bucket runs every 10 s (Velero's default: 1 min), so a test that waits for two syncs
  # (backup_schedule.rs: deleted backups stay deleted) waits seconds, not minutes.
  start velero env KUBECONFIG="$KUBECONFIG_PATH" HOME="$d/velero" TMPDIR="$d/velero/tmp" \
    AWS_SHARED_CREDENTIALS_FILE="$d/velero/credentials" AWS_EC2_METADATA_DISABLED=true \
    "$V/bin/velero" server --namespace "$VELERO_NS" --plugin-dir "$V/plugins" \
    --metrics-address "127.0.0.1:$VELERO_METRICS_PORT" --profiler-address "127.0.0.1:$VELERO_PROFILER_PORT" \
    --default-backup-storage-location default --backup-sync-period=10s \
    --log-format text --log-level info
}

cmd_up() {
  local t0=$SECONDS
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh")
  if [[ $PROFILE == apiserver ]]; then
    clean_stale_state
    ensure_netns
    gen_certs
    start_all
    { echo "export KUBECONFIG=$KUBECONFIG_PATH"; echo "export VWS_NETNS=$NETNS"; echo "export VWS_BIN_DIR=$BIN_DIR"
      echo "export VWS_CLUSTER_DIR=$CLUSTER_DIR"; } > "$CLUSTER_DIR/env"
    log "peer cluster up in $((SECONDS - t0))s: netns $NETNS, $CLUSTER_DIR"
    return
  fi
  VELERO_DIR=$("$HACK_DIR/build-velero-bins.sh")
  REGISTRY_DIR=$("$HACK_DIR/build-registry-bins.sh")
  clean_stale_state
  note_other_clusters
  ensure_netns
  gen_certs
  prepare_assets
  start_all
  if real_node_enabled; then node_up; fi
  peer up
  {
    echo "export KUBECONFIG=$KUBECONFIG_PATH"
    echo "export VWS_NETNS=$NETNS"
    echo "export VWS_BIN_DIR=$BIN_DIR"
    echo "export VWS_CLUSTER_DIR=$CLUSTER_DIR"
    echo "export VWS_CHART_REPO=http://127.0.0.1:$CHART_PORT"
    echo "export VWS_CHART_REPO_FOR_PODS=http://$NODE_IP:$CHART_PORT"
    echo "export VWS_OCI_REGISTRY=127.0.0.1:$REGISTRY_PORT"
    echo "export VWS_HTTPS_CHART_REPO=https://127.0.0.1:$HTTPS_CHART_PORT"
    echo "export VWS_REGISTRY_STATE=$REG_STATE"
    echo "export VWS_VELERO_DIR=$VELERO_DIR"
    echo "export VWS_VELERO_NAMESPACE=$VELERO_NS"
    echo "export VWS_S3_URL=$S3_URL"
    echo "export VWS_S3_BUCKET=$VELERO_BUCKET"
    echo "export VELERO_NAMESPACE=$VELERO_NS"
    echo "export VWS_PEER_NETNS=$PEER_NETNS"
    echo "export VWS_PEER_CLUSTER_DIR=$PEER_CLUSTER_DIR"
    if real_node_enabled; then
      echo "export VWS_REAL_NODE=$NODE_NAME"
      echo "export VWS_NODE_DIR=$NODE_DIR"
      echo "export VWS_NODE_IP=$NODE_IP"
    fi
  } > "$CLUSTER_DIR/env"
  log "cluster up in $((SECONDS - t0))s: KUBECONFIG=$KUBECONFIG_PATH, netns $NETNS (source $CLUSTER_DIR/env)"
}

# A cluster whose run was killed (no `down`) leaves its namespace, the node's mounts, pod
# processes and etcd data behind; its pod IPs would collide with the next cluster's on the
# same bridge. When none of our components runs but such state exists, take it down first.
clean_stale_state() {
  local c
  for c in "${COMPONENTS[@]}"; do running "$c" && return 0; done
  if [[ -e /run/netns/$NETNS || -d $CLUSTER_DIR/etcd || -d $ND ]]; then
    log "state of a cluster that was not taken down (netns $NETNS, $CLUSTER_DIR): cleaning it up first"
    cmd_down
  fi
}

# Other local clusters (other checkouts) share this machine's cores and memory: say so.
note_other_clusters() {
  local ns n
  while read -r ns; do
    [[ $ns == vws-* && $ns != "$NETNS" && $ns != "$PEER_NETNS" ]] || continue
    n=$(ip netns pids "$ns" 2>/dev/null | wc -l)
    (( n > 0 )) && log "note: another local cluster runs in netns $ns ($n processes); it shares this machine's CPUs and memory"
  done < <(ip netns list | awk '{print $1}')
  return 0
}

cmd_down() {
  local i pid
  if [[ $PROFILE == full ]]; then peer down; node_down; cmd_stop_argocd; fi
  for (( i=${#COMPONENTS[@]}-1; i>=0; i-- )); do stop_component "${COMPONENTS[$i]}"; done
  # Anything else still alive in our netns was started by tests or tools for this cluster.
  if ip netns list | grep -qw "^$NETNS"; then
    for pid in $(ip netns pids "$NETNS" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    sleep 0.5
    for pid in $(ip netns pids "$NETNS" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$NETNS" || true
  fi
  # The demo's processes (and any other started here) recorded pidfiles too. Those inside the
  # namespace are dead now; one outside it (the demo's bridge of Odoo's port to this machine's
  # loopback) is stopped here. Then the files go: a stale one could later name a reused pid.
  local f
  for f in "$PID_DIR"/*.pid; do
    [[ -f $f ]] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    # Only a process of this checkout's hack/ (a pid may have been reused since).
    [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$HACK_DIR/" &&
      kill "$pid" 2>/dev/null || true
  done
  rm -f "$PID_DIR"/*.pid
  # demo/ is the simulator's record of this cluster (its key, bound to this cluster's identity
  # on first contact): a new cluster gets a new record, or the agent is refused ClusterMismatch.
  rm -rf "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/flux-artifacts" "$CLUSTER_DIR/velero" "$CLUSTER_DIR/env" "$CLUSTER_DIR/demo" \
    "$CLUSTER_DIR/argocd" "$CLUSTER_DIR/argocd.env"
  if [[ $PROFILE == full ]]; then log "cluster down (logs kept in $LOG_DIR)"; else log "peer cluster down"; fi
}

cmd_status() {
  local name pid rc=0
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build 2>/dev/null || echo "$BIN_DIR")
  for name in "${COMPONENTS[@]}"; do
    pid=$(pid_of "$name" || true)
    if [[ -n $pid ]] && is_ours "$pid"; then printf '%-24s running (pid %s)\n' "$name" "$pid"
    else printf '%-24s stopped\n' "$name"; rc=1; fi
  done
  if real_node_enabled; then node_status; fi
  if (( rc == 0 )); then
    in_netns curl -fsS --cacert "$CLUSTER_DIR/ca.crt" --cert "$CLUSTER_DIR/admin.crt" --key "$CLUSTER_DIR/admin.key" \
      "$APISERVER/version" | python3 -c 'import json,sys; print("apiserver version:", json.load(sys.stdin)["gitVersion"])'
    kubectl_ get nodes -o wide 2>/dev/null | head -3
    printf 'velero BackupStorageLocation default: %s\n' \
      "$(kubectl_ -n "$VELERO_NS" get backupstoragelocations.velero.io default -o 'jsonpath={.status.phase}' 2>/dev/null)"
  fi
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  exec)
    shift; ensure_netns
    # The cluster's tools (kubectl, velero) first on PATH, and its env (KUBECONFIG, ...) exported.
    if [[ -f $CLUSTER_DIR/env ]]; then
      source "$CLUSTER_DIR/env"
      export PATH="$VWS_BIN_DIR:${VWS_VELERO_DIR:+$VWS_VELERO_DIR/bin:}$PATH"
    fi
    # `ip netns exec` (own mount namespace, /sys of the netns): tests read /sys/class/net.
    ip netns exec "$NETNS" "$@" ;;
  restart-flux) cmd_restart_flux ;;
  # Only source-controller and helm-controller, e.g. while a test runs the bundled Flux in
  # the cluster (two helm-controllers would fight); restart-flux starts them again.
  stop-flux) stop_component helm-controller; stop_component source-controller ;;
  # helm-controller alone, e.g. after `just chaos` SIGKILLed it (its pidfile names the dead one).
  start-helm-controller)
    BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build)
    running helm-controller && die "helm-controller is running"
    start_helm_controller
    wait_for helm-controller 90 curl -fsS http://127.0.0.1:19441/readyz ;;
  env) cat "$CLUSTER_DIR/env" ;;
  # OCI archives (hack/build-images.sh) into the real node's containerd.
  load-images)
    shift; NODE_DIR=$("$HACK_DIR/build-node-bins.sh" --no-build) || die "no node binaries; run hack/cluster.sh up"
    running node-containerd || die "the real node is not running (VWS_REAL_NODE=0?)"
    import_images "$@"; log "imported $# image archive(s) into $NODE_NAME" ;;
  # The peer alone (up starts it too), e.g. beside a cluster started before it existed.
  peer-up) peer up ;;
  # The registry and the HTTPS chart repository alone, e.g. beside a cluster started before they existed.
  start-registries) cmd_start_registries ;;
  # Real Argo CD, on demand (hack/argocd.sh); e2e tests call it from inside `exec`.
  start-argocd) cmd_start_argocd ;;
  stop-argocd) cmd_stop_argocd ;;
  *) echo "usage: $0 up|down|status|exec CMD...|env|peer-up|restart-flux|stop-flux|start-helm-controller|load-images ARCHIVE...|start-registries|start-argocd|stop-argocd" >&2; exit 2 ;;
esac
