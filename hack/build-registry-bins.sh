#!/usr/bin/env bash
# Builds the local OCI registry into $REGISTRY_DIR (outside the repo, keyed only
# by hack/versions-registry.env and hack/tools/registry/, see registry_cache_key
# in hack/lib.sh):
#
#   bin/registry    CNCF distribution's registry, from github.com/distribution/distribution/v3/cmd/registry
#   bin/htpasswd    bcrypt htpasswd lines for its basic auth (hack/tools/registry/htpasswd)
#
# A warm cache returns at once. Prints the directory on stdout.
# `--no-build`: print the directory if complete, else fail without building.
source "$(dirname "$0")/lib.sh"

have_all() { [[ -x $REGISTRY_DIR/bin/registry && -x $REGISTRY_DIR/bin/htpasswd ]]; }
if have_all; then echo "$REGISTRY_DIR"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1

mkdir -p "$REGISTRY_DIR"
exec 9>"$CACHE_ROOT/build.lock"; flock 9   # one builder at a time per cache (shared with the other build scripts)
if have_all; then echo "$REGISTRY_DIR"; exit 0; fi

t0=$SECONDS
log "building registry $DISTRIBUTION_VERSION and htpasswd"
out="$REGISTRY_DIR/build.tmp"
rm -rf "$out"; mkdir -p "$out"
# One go build, so the helper's bcrypt package compiles once. Stamped like
# upstream's Makefile, so `registry --version` says $DISTRIBUTION_VERSION.
(cd "$HACK_DIR/tools/registry" && go build -trimpath \
   -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
   -o "$out/" github.com/distribution/distribution/v3/cmd/registry ./htpasswd) || die "building the registry failed"
mkdir -p "$REGISTRY_DIR/bin"
mv "$out/registry" "$out/htpasswd" "$REGISTRY_DIR/bin/"
rmdir "$out"
echo "registry+htpasswd $((SECONDS - t0))s" >> "$REGISTRY_DIR/build-times.txt"
log "built registry and htpasswd in $((SECONDS - t0))s"
have_all || die "something is missing from $REGISTRY_DIR"
echo "$REGISTRY_DIR"
