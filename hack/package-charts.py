#!/usr/bin/env python3
"""Package the e2e Helm charts into a static, byte-for-byte reproducible Helm repository.

Usage: python3 hack/package-charts.py SRC_DIR OUT_DIR [--chart CHART_DIR]...
       (normally: python3 hack/package-charts.py e2e/charts target/e2e-charts)

--chart adds a plain chart directory (Chart.yaml at its top, no layers), e.g.
deploy/chart/vworkspace-operator, to the same repository, packaged the same way.

Source layout (see e2e/charts/README.md):

    SRC_DIR/_shared/...              files copied into every chart
    SRC_DIR/<chart>/_base/...        files common to every version of <chart>
    SRC_DIR/<chart>/<version>/...    Chart.yaml plus whatever differs in that version

Each chart version is the union of the three layers, in that order; a file in a
later layer replaces the file with the same relative path in an earlier one.
Directories whose names start with "_" or "." are never charts or versions.

Output: OUT_DIR/<chart>-<version>.tgz for every chart version (one top-level
directory named after the chart) and OUT_DIR/index.yaml (a Helm repository
index with relative URLs). Nothing else in OUT_DIR is touched.

Reproducibility: the same sources give the same bytes on any machine and any
day. Tar entries are sorted, USTAR format, mtime fixed at 2026-01-01T00:00:00Z,
uid/gid 0, empty uname/gname, mode 0644 for files and 0755 for directories.
The gzip stream has mtime 0, no file name, OS byte 255, and uses only "stored"
(uncompressed) deflate blocks written by this script: compressed output would
depend on the zlib implementation linked into Python (zlib and zlib-ng produce
different bytes), and these archives are a few KiB anyway.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import struct
import sys
import tarfile
import zlib
from pathlib import Path

FIXED_TIMESTAMP = "2026-01-01T00:00:00Z"
FIXED_MTIME = 1767225600  # FIXED_TIMESTAMP as seconds since the epoch
SHARED_LAYER = "_shared"
BASE_LAYER = "_base"
CHART_FILE = "Chart.yaml"
# Editor/OS droppings that must never change an archive's bytes.
IGNORED_NAMES = {".DS_Store", "Thumbs.db"}
IGNORED_SUFFIXES = ("~", ".swp", ".swo", ".orig", ".rej", ".bak", ".pyc")

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


class PackageError(Exception):
    pass


# --------------------------------------------------------------------------- sources


def is_special(path: Path) -> bool:
    return path.name.startswith(("_", "."))


def is_ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def layer_files(layer: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every regular file below `layer`."""
    files: dict[str, Path] = {}
    if not layer.exists():
        return files
    if not layer.is_dir():
        raise PackageError(f"{layer}: expected a directory")
    for path in sorted(layer.rglob("*")):
        rel = path.relative_to(layer).as_posix()
        if path.is_symlink():
            raise PackageError(f"{path}: symlinks are not allowed in chart sources")
        if path.is_dir() or is_ignored(path.name):
            continue
        if not path.is_file():
            raise PackageError(f"{path}: not a regular file")
        files[rel] = path
    return files


def merge_layers(layers: list[Path]) -> dict[str, Path]:
    merged: dict[str, Path] = {}
    for layer in layers:
        for rel, path in layer_files(layer).items():
            merged[rel] = path
    # A path may not be both a file and a directory across layers.
    for rel in merged:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in merged:
                raise PackageError(f"{prefix} is a file in one layer and a directory in another")
    return merged


def parse_chart_yaml(path: Path) -> dict[str, str]:
    """Top-level scalar `key: value` pairs of a Chart.yaml.

    Deliberately minimal (no YAML library in the stdlib): nested keys, lists and
    comments are skipped; the fields the index needs must be single-line plain
    or quoted scalars.
    """
    fields: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#") or line[0] in " \t-":
            continue
        m = re.match(r"^([A-Za-z][A-Za-z0-9_]*):(?:\s+(.*?))?\s*$", line)
        if not m:
            raise PackageError(f"{path}:{lineno}: cannot parse {line!r}")
        key, value = m.group(1), m.group(2) or ""
        if value and value[0] not in "\"'":
            value = re.sub(r"\s+#.*$", "", value)  # trailing comment
        if value[:1] in ("|", ">"):
            raise PackageError(f"{path}:{lineno}: {key}: block scalars are not supported here")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = json.loads(value)
        elif len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        fields[key] = value
    return fields


class ChartVersion:
    def __init__(self, src: Path | None, chart_dir: Path, version_dir: Path):
        """A layered chart version (SRC_DIR/_shared, <chart>/_base, <chart>/<version>), or with
        `src` None a plain chart: `chart_dir` == `version_dir`, one layer, any version."""
        if src is None:
            self.files = merge_layers([version_dir])
        else:
            self.files = merge_layers(
                [src / SHARED_LAYER, chart_dir / BASE_LAYER, version_dir]
            )
            for layer in (src / SHARED_LAYER, chart_dir / BASE_LAYER):
                if (layer / CHART_FILE).exists():
                    raise PackageError(f"{layer / CHART_FILE}: Chart.yaml belongs in the version directories only")
        meta = parse_chart_yaml(version_dir / CHART_FILE)
        self.meta = meta
        for key in ("apiVersion", "name", "version"):
            if not meta.get(key):
                raise PackageError(f"{version_dir / CHART_FILE}: missing {key}")
        if meta["apiVersion"] != "v2":
            raise PackageError(f"{version_dir / CHART_FILE}: apiVersion must be v2")
        if meta["name"] != chart_dir.name:
            raise PackageError(
                f"{version_dir / CHART_FILE}: name {meta['name']!r} != directory {chart_dir.name!r}"
            )
        if src is not None and meta["version"] != version_dir.name:
            raise PackageError(
                f"{version_dir / CHART_FILE}: version {meta['version']!r} != directory {version_dir.name!r}"
            )
        if not NAME_RE.match(meta["name"]):
            raise PackageError(f"{version_dir / CHART_FILE}: invalid chart name {meta['name']!r}")
        if not SEMVER_RE.match(meta["version"]):
            raise PackageError(f"{version_dir / CHART_FILE}: version {meta['version']!r} is not SemVer 2")
        self.name = meta["name"]
        self.version = meta["version"]

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}.tgz"


def discover(src: Path) -> list[ChartVersion]:
    charts: list[ChartVersion] = []
    for chart_dir in sorted(p for p in src.iterdir() if p.is_dir() and not is_special(p)):
        versions = sorted(
            p for p in chart_dir.iterdir() if p.is_dir() and not is_special(p)
        )
        if not versions:
            raise PackageError(f"{chart_dir}: no version directories")
        for version_dir in versions:
            if not (version_dir / CHART_FILE).is_file():
                raise PackageError(f"{version_dir}: missing {CHART_FILE}")
            charts.append(ChartVersion(src, chart_dir, version_dir))
    if not charts:
        raise PackageError(f"{src}: no charts found")
    return charts


# --------------------------------------------------------------------------- archives


def tar_bytes(chart: ChartVersion) -> bytes:
    entries: dict[str, bytes | None] = {chart.name: None}  # None = directory
    for rel, path in chart.files.items():
        parts = rel.split("/")
        for i in range(1, len(parts)):
            entries[f"{chart.name}/{'/'.join(parts[:i])}"] = None
        entries[f"{chart.name}/{rel}"] = path.read_bytes()

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(entries, key=lambda n: n.split("/")):
            data = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime = FIXED_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.type = tarfile.REGTYPE
                info.mode = 0o644
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_stored(data: bytes) -> bytes:
    """RFC 1952 gzip member holding `data` in RFC 1951 stored blocks.

    Header: magic, CM=8 (deflate), FLG=0 (no name/comment/extra), MTIME=0,
    XFL=0, OS=255 (unknown). Identical output everywhere by construction.
    """
    out = bytearray(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")
    block = 0xFFFF
    offsets = range(0, len(data), block) if data else [0]
    for off in offsets:
        chunk = data[off : off + block]
        final = off + block >= len(data)
        # BFINAL bit + BTYPE=00, padded to a byte boundary, then LEN and NLEN.
        out += struct.pack("<BHH", 1 if final else 0, len(chunk), len(chunk) ^ 0xFFFF)
        out += chunk
    out += struct.pack("<II", zlib.crc32(data) & 0xFFFFFFFF, len(data) & 0xFFFFFFFF)
    return bytes(out)


# --------------------------------------------------------------------------- index


def semver_key(version: str):
    m = SEMVER_RE.match(version)
    assert m
    major, minor, patch, pre = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    # A release sorts after all its pre-releases; pre-release identifiers per SemVer 2.
    pre_key = (1,) if pre is None else (0,) + tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")
    )
    return (major, minor, patch, pre_key)


def q(value: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is a subset of it)."""
    return json.dumps(value, ensure_ascii=False)


def index_yaml(charts: list[ChartVersion], digests: dict[str, str]) -> str:
    lines = ["apiVersion: v1", "entries:"]
    for name in sorted({c.name for c in charts}):
        lines.append(f"  {q(name)}:")
        versions = sorted(
            (c for c in charts if c.name == name), key=lambda c: semver_key(c.version), reverse=True
        )
        for c in versions:
            fields = {
                "apiVersion": c.meta["apiVersion"],
                "appVersion": c.meta.get("appVersion"),
                "created": FIXED_TIMESTAMP,
                "description": c.meta.get("description"),
                "digest": digests[c.filename],
                "name": c.name,
                "type": c.meta.get("type"),
                "urls": [c.filename],  # relative to the repository URL
                "version": c.version,
            }
            first = True
            for key in sorted(fields):
                value = fields[key]
                if value is None or value == "":
                    continue
                lead = "  - " if first else "    "
                first = False
                if isinstance(value, list):
                    lines.append(f"{lead}{key}:")
                    lines.extend(f"    - {q(item)}" for item in value)
                else:
                    lines.append(f"{lead}{key}: {q(value)}")
    lines.append(f"generated: {q(FIXED_TIMESTAMP)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def write_if_changed(path: Path, data: bytes) -> str:
    """Atomically (re)write `path` unless it already holds `data`; says which."""
    if path.is_file() and path.read_bytes() == data:
        return "unchanged"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return "wrote"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Package e2e Helm charts into a reproducible Helm repository (tgz files + index.yaml)."
    )
    parser.add_argument("src", type=Path, help="chart sources, e.g. e2e/charts")
    parser.add_argument("out", type=Path, help="output directory (created if missing)")
    parser.add_argument(
        "--chart", type=Path, action="append", default=[], metavar="CHART_DIR",
        help="also a plain chart directory (Chart.yaml at its top), e.g. deploy/chart/vworkspace-operator",
    )
    args = parser.parse_args(argv)

    if not args.src.is_dir():
        parser.error(f"{args.src}: not a directory")
    try:
        charts = discover(args.src)
        for chart_dir in args.chart:
            if not (chart_dir / CHART_FILE).is_file():
                raise PackageError(f"{chart_dir}: missing {CHART_FILE}")
            plain = ChartVersion(None, chart_dir, chart_dir)
            if any(c.filename == plain.filename for c in charts):
                raise PackageError(f"{chart_dir}: {plain.filename} is already in {args.src}")
            charts.append(plain)
    except PackageError as err:
        print(f"package-charts: error: {err}", file=sys.stderr)
        return 1

    args.out.mkdir(parents=True, exist_ok=True)
    digests: dict[str, str] = {}
    for chart in charts:
        archive = gzip_stored(tar_bytes(chart))
        digest = hashlib.sha256(archive).hexdigest()
        digests[chart.filename] = digest
        target = args.out / chart.filename
        status = write_if_changed(target, archive)
        print(f"{status} {target} ({len(archive)} bytes, sha256 {digest}, {len(chart.files)} files)")

    index = args.out / "index.yaml"
    status = write_if_changed(index, index_yaml(charts, digests).encode("utf-8"))
    print(f"{status} {index} ({len(charts)} chart versions)")

    stale = sorted(
        p.name for p in args.out.glob("*.tgz") if p.name not in digests
    )
    for name in stale:
        print(f"note: {args.out / name} is not in the index (left untouched)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
