#!/usr/bin/env bash
# Runs the e2e suite inside the cluster's loopback-only network namespace.
# Brings the local cluster up if it is not running, and then takes it down
# again at the end (set VWS_KEEP_CLUSTER=1 to keep it). Extra arguments go to
# the test binary (e.g. a test name filter).
#
#   hack/e2e.sh --file FILE [ARGS]   only e2e/tests/FILE.rs (`just e2e-file`): builds that
#                                    binary alone, readies what it needs, runs it; a cluster
#                                    this started is kept up, for the next run
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

file=""
if [[ ${1:-} == --file ]]; then
  file=${2:?usage: hack/e2e.sh --file FILE [ARGS]}
  shift 2
  [[ -f e2e/tests/$file.rs ]] ||
    die "no test file e2e/tests/$file.rs; the files are: $(cd e2e/tests && ls -- *.rs | sed 's/\.rs$//' | tr '\n' ' ')"
fi

# Whether one of the e2e test files FILE... (names of e2e/tests/*.rs) uses the harness module
# MODULE (`MODULE::` in its source): what a file needs beyond the cluster follows from it.
e2e_uses() { # MODULE FILE...
  local module=$1 f
  shift
  for f in "$@"; do
    grep -qE "(^|[^[:alnum:]_])($module)::" "$REPO_ROOT/e2e/tests/$f.rs" && return 0
  done
  return 1
}

# What the test files FILE... need besides a running cluster, made ready here, outside the
# network namespace (neither crates.io, the module proxy nor Debian is reachable inside it).
# Each step is cheap when already done.
prepare_e2e() { # FILE...
  # Build outside the netns, run inside it.
  build_operator_bins
  # Our images (and Flux's, Velero's, the test charts') into the real node, from the binaries
  # just built: tests that run the bundle in the cluster use them (never pulled), and
  # e2e::real_node::image reads their list.
  if [[ -n $("$HACK_DIR/cluster.sh" env | grep VWS_REAL_NODE= || true) ]] && e2e_uses 'real_node|bundle' "$@"; then
    local images
    images=$("$HACK_DIR/build-images.sh")
    "$HACK_DIR/cluster.sh" load-images "$images"/*.oci.tar
  fi
  # Argo CD is started on demand by the tests that need it (hack/cluster.sh start-argocd, from
  # inside the netns): build it (cached, keyed by hack/versions-argocd.env) and install
  # redis-server here.
  if e2e_uses argocd "$@"; then "$HACK_DIR/build-argocd-bins.sh" >/dev/null; fi
  # Real Odoo (e2e::odoo) reaches PostgreSQL over its Unix socket from inside the netns, but
  # cannot start it there: Odoo's Debian packages, PostgreSQL running, the socket's role.
  if e2e_uses odoo "$@"; then
    "$HACK_DIR/odoo.sh" deps
    "$HACK_DIR/odoo.sh" db-up
  fi
}

started=0
if ! "$HACK_DIR/cluster.sh" status >/dev/null 2>&1; then
  "$HACK_DIR/cluster.sh" up
  started=1
fi
cleanup() {
  if [[ $started == 1 && -z $file && -z ${VWS_KEEP_CLUSTER:-} ]]; then "$HACK_DIR/cluster.sh" down; fi
}
trap cleanup EXIT

if [[ -n $file ]]; then
  prepare_e2e "$file"
  t0=$SECONDS
  # One lane: the whole range of test ports, the same environment as a lane of the full run.
  status=0
  "$HACK_DIR/e2e-lanes.py" --lanes 1 --test "$file" -- "$@" || status=$?
  log "e2e $file finished in $((SECONDS - t0))s (cluster kept up: just cluster-down stops it)"
  exit "$status"
fi
mapfile -t files < <(cd e2e/tests && ls -- *.rs | sed 's/\.rs$//')
prepare_e2e "${files[@]}"
t0=$SECONDS
# Every test file runs (a failure in one hides no other's), several side by side
# (hack/e2e-lanes.py: VWS_E2E_LANES, default 3; VWS_E2E_THREADS tests per file, default 4).
status=0
"$HACK_DIR/e2e-lanes.py" -- "$@" || status=$?
log "e2e finished in $((SECONDS - t0))s"
exit "$status"
