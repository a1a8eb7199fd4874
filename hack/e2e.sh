#!/usr/bin/env bash
# Runs the e2e suite inside the cluster's loopback-only network namespace.
# Brings the local cluster up if it is not running, and then takes it down
# again at the end (set VWS_KEEP_CLUSTER=1 to keep it). Extra arguments go to
# the test binary (e.g. a test name filter).
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

started=0
if ! "$HACK_DIR/cluster.sh" status >/dev/null 2>&1; then
  "$HACK_DIR/cluster.sh" up
  started=1
fi
cleanup() {
  if [[ $started == 1 && -z ${VWS_KEEP_CLUSTER:-} ]]; then "$HACK_DIR/cluster.sh" down; fi
}
trap cleanup EXIT

# Build outside the netns (crates.io is not reachable inside it), run inside it.
build_operator_bins
# Our images (and Flux's, Velero's, the test charts') into the real node, from the binaries
# just built: tests that run the bundle in the cluster use them (never pulled).
if [[ -n $("$HACK_DIR/cluster.sh" env | grep VWS_REAL_NODE= || true) ]]; then
  images=$("$HACK_DIR/build-images.sh")
  "$HACK_DIR/cluster.sh" load-images "$images"/*.oci.tar
fi
# Argo CD is started on demand by the tests that need it (hack/cluster.sh start-argocd, from
# inside the netns, where neither the module proxy nor Debian is reachable): build it (cached,
# keyed by hack/versions-argocd.env) and install redis-server here, outside.
"$HACK_DIR/build-argocd-bins.sh" >/dev/null
t0=$SECONDS
# Every test file runs (a failure in one hides no other's), several side by side
# (hack/e2e-lanes.py: VWS_E2E_LANES, default 3; VWS_E2E_THREADS tests per file, default 4).
status=0
"$HACK_DIR/e2e-lanes.py" -- "$@" || status=$?
log "e2e finished in $((SECONDS - t0))s"
exit "$status"
