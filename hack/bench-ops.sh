#!/usr/bin/env bash
# `just bench-ops [ARGS]`: runbook-engine benchmark on the real local cluster
# (release builds). Default: 1,000 Runbook Operations across 100 apps. Prints
# figures; docs/performance.md records them.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
build_bench_release
if (($#)); then set -- "$@"; else set -- --ops 1000 --apps 100; fi
"$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/release/bench-ops" "$@"
