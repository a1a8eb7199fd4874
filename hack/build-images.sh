#!/usr/bin/env bash
# Writes the images a real node runs as OCI archives, without a container engine,
# daemon or registry (issue 15), with hack/oci-image.py (one layer each, reproducible):
#
#   hack/build-images.sh [OUT_DIR]     default $CLUSTER_DIR/images (target/e2e-cluster/images)
#
# Prints OUT_DIR on stdout. OUT_DIR/images.txt lists "<archive> <image name>" for every
# name; import with `ctr -n k8s.io images import OUT_DIR/<archive>` (one archive may carry
# several names). Groups (VWS_IMAGES, default all, space separated):
#
#   operator  operator.oci.tar: docker.io/vworkspace/<binary>:$VWS_IMAGE_TAG (default 0.1.0, the
#             overlays' tag) for each of the six binaries, one image under six names, like
#             deploy/image/Containerfile: /usr/local/bin/<binary>, USER 65532:65532, ENTRYPOINT
#             app-controller, the same labels. Binaries from ${CARGO_TARGET_DIR:-target}/
#             ${VWS_IMAGE_PROFILE:-debug}/ (cargo build only if one is missing), debug info stripped.
#             ONE DEVIATION: they are glibc-dynamic (the musl target is not installed here), so
#             the image carries the loader and the libraries `ldd` resolves, copied from this
#             machine, where the Containerfile has static musl binaries on distroless/static.
#   flux      source-controller.oci.tar, helm-controller.oci.tar: ghcr.io/fluxcd/<c>:<version of
#             hack/versions.env>, the static binaries of hack/build-cluster-bins.sh in /usr/local/bin,
#             ENTRYPOINT ["<c>"], USER 65534:65534, as upstream's images (minus their alpine base).
#   velero    velero.oci.tar: velero/velero:$VELERO_VERSION, /velero, ENTRYPOINT ["/velero"], and
#             /velero-restore-helper, /velero-helper as upstream's image (no restic);
#             velero-plugin-for-aws.oci.tar: velero/velero-plugin-for-aws:$VELERO_PLUGIN_AWS_VERSION,
#             /plugins/velero-plugin-for-aws copied to /target by its entrypoint (busybox cp), as
#             upstream's image does for the init container `velero install` adds. Both USER 65532.
#   test      busybox.oci.tar: registry.invalid/vworkspace/busybox:<busybox version> (Debian's static
#             busybox, every applet linked, CMD ["sh"], root like upstream busybox), and for every
#             image repository and appVersion of e2e/charts: registry.invalid/vworkspace/<app>:<v>,
#             serving /www on :8080 as 65532 with `busybox httpd` (read-only root filesystem is fine).
#
# Every image has /etc/passwd and /etc/group (root, nobody 65534, nonroot 65532), an
# nsswitch.conf, /tmp (1777) and this machine's /etc/ssl/certs/ca-certificates.crt.
# Details and sizes: docs/development/local-cluster.md#images.
source "$(dirname "$0")/lib.sh"

OUT="${1:-$CLUSTER_DIR/images}"
TAG="${VWS_IMAGE_TAG:-0.1.0}"
PROFILE="${VWS_IMAGE_PROFILE:-debug}"
CARGO_OUT="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
GROUPS_WANTED=" ${VWS_IMAGES:-operator flux velero test} "
# lib.sh's OPERATOR_IMAGE_BINARIES, built when missing by its build_operator_bins.

want() { [[ $GROUPS_WANTED == *" $1 "* ]]; }
t_start=$SECONDS
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAGE="$(mktemp -d "$OUT/.stage.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
LIST="$STAGE/images.txt"
: > "$LIST"

oci() { # ARCHIVE NAME... -- oci-image.py args: writes OUT/ARCHIVE, records its names
  local archive=$1; shift
  local names=() args=()
  while [[ $1 != -- ]]; do names+=("$1"); args+=(--name "$1"); shift; done; shift
  python3 "$HACK_DIR/oci-image.py" --out "$OUT/$archive" "${args[@]}" "$@" >&2
  local n; for n in "${names[@]}"; do echo "$archive $n" >> "$LIST"; done
}

# --- files every image shares ------------------------------------------------------
ETC="$STAGE/etc"
mkdir -p "$ETC/ssl/certs"
cat > "$ETC/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$ETC/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
echo 'hosts: files dns' > "$ETC/nsswitch.conf"
[[ -s /etc/ssl/certs/ca-certificates.crt ]] || die "/etc/ssl/certs/ca-certificates.crt missing (Debian package ca-certificates)"
cp /etc/ssl/certs/ca-certificates.crt "$ETC/ssl/certs/"
chmod 0644 "$ETC"/passwd "$ETC"/group "$ETC"/nsswitch.conf "$ETC"/ssl/certs/*
BASE=(--tree "$ETC:/etc" --dir tmp:1777)

busybox_bin() { # the static busybox of Debian's busybox-static, installed if missing
  if ! file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then
    [[ $(id -u) == 0 ]] || die "needs Debian's busybox-static (/bin/busybox, static): apt-get install -y busybox-static"
    log "installing busybox-static"
    "$HACK_DIR/apt-install.sh" busybox-static
  fi
  file -L /bin/busybox | grep -q 'statically linked' || die "/bin/busybox is not statically linked"
}
BUSYBOX_LINKS=()
busybox_files() { # sets BUSYBOX_LINKS: /bin/busybox and a symlink per applet (busybox --list-full)
  busybox_bin
  BUSYBOX_LINKS=(/bin/busybox:/bin/busybox:0755)
  local a
  for a in $(/bin/busybox --list-full | sort -u); do
    [[ $a == bin/busybox ]] && continue
    BUSYBOX_LINKS+=(--symlink "/$a:/bin/busybox")
  done
}

# --- operator ---------------------------------------------------------------------
if want operator; then
  # Cargo's profile "dev" writes to target/debug/; every other profile to target/<profile>/.
  case $PROFILE in
    debug|dev) prof_flag=(); PROFILE=debug ;;
    release) prof_flag=(--release) ;;
    *) prof_flag=(--profile "$PROFILE") ;;
  esac
  bindir="$CARGO_OUT/$PROFILE"
  missing=()
  for b in "${OPERATOR_IMAGE_BINARIES[@]}"; do [[ -x $bindir/$b ]] || missing+=("$b"); done
  if ((${#missing[@]})); then
    log "missing in $bindir: ${missing[*]}; cargo build ${prof_flag[*]} --bins -p ${OPERATOR_PACKAGES[*]}"
    build_operator_bins "${prof_flag[@]}" >&2
  fi
  files=() libs=()
  mkdir -p "$STAGE/op"
  for b in "${OPERATOR_IMAGE_BINARIES[@]}"; do
    [[ -x $bindir/$b ]] || die "$bindir/$b missing after cargo build"
    objcopy --strip-debug "$bindir/$b" "$STAGE/op/$b"
    files+=("$STAGE/op/$b:/usr/local/bin/$b:0755")
    # The loader and every library, at the path the binary asks for (what ldd prints).
    ldd_out="$(ldd "$STAGE/op/$b" 2>&1)" || true
    if grep -q 'not found' <<<"$ldd_out"; then die "$b: $(grep 'not found' <<<"$ldd_out")"; fi
    while read -r lib; do libs+=("$lib"); done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$ldd_out")
  done
  for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
    mode=0644; [[ $lib == */ld-linux* ]] && mode=0755
    files+=("$(readlink -f "$lib"):$lib:$mode")
  done
  names=(); for b in "${OPERATOR_IMAGE_BINARIES[@]}"; do names+=("docker.io/vworkspace/$b:$TAG"); done
  oci operator.oci.tar "${names[@]}" -- "${BASE[@]}" --dir home/nonroot \
    --user 65532:65532 --entrypoint /usr/local/bin/app-controller \
    --label org.opencontainers.image.title=vworkspace-operator \
    --label "org.opencontainers.image.description=vWorkspace operator binaries: app-controller, day-2 engines, agent" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "${files[@]}"
fi

# --- Flux -------------------------------------------------------------------------
if want flux; then
  bins="$("$HACK_DIR/build-cluster-bins.sh" --no-build)" \
    || die "no cluster binaries for the current hack/versions.env; run hack/build-cluster-bins.sh"
  for c in source-controller helm-controller; do
    v=SOURCE_CONTROLLER_VERSION; [[ $c == helm-controller ]] && v=HELM_CONTROLLER_VERSION
    oci "$c.oci.tar" "ghcr.io/fluxcd/$c:${!v}" -- "${BASE[@]}" --user 65534:65534 --entrypoint "$c" \
      --label "org.opencontainers.image.source=https://github.com/fluxcd/$c" \
      --label "org.opencontainers.image.version=${!v}" \
      "$bins/$c:/usr/local/bin/$c:0755"
  done
fi

# --- Velero -----------------------------------------------------------------------
if want velero; then
  vdir="$("$HACK_DIR/build-velero-bins.sh" --no-build)" \
    || die "no Velero binaries for the current hack/versions-velero.env; run hack/build-velero-bins.sh"
  oci velero.oci.tar "docker.io/velero/velero:$VELERO_VERSION" -- "${BASE[@]}" --dir home/nonroot \
    --user 65532:65532 --entrypoint /velero \
    --label org.opencontainers.image.source=https://github.com/vmware-tanzu/velero \
    --label "org.opencontainers.image.version=$VELERO_VERSION" \
    "$vdir/bin/velero:/velero:0755" "$vdir/bin/velero-restore-helper:/velero-restore-helper:0755" \
    "$vdir/bin/velero-helper:/velero-helper:0755"
  busybox_bin
  oci velero-plugin-for-aws.oci.tar "docker.io/velero/velero-plugin-for-aws:$VELERO_PLUGIN_AWS_VERSION" -- \
    "${BASE[@]}" --user 65532:65532 --dir target \
    --entrypoint /bin/cp --entrypoint /plugins/velero-plugin-for-aws --entrypoint /target/. \
    --symlink /bin/cp:/bin/busybox \
    --label org.opencontainers.image.source=https://github.com/vmware-tanzu/velero-plugin-for-aws \
    --label "org.opencontainers.image.version=$VELERO_PLUGIN_AWS_VERSION" \
    /bin/busybox:/bin/busybox:0755 "$vdir/plugins/velero-plugin-for-aws:/plugins/velero-plugin-for-aws:0755"
fi

# --- test images ------------------------------------------------------------------
if want test; then
  busybox_files
  bbv="$(/bin/busybox | sed -n '1s/^BusyBox v\([0-9][0-9.]*\).*/\1/p')"
  [[ -n $bbv ]] || die "cannot read busybox's version"
  oci busybox.oci.tar "registry.invalid/vworkspace/busybox:$bbv" -- "${BASE[@]}" --cmd sh \
    --label "org.opencontainers.image.version=$bbv" "${BUSYBOX_LINKS[@]}"
  # Every image repository:appVersion the e2e charts render (values.yaml's image.repository,
  # a version's own values.yaml first; Chart.yaml's appVersion).
  refs="$(python3 - "$REPO_ROOT/e2e/charts" <<'EOF'
import os, re, sys
root = sys.argv[1]
def repo_of(path):
    if not os.path.isfile(path):
        return None
    m = re.search(r'^image:\s*\n(?:[ \t]+.*\n)*?[ \t]+repository:\s*"?([^"\s#]+)', open(path).read(), re.M)
    return m.group(1) if m else None
for chart in sorted(os.listdir(root)):
    cdir = os.path.join(root, chart)
    if chart[0] in "._" or not os.path.isdir(cdir):
        continue
    for ver in sorted(os.listdir(cdir)):
        vdir = os.path.join(cdir, ver)
        if ver[0] in "._" or not os.path.isfile(os.path.join(vdir, "Chart.yaml")):
            continue
        repo = repo_of(os.path.join(vdir, "values.yaml")) or repo_of(os.path.join(cdir, "_base", "values.yaml"))
        m = re.search(r'^appVersion:\s*"?([^"\s#]+)', open(os.path.join(vdir, "Chart.yaml")).read(), re.M)
        if repo and m:
            print(f"{repo}:{m.group(1)}")
EOF
)"
  [[ -n $refs ]] || die "found no image in e2e/charts"
  mkdir -p "$STAGE/www"
  for ref in $(sort -u <<<"$refs"); do
    app="${ref%:*}"; app="${app##*/}"; v="${ref##*:}"
    printf '%s\n' "$ref" > "$STAGE/www/$app-$v.html"
    # The Deployments (no command) get the server; hook Jobs run their own `/bin/sh -c ...`.
    oci "$app-$v.oci.tar" "$ref" -- "${BASE[@]}" --user 65532:65532 \
      --entrypoint /bin/busybox --entrypoint httpd --entrypoint=-f --entrypoint=-p --entrypoint 8080 \
      --entrypoint=-h --entrypoint /www \
      --label "org.opencontainers.image.version=$v" \
      "${BUSYBOX_LINKS[@]}" "$STAGE/www/$app-$v.html:/www/index.html:0644"
  done
fi

# Archives of an earlier run that this one did not write: kept (and listed) when only some
# groups were built, deleted otherwise (e.g. a chart version removed).
if [[ -f $OUT/images.txt ]]; then
  for old in $(awk '{print $1}' "$OUT/images.txt" | sort -u); do
    grep -q "^$old " "$LIST" && continue
    if [[ -n ${VWS_IMAGES:-} && -f $OUT/$old ]]; then grep "^$old " "$OUT/images.txt" >> "$LIST"; else rm -f "$OUT/$old"; fi
  done
fi
mv "$LIST" "$OUT/images.txt"
log "$(awk '{print $1}' "$OUT/images.txt" | sort -u | wc -l) archives, $(wc -l < "$OUT/images.txt") names, $(cd "$OUT" && awk '{print $1}' images.txt | sort -u | xargs du -ch --apparent-size | tail -n1 | cut -f1) in $OUT, in $((SECONDS - t_start))s"
echo "$OUT"
