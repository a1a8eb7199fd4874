#!/usr/bin/env bash
# Builds promtool (github.com/prometheus/prometheus/cmd/promtool at PROMETHEUS_VERSION, pinned
# in hack/versions-promtool.env) from the Go module proxy into $CACHE_ROOT/promtool-<hash>
# (outside the repo, keyed only by hack/versions-promtool.env), only when it is missing, and
# prints the binary's path on stdout. `just monitoring-check` uses it for `promtool check rules`
# and `promtool test rules` on deploy/monitoring/. A warm cache returns at once; a cold build
# compiles all of Prometheus's dependencies (several minutes on 2 cores).
# `--no-build`: print the path if built, else fail without building.
source "$(dirname "$0")/lib.sh"
# shellcheck source=versions-promtool.env
source "$HACK_DIR/versions-promtool.env"

promtool_cache_key() { sha256sum < "$HACK_DIR/versions-promtool.env" | cut -c1-16; }
dir="$CACHE_ROOT/promtool-$(promtool_cache_key)"
bin="$dir/bin/promtool"
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
[[ ${1:-} == --no-build ]] && exit 1

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/build.lock"; flock 9   # one builder at a time per cache (shared with the other build scripts)
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi

export GOTOOLCHAIN=$PROMTOOL_GOTOOLCHAIN
# Into a scratch directory first, then renamed: an interrupted build never leaves a binary
# that would pass the -x test above.
tmp=$(mktemp -d "$CACHE_ROOT/.promtool.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building promtool $PROMETHEUS_VERSION from the Go module proxy (cold: several minutes on 2 cores)"
t0=$SECONDS
# Stamped like upstream's .promu.yml, so `promtool --version` names the release: the Go
# module's v0.MNN.P is Prometheus M.NN.P (v0.316.0 is Prometheus 3.16.0).
minor=${PROMETHEUS_VERSION#v0.}; minor=${minor%%.*}
ver="$((10#$minor / 100)).$((10#$minor % 100)).${PROMETHEUS_VERSION##*.}"
GOBIN="$tmp/bin" go install -trimpath \
  -ldflags "-s -w -X github.com/prometheus/common/version.Version=$ver -X github.com/prometheus/common/version.Branch=HEAD" \
  "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" \
  || die "building promtool $PROMETHEUS_VERSION failed (GOTOOLCHAIN=$GOTOOLCHAIN)"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built promtool $PROMETHEUS_VERSION in $((SECONDS - t0))s"
echo "$bin"
