#!/usr/bin/python3
"""What a person sees in Odoo's web client, read by headless Chromium (Debian's `chromium`).

    odoo_browser.py URL LOGIN PASSWORD EXPECT_JSON [SCREENSHOT_DIR]

Logs in at URL/web/login as a person does (the form, its CSRF token, the session cookie),
opens the Applications and Operations lists of the vworkspace addon (`/odoo/vworkspace-
applications`, `/odoo/vworkspace-operations`) and reads each row's cells from the page's
DOM after Odoo's web client rendered them: nothing is asked of Odoo's JSON APIs.
EXPECT_JSON names what must be on the screen:

    {"applications": [{"name": "hello", "status": "Ready", "deployed_chart_version": "0.2.0"}],
     "operations":   [{"name": "hello-backup-1", "status": "Succeeded"}, ...]}

each entry's keys being list columns (the `name` attribute of the cell: the field's name)
and their text as shown. It waits up to 60 s per page for every expected row to show, then
prints the rows it read and exits 0, or prints what differs and exits 1. A PNG of each
list goes to SCREENSHOT_DIR when given. Chromium is driven over its DevTools protocol
(python3-websocket, Debian's); it runs with --no-sandbox (as root here) and a profile of
its own that is removed at the end.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # Debian's python3-websocket

PAGES = {"applications": "vworkspace-applications", "operations": "vworkspace-operations"}
# Every cell of every data row of the list view, by the cell's field name.
READ_ROWS = """
[...document.querySelectorAll('.o_list_view tr.o_data_row')].map(tr =>
  Object.fromEntries([...tr.querySelectorAll('td.o_data_cell[name]')]
    .map(td => [td.getAttribute('name'), td.innerText.trim()])))
"""


class Page:
    """One Chromium tab over the DevTools protocol (requests answered in order)."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails'].get('text')}: {expression[:80]}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, seconds: float, what: str):
        deadline = time.monotonic() + seconds
        while True:
            try:
                value = self.eval(expression)
            except RuntimeError:
                value = None  # the page is being replaced (a navigation)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {seconds:.0f} s (page {self.eval('location.href')})")
            time.sleep(0.25)


def start_chromium(profile: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-dev-shm-usage", "--window-size=1400,900", f"--user-data-dir={profile}",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(profile, "chromium.log"), "w"))
    port_file = os.path.join(profile, "DevToolsActivePort")
    deadline = time.monotonic() + 30
    while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = open(os.path.join(profile, "chromium.log"), errors="replace").read()[-2000:]
            raise RuntimeError(f"chromium did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.1)
    port = open(port_file).read().split()[0]
    for _ in range(50):
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5))
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            return proc, pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.1)
    raise RuntimeError("chromium has no page to drive")


def matches(row: dict, wanted: dict) -> bool:
    return all(row.get(k) == v for k, v in wanted.items())


def main() -> int:
    if len(sys.argv) not in (5, 6):
        print(__doc__, file=sys.stderr)
        return 2
    base, login, password, expect = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    shots = sys.argv[5] if len(sys.argv) == 6 else None
    if not shutil.which("chromium"):
        print("odoo_browser: no `chromium` on PATH (Debian's package chromium)", file=sys.stderr)
        return 2
    profile = tempfile.mkdtemp(prefix="vws-chromium.")
    proc = None
    ok = True
    try:
        proc, ws_url = start_chromium(profile)
        page = Page(ws_url)
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{base}/web/login")
        page.wait_for("!!document.querySelector('form input[name=login]')", 60, "login form")
        page.eval(f"""(() => {{
            const f = document.querySelector('form input[name=login]').form;
            f.querySelector('input[name=login]').value = {json.dumps(login)};
            f.querySelector('input[name=password]').value = {json.dumps(password)};
            f.submit(); return true; }})()""")
        page.wait_for("location.pathname.startsWith('/odoo') && !!document.querySelector('.o_main_navbar')",
                      60, "web client after login (wrong login or password?)")
        print(f"odoo_browser: logged in at {base} as {login}")
        for key, path in PAGES.items():
            wanted = expect.get(key) or []
            page.call("Page.navigate", url=f"{base}/odoo/{path}")
            page.wait_for("!!document.querySelector('.o_list_view')", 60, f"{key} list")
            rows: list = []
            deadline = time.monotonic() + 60
            while True:
                rows = page.eval(READ_ROWS) or []
                missing = [w for w in wanted if not any(matches(r, w) for r in rows)]
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(1)
                page.eval("location.reload(); true")
                page.wait_for("!!document.querySelector('.o_list_view')", 60, f"{key} list")
            print(f"odoo_browser: {base}/odoo/{path} shows {len(rows)} row(s):")
            for r in rows:
                print("  " + " | ".join(f"{k}={v}" for k, v in r.items() if v))
            if shots:
                os.makedirs(shots, exist_ok=True)
                png = os.path.join(shots, f"odoo-{key}.png")
                with open(png, "wb") as f:
                    f.write(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))
                print(f"odoo_browser: screenshot {png}")
            for w in missing:
                ok = False
                print(f"odoo_browser: NOT on the {key} page: a row with {w}", file=sys.stderr)
    except (RuntimeError, TimeoutError, OSError, websocket.WebSocketException) as e:
        print(f"odoo_browser: {e}", file=sys.stderr)
        ok = False
    finally:
        if proc:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
