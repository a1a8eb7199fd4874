#!/usr/bin/env python3
"""Write a single-layer OCI image archive from local files, without a daemon or registry.

Usage:
    python3 hack/oci-image.py --out IMAGE.tar --name REF [--name REF ...]
        [--entrypoint ARG ...] [--cmd ARG ...] [--user UID[:GID]] [--env K=V ...]
        [--workdir DIR] [--label K=V ...] [--dir DEST[:MODE] ...]
        [--symlink DEST:TARGET ...] [--tree SRC_DIR:DEST ...] [SRC:DEST[:MODE] ...]

Contents of the one layer (all owned by 0:0, mtime 0):
- SRC:DEST[:MODE] copies the local file SRC to DEST (MODE octal, default 0755).
- --tree SRC_DIR:DEST copies a local directory tree to DEST: regular files (mode 0755
  if the owner may execute them, else 0644), directories (0755) and symlinks (kept
  as symlinks, targets verbatim). Other file types are an error.
- --dir DEST[:MODE] an (empty) directory, e.g. a mount point or /tmp:1777.
- --symlink DEST:TARGET a symlink DEST -> TARGET (TARGET verbatim, may be relative).
Parent directories are created (0755). Naming one path twice is an error, except a
directory named by several options. Files are streamed, never read into memory whole.

Each --entrypoint / --cmd adds one argument. --label sets the config's Labels
(org.opencontainers.image.*).

The output is an OCI image layout (oci-layout, index.json, blobs/sha256/...) packed
as one tar, the form `ctr -n k8s.io images import IMAGE.tar` reads. index.json lists
the one manifest once per --name, each entry annotated with
`io.containerd.image.name` (the full REF, used by ctr as is) and
`org.opencontainers.image.ref.name` (the tag), so one archive can carry one image
under several names (same digest).

The archive is byte-for-byte reproducible: fixed mtimes (0), uid/gid 0, sorted
entries, an uncompressed layer, no creation date in the config.
Platform: linux/amd64 (the only one the local cluster runs on).
"""
import argparse
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile

CHUNK = 1 << 20


class HashingWriter:
    """A write-only file object that hashes (sha256) and counts what passes through."""

    def __init__(self, f):
        self.f, self.h, self.size = f, hashlib.sha256(), 0

    def write(self, b):
        self.h.update(b)
        self.size += len(b)
        return self.f.write(b)

    def digest(self):
        return "sha256:" + self.h.hexdigest()


def tarinfo(name, mode):
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mode = mode
    return ti


def write_tar(fileobj, entries):
    """entries: sorted list of (name, kind, arg, mode); kind is 'dir', 'file' (arg: local
    path), 'bytes' (arg: data) or 'symlink' (arg: target)."""
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, arg, mode in entries:
            ti = tarinfo(name, mode)
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                ti.name = name.rstrip("/") + "/"
                tf.addfile(ti)
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = arg
                tf.addfile(ti)
            elif kind == "bytes":
                ti.size = len(arg)
                tf.addfile(ti, io.BytesIO(arg))
            else:
                ti.size = os.path.getsize(arg)
                with open(arg, "rb") as f:
                    tf.addfile(ti, f)


class Layer:
    def __init__(self, ap):
        self.ap = ap
        self.items = {}  # dest (no leading/trailing slash) -> (kind, arg, mode)

    def _parents(self, dest):
        d = os.path.dirname(dest)
        while d:
            self.add(d, "dir", None, 0o755, implicit=True)
            d = os.path.dirname(d)

    def add(self, dest, kind, arg, mode, implicit=False):
        dest = os.path.normpath("/" + dest).lstrip("/")
        if not dest:
            self.ap.error("the image root cannot be named")
        old = self.items.get(dest)
        if old is not None:
            if old[0] == "dir" and kind == "dir":
                if not implicit:  # an explicit mode wins over an implied parent
                    self.items[dest] = (kind, arg, mode)
                return
            self.ap.error(f"{dest!r} is named twice")
        self.items[dest] = (kind, arg, mode)
        self._parents(dest)

    def add_tree(self, src, dest):
        if not os.path.isdir(src):
            self.ap.error(f"--tree {src!r}: not a directory")
        self.add(dest, "dir", None, 0o755, implicit=True)
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for n in sorted(dirs + files):
                p = os.path.join(root, n)
                d = os.path.join(dest, os.path.relpath(p, src))
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    self.add(d, "symlink", os.readlink(p), 0o777)
                elif stat.S_ISDIR(st.st_mode):
                    self.add(d, "dir", None, 0o755, implicit=True)
                elif stat.S_ISREG(st.st_mode):
                    self.add(d, "file", p, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)
                else:
                    self.ap.error(f"--tree: {p!r} is not a file, directory or symlink")

    def entries(self):
        return [(n, k, a, m) for n, (k, a, m) in sorted(self.items.items())]


def split2(ap, opt, spec):
    parts = spec.split(":", 1)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        ap.error(f"bad {opt} {spec!r}")
    return parts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True, action="append",
                    help="full image reference, e.g. registry.k8s.io/pause:3.10.2; repeat for more names")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir", default="")
    ap.add_argument("--label", action="append", default=[], metavar="K=V")
    ap.add_argument("--dir", action="append", default=[], metavar="DEST[:MODE]")
    ap.add_argument("--symlink", action="append", default=[], metavar="DEST:TARGET")
    ap.add_argument("--tree", action="append", default=[], metavar="SRC_DIR:DEST")
    ap.add_argument("files", nargs="*", metavar="SRC:DEST[:MODE]")
    a = ap.parse_intermixed_args()  # SRC:DEST specs may come between options

    layer = Layer(ap)
    for spec in a.files:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            ap.error(f"bad file spec {spec!r}")
        if not os.path.isfile(parts[0]):
            ap.error(f"{parts[0]!r}: not a file")
        layer.add(parts[1], "file", parts[0], int(parts[2], 8) if len(parts) == 3 else 0o755)
    for spec in a.tree:
        src, dest = split2(ap, "--tree", spec)
        layer.add_tree(src, dest)
    for spec in a.dir:
        parts = spec.split(":")
        if len(parts) not in (1, 2):
            ap.error(f"bad --dir {spec!r}")
        layer.add(parts[0], "dir", None, int(parts[1], 8) if len(parts) == 2 else 0o755)
    for spec in a.symlink:
        dest, target = split2(ap, "--symlink", spec)
        layer.add(dest, "symlink", target, 0o777)
    if not layer.items:
        ap.error("the image would be empty")
    labels = {}
    for kv in a.label:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            ap.error(f"bad --label {kv!r}")
        labels[k] = v

    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".oci-image-") as tmpd:
        layer_path = os.path.join(tmpd, "layer.tar")
        with open(layer_path, "wb") as f:
            hw = HashingWriter(f)
            write_tar(hw, layer.entries())
        layer_digest, layer_size = hw.digest(), hw.size

        cfg = {"Env": a.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
        if a.entrypoint:
            cfg["Entrypoint"] = a.entrypoint
        if a.cmd:
            cfg["Cmd"] = a.cmd
        if a.user:
            cfg["User"] = a.user
        if a.workdir:
            cfg["WorkingDir"] = a.workdir
        if labels:
            cfg["Labels"] = labels
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
                        "digest": layer_digest, "size": layer_size}],
        }, sort_keys=True, separators=(",", ":")).encode()
        manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()

        descs = []
        for name in a.name:
            last = name.rsplit("/", 1)[-1]
            if "@" in last:
                ap.error(f"--name {name!r}: a digest reference cannot be written")
            tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
            descs.append({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": tag},
            })
        index = json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": descs,
        }, sort_keys=True, separators=(",", ":")).encode()

        blobs = [(layer_digest, "file", layer_path), (config_digest, "bytes", config),
                 (manifest_digest, "bytes", manifest)]
        out_entries = [("blobs", "dir", None, 0o755), ("blobs/sha256", "dir", None, 0o755)]
        out_entries += sorted(("blobs/sha256/" + d.split(":", 1)[1], k, arg, 0o644) for d, k, arg in blobs)
        out_entries += [("index.json", "bytes", index, 0o644),
                        ("oci-layout", "bytes", b'{"imageLayoutVersion":"1.0.0"}', 0o644)]
        tmp = os.path.join(tmpd, "out.tar")
        with open(tmp, "wb") as f:
            write_tar(f, out_entries)
        os.replace(tmp, a.out)
    print(f"{a.out}: {' '.join(a.name)} manifest {manifest_digest}")


if __name__ == "__main__":
    main()
