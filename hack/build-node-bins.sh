#!/usr/bin/env bash
# Builds the real node's components from their Go
# modules into $NODE_DIR (outside the repo, keyed by KUBE_VERSION,
# hack/versions-node.env and the hack/tools/node-* wrappers; see lib.sh):
#
#   bin/      kubelet, kube-proxy (KUBE_VERSION), containerd, containerd-shim-runc-v2,
#             ctr (CONTAINERD_VERSION), runc (RUNC_VERSION, cgo + libseccomp, static),
#             coredns (COREDNS_VERSION), local-path-provisioner (LOCAL_PATH_PROVISIONER_VERSION)
#   cni/bin/  bridge, host-local, loopback, portmap (CNI_PLUGINS_VERSION)
#   images/   OCI archives written by hack/oci-image.py (no registry, no daemon):
#             pause.oci.tar: PAUSE_IMAGE, from Kubernetes' own pause.c (static);
#             coredns.oci.tar: registry.k8s.io/coredns/coredns:$COREDNS_VERSION;
#             local-path-provisioner.oci.tar: docker.io/rancher/local-path-provisioner:$LOCAL_PATH_PROVISIONER_VERSION
#             (their in-cluster manifests: hack/node/coredns.yaml, hack/node/local-path.yaml)
#
# Called by `hack/cluster.sh up` (hack/node.sh) unless VWS_REAL_NODE=0. A warm cache
# returns at once; prints the directory.
#   hack/build-node-bins.sh [--no-build]
# Needs gcc, pkg-config and libseccomp-dev (runc with seccomp); as root it
# installs the two Debian packages itself if they are missing.
source "$(dirname "$0")/lib.sh"

BINS=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr runc coredns local-path-provisioner)
CNI=(bridge host-local loopback portmap)
IMAGES=(pause coredns local-path-provisioner)   # images/<name>.oci.tar
have_cni() { local b; for b in "${CNI[@]}"; do [[ -x $NODE_DIR/cni/bin/$b ]] || return 1; done; }
have_all() {
  local b
  for b in "${BINS[@]}"; do [[ -x $NODE_DIR/bin/$b ]] || return 1; done
  for b in "${IMAGES[@]}"; do [[ -s $NODE_DIR/images/$b.oci.tar ]] || return 1; done
  have_cni
}
# The manifests in hack/node/ name these images by tag: they must follow the pins.
for pair in "coredns.yaml:registry.k8s.io/coredns/coredns:$COREDNS_VERSION" \
            "local-path.yaml:docker.io/rancher/local-path-provisioner:$LOCAL_PATH_PROVISIONER_VERSION"; do
  grep -qF "image: ${pair#*:}" "$HACK_DIR/node/${pair%%:*}" ||
    die "hack/node/${pair%%:*} does not name ${pair#*:} (hack/versions-node.env); update its image"
done
if have_all; then echo "$NODE_DIR"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1

mkdir -p "$NODE_DIR/bin" "$NODE_DIR/cni/bin" "$NODE_DIR/images"
exec 9>"$CACHE_ROOT/build.lock"; flock 9   # one builder at a time per cache
if have_all; then echo "$NODE_DIR"; exit 0; fi

timed() { # name cmd...: record seconds in build-times.txt
  local name=$1; shift; local t0=$SECONDS
  log "building $name"
  "$@" || die "building $name failed"
  echo "$name $((SECONDS - t0))s" >> "$NODE_DIR/build-times.txt"
  log "built $name in $((SECONDS - t0))s"
}
build_in() { # wrapper-dir go-build-args...
  local dir=$1; shift
  (cd "$HACK_DIR/tools/$dir" && go build -trimpath "$@")
}

# --- kubelet, kube-proxy: same release and stamping as the control plane -------
if ! [[ -x $NODE_DIR/bin/kubelet && -x $NODE_DIR/bin/kube-proxy ]]; then
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  ldf="-s -w"
  for k in client-go/pkg/version component-base/version; do
    ldf="$ldf -X k8s.io/$k.gitVersion=$KUBE_VERSION -X k8s.io/$k.gitMajor=1 -X k8s.io/$k.gitMinor=$minor"
    ldf="$ldf -X k8s.io/$k.gitTreeState=clean -X k8s.io/$k.buildDate=2026-01-01T00:00:00Z"
  done
  # CGO_ENABLED=0 (from lib.sh), as upstream builds them: static binaries.
  timed kubelet+kube-proxy build_in node-kube -ldflags "$ldf" -o "$NODE_DIR/bin/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
fi

# --- containerd, shim, ctr -----------------------------------------------------
# CGO_ENABLED=0: static, and the btrfs snapshotter (the only cgo part,
# `//go:build linux && !no_btrfs && cgo`) is left out; overlayfs and native
# remain. Upstream builds the shim without cgo too (SHIM_CGO_ENABLED ?= 0).
if ! [[ -x $NODE_DIR/bin/containerd && -x $NODE_DIR/bin/containerd-shim-runc-v2 && -x $NODE_DIR/bin/ctr ]]; then
  c=github.com/containerd/containerd/v2
  ldf="-s -w -X $c/version.Version=$CONTAINERD_VERSION -X $c/version.Revision=module-proxy -X $c/version.Package=$c"
  timed containerd build_in node-containerd -tags urfave_cli_no_docs -ldflags "$ldf" -o "$NODE_DIR/bin/" \
    "$c/cmd/containerd" "$c/cmd/containerd-shim-runc-v2" "$c/cmd/ctr"
fi

# --- runc: needs cgo (its nsenter is C) and libseccomp ---------------------------
ensure_seccomp_dev() {
  command -v gcc >/dev/null && command -v pkg-config >/dev/null && pkg-config --exists libseccomp && return
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing Debian packages gcc, pkg-config and libseccomp-dev (runc with seccomp needs them)"
    "$HACK_DIR/apt-install.sh" gcc pkg-config libseccomp-dev
  fi
  pkg-config --exists libseccomp || die "runc needs libseccomp-dev, pkg-config and gcc (Debian: apt-get install -y libseccomp-dev pkg-config gcc)"
}
if ! [[ -x $NODE_DIR/bin/runc ]]; then
  ensure_seccomp_dev
  # As runc's `make static`, minus the libpathrs tag (a Rust C library no
  # distribution here ships; without the tag runc uses its pure-Go path code).
  timed runc env CGO_ENABLED=1 bash -c 'cd "$1/tools/node-runc" && go build -trimpath -buildmode=pie \
      -tags "seccomp urfave_cli_no_docs netgo osusergo" \
      -ldflags "-X main.gitCommit=$2-module-proxy -linkmode external -extldflags -static-pie" \
      -o "$3/bin/runc" github.com/opencontainers/runc' _ "$HACK_DIR" "$RUNC_VERSION" "$NODE_DIR"
fi

# --- CNI plugins ---------------------------------------------------------------
if ! have_cni; then
  p=github.com/containernetworking/plugins/plugins
  timed cni-plugins build_in node-cni -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    -o "$NODE_DIR/cni/bin/" "$p/main/bridge" "$p/ipam/host-local" "$p/main/loopback" "$p/meta/portmap"
fi

# --- pause image ---------------------------------------------------------------
if ! [[ -s $NODE_DIR/images/pause.oci.tar ]]; then
  build_pause() {
    local kk tag=${PAUSE_IMAGE##*:}
    kk=$(cd "$HACK_DIR/tools/node-kube" && go_mod_dir "k8s.io/kubernetes@$KUBE_VERSION")
    # Kubernetes' build/pause/Makefile: CFLAGS = -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV)
    gcc -Os -Wall -Werror -static -DVERSION="v$tag-vws" -o "$NODE_DIR/images/pause" "$kk/build/pause/linux/pause.c"
    strip "$NODE_DIR/images/pause"
    python3 "$HACK_DIR/oci-image.py" --out "$NODE_DIR/images/pause.oci.tar" --name "$PAUSE_IMAGE" \
      --entrypoint /pause --user 65535:65535 "$NODE_DIR/images/pause:/pause" >&2
  }
  timed pause-image build_pause
fi

# --- CoreDNS ------------------------------------------------------------------
# As upstream's Makefile: CGO_ENABLED=0, -tags grpcnotrace, -s -w and
# coremain.GitCommit (the version itself is a constant in coremain/version.go).
# Plugins: upstream's default plugin.cfg (its generated zplugin.go is in the module).
if ! [[ -x $NODE_DIR/bin/coredns ]]; then
  timed coredns build_in node-coredns -tags grpcnotrace \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION-module-proxy" \
    -o "$NODE_DIR/bin/coredns" github.com/coredns/coredns
fi

# --- local-path-provisioner -----------------------------------------------------
# As upstream's scripts/build: CGO_ENABLED=0, -s -w, -X main.VERSION=<tag>.
if ! [[ -x $NODE_DIR/bin/local-path-provisioner ]]; then
  timed local-path-provisioner build_in node-local-path \
    -ldflags "-s -w -X main.VERSION=$LOCAL_PATH_PROVISIONER_VERSION" \
    -o "$NODE_DIR/bin/local-path-provisioner" github.com/rancher/local-path-provisioner
fi

# --- their images ----------------------------------------------------------------
# Upstream's CoreDNS image is distroless static (CA certificates, nonroot 65532)
# with the binary at /coredns; upstream's provisioner image is alpine with the
# binary at /usr/bin/local-path-provisioner. Ours hold the binary and the CA
# bundle of this machine (Debian's ca-certificates) only; the provisioner runs
# as 65532 too (it only talks to the API server; its helper pods do the disk work).
# Names are fully qualified (docker.io/...): `ctr images import` keeps the name as
# written, and the CRI looks images up by their normalized name.
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
build_addon_images() {
  [[ -s $CA_BUNDLE ]] || die "$CA_BUNDLE is missing (Debian: apt-get install -y ca-certificates)"
  python3 "$HACK_DIR/oci-image.py" --out "$NODE_DIR/images/coredns.oci.tar" \
    --name "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" \
    --entrypoint /coredns --user 65532:65532 --workdir / \
    "$NODE_DIR/bin/coredns:/coredns" "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:0644" >&2
  python3 "$HACK_DIR/oci-image.py" --out "$NODE_DIR/images/local-path-provisioner.oci.tar" \
    --name "docker.io/rancher/local-path-provisioner:$LOCAL_PATH_PROVISIONER_VERSION" \
    --entrypoint /usr/bin/local-path-provisioner --user 65532:65532 \
    "$NODE_DIR/bin/local-path-provisioner:/usr/bin/local-path-provisioner" \
    "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:0644" >&2
}
if ! [[ -s $NODE_DIR/images/coredns.oci.tar && -s $NODE_DIR/images/local-path-provisioner.oci.tar ]]; then
  timed addon-images build_addon_images
fi

have_all || die "some node binaries are missing from $NODE_DIR"
echo "$NODE_DIR"
