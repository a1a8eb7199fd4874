#!/usr/bin/env bash
# The main job: a real local cluster (built and cached on first run), the app
# controller running against it, and a sample ApplicationInstance followed until
# Ready. Leaves everything running; `just cluster-down` stops it all.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

"$HACK_DIR/cluster.sh" up
source "$CLUSTER_DIR/env"
kubectl_() { "$HACK_DIR/cluster.sh" exec "$VWS_BIN_DIR/kubectl" "$@"; }

log "building the app controller"
cargo build --quiet -p app-controller
pidfile="$CLUSTER_DIR/pids/app-controller.pid"
if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  kill "$(cat "$pidfile")"; sleep 1
fi
mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids"
ip netns exec "$VWS_NETNS" setsid bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" \
  env KUBECONFIG="$KUBECONFIG" "$REPO_ROOT/target/debug/app-controller" --admin-addr 127.0.0.1:18090 \
  >> "$CLUSTER_DIR/logs/app-controller.log" 2>&1 < /dev/null &
for _ in $(seq 60); do
  "$HACK_DIR/cluster.sh" exec curl -fsS http://127.0.0.1:18090/readyz >/dev/null 2>&1 && break; sleep 0.5
done
log "app-controller ready (log $CLUSTER_DIR/logs/app-controller.log, metrics http://127.0.0.1:18090/metrics in netns $VWS_NETNS)"

kubectl_ apply --server-side --field-manager=vws-demo -f e2e/samples/demo.yaml
log "following ApplicationInstance demo/hello until Ready"
last=""
for _ in $(seq 240); do
  line=$(kubectl_ get ai hello -n demo -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}: {.message}{end}' 2>/dev/null || true)
  if [[ -n $line && $line != "$last" ]]; then log "Ready=$line"; last=$line; fi
  [[ $line == True* ]] && break
  sleep 0.5
done
echo
kubectl_ get applicationinstances,helmreleases,helmrepositories -n demo
kubectl_ get deployments,configmaps -n demo -l app.kubernetes.io/instance=hello
echo
echo "greeting rendered by the chart: $(kubectl_ get configmap hello-config -n demo -o jsonpath='{.data.greeting}')"
cat <<MSG

The cluster and the app controller keep running. Try:
  just in-cluster kubectl get ai -A
  just in-cluster kubectl describe ai hello -n demo
  just cluster-down          # stop everything
MSG
[[ $last == True* ]] || die "demo/hello did not become Ready; see $CLUSTER_DIR/logs/"
