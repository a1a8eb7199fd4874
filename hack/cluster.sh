#!/usr/bin/env bash
# Local Kubernetes with real Flux, as local processes inside a network
# namespace whose only interface is loopback.
#
#   hack/cluster.sh up       build (cached) + start everything, wait for readiness
#   hack/cluster.sh down     stop our processes, delete state and the netns
#   hack/cluster.sh status   show processes and health
#   hack/cluster.sh exec CMD run CMD inside the cluster's network namespace
#   hack/cluster.sh env      print the environment for tools (KUBECONFIG, ...)
#
# Recipe and pitfalls: docs/development/local-cluster.md.
source "$(dirname "$0")/lib.sh"

NETNS="${VWS_NETNS:-vws-e2e}"
PID_DIR="$CLUSTER_DIR/pids"
LOG_DIR="$CLUSTER_DIR/logs"
CHART_PORT=18879
APISERVER=https://127.0.0.1:6443

# Components in start order; stopped in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok chart-server source-controller helm-controller)

in_netns() { ip netns exec "$NETNS" "$@"; }

ensure_netns() {
  [[ $EUID -eq 0 ]] || die "the cluster runs in a network namespace; run as root (CI and dev machines are root)"
  if ! ip netns list | grep -qw "^$NETNS"; then
    ip netns add "$NETNS"
  fi
  in_netns ip link set lo up
  # Only loopback: anything else means someone added an interface, refuse.
  local ifaces; ifaces=$(in_netns ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ')
  [[ "$ifaces" == "lo " ]] || die "netns $NETNS has interfaces other than lo: $ifaces"
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
  [[ -f $d/admin.crt && -f $d/apiserver.crt && -f $d/sa.key ]] && return
  log "generating certificates in $d"
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=vws-e2e-ca" -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out apiserver.crt -extfile apiserver.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=vws-admin/O=system:masters" -keyout admin.key -out admin.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > client.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out admin.crt -extfile client.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr
  )
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
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo '---'; cat "$kw/kustomize/stage/$f.yaml"
  done > "$assets/kwok-stages.yaml"
  rm -rf "$CLUSTER_DIR/charts"
  python3 "$HACK_DIR/package-charts.py" "$REPO_ROOT/e2e/charts" "$CLUSTER_DIR/charts" >/dev/null
}

kubectl_() { in_netns "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

start_all() {
  local d=$CLUSTER_DIR B=$BIN_DIR
  start etcd "$B/etcd" --name vws-e2e --data-dir "$d/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster vws-e2e=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
  wait_for etcd 60 curl -fsS http://127.0.0.1:2379/health

  start kube-apiserver "$B/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=127.0.0.1 --secure-port=6443 \
    --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" --client-ca-file="$d/ca.crt" \
    --service-account-issuer=https://127.0.0.1:6443 --service-account-key-file="$d/sa.pub" \
    --service-account-signing-key-file="$d/sa.key" --service-cluster-ip-range=10.96.0.0/16 \
    --authorization-mode=Node,RBAC --allow-privileged=true --cert-dir="$d/apiserver-certs"
  wait_for kube-apiserver 120 curl -fsS --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" "$APISERVER/readyz"

  # CRDs before the controllers that watch them.
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f "$d/assets/flux-crds/" >/dev/null
  kubectl_ apply --server-side --field-manager=vws-cluster-up -f "$REPO_ROOT/deploy/crds/" >/dev/null
  kubectl_ wait --for=condition=Established --timeout=60s crd --all >/dev/null

  start kube-controller-manager "$B/kube-controller-manager" --kubeconfig="$KUBECONFIG_PATH" \
    --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10257 --cert-dir="$d/kcm" \
    --service-account-private-key-file="$d/sa.key" --root-ca-file="$d/ca.crt" --use-service-account-credentials=true
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

  start chart-server python3 -m http.server "$CHART_PORT" --bind 127.0.0.1 --directory "$d/charts"
  wait_for chart-server 30 curl -fsS "http://127.0.0.1:$CHART_PORT/index.yaml"

  mkdir -p "$d/flux-artifacts"
  start source-controller env KUBECONFIG="$KUBECONFIG_PATH" "$B/source-controller" \
    --storage-path="$d/flux-artifacts" --storage-addr=127.0.0.1:19090 --storage-adv-addr=127.0.0.1:19090 \
    --metrics-addr=127.0.0.1:18080 --health-addr=127.0.0.1:19440 \
    --watch-all-namespaces=true --log-encoding=console --requeue-dependency=5s
  start helm-controller env KUBECONFIG="$KUBECONFIG_PATH" "$B/helm-controller" \
    --metrics-addr=127.0.0.1:18081 --health-addr=127.0.0.1:19441 \
    --watch-all-namespaces=true --log-encoding=console --requeue-dependency=5s --concurrent=4
  wait_for source-controller 90 curl -fsS http://127.0.0.1:19440/readyz
  wait_for helm-controller 90 curl -fsS http://127.0.0.1:19441/readyz
}

cmd_up() {
  local t0=$SECONDS
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh")
  ensure_netns
  gen_certs
  prepare_assets
  start_all
  {
    echo "export KUBECONFIG=$KUBECONFIG_PATH"
    echo "export VWS_NETNS=$NETNS"
    echo "export VWS_BIN_DIR=$BIN_DIR"
    echo "export VWS_CLUSTER_DIR=$CLUSTER_DIR"
    echo "export VWS_CHART_REPO=http://127.0.0.1:$CHART_PORT"
  } > "$CLUSTER_DIR/env"
  log "cluster up in $((SECONDS - t0))s: KUBECONFIG=$KUBECONFIG_PATH, netns $NETNS (source $CLUSTER_DIR/env)"
}

cmd_down() {
  local i name pid
  for (( i=${#COMPONENTS[@]}-1; i>=0; i-- )); do
    name=${COMPONENTS[$i]}
    pid=$(pid_of "$name") || continue
    if is_ours "$pid"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      log "stopped $name"
    fi
    rm -f "$PID_DIR/$name.pid"
  done
  # Anything else still alive in our netns was started by tests or tools for this cluster.
  if ip netns list | grep -qw "^$NETNS"; then
    for pid in $(ip netns pids "$NETNS" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    sleep 0.5
    for pid in $(ip netns pids "$NETNS" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$NETNS" || true
  fi
  rm -rf "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/flux-artifacts" "$CLUSTER_DIR/env"
  log "cluster down (logs kept in $LOG_DIR)"
}

cmd_status() {
  local name pid rc=0
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build 2>/dev/null || echo "$BIN_DIR")
  for name in "${COMPONENTS[@]}"; do
    pid=$(pid_of "$name" || true)
    if [[ -n $pid ]] && is_ours "$pid"; then printf '%-24s running (pid %s)\n' "$name" "$pid"
    else printf '%-24s stopped\n' "$name"; rc=1; fi
  done
  if (( rc == 0 )); then
    in_netns curl -fsS --cacert "$CLUSTER_DIR/ca.crt" --cert "$CLUSTER_DIR/admin.crt" --key "$CLUSTER_DIR/admin.key" \
      "$APISERVER/version" | python3 -c 'import json,sys; print("apiserver version:", json.load(sys.stdin)["gitVersion"])'
    kubectl_ get nodes -o wide 2>/dev/null | head -3
  fi
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  exec)
    shift; ensure_netns
    # The cluster's tools (kubectl) first on PATH, and its env (KUBECONFIG, ...) exported.
    if [[ -f $CLUSTER_DIR/env ]]; then source "$CLUSTER_DIR/env"; export PATH="$VWS_BIN_DIR:$PATH"; fi
    in_netns "$@" ;;
  env) cat "$CLUSTER_DIR/env" ;;
  *) echo "usage: $0 up|down|status|exec CMD...|env" >&2; exit 2 ;;
esac
