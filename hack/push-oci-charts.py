#!/usr/bin/env python3
"""Push packaged Helm charts to an OCI registry as Helm OCI artifacts, without helm or oras.

Usage: python3 hack/push-oci-charts.py --registry https://127.0.0.1:18881 --ca CA_FILE \
           --username-file FILE --password-file FILE [--prefix charts] CHARTS_DIR

Every CHARTS_DIR/*.tgz (hack/package-charts.py output) becomes
<registry>/<prefix>/<chart>:<version> with the layout `helm push` writes (helm.sh/helm/v4
pkg/registry, Client.Push): an OCI image manifest
(application/vnd.oci.image.manifest.v1+json) whose config is the chart's Chart.yaml metadata
as JSON (application/vnd.cncf.helm.config.v1+json) and whose one layer is the .tgz itself
(application/vnd.cncf.helm.chart.content.v1.tar+gzip). Tags are the chart version with `+`
replaced by `_`, as Helm does (OCI tags may not contain `+`).

The OCI distribution push, per blob: HEAD /v2/<repo>/blobs/<digest> (skip if present), else
POST /v2/<repo>/blobs/uploads/ and PUT <Location>?digest=<digest> with the bytes; then
PUT /v2/<repo>/manifests/<tag>. Basic auth on every request (distribution's htpasswd auth
needs no token exchange). The same charts give the same manifests and digests on every
run, so pushing again is a no-op. The password is read from a file and never printed.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import re
import ssl
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
CHART_LAYER_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
# Helm stamps the push time; a fixed one (package-charts.py's) keeps manifests reproducible.
CREATED = "2026-01-01T00:00:00Z"
# Chart.yaml scalars copied into the config, under Helm's JSON names (chart.Metadata).
STRING_FIELDS = ("name", "home", "version", "description", "icon", "apiVersion", "condition", "tags",
                 "appVersion", "kubeVersion", "type")


class PushError(Exception):
    pass


def parse_chart_yaml(text: str) -> dict[str, str]:
    """Top-level scalar `key: value` pairs (the subset hack/package-charts.py accepts)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or line[0] in " \t-":
            continue
        m = re.match(r"^([A-Za-z][A-Za-z0-9_]*):(?:\s+(.*?))?\s*$", line)
        if not m:
            continue
        key, value = m.group(1), m.group(2) or ""
        if value and value[0] not in "\"'":
            value = re.sub(r"\s+#.*$", "", value)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = json.loads(value)
        elif len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        fields[key] = value
    return fields


def chart_metadata(tgz: bytes, path: Path) -> dict[str, object]:
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = next((m for m in tar.getmembers()
                       if m.isfile() and m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")), None)
        if member is None:
            raise PushError(f"{path}: no <chart>/Chart.yaml in the archive")
        extracted = tar.extractfile(member)
        if extracted is None:
            raise PushError(f"{path}: cannot read {member.name}")
        fields = parse_chart_yaml(extracted.read().decode("utf-8"))
    meta: dict[str, object] = {k: fields[k] for k in STRING_FIELDS if fields.get(k)}
    if fields.get("deprecated") == "true":
        meta["deprecated"] = True
    for key in ("name", "version", "apiVersion"):
        if not meta.get(key):
            raise PushError(f"{path}: Chart.yaml has no {key}")
    return meta


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    def __init__(self, base: str, ca_file: str, username: str, password: str):
        self.base = base.rstrip("/")
        self.context = ssl.create_default_context(cafile=ca_file)
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.auth = f"Basic {token}"

    def request(self, method: str, url: str, data: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
        if not url.startswith(("http://", "https://")):
            url = urllib.parse.urljoin(self.base + "/", url)
        req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": self.auth,
                                                                             **(headers or {})})
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                resp.read()
                return resp.status, dict(resp.headers.items())
        except urllib.error.HTTPError as e:
            body = e.read(2000).decode("utf-8", "replace")
            if method == "HEAD" and e.code == 404:
                return 404, {}
            # Neither the URL's query nor our headers are echoed: only the path and the server's answer.
            raise PushError(f"{method} {urllib.parse.urlsplit(url).path}: HTTP {e.code}: {body.strip()}") from None

    def push_blob(self, repo: str, data: bytes) -> str:
        d = digest(data)
        status, _ = self.request("HEAD", f"/v2/{repo}/blobs/{d}")
        if status == 200:
            return d
        status, headers = self.request("POST", f"/v2/{repo}/blobs/uploads/", data=b"",
                                       headers={"Content-Length": "0"})
        location = headers.get("Location") or headers.get("location")
        if status != 202 or not location:
            raise PushError(f"POST /v2/{repo}/blobs/uploads/: HTTP {status} without a Location")
        sep = "&" if "?" in location else "?"
        self.request("PUT", f"{location}{sep}digest={urllib.parse.quote(d)}", data=data,
                     headers={"Content-Type": "application/octet-stream"})
        return d

    def push_manifest(self, repo: str, tag: str, manifest: bytes) -> None:
        self.request("PUT", f"/v2/{repo}/manifests/{tag}", data=manifest,
                     headers={"Content-Type": MANIFEST_MEDIA_TYPE})


def push_chart(reg: Registry, prefix: str, path: Path) -> str:
    tgz = path.read_bytes()
    meta = chart_metadata(tgz, path)
    config = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    repo = f"{prefix}/{meta['name']}" if prefix else str(meta["name"])
    tag = str(meta["version"]).replace("+", "_")
    layer_digest = reg.push_blob(repo, tgz)
    config_digest = reg.push_blob(repo, config)
    annotations = {
        "org.opencontainers.image.created": CREATED,
        "org.opencontainers.image.title": str(meta["name"]),
        "org.opencontainers.image.version": str(meta["version"]),
    }
    if meta.get("description"):
        annotations["org.opencontainers.image.description"] = str(meta["description"])
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": CHART_LAYER_MEDIA_TYPE, "digest": layer_digest, "size": len(tgz)}],
        "annotations": annotations,
    }
    body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    reg.push_manifest(repo, tag, body)
    return f"{repo}:{tag}@{digest(body)}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--registry", required=True, help="https://host:port")
    p.add_argument("--ca", required=True, help="CA certificate file that signed the registry's certificate")
    p.add_argument("--username-file", required=True)
    p.add_argument("--password-file", required=True)
    p.add_argument("--prefix", default="charts", help="repository path prefix (default: charts)")
    p.add_argument("charts_dir", type=Path)
    args = p.parse_args()
    username = Path(args.username_file).read_text().strip()
    password = Path(args.password_file).read_text().strip()
    charts = sorted(args.charts_dir.glob("*.tgz"))
    if not charts:
        print(f"push-oci-charts: no *.tgz in {args.charts_dir}", file=sys.stderr)
        return 1
    reg = Registry(args.registry, args.ca, username, password)
    try:
        for path in charts:
            print(push_chart(reg, args.prefix.strip("/"), path))
    except (PushError, OSError) as e:
        print(f"push-oci-charts: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
