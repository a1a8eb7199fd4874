#!/usr/bin/env bash
# Shared settings for the hack/ scripts. Source it; do not run it.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HACK_DIR/.." && pwd)"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
# shellcheck source=versions-velero.env
source "$HACK_DIR/versions-velero.env"
# shellcheck source=versions-node.env
source "$HACK_DIR/versions-node.env"
# shellcheck source=versions-registry.env
source "$HACK_DIR/versions-registry.env"
# shellcheck source=versions-argocd.env
source "$HACK_DIR/versions-argocd.env"

export GOTOOLCHAIN=local
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

# Binaries live outside the repository, keyed by everything that decides them,
# so a clean clone reuses them and a version bump rebuilds.
CACHE_ROOT="${VWS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vworkspace-operator}"
# Velero (hack/tools/velero, hack/versions-velero.env), the real node
# (hack/tools/node-*, hack/versions-node.env), the OCI registry
# (hack/tools/registry, hack/versions-registry.env) and Argo CD
# (hack/tools/argocd, hack/versions-argocd.env) are cached on their own, so
# they are left out of this key: adding or bumping them never rebuilds Kubernetes.
cache_key() {
  local d mods=() sums=()
  for d in "$HACK_DIR"/tools/*/; do
    [[ $d == */tools/velero/ || $d == */tools/node-*/ || $d == */tools/registry/ || $d == */tools/argocd/ ]] && continue
    mods+=("${d}go.mod"); sums+=("${d}go.sum")
  done
  { cat "$HACK_DIR/versions.env" "${mods[@]}" "${sums[@]}" 2>/dev/null || true; } | sha256sum | cut -c1-16
}
BIN_DIR="$CACHE_ROOT/bin-$(cache_key)"

# Velero server, its AWS plugin and the moto venv, keyed by their own pins only.
velero_cache_key() {
  { grep -E '^(VELERO|MOTO)_' "$HACK_DIR/versions-velero.env"
    cat "$HACK_DIR"/tools/velero/go.mod "$HACK_DIR"/tools/velero/go.sum \
        "$HACK_DIR"/tools/velero/moto-requirements.txt 2>/dev/null || true; } | sha256sum | cut -c1-16
}
VELERO_DIR="$CACHE_ROOT/velero-$(velero_cache_key)"

# The real node's binaries and pause image (hack/build-node-bins.sh), keyed by
# KUBE_VERSION (kubelet, kube-proxy), versions-node.env and the node-*
# wrappers. Like bin-<hash>, not keyed by the build script: a change of build
# flags there needs a new directory by hand (delete it, or bump NODE_BUILD_REV).
node_cache_key() {
  { grep -E '^KUBE_VERSION=' "$HACK_DIR/versions.env"
    cat "$HACK_DIR/versions-node.env" "$HACK_DIR"/tools/node-*/go.mod "$HACK_DIR"/tools/node-*/go.sum 2>/dev/null || true; } | sha256sum | cut -c1-16
}
NODE_DIR="$CACHE_ROOT/node-$(node_cache_key)"

# The OCI registry and its htpasswd helper (hack/build-registry-bins.sh), keyed
# by hack/versions-registry.env, the wrapper and the helper's source.
registry_cache_key() {
  { cat "$HACK_DIR/versions-registry.env" "$HACK_DIR"/tools/registry/go.mod "$HACK_DIR"/tools/registry/go.sum \
        "$HACK_DIR"/tools/registry/htpasswd/main.go 2>/dev/null || true; } | sha256sum | cut -c1-16
}
REGISTRY_DIR="$CACHE_ROOT/registry-$(registry_cache_key)"

# Argo CD (one multi-call binary), the helm CLI its repo-server execs and Argo CD's
# CRDs and RBAC (hack/build-argocd-bins.sh), keyed by hack/versions-argocd.env and
# the wrapper. Only `hack/cluster.sh start-argocd` uses them; `up` never builds them.
argocd_cache_key() {
  { cat "$HACK_DIR/versions-argocd.env" "$HACK_DIR"/tools/argocd/go.mod "$HACK_DIR"/tools/argocd/go.sum 2>/dev/null || true; } | sha256sum | cut -c1-16
}
ARGOCD_DIR="$CACHE_ROOT/argocd-$(argocd_cache_key)"

# Runtime state of the local cluster (certs, kubeconfig, logs, pids): ignored by git.
CLUSTER_DIR="${VWS_CLUSTER_DIR:-$REPO_ROOT/target/e2e-cluster}"
KUBECONFIG_PATH="$CLUSTER_DIR/admin.kubeconfig"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The operator's binaries (debug; the images may pass --release), built by this one command
# everywhere (the demo, e2e, the images, chaos): Cargo resolves dependency features over the
# packages one invocation selects, so `--workspace` (which pulls in test-support, hence
# tokio's test-util) or a shorter `-p` list compiled tokio, hyper, kube and everything above
# them once more, with its own copy in target/. e2e/Cargo.toml asks for the same kube
# features, so its tests reuse this build too (docs/development/README.md, "Disk and build
# reuse").
OPERATOR_PACKAGES=(app-controller engines agent odoo-sim kubectl-vws)
# The binaries that run in the cluster as the operator's own images (build-images.sh packs
# them; the demo runs them, with odoo-sim).
OPERATOR_IMAGE_BINARIES=(app-controller backup-engine restore-engine upgrade-engine runbook-engine agent)
build_operator_bins() { # [cargo build flags...]
  local selection=() p
  for p in "${OPERATOR_PACKAGES[@]}"; do selection+=(-p "$p"); done
  (cd "$REPO_ROOT" && cargo build --quiet --bins "${selection[@]}" "$@")
}

# The release binaries of every benchmark, in one cargo invocation shared by all `hack/bench-*.sh`:
# cargo unifies dependency features over the packages of one invocation, so building each
# benchmark's packages on their own compiled the common dependencies once per feature set.
build_bench_release() {
  cargo build --release --quiet -p app-controller -p agent -p odoo-sim -p engines -p e2e \
    --bin app-controller --bin agent --bin odoo-sim --bin runbook-engine \
    --bin bench-app --bin bench-ops --bin bench-agent
}
go_mod_dir() { go mod download -json "$1" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])'; }
