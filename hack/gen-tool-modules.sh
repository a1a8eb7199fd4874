#!/usr/bin/env bash
# Regenerates the wrapper Go modules under hack/tools/ from hack/versions.env.
#
# Why wrappers: none of these upstream commands can be `go install`ed at a
# version, because their go.mod files carry `replace` directives (k/k's staging
# modules, etcd's ../api, Flux's ./api). A wrapper module requires the upstream
# module and re-states the non-local replaces, taken from the upstream go.mod
# itself so a version bump never needs hand-editing.
#
#   hack/gen-tool-modules.sh               regenerate every wrapper
#   hack/gen-tool-modules.sh velero ...    only the named ones (kube, etcd, kwok,
#                                          helm-controller, source-controller, velero,
#                                          node-kube, node-containerd, node-runc, node-cni,
#                                          node-coredns, node-local-path, registry, argocd)
source "$(dirname "$0")/lib.sh"

SELECTED=("$@")
selected() { # name: true if no names were given on the command line, or this one was
  (( ${#SELECTED[@]} == 0 )) && return 0
  local s; for s in "${SELECTED[@]}"; do [[ $s == "$1" ]] && return 0; done
  return 1
}

gen_module() { # tools-subdir module-path: a fresh wrapper go.mod
  local dir="$HACK_DIR/tools/$1" mod="$2"
  rm -rf "$dir"; mkdir -p "$dir"
  printf 'module %s\n\ngo 1.26.0\n' "$mod" > "$dir/go.mod"
}

copy_nonlocal_replaces() { # dir upstream-go.mod
  # Every `old => new version` replace of the upstream go.mod, except local paths.
  python3 - "$2" <<'PY' | while read -r spec; do (cd "$1" && go mod edit -replace="$spec"); done
import re, sys
text = open(sys.argv[1]).read()
lines = []
for block in re.findall(r'^replace\s*\((.*?)^\)', text, re.S | re.M):
    lines += block.splitlines()
lines += re.findall(r'^replace\s+([^(\n].*)$', text, re.M)
for line in lines:
    line = line.split('//')[0].strip()
    m = re.match(r'(\S+)(?:\s+\S+)?\s*=>\s*(\S+)\s+(\S+)$', line)
    if m and not m.group(2).startswith('.'):
        print(f"{m.group(1)}={m.group(2)}@{m.group(3)}")
PY
}

# Flux builds helm-controller against a Helm fork (github.com/fluxcd/helm/v4
# vX.Y.Z-flux.N). Where the module proxy does not serve that fork, fall back to
# upstream Helm at the fork's base version and say so: the fork carries small
# patches (see docs/development/local-cluster.md), not API changes.
fallback_unavailable_forks() { # dir
  local dir="$1" spec
  for spec in $(cd "$dir" && go mod edit -json | python3 -c '
import json,sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"].get("Version"): print(r["Old"]["Path"] + "=" + r["New"]["Path"] + "@" + r["New"]["Version"])'); do
    local old=${spec%%=*} new=${spec#*=}
    if ! (cd /tmp && go mod download "$new" >/dev/null 2>&1); then
      local base=${new#*@}; base=${base%%-flux.*}
      log "WARNING: $new is not served by the module proxy; using $old@$base instead"
      (cd "$dir" && go mod edit -replace="$old=$old@$base")
    fi
  done
}

# `go get -tool` that survives requirement versions the module proxy refuses
# ("403 ... This module version is not available"): such a requirement is raised
# to the next patch release of the same minor that the proxy serves, with a
# WARNING, and `go get` is retried. Velero v1.18.3 needs this: it requires
# k8s.io/cli-runtime v0.33.12, which the proxy does not serve.
go_get_tool_with_patch_fallback() { # dir pkg@version...
  local dir=$1; shift
  local err mod ver next attempt
  for attempt in 1 2 3 4 5 6 7 8; do
    if err=$(cd "$dir" && go get -tool "$@" 2>&1); then return 0; fi
    read -r mod ver < <(grep -oE '[^[:space:]]+@v[^:[:space:]]+: reading [^ ]+: 403' <<<"$err" | head -1 |
                        sed -E 's/^([^@ ]+)@(v[^:]+): .*/\1 \2/') || true
    if [[ -z ${mod:-} ]]; then printf '%s\n' "$err" >&2; return 1; fi
    next=$(cd /tmp && go list -m -versions "$mod" | tr ' ' '\n' | python3 -c '
import re, sys
want = sys.argv[1]
def key(v): return tuple(int(x) for x in re.match(r"v(\d+)\.(\d+)\.(\d+)$", v).groups())
mm = key(want)[:2]
c = sorted((v for v in sys.stdin.read().split() if re.match(r"v\d+\.\d+\.\d+$", v)
            and key(v)[:2] == mm and key(v) > key(want)), key=key)
print(c[0] if c else "")' "$ver")
    if [[ -z $next ]]; then
      printf '%s\n' "$err" >&2
      die "$mod@$ver is not served by the module proxy, and no later patch release of it is"
    fi
    log "WARNING: $mod@$ver is not served by the module proxy; requiring $mod@$next instead"
    (cd "$dir" && go get "$mod@$next") # a plain requirement, not a tool; MVS keeps it
  done
  die "go get -tool in $dir: too many unavailable versions"
}

# --- Kubernetes: control plane (kube) and the real node's kubelet, kube-proxy (node-kube)
kube_wrapper() { # tools-subdir cmd...: k8s.io/kubernetes commands with every staging module replaced
  local name=$1; shift
  gen_module "$name" "vworkspace.local/tools/$name"
  local d="$HACK_DIR/tools/$name" kk_gomod staging c pkgs=()
  kk_gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  staging="v0.${KUBE_VERSION#v1.}"
  grep -o 'k8s.io/[a-z0-9-]* => ./staging' "$kk_gomod" | awk '{print $1}' | sort -u |
    while read -r m; do (cd "$d" && go mod edit -replace="$m=$m@$staging"); done
  # godebug lines of dependencies are ignored; only the main module's apply.
  grep -E '^godebug ' "$kk_gomod" >> "$d/go.mod" || true
  for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c@$KUBE_VERSION"); done
  (cd "$d" && go get -tool "${pkgs[@]}")
}
if selected kube; then
  log "kube $KUBE_VERSION"
  kube_wrapper kube kube-apiserver kube-controller-manager kube-scheduler kubectl
fi
# A wrapper of its own, so the node never changes the control plane's cache key.
if selected node-kube; then
  log "node-kube $KUBE_VERSION (kubelet, kube-proxy)"
  kube_wrapper node-kube kubelet kube-proxy
fi

# --- etcd ---------------------------------------------------------------------
if selected etcd; then
  log "etcd $ETCD_VERSION"
  gen_module etcd vworkspace.local/tools/etcd
  (cd "$HACK_DIR/tools/etcd" && go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
fi

# --- kwok ---------------------------------------------------------------------
if selected kwok; then
  log "kwok $KWOK_VERSION"
  gen_module kwok vworkspace.local/tools/kwok
  (cd "$HACK_DIR/tools/kwok" && go get -tool "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
fi

# --- Flux: one wrapper per controller (their go-digest replaces conflict) -----
for pair in "helm-controller:$HELM_CONTROLLER_VERSION" "source-controller:$SOURCE_CONTROLLER_VERSION"; do
  name=${pair%%:*} ver=${pair#*:}
  selected "$name" || continue
  log "$name $ver"
  gen_module "$name" "vworkspace.local/tools/$name"
  up=$(go mod download -json "github.com/fluxcd/$name@$ver" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  copy_nonlocal_replaces "$HACK_DIR/tools/$name" "$up"
  fallback_unavailable_forks "$HACK_DIR/tools/$name"
  (cd "$HACK_DIR/tools/$name" && go get -tool "github.com/fluxcd/$name@$ver")
done

# --- Velero server + AWS object-store plugin: one wrapper, one go build --------
# Separately cached (see velero_cache_key in lib.sh): regenerating it never
# invalidates the Kubernetes/Flux binaries.
if selected velero; then
  log "velero $VELERO_VERSION, velero-plugin-for-aws $VELERO_PLUGIN_AWS_VERSION"
  gen_module velero vworkspace.local/tools/velero
  for m in "github.com/vmware-tanzu/velero@$VELERO_VERSION" \
           "github.com/vmware-tanzu/velero-plugin-for-aws@$VELERO_PLUGIN_AWS_VERSION"; do
    up=$(go mod download -json "$m" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
    copy_nonlocal_replaces "$HACK_DIR/tools/velero" "$up"
  done
  fallback_unavailable_forks "$HACK_DIR/tools/velero"
  # The plugin requires an older velero patch release; MVS then picks ours.
  go_get_tool_with_patch_fallback "$HACK_DIR/tools/velero" "github.com/vmware-tanzu/velero/cmd/velero@$VELERO_VERSION" \
     "github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws@$VELERO_PLUGIN_AWS_VERSION"
  # moto (the S3 server) is pinned with its whole dependency closure, so the venv
  # is reproducible. Resolved in a throwaway venv.
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/pip" install --quiet "moto[server]==$MOTO_VERSION"
  { echo "# Generated by hack/gen-tool-modules.sh from MOTO_VERSION=$MOTO_VERSION; do not edit."
    "$tmp/venv/bin/pip" freeze; } \
    > "$HACK_DIR/tools/velero/moto-requirements.txt"
fi
# --- The real node: containerd, runc, CNI plugins, CoreDNS, local-path-provisioner
# (hack/versions-node.env) ------------------------------------------------------
# Cached apart from the control plane (node_cache_key in lib.sh). None of these
# upstream go.mod files has a replace today; any non-local one is copied anyway.
node_wrapper() { # tools-subdir module@version pkg...
  local name=$1 mv=$2 up; shift 2
  gen_module "$name" "vworkspace.local/tools/$name"
  up=$(go mod download -json "$mv" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  copy_nonlocal_replaces "$HACK_DIR/tools/$name" "$up"
  (cd "$HACK_DIR/tools/$name" && go get -tool "${@/%/@${mv#*@}}")
}
if selected node-containerd; then
  log "node-containerd $CONTAINERD_VERSION"
  c=github.com/containerd/containerd/v2
  node_wrapper node-containerd "$c@$CONTAINERD_VERSION" "$c/cmd/containerd" "$c/cmd/containerd-shim-runc-v2" "$c/cmd/ctr"
fi
if selected node-runc; then
  log "node-runc $RUNC_VERSION"
  node_wrapper node-runc "github.com/opencontainers/runc@$RUNC_VERSION" github.com/opencontainers/runc
fi
if selected node-cni; then
  log "node-cni $CNI_PLUGINS_VERSION"
  c=github.com/containernetworking/plugins/plugins
  node_wrapper node-cni "github.com/containernetworking/plugins@$CNI_PLUGINS_VERSION" \
    "$c/main/bridge" "$c/ipam/host-local" "$c/main/loopback" "$c/meta/portmap"
fi
# CoreDNS: the module's root package is the command; its committed zplugin.go
# (upstream's default plugin.cfg) decides the plugins.
if selected node-coredns; then
  log "node-coredns $COREDNS_VERSION"
  node_wrapper node-coredns "github.com/coredns/coredns@$COREDNS_VERSION" github.com/coredns/coredns
fi
# local-path-provisioner: also a root package. Its vendor/ directory is not used
# (a dependency's vendor/ never is); go.sum pins the same versions.
if selected node-local-path; then
  log "node-local-path $LOCAL_PATH_PROVISIONER_VERSION"
  node_wrapper node-local-path "github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION" \
    github.com/rancher/local-path-provisioner
fi
# --- The OCI registry (CNCF distribution, hack/versions-registry.env) ----------
# Cached apart from the control plane (registry_cache_key in lib.sh). The module
# also holds the hand-written htpasswd helper (hack/tools/registry/htpasswd/),
# so only go.mod and go.sum are regenerated, and tidy adds golang.org/x/crypto at
# the version distribution already selects.
if selected registry; then
  log "registry $DISTRIBUTION_VERSION"
  d="$HACK_DIR/tools/registry"
  mkdir -p "$d"; rm -f "$d/go.mod" "$d/go.sum"
  printf 'module %s\n\ngo 1.26.0\n' vworkspace.local/tools/registry > "$d/go.mod"
  up=$(go mod download -json "github.com/distribution/distribution/v3@$DISTRIBUTION_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  copy_nonlocal_replaces "$d" "$up"
  (cd "$d" && go get -tool "github.com/distribution/distribution/v3/cmd/registry@$DISTRIBUTION_VERSION" && go mod tidy)
fi
# --- Argo CD (hack/versions-argocd.env) -----------------------------------------
# Cached apart from the control plane (argocd_cache_key in lib.sh). Its go.mod says
# `go 1.27.0`, so this wrapper (and hack/build-argocd-bins.sh) uses ARGOCD_GOTOOLCHAIN.
# argo-cd requires its in-repo gitops-engine module, github.com/argoproj/argo-cd/gitops-engine/v3
# (tagged gitops-engine/vX.Y.Z, served by the proxy at Argo CD's version), and replaces it with
# ./gitops-engine: a local path, so not copied; the published module is used as required.
if selected argocd; then
  log "argocd $ARGOCD_VERSION"
  gen_module argocd vworkspace.local/tools/argocd
  up=$(GOTOOLCHAIN=$ARGOCD_GOTOOLCHAIN go mod download -json "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  copy_nonlocal_replaces "$HACK_DIR/tools/argocd" "$up"
  (cd "$HACK_DIR/tools/argocd" && GOTOOLCHAIN=$ARGOCD_GOTOOLCHAIN go get -tool "github.com/argoproj/argo-cd/v3/cmd@$ARGOCD_VERSION")
fi
log "wrappers regenerated under hack/tools/"
