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
cargo test -p e2e --no-run --quiet
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
# --no-fail-fast: every test file runs, so a failure in one does not hide another's.
"$HACK_DIR/cluster.sh" exec cargo test -p e2e --offline --no-fail-fast -- --test-threads="${VWS_E2E_THREADS:-4}" "$@"
log "e2e finished in $((SECONDS - t0))s"
