#!/usr/bin/env bash
# Builds Argo CD for the local cluster's on-demand Argo CD (`hack/cluster.sh
# start-argocd`, hack/argocd.sh) into $ARGOCD_DIR (outside the repo, keyed only
# by hack/versions-argocd.env and hack/tools/argocd/, see argocd_cache_key in
# hack/lib.sh):
#
#   bin/argocd                          Argo CD's multi-call binary (github.com/argoproj/argo-cd/v3/cmd),
#   bin/argocd-application-controller   symlinks to it: cmd/main.go dispatches on argv[0]'s basename
#   bin/argocd-repo-server
#   bin/helm                            the helm CLI the repo-server execs (helm.sh/helm/v4/cmd/helm)
#   crds/                               Argo CD's Application and AppProject CRDs, from the module
#   manifests/core.yaml                 from the module's manifests/install.yaml: the application
#                                       controller's ServiceAccount and RBAC (ClusterRole `*` on
#                                       everything, as real installs), the repo-server's
#                                       ServiceAccount, and the (empty) ConfigMaps and Secret
#
# Also installs redis-server from Debian when it is missing (Argo CD's cache).
# Run it outside the cluster's netns: the module proxy and Debian are not
# reachable inside. A warm cache returns at once. Prints the directory on stdout.
# `--no-build`: print the directory if complete, else fail without building.
source "$(dirname "$0")/lib.sh"

have_all() {
  [[ -x $ARGOCD_DIR/bin/argocd && -x $ARGOCD_DIR/bin/helm && -s $ARGOCD_DIR/manifests/core.yaml &&
     -s $ARGOCD_DIR/crds/application-crd.yaml && -s $ARGOCD_DIR/crds/appproject-crd.yaml ]]
}
ensure_redis() {
  command -v redis-server >/dev/null && return 0
  [[ $EUID -eq 0 ]] || die "redis-server is missing; install it (apt-get install redis-server) or run as root"
  log "installing redis-server from Debian"
  "$HACK_DIR/apt-install.sh" redis-server >&2 \
    || die "installing redis-server failed"
}
if have_all; then [[ ${1:-} == --no-build ]] || ensure_redis; echo "$ARGOCD_DIR"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1
ensure_redis

mkdir -p "$ARGOCD_DIR"
exec 9>"$CACHE_ROOT/build.lock"; flock 9   # one builder at a time per cache (shared with the other build scripts)
if have_all; then echo "$ARGOCD_DIR"; exit 0; fi

# Argo CD v3.6 needs Go 1.27 (its go.mod); the go command fetches that toolchain from the module proxy.
export GOTOOLCHAIN=$ARGOCD_GOTOOLCHAIN
t0=$SECONDS
out="$ARGOCD_DIR/build.tmp"
rm -rf "$out"; mkdir -p "$out/bin" "$out/crds" "$out/manifests"
ver=${ARGOCD_VERSION#v}
log "building Argo CD $ARGOCD_VERSION (Go $ARGOCD_GOTOOLCHAIN; several minutes on a cold Go build cache)"
# Stamped like upstream's Makefile (common.version), so `argocd version` says $ARGOCD_VERSION.
(cd "$HACK_DIR/tools/argocd" && go build -trimpath \
   -ldflags "-s -w -X github.com/argoproj/argo-cd/v3/common.version=$ver -X github.com/argoproj/argo-cd/v3/common.gitTreeState=clean" \
   -o "$out/bin/argocd" github.com/argoproj/argo-cd/v3/cmd) || die "building Argo CD failed"
t1=$SECONDS
log "building helm $HELM_VERSION"
# Helm's go.mod has no replace directives: `go install` at the version, with its own go.sum.
GOBIN="$out/bin" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" || die "building helm failed"
ln -s argocd "$out/bin/argocd-application-controller"
ln -s argocd "$out/bin/argocd-repo-server"

src=$(cd "$HACK_DIR/tools/argocd" && go_mod_dir "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION")
cp "$src/manifests/crds/application-crd.yaml" "$src/manifests/crds/appproject-crd.yaml" "$out/crds/"
python3 - "$src/manifests/install.yaml" > "$out/manifests/core.yaml" <<'PY' || die "extracting from install.yaml failed"
import re, sys
# No YAML library (a fresh machine's python3 has none): install.yaml is kustomize output, one
# object per `---`-separated document with `kind:` and `metadata:`/`  name:` at fixed indents.
want = {
    ("ServiceAccount", "argocd-application-controller"), ("Role", "argocd-application-controller"),
    ("RoleBinding", "argocd-application-controller"), ("ClusterRole", "argocd-application-controller"),
    ("ClusterRoleBinding", "argocd-application-controller"), ("ServiceAccount", "argocd-repo-server"),
    ("ConfigMap", "argocd-cm"), ("ConfigMap", "argocd-cmd-params-cm"), ("ConfigMap", "argocd-rbac-cm"),
    ("ConfigMap", "argocd-gpg-keys-cm"), ("ConfigMap", "argocd-ssh-known-hosts-cm"),
    ("ConfigMap", "argocd-tls-certs-cm"), ("Secret", "argocd-secret"),
}
def key(doc):
    kind = re.search(r"^kind: (\S+)$", doc, re.M)
    name = re.search(r"^metadata:\n(?:  .*\n)*?  name: (\S+)$", doc, re.M)
    return (kind.group(1), name.group(1).strip("'\"")) if kind and name else None
docs = re.split(r"^---\s*$", open(sys.argv[1]).read(), flags=re.M)
found = [d.strip("\n") for d in docs if key(d) in want]
missing = want - {key(d) for d in found}
if missing:
    sys.exit(f"not in install.yaml: {sorted(missing)}")
print("# From github.com/argoproj/argo-cd/v3 manifests/install.yaml; generated by hack/build-argocd-bins.sh.")
print("\n---\n".join(found))
PY
chmod -R u+w "$out"
rm -rf "$ARGOCD_DIR/bin" "$ARGOCD_DIR/crds" "$ARGOCD_DIR/manifests"
mv "$out/bin" "$out/crds" "$out/manifests" "$ARGOCD_DIR/"
rmdir "$out"
echo "argocd $((t1 - t0))s helm $((SECONDS - t1))s" >> "$ARGOCD_DIR/build-times.txt"
log "built Argo CD in $((t1 - t0))s and helm in $((SECONDS - t1))s"
have_all || die "something is missing from $ARGOCD_DIR"
echo "$ARGOCD_DIR"
