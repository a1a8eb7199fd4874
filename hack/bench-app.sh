#!/usr/bin/env bash
# `just bench-app [ARGS]`: app-controller benchmark on the real local cluster
# (release builds). Without ARGS runs the two standard cases: 100 apps with real
# Helm installs (plus the Flux-alone baseline) and 1000 apps materialised
# suspended. With `--engine argocd` in ARGS, starts Argo CD first (on demand,
# hack/argocd.sh). Prints figures; docs/performance.md records them.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
# Outside the netns: building Argo CD needs the module proxy (a no-op when it runs already).
args=" $* "
if [[ $args == *" --engine argocd "* || $args == *" --engine=argocd "* ]]; then
  "$HACK_DIR/cluster.sh" start-argocd
fi
cargo build --release --quiet -p app-controller
cargo build --release --quiet -p e2e --bin bench-app
run() { "$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/release/bench-app" "$@"; }
if (($#)); then
  run "$@"
else
  run --apps 100
  run --apps 1000 --suspended
fi
