#!/usr/bin/env bash
# `just chaos`: SIGKILL every binary at seeded random moments during install, upgrade,
# backup and restore, then stop the API server (2 min) and the control plane (5 min) under
# load, and count what was lost (must be 0). About twenty minutes; not part of CI.
# Environment: CHAOS_SEED (18), CHAOS_KILLS (10 per binary), CHAOS_API_OUTAGE (120 s),
# CHAOS_CP_OUTAGE (300 s). Figures: the CHAOS lines; docs/reliability.md records them.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
build_operator_bins
"$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/debug/chaos" 2>&1 \
  | tee "${CHAOS_LOG:-$REPO_ROOT/target/chaos.log}" | grep --line-buffered -E '^CHAOS|panicked|Error'
