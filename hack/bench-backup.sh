#!/usr/bin/env bash
# `just bench-backup [ARGS]`: backup and restore throughput of volume data on the real node,
# as a ratio to a plain `cp` of the same data on the same disk in the same run, and the time
# from Operation created to Velero started. Default: 1 GiB. Prints figures;
# docs/performance.md records them.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
# The controllers the benchmark starts (e2e builds) and the images the real node runs.
build_operator_bins
cargo build --quiet -p e2e --bin bench-backup
images=$("$HACK_DIR/build-images.sh")
"$HACK_DIR/cluster.sh" load-images "$images"/*.oci.tar
if (($#)); then set -- "$@"; else set -- --size-mib 1024; fi
"$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/debug/bench-backup" "$@"
