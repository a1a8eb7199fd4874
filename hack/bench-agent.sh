#!/usr/bin/env bash
# `just bench-agent [ARGS]`: connectivity-agent benchmark (release builds). Brings the
# local cluster up if needed (VWS_NETNS / VWS_CLUSTER_DIR pick which one, as for
# hack/cluster.sh) and runs inside its netns:
#   (a) status change in the cluster -> the simulator has it, p50/p99, with the gRPC
#       status channel and without it, and the real agent's RSS;
#   (b) 1,000 simulated agents (tasks of one process, the agent's own client) against one
#       odoo-sim at a 30 s sync interval: requests/s, bytes per sync at rest, memory.
#   (c) the real agent with 10,000 suspended ApplicationInstances: full resync (calls,
#       bytes, time), RSS, and the latency while 1,000 of them change at once
#       (--scale-objects N --scale-changes M --scale-namespaces K --keep-objects).
# Prints figures; docs/performance.md records them. One part: --part latency|fleet|scale.
# Longer fleet window than 60 s: BENCH_AGENT_FLEET_WINDOW_SECS=600 just bench-agent.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
"$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || "$HACK_DIR/cluster.sh" up
build_bench_release
# One connection per simulated agent (--client-per-agent) needs a few thousand descriptors.
if (( $(ulimit -n) < 8192 )); then ulimit -n "$(ulimit -Hn)" 2>/dev/null || true; fi
"$HACK_DIR/cluster.sh" exec "$REPO_ROOT/target/release/bench-agent" "$@"
