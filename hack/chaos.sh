#!/usr/bin/env bash
# `just chaos`: SIGKILL every binary at seeded random moments during install, upgrade,
# backup and restore, then stop the API server (2 min) and the control plane (5 min) under
# load, and count what was lost (must be 0). About 25 minutes; not part of CI.
# Last, real Odoo 19 and PostgreSQL as the control plane, killed, and an answer Odoo committed
# lost on its way. Environment: CHAOS_SEED (18), CHAOS_KILLS (10 per binary),
# CHAOS_API_OUTAGE (120 s), CHAOS_CP_OUTAGE (300 s), CHAOS_ODOO_FAULTS (5 of each),
# CHAOS_PHASES (some of kills,api,control-plane,push,odoo; all by default). Figures: the
# CHAOS lines; docs/reliability.md.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
build_operator_bins
(cd "$REPO_ROOT" && cargo build --quiet -p e2e --bin chaos)
if [[ -z ${CHAOS_PHASES:-} || ,${CHAOS_PHASES// /}, == *,odoo,* ]]; then
  "$HACK_DIR/odoo.sh" deps
  "$HACK_DIR/odoo.sh" db-up
  # PostgreSQL is started again where it listens on TCP, this (the host's) network namespace,
  # which a process inside the cluster's cannot name: give it a name for the run.
  export VWS_HOST_NETNS="vws-host-$$"
  ip netns attach "$VWS_HOST_NETNS" $$
  trap 'ip netns delete "$VWS_HOST_NETNS" 2>/dev/null || true' EXIT
fi
"$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/debug/chaos" 2>&1 \
  | tee "${CHAOS_LOG:-$REPO_ROOT/target/chaos.log}" | grep --line-buffered -E '^CHAOS|panicked|Error'
