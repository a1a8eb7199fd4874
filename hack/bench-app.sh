#!/usr/bin/env bash
# `just bench-app [ARGS]`: app-controller benchmark on the real local cluster
# (release builds). Without ARGS runs the three standard cases: 100 apps with real
# Helm installs against Flux alone over 3 alternating pairs, then 1,000 and 10,000
# apps materialised suspended (10 namespaces, 5 repository URLs), and prints the
# time each case took. With `--engine argocd` in ARGS, starts Argo CD first (on
# demand, hack/argocd.sh). Prints figures; docs/performance.md records them.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
# Outside the netns: building Argo CD needs the module proxy (a no-op when it runs already).
args=" $* "
if [[ $args == *" --engine argocd "* || $args == *" --engine=argocd "* ]]; then
  "$HACK_DIR/cluster.sh" start-argocd
fi
build_bench_release
run() { "$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/release/bench-app" "$@"; }
if (($#)); then
  run "$@"
else
  cases=("--apps 100 --pairs 3" "--apps 1000 --suspended" "--apps 10000 --suspended")
  times=()
  for c in "${cases[@]}"; do
    start=$SECONDS
    # shellcheck disable=SC2086 # the case's words are separate arguments
    run $c
    times+=("bench-app $c: $((SECONDS - start)) s")
  done
  printf '%s\n' "${times[@]}"
fi
