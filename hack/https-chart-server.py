#!/usr/bin/env python3
"""A static Helm repository over HTTPS with basic auth, for the chart-source tests.

Usage: python3 hack/https-chart-server.py --port 18882 --bind 127.0.0.1 --cert CRT --key KEY \
           --username-file FILE --password-file FILE DIRECTORY

Serves DIRECTORY (index.yaml and the .tgz files of hack/package-charts.py) read-only: GET and
HEAD only. A request without the right `Authorization: Basic` credentials gets 401 with a
`WWW-Authenticate` challenge, the way an authenticated chart repository answers (Flux then
reports the HelmRepository's failure with its own reason). The access log has the method,
path, status and whether credentials were sent; never the Authorization header or any
credential. The password is read from a file, not the command line, so it stays out of
process lists.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hmac
import http.server
import ssl
import sys
from pathlib import Path


class Handler(http.server.SimpleHTTPRequestHandler):
    expected: bytes = b""

    def authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            given = base64.b64decode(header[len("Basic "):], validate=True)
        except ValueError:
            return False
        return hmac.compare_digest(given, self.expected)

    def refuse(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="vws-charts"')
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        body = b"401 Unauthorized\n"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if not self.authorized():
            self.refuse()
            return
        super().do_GET()

    def do_HEAD(self) -> None:
        if not self.authorized():
            self.refuse()
            return
        super().do_HEAD()

    def list_directory(self, path):  # no listings: a repository is read through index.yaml
        self.send_error(404)
        return None

    def log_request(self, code="-", size="-") -> None:
        # The request line never holds the Authorization header; say only whether one was sent.
        creds = "with credentials" if "Authorization" in self.headers else "anonymous"
        code = getattr(code, "value", code)
        self.log_message('"%s %s" %s %s (%s)', self.command, self.path.split("?")[0], code, size, creds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--username-file", required=True)
    p.add_argument("--password-file", required=True)
    p.add_argument("directory", type=Path)
    args = p.parse_args()
    username = Path(args.username_file).read_text().strip()
    password = Path(args.password_file).read_text().strip()
    Handler.expected = f"{username}:{password}".encode()
    handler = functools.partial(Handler, directory=str(args.directory))
    server = http.server.ThreadingHTTPServer((args.bind, args.port), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.cert, args.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"serving {args.directory} on https://{args.bind}:{args.port} (basic auth)", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
