# Real Argo CD on the local cluster, on demand: sourced by hack/cluster.sh (which defines
# start, stop_component, wait_for, running, kubectl_, in_netns), never run.
#
#   hack/cluster.sh start-argocd   idempotent; safe when two callers race (flock); a fast no-op
#                                  when Argo CD already runs; works from inside `hack/cluster.sh exec`
#                                  once hack/build-argocd-bins.sh has run outside the netns
#   hack/cluster.sh stop-argocd    stops the three processes (`down` stops them too)
#
# What runs, as host processes inside the cluster's netns like the other components (logs in
# $LOG_DIR, pidfiles in $PID_DIR): argocd-redis (Debian's redis-server, 127.0.0.1:18890, no
# persistence), argocd-repo-server (plaintext gRPC on 127.0.0.1:18891, metrics/healthz on
# 18892, the helm v4 CLI on its PATH) and argocd-application-controller (metrics/healthz on
# 18893). No argocd-server, Dex, ApplicationSet or notifications controller: Applications are
# created with kubectl (or by the operator), as in Argo CD's "core" install.
#
# In-cluster destination (https://kubernetes.default.svc): Argo CD's own out-of-cluster mode
# (ARGOCD_FAKE_IN_CLUSTER=true, what upstream's Procfile runs) builds the in-cluster REST config
# from KUBECONFIG instead of rest.InClusterConfig(). That kubeconfig holds a token of the
# ServiceAccount argocd/argocd-application-controller, bound to upstream's own Role and
# ClusterRole (`*` on everything, from manifests/install.yaml): the controller acts with the
# identity and rights a real install has, not as the cluster admin. Sync impersonation is on
# (argocd-cm application.sync.impersonation.enabled): Applications sync as their AppProject's
# destinationServiceAccounts, so the `default` project (which names none) syncs nothing.
#
# Details: docs/development/local-cluster.md#argo-cd-on-demand.

ARGOCD_NS=argocd
ARGOCD_REDIS_PORT=18890
ARGOCD_REPO_PORT=18891
ARGOCD_REPO_METRICS_PORT=18892
ARGOCD_CONTROLLER_METRICS_PORT=18893
ARGOCD_STATE=$CLUSTER_DIR/argocd
# Stopped in reverse order.
ARGOCD_COMPONENTS=(argocd-redis argocd-repo-server argocd-application-controller)

# True when this shell already runs inside the cluster's netns (e.g. under `hack/cluster.sh exec`),
# where neither the module proxy nor Debian is reachable.
argocd_in_netns() {
  [[ -e /run/netns/$NETNS && $(stat -Lc %i /proc/self/ns/net) == "$(stat -Lc %i "/run/netns/$NETNS")" ]]
}

argocd_healthy() {
  local c
  for c in "${ARGOCD_COMPONENTS[@]}"; do running "$c" || return 1; done
  in_netns curl -fsS -o /dev/null "http://127.0.0.1:$ARGOCD_REPO_METRICS_PORT/healthz" 2>/dev/null &&
    in_netns curl -fsS -o /dev/null "http://127.0.0.1:$ARGOCD_CONTROLLER_METRICS_PORT/healthz" 2>/dev/null
}

cmd_start_argocd() {
  running kube-apiserver || die "the cluster is not running; run hack/cluster.sh up"
  if argocd_healthy; then return 0; fi
  # Two callers at once: the second waits for the lock, then finds Argo CD running. The lock is
  # held by the flock process (-o: not passed on), not by this shell: every process this shell
  # forks (the background subshells of `start` live as long as their component) would inherit
  # an fd lock and hold it for good.
  if [[ -z ${VWS_ARGOCD_LOCKED:-} ]]; then
    mkdir -p "$PID_DIR" "$LOG_DIR"
    VWS_ARGOCD_LOCKED=1 flock -o "$CLUSTER_DIR/argocd-start.lock" "$0" start-argocd
    return
  fi
  if argocd_healthy; then return 0; fi
  if ! ARGOCD_DIR=$("$HACK_DIR/build-argocd-bins.sh" --no-build) || ! command -v redis-server >/dev/null; then
    argocd_in_netns && die "Argo CD is not built (or redis-server is missing) and this shell is inside the netns, \
where the module proxy and Debian are not reachable: run hack/build-argocd-bins.sh outside it first"
    ARGOCD_DIR=$("$HACK_DIR/build-argocd-bins.sh")
  fi
  BIN_DIR=$("$HACK_DIR/build-cluster-bins.sh" --no-build) || die "no cluster binaries; run hack/cluster.sh up"
  local t0=$SECONDS s=$ARGOCD_STATE A=$ARGOCD_DIR
  mkdir -p "$s/redis" "$s/tmp" "$s/home" "$s/helm" "$s/tls" "$s/ssh" "$s/gpg/keys" "$s/gpg/source" "$s/plugins"
  chmod 700 "$s" "$s/gpg/keys"

  # CRDs, namespace, upstream's RBAC, ConfigMaps and Secret, and the default AppProject
  # (argocd-server creates it in a real install; it does not run here). Server-side apply with
  # our own field manager: re-applying is a no-op and leaves Argo CD's own fields alone.
  kubectl_ apply --server-side --field-manager=vws-cluster-argocd -f "$A/crds/" >/dev/null
  wait_crds_established
  kubectl_ apply --server-side --field-manager=vws-cluster-argocd -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $ARGOCD_NS}
EOF
  kubectl_ apply --server-side --field-manager=vws-cluster-argocd -n "$ARGOCD_NS" -f "$A/manifests/core.yaml" >/dev/null
  # Sync impersonation on (the operator's argocd engine refuses to write without it): an
  # Application syncs as its AppProject's destinationServiceAccounts say, never with the
  # controller's own rights; with no matching entry its sync fails. Own field manager, so
  # re-applying core.yaml (argocd-cm without this key) never drops it.
  kubectl_ apply --server-side --field-manager=vws-cluster-argocd-settings -n "$ARGOCD_NS" -f - >/dev/null <<EOF
apiVersion: v1
kind: ConfigMap
metadata: {name: argocd-cm}
data:
  application.sync.impersonation.enabled: "true"
EOF
  kubectl_ apply --server-side --field-manager=vws-cluster-argocd -f - >/dev/null <<EOF
apiVersion: argoproj.io/v1alpha1
kind: AppProject
metadata: {name: default, namespace: $ARGOCD_NS}
spec:
  sourceRepos: ['*']
  destinations: [{namespace: '*', server: '*'}]
  clusterResourceWhitelist: [{group: '*', kind: '*'}]
EOF

  # The controller's credentials: a token of its ServiceAccount (one year; a new one per start).
  local token
  token=$(kubectl_ -n "$ARGOCD_NS" create token argocd-application-controller --duration=8760h) \
    || die "creating a token for argocd-application-controller failed"
  (umask 077; cat > "$s/controller.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: in-cluster, cluster: {server: "$APISERVER", certificate-authority: $CLUSTER_DIR/ca.crt}}]
users: [{name: argocd-application-controller, user: {token: "$token"}}]
contexts: [{name: in-cluster, context: {cluster: in-cluster, user: argocd-application-controller, namespace: $ARGOCD_NS}}]
current-context: in-cluster
EOF
  )

  # redis-server rewrites its process title; {config-file} keeps $CLUSTER_DIR in it, which is how
  # `running` tells our processes from others.
  cat > "$s/redis.conf" <<EOF
bind 127.0.0.1
port $ARGOCD_REDIS_PORT
protected-mode yes
save ""
appendonly no
dir $s/redis
daemonize no
proc-title-template "{title} {listen-addr} {config-file}"
EOF
  start argocd-redis redis-server "$s/redis.conf"
  wait_for argocd-redis 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ARGOCD_REDIS_PORT && printf 'PING\r\n' >&3 && read -r l <&3 && [[ \$l == +PONG* ]]"

  # Directories upstream's manifests mount into the pods, and the sockets it puts in the pod's
  # /tmp, here under $ARGOCD_STATE: nothing is shared with another cluster on this machine.
  local common_env=(HOME="$s/home" TMPDIR="$s/tmp" ARGOCD_TLS_DATA_PATH="$s/tls" ARGOCD_SSH_DATA_PATH="$s/ssh"
                    ARGOCD_GNUPGHOME="$s/gpg/keys" ARGOCD_GPG_DATA_PATH="$s/gpg/source" ARGOCD_GPG_ENABLED=false)
  # --client-ca-path=: its default (a file in the pod) is refused together with --disable-tls.
  start argocd-repo-server env "${common_env[@]}" PATH="$A/bin:$PATH" \
    ARGOCD_ASK_PASS_SOCK="$s/askpass.sock" ARGOCD_PLUGINSOCKFILEPATH="$s/plugins" \
    HELM_CACHE_HOME="$s/helm/cache" HELM_CONFIG_HOME="$s/helm/config" HELM_DATA_HOME="$s/helm/data" \
    "$A/bin/argocd-repo-server" --loglevel info --logformat text \
    --address 127.0.0.1 --port "$ARGOCD_REPO_PORT" --disable-tls --client-ca-path= \
    --metrics-address 127.0.0.1 --metrics-port "$ARGOCD_REPO_METRICS_PORT" \
    --redis "127.0.0.1:$ARGOCD_REDIS_PORT"
  start argocd-application-controller env "${common_env[@]}" \
    ARGOCD_FAKE_IN_CLUSTER=true KUBECONFIG="$s/controller.kubeconfig" \
    "$A/bin/argocd-application-controller" --loglevel info --logformat text \
    --namespace "$ARGOCD_NS" --metrics-port "$ARGOCD_CONTROLLER_METRICS_PORT" \
    --repo-server "127.0.0.1:$ARGOCD_REPO_PORT" --repo-server-plaintext \
    --redis "127.0.0.1:$ARGOCD_REDIS_PORT"
  wait_for argocd-repo-server 90 curl -fsS "http://127.0.0.1:$ARGOCD_REPO_METRICS_PORT/healthz?full=true"
  wait_for argocd-application-controller 90 curl -fsS "http://127.0.0.1:$ARGOCD_CONTROLLER_METRICS_PORT/healthz"
  { echo "export VWS_ARGOCD_NAMESPACE=$ARGOCD_NS"; echo "export VWS_ARGOCD_DIR=$A"; } > "$CLUSTER_DIR/argocd.env"
  log "Argo CD up in $((SECONDS - t0))s (namespace $ARGOCD_NS; source $CLUSTER_DIR/argocd.env)"
}

cmd_stop_argocd() {
  local i
  for (( i=${#ARGOCD_COMPONENTS[@]}-1; i>=0; i-- )); do stop_component "${ARGOCD_COMPONENTS[$i]}"; done
  rm -f "$CLUSTER_DIR/argocd.env"
}
