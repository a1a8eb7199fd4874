#!/usr/bin/env bash
# The main job, end to end as the product runs: a real local cluster (built and cached
# on first run) with Flux; the app controller and the runbook engine; the connectivity
# agent in pull mode; and odoo-sim, the SIMULATOR of the Odoo control plane (not Odoo).
# The sample application is declared as intent in the simulator, the agent pulls it and
# applies an ApplicationInstance, Flux installs the chart, and the status travels back
# (through the gRPC status channel) until the simulator shows it ready.
# `just demo push` runs the agent in push mode instead: the simulator, playing the Odoo
# module's push side, calls the agent's endpoint with the document and polls its status
# (plain http with --push-insecure-http: a development setting, as --insecure-allow-http
# is for pull mode).
# Leaves everything running; `just cluster-down` stops it all.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
MODE=${1:-pull}
[[ $MODE == pull || $MODE == push ]] || die "usage: just demo [pull|push]"

"$HACK_DIR/cluster.sh" up
source "$CLUSTER_DIR/env"
kubectl_() { "$HACK_DIR/cluster.sh" exec "$VWS_BIN_DIR/kubectl" "$@"; }
in_ns() { "$HACK_DIR/cluster.sh" exec "$@"; }

SIM_URL=http://127.0.0.1:18069
CHANNEL=127.0.0.1:19091
PUSH_ADDR=127.0.0.1:18443
CLUSTER_NAME=demo
# Confined to the demo namespace, so the demo can keep running beside `just e2e`.
DEMO_SCOPE="--watch-namespace demo --allowed-namespaces demo"

log "building the app controller, the runbook engine, the agent and odoo-sim"
# `--bins` (not `--bin X`): a `--bin` filter applies to every `-p`, which once left agent,
# app-controller and odoo-sim unbuilt on a fresh machine.
cargo build --quiet --bins -p app-controller -p engines -p agent -p odoo-sim
mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids" "$CLUSTER_DIR/demo"

# start NAME READY_URL ARGS...: (re)starts a process in the cluster's network namespace.
start() {
  local name=$1 ready=$2; shift 2
  local pidfile="$CLUSTER_DIR/pids/$name.pid"
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"; sleep 1
  fi
  ip netns exec "$VWS_NETNS" setsid bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" \
    env KUBECONFIG="$KUBECONFIG" "$@" >> "$CLUSTER_DIR/logs/$name.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do
    in_ns curl -fsS "$ready" >/dev/null 2>&1 && { log "$name ready (log $CLUSTER_DIR/logs/$name.log)"; return; }
    sleep 0.5
  done
  die "$name did not become ready; see $CLUSTER_DIR/logs/$name.log"
}

# The simulator keeps its state in a file, so a re-run finds its cluster record again.
key_file="$CLUSTER_DIR/demo/api-key"
[[ -s $key_file ]] || python3 -c 'import secrets; print("vws-demo-" + secrets.token_hex(16), end="")' > "$key_file"
start odoo-sim "$SIM_URL/sim/health" "$REPO_ROOT/target/debug/odoo-sim" serve --listen "${SIM_URL#http://}" \
  --state-file "$CLUSTER_DIR/demo/sim-state.json" --cluster "$CLUSTER_NAME" --api-key-file "$key_file"
sim() { in_ns env ODOO_SIM_URL="$SIM_URL" "$REPO_ROOT/target/debug/odoo-sim" "$@"; }
if [[ $MODE == pull ]]; then
  sim unset-push "$CLUSTER_NAME" >/dev/null   # a previous `just demo push` left a push target
  start agent http://127.0.0.1:18092/livez "$REPO_ROOT/target/debug/agent" \
    --control-plane-url "$SIM_URL" --insecure-allow-http --api-key-file "$key_file" \
    --cluster-name "$CLUSTER_NAME" $DEMO_SCOPE --admin-addr 127.0.0.1:18092 \
    --status-channel-addr "$CHANNEL" --sync-interval 5s   # new intent is pulled at the next sync (default 30s)
else
  token_file="$CLUSTER_DIR/demo/push-token"
  [[ -s $token_file ]] || python3 -c 'import secrets; print("vws-push-" + secrets.token_hex(16), end="")' > "$token_file"
  start agent http://127.0.0.1:18092/livez "$REPO_ROOT/target/debug/agent" \
    --mode push --push-addr "$PUSH_ADDR" --push-insecure-http --push-token-file "$token_file" \
    --cluster-name "$CLUSTER_NAME" $DEMO_SCOPE --admin-addr 127.0.0.1:18092 --status-channel-addr "$CHANNEL"
  log "odoo-sim now plays the module's push side: it calls http://$PUSH_ADDR (apply on intent, status every second)"
  sim set-push "$CLUSTER_NAME" --endpoint "http://$PUSH_ADDR" --token-file "$token_file" --poll-seconds 1 >/dev/null
fi
start app-controller http://127.0.0.1:18090/readyz "$REPO_ROOT/target/debug/app-controller" \
  $DEMO_SCOPE --admin-addr 127.0.0.1:18090 --status-channel-endpoint "http://$CHANNEL"
start runbook-engine http://127.0.0.1:18091/readyz "$REPO_ROOT/target/debug/runbook-engine" \
  $DEMO_SCOPE --admin-addr 127.0.0.1:18091 --status-channel-endpoint "http://$CHANNEL"

# The namespace is the cluster owner's: the agent applies only inside its allow-list.
kubectl_ create namespace demo --dry-run=client -o yaml | kubectl_ apply --server-side --field-manager=vws-demo -f - >/dev/null
log "declaring intent in the simulator: application demo/hello (chart demo-app 0.1.0)"
sim set-app "$CLUSTER_NAME" demo hello --spec e2e/samples/demo-app.json >/dev/null

log "following demo/hello as the simulator (Odoo's side, $MODE mode) sees it, until ready"
last="" state=""
for _ in $(seq 240); do
  line=$(sim show "$CLUSTER_NAME" 2>/dev/null | python3 -c '
import json, sys
view = json.load(sys.stdin)
o = next((o for o in view.get("objects", []) if o["namespace"] == "demo" and o["name"] == "hello"), None)
if o:
    r = (view.get("reports", {}).get("ApplicationInstance/demo/hello") or {}).get("report") or {}
    ready = next((c for c in r.get("conditions", []) if c["type"] == "Ready"), {})
    print(o.get("status", "?"), "|", ready.get("reason", "-"), ready.get("message", "")[:100])
' || true)
  state=${line%% *}
  if [[ -n $line && $line != "$last" ]]; then log "odoo-sim: $line"; last=$line; fi
  [[ $state == ready ]] && break
  sleep 0.5
done
echo
kubectl_ get applicationinstances,helmreleases,helmrepositories -n demo
kubectl_ get deployments,configmaps -n demo -l app.kubernetes.io/instance=hello
echo
echo "greeting rendered by the chart: $(kubectl_ get configmap hello-config -n demo -o jsonpath='{.data.greeting}')"
cat <<MSG

Everything keeps running (in network namespace $VWS_NETNS). Try:
  just in-cluster target/debug/odoo-sim --url $SIM_URL show $CLUSTER_NAME     # what Odoo sees
  just in-cluster kubectl get ai -A
  just in-cluster curl -s http://127.0.0.1:18092/metrics | grep vworkspace_agent
  just cluster-down          # stop everything
MSG
[[ $state == ready ]] || die "demo/hello was not reported ready; see $CLUSTER_DIR/logs/"
