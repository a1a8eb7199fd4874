#!/usr/bin/env bash
# Builds every binary of the local e2e cluster from its Go module into
# $BIN_DIR (outside the repo, keyed by versions and wrapper modules). A warm
# cache returns at once; a cold build takes tens of minutes on 2 cores (figures
# in docs/development/local-cluster.md). Prints the bin dir on stdout.
source "$(dirname "$0")/lib.sh"

want=(etcd kwok kube-apiserver kube-controller-manager kube-scheduler kubectl source-controller helm-controller)
have_all() { for b in "${want[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done; }
if have_all; then echo "$BIN_DIR"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1

mkdir -p "$BIN_DIR"
exec 9>"$CACHE_ROOT/build.lock"; flock 9   # one builder at a time per cache
if have_all; then echo "$BIN_DIR"; exit 0; fi

timed() { # name cmd...: run in a wrapper dir, record seconds in build-times.txt
  local name=$1; shift; local t0=$SECONDS
  log "building $name"
  "$@" || die "building $name failed"
  echo "$name $((SECONDS - t0))s" >> "$BIN_DIR/build-times.txt"
  log "built $name in $((SECONDS - t0))s"
}

build_in() { # wrapper-dir ldflags out pkg...
  local dir=$1 ldf=$2 out=$3; shift 3
  (cd "$HACK_DIR/tools/$dir" && go build -trimpath -ldflags "$ldf" -o "$out" "$@")
}

# helm-controller first: it is the build most likely to break on a version bump.
[[ -x $BIN_DIR/helm-controller ]] || timed helm-controller build_in helm-controller "-s -w" "$BIN_DIR/helm-controller" github.com/fluxcd/helm-controller
[[ -x $BIN_DIR/etcd ]] || timed etcd build_in etcd "-s -w" "$BIN_DIR/etcd" go.etcd.io/etcd/server/v3
[[ -x $BIN_DIR/kwok ]] || timed kwok build_in kwok "-s -w" "$BIN_DIR/kwok" sigs.k8s.io/kwok/cmd/kwok

if ! [[ -x $BIN_DIR/kube-apiserver && -x $BIN_DIR/kube-controller-manager && -x $BIN_DIR/kube-scheduler && -x $BIN_DIR/kubectl ]]; then
  # Version stamping is required: Helm reads .Capabilities.KubeVersion from /version.
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  ldf="-s -w"
  for k in client-go/pkg/version component-base/version; do
    ldf="$ldf -X k8s.io/$k.gitVersion=$KUBE_VERSION -X k8s.io/$k.gitMajor=1 -X k8s.io/$k.gitMinor=$minor"
    ldf="$ldf -X k8s.io/$k.gitTreeState=clean -X k8s.io/$k.buildDate=2026-01-01T00:00:00Z"
  done
  # One go build so the shared packages compile once.
  timed kubernetes build_in kube "$ldf" "$BIN_DIR/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
[[ -x $BIN_DIR/source-controller ]] || timed source-controller build_in source-controller "-s -w" "$BIN_DIR/source-controller" github.com/fluxcd/source-controller

have_all || die "some binaries are missing from $BIN_DIR"
echo "$BIN_DIR"
