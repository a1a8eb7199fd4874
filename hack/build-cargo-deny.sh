#!/usr/bin/env bash
# Installs the pinned cargo-deny (the licence, ban and source check of `just test`, deny.toml)
# into $CACHE_ROOT/cargo-deny-<version> (outside the repo, like the cluster's binaries), only
# when it is missing, and prints the binary's path on stdout. A warm cache returns at once; a
# cold `cargo install` from crates.io takes ~5 minutes on 2 cores (docs/development/README.md).
source "$(dirname "$0")/lib.sh"

CARGO_DENY_VERSION=0.20.2
dir="$CACHE_ROOT/cargo-deny-$CARGO_DENY_VERSION"
bin="$dir/bin/cargo-deny"
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/cargo-deny.lock"; flock 9   # one installer at a time per cache
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi

# Into a scratch root first, then renamed: an interrupted install never leaves a half-written
# directory that would pass the -x test above. --locked builds cargo-deny's own Cargo.lock.
tmp=$(mktemp -d "$CACHE_ROOT/.cargo-deny-$CARGO_DENY_VERSION.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "installing cargo-deny $CARGO_DENY_VERSION with cargo (cold: ~5 minutes on 2 cores)"
t0=$SECONDS
env -u CARGO_TARGET_DIR cargo install --locked --quiet --version "$CARGO_DENY_VERSION" --root "$tmp" cargo-deny \
  || die "installing cargo-deny $CARGO_DENY_VERSION failed"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "installed cargo-deny $CARGO_DENY_VERSION in $((SECONDS - t0))s"
echo "$bin"
