#!/usr/bin/env bash
# Builds the Velero part of the local cluster into $VELERO_DIR (outside the
# repo, keyed only by hack/versions-velero.env and hack/tools/velero/, see
# velero_cache_key in hack/lib.sh):
#
#   bin/velero                        server and CLI, from github.com/vmware-tanzu/velero/cmd/velero
#   bin/velero-restore-helper,        the other two binaries of upstream's velero image (the restore
#   bin/velero-helper                 init container; hack/build-images.sh puts them in the image)
#   plugins/velero-plugin-for-aws     object-store plugin (the server's --plugin-dir)
#   moto/                             venv with moto[server] (the S3 server), from moto-requirements.txt
#   crds/velero.yaml                  Velero's CRDs (`velero install --crds-only --dry-run -o yaml`)
#
# A warm cache returns at once. Prints the directory on stdout.
source "$(dirname "$0")/lib.sh"

have_all() {
  [[ -x $VELERO_DIR/bin/velero && -x $VELERO_DIR/plugins/velero-plugin-for-aws \
     && -x $VELERO_DIR/bin/velero-restore-helper && -x $VELERO_DIR/bin/velero-helper \
     && -f $VELERO_DIR/moto/.complete && -s $VELERO_DIR/crds/velero.yaml ]]
}
if have_all; then echo "$VELERO_DIR"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1

mkdir -p "$VELERO_DIR"
exec 9>"$CACHE_ROOT/build.lock"; flock 9   # one builder at a time per cache (shared with build-cluster-bins.sh)
if have_all; then echo "$VELERO_DIR"; exit 0; fi

timed() { # name cmd...: record seconds in build-times.txt
  local name=$1; shift; local t0=$SECONDS
  log "building $name"
  "$@" || die "building $name failed"
  echo "$name $((SECONDS - t0))s" >> "$VELERO_DIR/build-times.txt"
  log "built $name in $((SECONDS - t0))s"
}

build_velero() {
  # Stamped like upstream's hack/build.sh, so `velero version` and the backups'
  # recorded server version say $VELERO_VERSION.
  local ldf="-s -w -X github.com/vmware-tanzu/velero/pkg/buildinfo.Version=$VELERO_VERSION"
  ldf="$ldf -X github.com/vmware-tanzu/velero/pkg/buildinfo.GitTreeState=clean"
  local out="$VELERO_DIR/build.tmp"
  rm -rf "$out"; mkdir -p "$out"
  # One go build so the shared packages (velero's plugin framework, the AWS SDK) compile once.
  (cd "$HACK_DIR/tools/velero" && go build -trimpath -ldflags "$ldf" -o "$out/" \
     github.com/vmware-tanzu/velero/cmd/velero \
     github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws) || return 1
  mkdir -p "$VELERO_DIR/bin" "$VELERO_DIR/plugins"
  mv "$out/velero-plugin-for-aws" "$VELERO_DIR/plugins/"
  mv "$out/velero" "$VELERO_DIR/bin/"
  rmdir "$out"
}

build_moto() {
  rm -rf "$VELERO_DIR/moto"
  python3 -m venv "$VELERO_DIR/moto" || { log "python3 -m venv failed (Debian: apt-get install python3-venv)"; return 1; }
  "$VELERO_DIR/moto/bin/pip" install --quiet --require-virtualenv \
    -r "$HACK_DIR/tools/velero/moto-requirements.txt" || return 1
  "$VELERO_DIR/moto/bin/python" -c 'import moto.server' || return 1
  touch "$VELERO_DIR/moto/.complete"
}

# Added after the first caches were built, so a step of its own: an existing cache gets only these.
build_helpers() {
  local ldf="-s -w -X github.com/vmware-tanzu/velero/pkg/buildinfo.Version=$VELERO_VERSION"
  ldf="$ldf -X github.com/vmware-tanzu/velero/pkg/buildinfo.GitTreeState=clean"
  local out="$VELERO_DIR/helpers.tmp"
  rm -rf "$out"; mkdir -p "$out"
  (cd "$HACK_DIR/tools/velero" && go build -trimpath -ldflags "$ldf" -o "$out/" \
     github.com/vmware-tanzu/velero/cmd/velero-restore-helper \
     github.com/vmware-tanzu/velero/cmd/velero-helper) || return 1
  mkdir -p "$VELERO_DIR/bin"
  mv "$out/velero-restore-helper" "$out/velero-helper" "$VELERO_DIR/bin/"
  rmdir "$out"
}

gen_crds() {
  mkdir -p "$VELERO_DIR/crds"
  "$VELERO_DIR/bin/velero" install --crds-only --dry-run -o yaml > "$VELERO_DIR/crds/velero.yaml.tmp" &&
    mv "$VELERO_DIR/crds/velero.yaml.tmp" "$VELERO_DIR/crds/velero.yaml"
}

[[ -x $VELERO_DIR/bin/velero && -x $VELERO_DIR/plugins/velero-plugin-for-aws ]] || timed velero build_velero
[[ -x $VELERO_DIR/bin/velero-restore-helper && -x $VELERO_DIR/bin/velero-helper ]] || timed velero-helpers build_helpers
[[ -f $VELERO_DIR/moto/.complete ]] || timed moto build_moto
[[ -s $VELERO_DIR/crds/velero.yaml ]] || gen_crds || die "velero install --crds-only failed"

have_all || die "something is missing from $VELERO_DIR"
echo "$VELERO_DIR"
