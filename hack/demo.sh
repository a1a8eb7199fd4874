#!/usr/bin/env bash
# The main job, end to end as the product runs: a real local cluster (built and cached
# on first run) with Flux and Velero; the app controller and the four day-2 engines; the
# connectivity agent in pull mode; and the control plane: a REAL Odoo 19 (VWS_ODOO_SRC,
# default ../shared/odoo-19) with the reference addon `vworkspace` on Debian's PostgreSQL
# (docs/connectivity/odoo-addon.md). The sample application is declared as an Odoo record
# (Applications → New, as a person does; hack/demo_odoo.py over JSON-2 as Odoo's admin), the
# agent pulls it and applies an ApplicationInstance, Flux installs the chart, and the status
# travels back (through the gRPC status channel) until Odoo shows it ready. Then day-2, as
# Odoo drives it: a Backup, an Upgrade, and a failing Upgrade that is rolled back and
# restored by itself; each step is one Operation record, followed as Odoo shows it. It ends
# with headless Chromium reading Odoo's web client (hack/odoo_browser.py: the lists a person
# sees, checked against what the story did) and prints the web client's URL and a login.
# `just demo sim` runs the same story against odoo-sim, the SIMULATOR of the control plane
# (not Odoo), and `just demo push` runs the agent in push mode against the simulator, which
# plays the module's push side: it calls the agent's endpoint with the document and polls
# its status (plain http with --push-insecure-http: a development setting, as
# --insecure-allow-http is for pull mode). The reference addon has no push side
# (docs/connectivity/odoo-addon.md, "Push mode").
# The sample app's pods run on the cluster's real node (real-node-0: containerd, runc,
# kubelet), from images built here (hack/build-images.sh, never pulled), and the demo
# asks its Service for the greeting after each step. With VWS_REAL_NODE=0 (no real node)
# they land on the fake kwok node instead, and nothing answers.
# Leaves everything running; `just cluster-down` stops it all.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
MODE=${1:-odoo}
[[ $MODE == pull ]] && MODE=sim   # the name of the simulator's pull demo before Odoo was real
[[ $MODE == odoo || $MODE == sim || $MODE == push ]] || die "usage: just demo [odoo|sim|push]"
T0=$SECONDS

# Ports of the demo's own processes, used by no other recipe (e2e tests and benchmarks
# pick free ports at run time), so the demo can keep running beside them.
SIM_URL=http://127.0.0.1:18069
# Odoo: inside the cluster's network namespace on this port, carried out to the same port on
# this machine's loopback (hack/netns-bridge.py) for a person's browser.
ODOO_PORT=18169
ODOO_URL=http://127.0.0.1:$ODOO_PORT
CHANNEL=127.0.0.1:19091
PUSH_ADDR=127.0.0.1:18443
declare -A ADMIN=([app-controller]=18090 [runbook-engine]=18091 [agent]=18092
                  [backup-engine]=18093 [restore-engine]=18094 [upgrade-engine]=18095)
CLUSTER_NAME=demo
NS=demo
APP=hello
# Confined to the demo namespace, so the demo can keep running beside `just e2e`.
DEMO_SCOPE="--watch-namespace $NS --allowed-namespaces $NS"
BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug"
BINARIES=(odoo-sim "${OPERATOR_IMAGE_BINARIES[@]}")

if [[ $MODE == odoo ]]; then
  # Before the cluster: a missing Odoo source or package fails in seconds, not after the build.
  "$HACK_DIR/odoo.sh" deps
  "$HACK_DIR/odoo.sh" db-up   # outside the network namespace: PostgreSQL's socket crosses it
fi
"$HACK_DIR/cluster.sh" up
source "$CLUSTER_DIR/env"
kubectl_() { "$HACK_DIR/cluster.sh" exec "$VWS_BIN_DIR/kubectl" "$@"; }
in_ns() { "$HACK_DIR/cluster.sh" exec "$@"; }

log "building ${BINARIES[*]}"
# `--bins` for every package: a `--bin X` filter applies to every `-p`, which once left
# agent, app-controller and odoo-sim unbuilt on a fresh machine.
build_operator_bins
for b in "${BINARIES[@]}"; do
  [[ -x $BIN/$b ]] || die "cargo build did not produce $BIN/$b"
done
mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids" "$CLUSTER_DIR/demo"
SPEC="$CLUSTER_DIR/demo/demo-app.json"
if [[ ${VWS_REAL_NODE:-0} != 0 ]]; then
  log "building the sample app's images and importing them into $VWS_REAL_NODE"
  images=$(VWS_IMAGES=test "$HACK_DIR/build-images.sh" "$CLUSTER_DIR/demo/images")
  "$HACK_DIR/cluster.sh" load-images "$images"/*.oci.tar
  # The sample intent, placed on the real node (its taint keeps every other pod off it).
  python3 - e2e/samples/demo-app.json "$VWS_REAL_NODE" > "$SPEC" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["values"]["nodeSelector"] = {"kubernetes.io/hostname": sys.argv[2]}
spec["values"]["tolerations"] = [{"key": "vws.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}]
print(json.dumps(spec))
PY
else
  cp e2e/samples/demo-app.json "$SPEC"
fi

# Every process the demo depends on (the cluster's and its own): if one exits, the demo
# stops at once and shows that process's log instead of waiting for a state that
# cannot come.
WATCHED=()
watch_all_running() {
  local f
  WATCHED=()
  for f in "$CLUSTER_DIR"/pids/*.pid; do
    [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && WATCHED+=("$(basename "$f" .pid)")
  done
}
check_alive() {
  local name pid
  for name in "${WATCHED[@]}" "$@"; do
    pid=$(cat "$CLUSTER_DIR/pids/$name.pid" 2>/dev/null) || pid=""
    if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
      echo "---- last 40 lines of $CLUSTER_DIR/logs/$name.log ----" >&2
      tail -n 40 "$CLUSTER_DIR/logs/$name.log" >&2 || true
      die "$name exited; see $CLUSTER_DIR/logs/$name.log"
    fi
  done
}

# start NAME READY ARGS...: (re)starts a process in the cluster's network namespace and waits
# until READY (a URL that answers, or a path that exists) for START_TRIES half-seconds (60).
start() {
  local name=$1 ready=$2; shift 2
  local pidfile="$CLUSTER_DIR/pids/$name.pid"
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"; sleep 1
  fi
  rm -f "$pidfile"
  ip netns exec "$VWS_NETNS" setsid bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" \
    env KUBECONFIG="$KUBECONFIG" "$@" >> "$CLUSTER_DIR/logs/$name.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [[ -s $pidfile ]] && break; sleep 0.1; done
  for _ in $(seq "${START_TRIES:-60}"); do
    if [[ $ready == http* ]]; then in_ns curl -fsS "$ready" >/dev/null 2>&1; else [[ -e $ready ]]; fi &&
      { log "$name ready (log $CLUSTER_DIR/logs/$name.log)"; return; }
    check_alive "$name"
    sleep 0.5
  done
  die "$name did not become ready; see $CLUSTER_DIR/logs/$name.log"
}
admin() { echo "http://127.0.0.1:${ADMIN[$1]}"; }

# stop NAME: stops a process start() started (a re-run in another mode leaves the other control plane).
stop() {
  local pidfile="$CLUSTER_DIR/pids/$1.pid"
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then kill "$(cat "$pidfile")"; sleep 1; fi
  rm -f "$pidfile"
}
key_file="$CLUSTER_DIR/demo/api-key"
if [[ $MODE == odoo ]]; then
  stop odoo-sim
  # One database per cluster directory (two checkouts' demos share PostgreSQL, not records).
  # A new cluster gets a new database (`cluster.sh down` removes demo/, where the record's id
  # is kept); a re-run keeps it, with the addon updated to this checkout's.
  ODOO_DB="vws_demo_$(printf '%s' "$CLUSTER_DIR" | sha256sum | cut -c1-8)"
  odoo_sh() { VWS_ODOO_DB_SOCKET=1 VWS_ODOO_LOG_DIR="$CLUSTER_DIR/logs/odoo" "$HACK_DIR/odoo.sh" "$@"; }
  stop odoo; stop odoo-bridge; stop odoo-bridge-host
  if [[ -s $CLUSTER_DIR/demo/odoo-cluster.json ]]; then
    odoo_sh update "$ODOO_DB"
  else
    odoo_sh init "$ODOO_DB"
  fi
  # Keys made server-side (`odoo-bin shell`), as the addon's "Generate key" button does: the
  # cluster's bot (scope rpc) for the agent, and one of admin for the demo's own calls.
  odoo_sh cluster "$ODOO_DB" "$CLUSTER_NAME" rpc > "$CLUSTER_DIR/demo/odoo-cluster.json"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["keys"]["rpc"], end="")' \
    "$CLUSTER_DIR/demo/odoo-cluster.json" > "$key_file"
  odoo_sh admin-key "$ODOO_DB" | tr -d '\n' > "$CLUSTER_DIR/demo/odoo-admin-key"
  export VWS_DEMO_ODOO_URL="$ODOO_URL" VWS_DEMO_ODOO_DB="$ODOO_DB" VWS_DEMO_ODOO_KEY_FILE="$CLUSTER_DIR/demo/odoo-admin-key"
  VWS_DEMO_CLUSTER_ID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$CLUSTER_DIR/demo/odoo-cluster.json")
  export VWS_DEMO_CLUSTER_ID
  START_TRIES=240 start odoo "$ODOO_URL/web/login" env VWS_ODOO_DB_SOCKET=1 VWS_ODOO_SERVE_LOG="" \
    "$HACK_DIR/odoo.sh" serve "$ODOO_DB" "$ODOO_PORT"
  # Odoo's port on this machine's loopback: a Unix socket is a file, so it crosses the namespace.
  bridge_sock="$CLUSTER_DIR/demo/odoo.sock"
  rm -f "$bridge_sock"
  start odoo-bridge "$bridge_sock" python3 "$HACK_DIR/netns-bridge.py" unix-to-tcp "$bridge_sock" "127.0.0.1:$ODOO_PORT"
  # The same port number here, unless another checkout's demo holds it.
  host_port=$(python3 -c '
import socket, sys
for port in [int(sys.argv[1])] + list(range(18170, 18200)):
    try:
        socket.create_server(("127.0.0.1", port)).close()
        print(port); break
    except OSError:
        pass' "$ODOO_PORT")
  [[ -n $host_port ]] || die "no free port on this machine's loopback for Odoo's web client (18169-18199)"
  ODOO_HOST_URL=http://127.0.0.1:$host_port
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$CLUSTER_DIR/pids/odoo-bridge-host.pid" \
    python3 "$HACK_DIR/netns-bridge.py" tcp-to-unix "127.0.0.1:$host_port" "$bridge_sock" \
    >> "$CLUSTER_DIR/logs/odoo-bridge-host.log" 2>&1 < /dev/null &
  for _ in $(seq 40); do curl -fsS -o /dev/null "$ODOO_HOST_URL/web/login" 2>/dev/null && break; sleep 0.25; done
  curl -fsS -o /dev/null "$ODOO_HOST_URL/web/login" || die "Odoo does not answer at $ODOO_HOST_URL (see $CLUSTER_DIR/logs/odoo-bridge-host.log)"
  log "Odoo's web client: $ODOO_HOST_URL (database $ODOO_DB)"
  # Odoo tells the agent its pace (the cluster's "Sync interval (s)", default 30): new intent
  # is pulled within 5 s here.
  in_ns python3 "$HACK_DIR/demo_odoo.py" sync-interval 5
  start agent "$(admin agent)/livez" "$BIN/agent" \
    --control-plane-url "$ODOO_URL" --database "$ODOO_DB" --insecure-allow-http --api-key-file "$key_file" \
    --cluster-name "$CLUSTER_NAME" $DEMO_SCOPE --admin-addr "127.0.0.1:${ADMIN[agent]}" \
    --status-channel-addr "$CHANNEL" --sync-interval 5s   # new intent is pulled at the next sync (default 30s)
else
  stop odoo; stop odoo-bridge; stop odoo-bridge-host
  # The simulator keeps its state in a file, so a re-run finds its cluster record again.
  [[ -s $key_file ]] || python3 -c 'import secrets; print("vws-demo-" + secrets.token_hex(16), end="")' > "$key_file"
  start odoo-sim "$SIM_URL/sim/health" "$BIN/odoo-sim" serve --listen "${SIM_URL#http://}" \
    --state-file "$CLUSTER_DIR/demo/sim-state.json" --cluster "$CLUSTER_NAME" --api-key-file "$key_file"
fi
sim() { in_ns env ODOO_SIM_URL="$SIM_URL" "$BIN/odoo-sim" "$@"; }
if [[ $MODE == sim ]]; then
  sim unset-push "$CLUSTER_NAME" >/dev/null   # a previous `just demo push` left a push target
  start agent "$(admin agent)/livez" "$BIN/agent" \
    --control-plane-url "$SIM_URL" --insecure-allow-http --api-key-file "$key_file" \
    --cluster-name "$CLUSTER_NAME" $DEMO_SCOPE --admin-addr "127.0.0.1:${ADMIN[agent]}" \
    --status-channel-addr "$CHANNEL" --sync-interval 5s   # new intent is pulled at the next sync (default 30s)
elif [[ $MODE == push ]]; then
  token_file="$CLUSTER_DIR/demo/push-token"
  [[ -s $token_file ]] || python3 -c 'import secrets; print("vws-push-" + secrets.token_hex(16), end="")' > "$token_file"
  start agent "$(admin agent)/livez" "$BIN/agent" \
    --mode push --push-addr "$PUSH_ADDR" --push-insecure-http --push-token-file "$token_file" \
    --cluster-name "$CLUSTER_NAME" $DEMO_SCOPE --admin-addr "127.0.0.1:${ADMIN[agent]}" --status-channel-addr "$CHANNEL"
  log "odoo-sim now plays the module's push side: it calls http://$PUSH_ADDR (apply on intent, status every second)"
  sim set-push "$CLUSTER_NAME" --endpoint "http://$PUSH_ADDR" --token-file "$token_file" --poll-seconds 1 >/dev/null
fi
# The demo's charts come from the local cluster's plain-http chart server on 127.0.0.1,
# which the app controller refuses unless the host is named (docs/install/README.md#repositories).
declare -A EXTRA=([app-controller]="--insecure-repository-hosts 127.0.0.1")
# Each publisher authenticates to the agent's status channel with a token of its own
# ServiceAccount (the bundle projects one into each pod; here, minted with the TokenRequest API).
kubectl_ create namespace vworkspace-system --dry-run=client -o yaml | kubectl_ apply --server-side --field-manager=vws-demo -f - >/dev/null
for name in app-controller backup-engine restore-engine upgrade-engine runbook-engine; do
  kubectl_ create serviceaccount "$name" -n vworkspace-system --dry-run=client -o yaml \
    | kubectl_ apply --server-side --field-manager=vws-demo -f - >/dev/null
  token="$CLUSTER_DIR/demo/$name.status-channel-token"
  kubectl_ create token "$name" -n vworkspace-system --audience vworkspace-status-channel --duration 24h > "$token"
  start "$name" "$(admin "$name")/readyz" env VWS_STATUS_CHANNEL_TOKEN_FILE="$token" "$BIN/$name" \
    $DEMO_SCOPE ${EXTRA[$name]:-} --admin-addr "127.0.0.1:${ADMIN[$name]}" --status-channel-endpoint "http://$CHANNEL"
done
watch_all_running

# The control plane's side of the story: Odoo's records (hack/demo_odoo.py) or the simulator's.
if [[ $MODE == odoo ]]; then
  control_plane() { in_ns python3 "$HACK_DIR/demo_odoo.py" "$@"; }
  cp_set_app() { control_plane set-app "$NS" "$APP" "$1"; }        # SPEC_FILE or - (stdin)
  cp_delete_app() { control_plane delete-app "$NS" "$APP"; }
  cp_set_op() { control_plane set-op "$NS" "$1" -; }                # NAME; the spec on stdin
  cp_line() { control_plane line "$1" "$NS" "$2"; }                 # KIND NAME
  cp_table() { control_plane table; }
  cp_agent_error() { control_plane agent-error; }
else
  cp_set_app() { sim set-app "$CLUSTER_NAME" "$NS" "$APP" --spec "$1" >/dev/null; }
  cp_delete_app() { sim delete-app "$CLUSTER_NAME" "$NS" "$APP" >/dev/null; }
  cp_set_op() { sim set-op "$CLUSTER_NAME" "$NS" "$1" --spec - >/dev/null; }
  cp_line() { sim show "$CLUSTER_NAME" | python3 "$HACK_DIR/demo_view.py" line "$1" "$NS" "$2"; }
  cp_table() { sim show "$CLUSTER_NAME" | python3 "$HACK_DIR/demo_view.py" table; }
  cp_agent_error() { sim show "$CLUSTER_NAME" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("last_agent_error") or "none")'; }
fi

# follow KIND NAME DONE_REGEX SECONDS: prints each change of the simulator's view of one
# object (Odoo's side) with the time since the step began, until the status matches
# DONE_REGEX; sets FOLLOWED to the last line. Fails if a watched process exits or time runs out.
FOLLOWED=""
# describe_pods_and_node: why the app's pods are not Ready (phase, waiting or terminated
# reasons, unschedulable messages, the last Warning events) and the real node's taints and
# any pressure condition, so a timeout in a CI log says what held the pods back.
describe_pods_and_node() {
  kubectl_ get pods -n "$NS" -o json | python3 -c '
import json, sys
for pod in json.load(sys.stdin)["items"]:
    st = pod.get("status", {})
    why = [c.get("reason", "") + " " + c.get("message", "") for c in st.get("conditions", []) if c.get("status") != "True"]
    for cs in st.get("containerStatuses", []) + st.get("initContainerStatuses", []):
        for k, v in cs.get("state", {}).items():
            if k != "running":
                why.append("%s %s: %s %s" % (cs["name"], k, v.get("reason", ""), v.get("message", "")))
    print("  pod %s on %s: %s; %s" % (pod["metadata"]["name"], pod["spec"].get("nodeName", "-"), st.get("phase"), "; ".join(dict.fromkeys(w.strip() for w in why if w.strip())) or "ready"))
'
  kubectl_ get events -n "$NS" --field-selector type=Warning -o json | python3 -c '
import json, sys
for e in json.load(sys.stdin)["items"][-8:]:
    print("  event %s %s: %s" % (e.get("involvedObject", {}).get("name"), e.get("reason"), e.get("message", "").strip()))
'
  [[ ${VWS_REAL_NODE:-0} != 0 ]] || return 0
  kubectl_ get node "$VWS_REAL_NODE" -o json | python3 -c '
import json, sys
node = json.load(sys.stdin)
print("  node %s taints: %s" % (node["metadata"]["name"], ", ".join("%s:%s" % (t["key"], t["effect"]) for t in node["spec"].get("taints", [])) or "none"))
for c in node["status"].get("conditions", []):
    if (c["type"] == "Ready") != (c["status"] == "True"):
        print("  node condition %s=%s %s: %s" % (c["type"], c["status"], c.get("reason", ""), c.get("message", "")))
'
}
follow() {
  local kind=$1 name=$2 done_re=$3 secs=$4 t0=$SECONDS last="" line
  while :; do
    check_alive
    line=$(cp_line "$kind" "$name" 2>/dev/null || true)
    if [[ -n $line && $line != "$last" ]]; then
      printf '  %6ss  %s\n' "$((SECONDS - t0))" "$line" >&2; last=$line
    fi
    FOLLOWED=$line
    [[ ${line%% *} =~ ^($done_re)$ ]] && return 0
    if (( SECONDS - t0 > secs )); then
      # The agent's last error as the simulator recorded it (e.g. a refused key) says why.
      local agent_error
      agent_error=$(cp_agent_error 2>/dev/null || true)
      log "the namespace's pods and the real node, as the API server sees them:"
      describe_pods_and_node >&2 || true
      die "$kind $NS/$name: no '$done_re' after ${secs}s (last: ${line:-nothing}; the agent's last error: ${agent_error:-unknown}); logs in $CLUSTER_DIR/logs/"
    fi
    sleep 0.5
  done
}
step() { echo >&2; log "── $* ──"; STEP_T0=$SECONDS; }
# served EXPECTED: the app's pods on the real node answer on its Service with EXPECTED
# (through kube-proxy; a rollout may still be replacing pods, so a few tries).
served() {
  [[ ${VWS_REAL_NODE:-0} != 0 ]] || return 0
  local ip body=""
  ip=$(kubectl_ get service "$APP" -n "$NS" -o jsonpath='{.spec.clusterIP}')
  for _ in $(seq 60); do
    body=$(in_ns curl -fsS -m 2 "http://$ip/" 2>/dev/null || true)
    [[ $body == "$1" ]] && break
    sleep 0.5
  done
  kubectl_ get pods -n "$NS" -l app.kubernetes.io/instance="$APP" -o wide
  [[ $body == "$1" ]] || die "the Service $NS/$APP ($ip) answered '${body}', expected '$1'"
  log "GET http://$ip/ (Service $NS/$APP, pods on $VWS_REAL_NODE): $body"
}
step_done() { log "   done in $((SECONDS - STEP_T0))s: $*"; }

# The namespace is the cluster owner's: the agent applies only inside its allow-list.
kubectl_ create namespace "$NS" --dry-run=client -o yaml | kubectl_ apply --server-side --field-manager=vws-demo -f - >/dev/null
if kubectl_ get applicationinstance -n "$NS" "$APP" >/dev/null 2>&1; then
  step "an earlier demo left $NS/$APP: Odoo deletes it first (explicit deletion intent)"
  if [[ $MODE == odoo ]] && [[ $(cp_line ApplicationInstance "$APP") == not_declared* ]]; then
    # A new database has no record of it (an earlier demo's, before `cluster.sh down`).
    kubectl_ delete applicationinstance -n "$NS" "$APP" --wait=false >/dev/null
  else
    cp_delete_app
  fi
  for _ in $(seq 240); do
    kubectl_ get applicationinstance -n "$NS" "$APP" >/dev/null 2>&1 || break
    check_alive; sleep 0.5
  done
  kubectl_ get applicationinstance -n "$NS" "$APP" >/dev/null 2>&1 && die "$NS/$APP was not deleted"
  step_done "removed"
fi

step "install: Odoo declares $NS/$APP (chart demo-app 0.1.0); the agent pulls it, Flux installs it ($MODE mode)"
cp_set_app "$SPEC"
follow ApplicationInstance "$APP" ready 180
step_done "$FOLLOWED"
kubectl_ get applicationinstances,helmreleases,helmrepositories -n "$NS"
kubectl_ get deployments,configmaps -n "$NS" -l app.kubernetes.io/instance="$APP"
log "greeting rendered by the chart: $(kubectl_ get configmap "$APP-config" -n "$NS" -o jsonpath='{.data.greeting}')"
served "Hello from vWorkspace"

# Day-2. Operation names and request ids are new on each run (Operations are immutable,
# and a replayed requestId ends DuplicateRequest without acting).
RUN=$(date +%H%M%S)
DEADLINE=$(date -u -d '+20 min' +%Y-%m-%dT%H:%M:%SZ)
# declare_op NAME TYPE PARAMS_JSON: Odoo declares an Operation on the app.
declare_op() {
  local name=$1 type=$2 params=$3 field
  field=$(tr '[:upper:]' '[:lower:]' <<<"$type")
  printf '{"type":"%s","applicationRef":{"name":"%s"},"requestId":"demo-%s","deadline":"%s","%s":%s}' \
    "$type" "$APP" "$name" "$DEADLINE" "$field" "$params" | cp_set_op "$name"
}

step "backup: Odoo asks for a Backup Operation (Velero, to S3 on loopback)"
declare_op "$APP-backup-$RUN" Backup '{"ttl":"72h"}'
follow Operation "$APP-backup-$RUN" 'succeeded|failed|expired|refused' 180
[[ ${FOLLOWED%% *} == succeeded ]] || die "the backup did not succeed: $FOLLOWED"
step_done "$FOLLOWED"

step "upgrade: Odoo asks for demo-app 0.2.0 with a new greeting (Upgrade Operation, Flux upgrades)"
declare_op "$APP-upgrade-$RUN" Upgrade '{"chartVersion":"0.2.0","valuesPatch":{"greeting":"Hello again, from demo-app 0.2.0"}}'
follow Operation "$APP-upgrade-$RUN" 'succeeded|failed|expired|refused' 240
[[ ${FOLLOWED%% *} == succeeded ]] || die "the upgrade did not succeed: $FOLLOWED"
# As protocol.md asks: the Operation now owns the version (the agent acknowledges the old
# intent as a conflict), so Odoo adopts what is in force.
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); s["chart"]["version"]="0.2.0"; s["values"]["greeting"]=sys.argv[2]; print(json.dumps(s))' \
  "$SPEC" "Hello again, from demo-app 0.2.0" | cp_set_app -
follow ApplicationInstance "$APP" ready 120
served "Hello again, from demo-app 0.2.0"
step_done "greeting now: $(kubectl_ get configmap "$APP-config" -n "$NS" -o jsonpath='{.data.greeting}')"

step "failing upgrade: Odoo asks for demo-app 0.3.0 (broken on purpose) with backupFirst and onFailure RollbackAndRestore"
declare_op "$APP-broken-$RUN" Upgrade '{"chartVersion":"0.3.0","backupFirst":true,"onFailure":"RollbackAndRestore"}'
follow Operation "$APP-broken-$RUN" 'succeeded|failed|expired|refused' 420
[[ ${FOLLOWED%% *} == failed && $FOLLOWED == *UpgradeFailed* ]] \
  || die "the broken upgrade should fail with UpgradeFailed after its rollback and restore: $FOLLOWED"
follow ApplicationInstance "$APP" ready 120
[[ $FOLLOWED == *"deployed 0.2.0"* ]] || die "the app is not back on 0.2.0: $FOLLOWED"
served "Hello again, from demo-app 0.2.0"
step_done "rolled back to 0.2.0 and restored from the pre-upgrade backup; greeting: $(kubectl_ get configmap "$APP-config" -n "$NS" -o jsonpath='{.data.greeting}')"

echo >&2
if [[ $MODE == odoo ]]; then
  log "what Odoo holds (its records of cluster $CLUSTER_NAME, condensed):"
else
  log "what the simulator holds (odoo-sim show $CLUSTER_NAME, condensed):"
fi
cp_table
kubectl_ get operations -n "$NS"
if [[ $MODE == odoo ]]; then
  step "what a person sees: headless Chromium logs in to $ODOO_HOST_URL and reads the Applications and Operations lists"
  expect=$(python3 -c 'import json, sys; app, run = sys.argv[1], sys.argv[2]; print(json.dumps({
      "applications": [{"name": app, "status": "Ready", "deployed_chart_version": "0.2.0"}],
      "operations": [{"name": f"{app}-backup-{run}", "status": "Succeeded"},
                     {"name": f"{app}-upgrade-{run}", "status": "Succeeded"},
                     {"name": f"{app}-broken-{run}", "status": "Failed"}]}))' "$APP" "$RUN")
  "$HACK_DIR/odoo_browser.py" "$ODOO_HOST_URL" admin admin "$expect" "$CLUSTER_DIR/demo" \
    || die "Odoo's web client does not show what the story did (expected: $expect)"
  step_done "the web client shows $NS/$APP Ready on 0.2.0, the backup and the upgrade Succeeded, the broken upgrade Failed"
fi
log "demo finished in $((SECONDS - T0))s"
if [[ $MODE == odoo ]]; then
  cat <<MSG

Odoo's web client: $ODOO_HOST_URL/odoo/vworkspace-applications   (login admin, password admin; database $ODOO_DB)
  Applications, Operations and Clusters are under the vWorkspace menu; what Chromium saw:
  $CLUSTER_DIR/demo/odoo-applications.png, $CLUSTER_DIR/demo/odoo-operations.png
MSG
fi
SIM_HINT=""
[[ $MODE == odoo ]] || SIM_HINT="  just in-cluster target/debug/odoo-sim --url $SIM_URL show $CLUSTER_NAME     # what the simulator holds, in full
"
cat <<MSG

Everything keeps running (in network namespace $VWS_NETNS). Try:
${SIM_HINT}  just in-cluster kubectl get ai,vop -A                                      # ApplicationInstances, Operations
  just in-cluster kubectl get configmap $APP-revisions -n $NS -o yaml            # the revision history
  just in-cluster kubectl get backups.velero.io,restores.velero.io -n velero
  just in-cluster curl -s http://127.0.0.1:${ADMIN[agent]}/metrics | grep vworkspace_agent
  just cluster-down          # stop everything
MSG
