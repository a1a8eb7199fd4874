#!/usr/bin/env python3
"""`just demo`'s hands in Odoo: records of the reference addon `vworkspace`, over JSON-2.

    demo_odoo.py set-app NAMESPACE NAME SPEC_FILE|-   declare (or change) an application
    demo_odoo.py delete-app NAMESPACE NAME            "Delete on cluster" (explicit deletion intent)
    demo_odoo.py set-op NAMESPACE NAME SPEC_FILE|-    declare an Operation (a spec as in the CRD)
    demo_odoo.py line KIND NAMESPACE NAME             "STATUS | details" of one record
    demo_odoo.py table                                every record of the cluster, one line each
    demo_odoo.py agent-error                          the cluster's last agent error, or "none"
    demo_odoo.py sync-interval SECONDS                the cluster's "Sync interval (s)" (the agent's pace)

Each call is what a person does in Odoo's web client (Applications → New, the form's
fields; Operations → New; the buttons), made as Odoo's `admin` user with an API key of scope
`rpc`, so the addon's own create/write and actions run exactly as they do behind the form.
The spec files are the CRD's spec (e2e/samples/demo-app.json); they are mapped onto the
form's fields here, as a person would type them.

Settings (environment): VWS_DEMO_ODOO_URL, VWS_DEMO_ODOO_DB, VWS_DEMO_ODOO_KEY_FILE (admin's
key) and VWS_DEMO_CLUSTER_ID (the vworkspace.cluster record). Standard library only; any
UTF-8 in reports (Flux and Velero messages) is kept.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import urllib.error
import urllib.request

WIDTH = 110
APP_FIELDS = ["name", "namespace", "status", "status_message", "deployed_chart_version", "ready_reason",
              "report_state", "ack_outcome", "ack_reason", "chart_version"]
OP_FIELDS = ["name", "namespace", "op_type", "status", "status_message", "phase", "result", "succeeded_reason"]


class Odoo:
    def __init__(self):
        env = os.environ
        self.url = env["VWS_DEMO_ODOO_URL"].rstrip("/")
        self.db = env["VWS_DEMO_ODOO_DB"]
        self.key = open(env["VWS_DEMO_ODOO_KEY_FILE"]).read().strip()
        self.cluster = int(env["VWS_DEMO_CLUSTER_ID"])

    def call(self, model: str, method: str, **body):
        req = urllib.request.Request(
            f"{self.url}/json/2/{model}/{method}", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"bearer {self.key}", "Content-Type": "application/json",
                     "X-Odoo-Database": self.db})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except (json.JSONDecodeError, AttributeError):
                pass
            raise SystemExit(f"demo_odoo: {model}.{method}: HTTP {e.code}: {detail[:500]}") from None

    def find(self, model: str, namespace: str, name: str, fields: list[str]) -> dict | None:
        rows = self.call(model, "search_read", fields=fields, limit=1,
                         domain=[["cluster_id", "=", self.cluster], ["namespace", "=", namespace], ["name", "=", name]])
        return rows[0] if rows else None


def clip(text: str, width: int = WIDTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def load_spec(arg: str) -> dict:
    return json.load(sys.stdin if arg == "-" else open(arg))


def app_vals(spec: dict) -> dict:
    """The Applications form's fields for an ApplicationInstance spec (what a person types)."""
    chart = spec.get("chart") or {}
    repo = chart.get("repository") or {}
    vals = {"chart_name": chart.get("name"), "chart_version": chart.get("version") or False,
            "chart_repository_url": repo.get("url") or False, "chart_repository_interval": repo.get("interval") or False,
            "values_json": json.dumps(spec.get("values") or {}), "timeout": spec.get("timeout") or False}
    rest = {k: v for k, v in spec.items() if k not in ("chart", "values", "timeout")}
    vals["spec_extra_json"] = json.dumps(rest) if rest else False
    return vals


def odoo_datetime(rfc3339: str) -> str:
    """Odoo's Datetime text (UTC, no T, no offset) for an RFC 3339 time."""
    t = datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).astimezone(datetime.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S")


def op_vals(spec: dict) -> dict:
    """The Operations form's fields for an Operation spec: the type's own block is the payload."""
    op_type = spec["type"]
    payload = spec.get(op_type[0].lower() + op_type[1:]) or {}
    vals = {"op_type": op_type, "application_name": spec["applicationRef"]["name"],
            "payload_json": json.dumps(payload)}
    if spec.get("requestId"):
        vals["request_id"] = spec["requestId"]
    if spec.get("deadline"):
        vals["deadline"] = odoo_datetime(spec["deadline"])
    return vals


def app_line(rec: dict) -> str:
    parts = []
    if rec.get("deployed_chart_version"):
        parts.append(f"deployed {rec['deployed_chart_version']}")
    if rec.get("ready_reason"):
        parts.append(rec["ready_reason"])
    if rec.get("ack_outcome") in ("refused", "conflict"):
        parts.append(f"ack {rec['ack_outcome']} {rec.get('ack_reason') or ''}".strip())
    if rec.get("status_message"):
        parts.append(rec["status_message"])
    return clip(f"{rec.get('status') or '?'} | " + ", ".join(dict.fromkeys(parts)))


def op_line(odoo: Odoo, rec: dict) -> str:
    parts = [p for p in (rec.get("phase"),) if p]
    # The child Operations an Upgrade creates (<name>-backup, -rollback, -restore) are reported
    # to Odoo like any object; the running ones say what the Upgrade is doing now.
    children = odoo.call("vworkspace.report", "search_read", fields=["name", "state"],
                         domain=[["cluster_id", "=", odoo.cluster], ["kind", "=", "Operation"],
                                 ["namespace", "=", rec["namespace"]], ["name", "=like", rec["name"] + "-%"],
                                 ["state", "in", ["pending", "running"]]])
    if children:
        parts.append("child " + ", ".join(f"{c['name']} {c['state']}" for c in sorted(children, key=lambda c: c["name"])))
    reason = (rec.get("succeeded_reason") or "").split(":", 1)[0].split(" ", 1)[-1]
    if reason:
        parts.append(reason)
    message = rec.get("result") or rec.get("status_message")
    if message:
        parts.append(message)
    parts = [p for i, p in enumerate(parts) if i == 0 or p != parts[i - 1]]
    return clip(f"{rec.get('status') or '?'} | " + ", ".join(parts))


def main(argv: list[str]) -> int:
    cmd, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    odoo = Odoo()
    if cmd == "set-app" and len(args) == 3:
        ns, name = args[0], args[1]
        vals = app_vals(load_spec(args[2]))
        rec = odoo.find("vworkspace.application", ns, name, ["id"])
        if rec:
            odoo.call("vworkspace.application", "write", ids=[rec["id"]], vals=vals)
        else:
            odoo.call("vworkspace.application", "create",
                      vals_list=[{"cluster_id": odoo.cluster, "namespace": ns, "name": name, **vals}])
    elif cmd == "delete-app" and len(args) == 2:
        rec = odoo.find("vworkspace.application", args[0], args[1], ["id"])
        if not rec:
            raise SystemExit(f"demo_odoo: no application {args[0]}/{args[1]} on cluster record {odoo.cluster}")
        odoo.call("vworkspace.application", "action_delete_on_cluster", ids=[rec["id"]])
    elif cmd == "set-op" and len(args) == 3:
        vals = op_vals(load_spec(args[2]))
        odoo.call("vworkspace.operation", "create",
                  vals_list=[{"cluster_id": odoo.cluster, "namespace": args[0], "name": args[1], **vals}])
    elif cmd == "line" and len(args) == 3:
        kind, ns, name = args
        if kind == "ApplicationInstance":
            rec = odoo.find("vworkspace.application", ns, name, APP_FIELDS)
            print(app_line(rec) if rec else "not_declared |")
        else:
            rec = odoo.find("vworkspace.operation", ns, name, OP_FIELDS)
            print(op_line(odoo, rec) if rec else "not_declared |")
    elif cmd == "table" and not args:
        cluster = odoo.call("vworkspace.cluster", "read", ids=[odoo.cluster],
                            fields=["name", "status", "agent_mode", "revision", "bound_uid", "last_seen"])[0]
        print(f"cluster {cluster['name']}: agent {cluster.get('status')}, {cluster.get('agent_mode')} mode, "
              f"intent revision {cluster.get('revision')}, bound to UID {cluster.get('bound_uid')}, "
              f"last seen {cluster.get('last_seen')} UTC")
        domain = [["cluster_id", "=", odoo.cluster]]
        declared = set()
        for rec in odoo.call("vworkspace.application", "search_read", domain=domain, fields=APP_FIELDS):
            declared.add(("ApplicationInstance", rec["namespace"], rec["name"]))
            print(f"  {'ApplicationInstance':<19} {rec['namespace'] + '/' + rec['name']:<36} {app_line(rec)}")
        for rec in odoo.call("vworkspace.operation", "search_read", domain=domain, fields=OP_FIELDS, order="id"):
            declared.add(("Operation", rec["namespace"], rec["name"]))
            print(f"  {'Operation':<19} {rec['namespace'] + '/' + rec['name']:<36} {op_line(odoo, rec)}")
        # Child Operations are created by the engines, not declared in Odoo; they are reported all the same.
        for rep in odoo.call("vworkspace.report", "search_read", domain=domain, order="kind, namespace, name",
                             fields=["kind", "namespace", "name", "state", "phase", "ready_reason", "result"]):
            if (rep["kind"], rep["namespace"], rep["name"]) in declared:
                continue
            detail = ", ".join(dict.fromkeys(x for x in (rep.get("phase"), rep.get("ready_reason"), rep.get("result")) if x))
            print(f"  {rep['kind']:<19} {rep['namespace'] + '/' + rep['name']:<36} "
                  + clip(f"{rep.get('state')} (child) | {detail}"))
    elif cmd == "sync-interval" and len(args) == 1 and args[0].isdigit():
        odoo.call("vworkspace.cluster", "write", ids=[odoo.cluster], vals={"sync_interval_seconds": int(args[0])})
    elif cmd == "agent-error" and not args:
        cluster = odoo.call("vworkspace.cluster", "read", ids=[odoo.cluster],
                            fields=["last_error_reason", "last_error_message"])[0]
        print(f"{cluster['last_error_reason']}: {cluster['last_error_message']}" if cluster.get("last_error_reason") else "none")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
