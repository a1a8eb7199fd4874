#!/usr/bin/env python3
"""Write a single-layer OCI image archive from local files, without a daemon or registry.

Usage:
    python3 hack/oci-image.py --out IMAGE.tar --name REF [--entrypoint PATH ...]
        [--user UID[:GID]] [--env K=V ...] [--workdir DIR] SRC:DEST[:MODE] ...

Each SRC:DEST[:MODE] copies the local file SRC to DEST inside the image (parent
directories are created, MODE is octal, default 0755). The output is an OCI
image layout (oci-layout, index.json, blobs/sha256/...) packed as one tar, the
form `ctr -n k8s.io images import IMAGE.tar` reads. index.json names the image
twice: `io.containerd.image.name` (the full REF, used by ctr as is) and
`org.opencontainers.image.ref.name` (the tag).

The archive is byte-for-byte reproducible: fixed mtimes (0), uid/gid 0, sorted
entries, an uncompressed layer, no creation date in the config.
Platform: linux/amd64 (the only one the local cluster runs on).
"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def tar_bytes(entries):
    """entries: list of (name, data-or-None-for-dir, mode). Returns tar bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mode = mode
            if data is None:
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True, help="full image reference, e.g. registry.k8s.io/pause:3.10.2")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir", default="")
    ap.add_argument("files", nargs="+", metavar="SRC:DEST[:MODE]")
    a = ap.parse_args()

    files, dirs = {}, set()
    for spec in a.files:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            ap.error(f"bad file spec {spec!r}")
        src, dest = parts[0], parts[1].lstrip("/")
        mode = int(parts[2], 8) if len(parts) == 3 else 0o755
        with open(src, "rb") as f:
            files[dest] = (f.read(), mode)
        d = os.path.dirname(dest)
        while d:
            dirs.add(d)
            d = os.path.dirname(d)
    entries = [(d + "/", None, 0o755) for d in sorted(dirs)]
    entries += [(n, data, mode) for n, (data, mode) in sorted(files.items())]
    layer = tar_bytes(entries)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()

    cfg = {"Env": a.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    if a.entrypoint:
        cfg["Entrypoint"] = a.entrypoint
    if a.cmd:
        cfg["Cmd"] = a.cmd
    if a.user:
        cfg["User"] = a.user
    if a.workdir:
        cfg["WorkingDir"] = a.workdir
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "hack/oci-image.py"}],
    }, sort_keys=True, separators=(",", ":")).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()

    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
    }, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()

    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": a.name,
                            "org.opencontainers.image.ref.name": tag},
        }],
    }, sort_keys=True, separators=(",", ":")).encode()

    blobs = {d: b for d, b in ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest))}
    out_entries = [("blobs/", None, 0o755), ("blobs/sha256/", None, 0o755)]
    out_entries += [("blobs/sha256/" + d.split(":", 1)[1], b, 0o644) for d, b in sorted(blobs.items())]
    out_entries += [("index.json", index, 0o644),
                    ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644)]
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(tar_bytes(out_entries))
    os.replace(tmp, a.out)
    print(f"{a.out}: {a.name} manifest {manifest_digest}")


if __name__ == "__main__":
    main()
