#!/usr/bin/env python3
"""Reads `odoo-sim show CLUSTER` (JSON, on stdin) and prints what `just demo` shows of it.

    demo_view.py line KIND NAMESPACE NAME   one progress line for an object, as Odoo sees it
    demo_view.py table                      every object of the cluster record, one line each

`line` prints "STATUS | details": STATUS is the simulator's summary (`ready`, `succeeded`,
`failed`, `applied_not_ready`, ...), the details are the last report's phase, condition
reason and message, and for an Operation the child Operation that is running now.
Standard library only; any UTF-8 in reports (Flux and Velero messages) is kept.
"""

from __future__ import annotations

import json
import sys

WIDTH = 110


def clip(text: str, width: int = WIDTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def ready_condition(report: dict) -> dict:
    conds = report.get("conditions") or []
    for wanted in ("Ready", "Succeeded"):
        for c in conds:
            if c.get("type") == wanted:
                return c
    return conds[-1] if conds else {}


def reports_of(view: dict, kind: str, namespace: str) -> dict:
    prefix = f"{kind}/{namespace}/"
    return {k[len(prefix):]: (v or {}).get("report") or {} for k, v in (view.get("reports") or {}).items()
            if k.startswith(prefix)}


def object_line(view: dict, kind: str, namespace: str, name: str) -> str:
    obj = next((o for o in view.get("objects", [])
                if o.get("kind") == kind and o.get("namespace") == namespace and o.get("name") == name), None)
    if obj is None:
        return "not_declared |"
    report = reports_of(view, kind, namespace).get(name, {})
    cond = ready_condition(report)
    parts = []
    if kind == "ApplicationInstance":
        deployed = report.get("deployed_chart_version")
        if deployed:
            parts.append(f"deployed {deployed}")
    else:
        if report.get("phase"):
            parts.append(report["phase"])
        # The child Operations an Upgrade creates are named <name>-backup, -rollback, -restore.
        children = {n: r for n, r in reports_of(view, "Operation", namespace).items() if n.startswith(name + "-")}
        active = [n for n, r in children.items() if r.get("state") in ("pending", "running")]
        if active:
            parts.append("child " + ", ".join(f"{n} {children[n].get('state')}" for n in sorted(active)))
    if cond.get("reason"):
        parts.append(cond["reason"])
    message = report.get("result") or cond.get("message") or ""
    ack = obj.get("ack") or {}
    if ack.get("outcome") in ("refused", "conflict"):
        parts.append(f"ack {ack['outcome']} {ack.get('reason') or ''}".strip())
        message = message or ack.get("message") or ""
    if message:
        parts.append(message)
    # The phase and the condition's reason are often the same word (Running, Running).
    parts = [p for i, p in enumerate(parts) if i == 0 or p != parts[i - 1]]
    return clip(f"{obj.get('status', '?')} | " + ", ".join(parts))


def table(view: dict) -> str:
    rows = [f"cluster {view.get('name')}: agent {'online' if view.get('agent_online') else 'offline'}, "
            f"{view.get('mode')} mode, intent revision {view.get('cursor', {}).get('revision')}, "
            f"acknowledged {view.get('acknowledged_revision')}"]
    declared = {(o.get("kind"), o.get("namespace"), o.get("name")) for o in view.get("objects", [])}
    for o in view.get("objects", []):
        line = object_line(view, o["kind"], o["namespace"], o["name"])
        rows.append(f"  {o['kind']:<19} {o['namespace'] + '/' + o['name']:<36} {line}")
    # Child Operations are created by the engines, not declared by Odoo; they are reported all the same.
    for key, entry in sorted((view.get("reports") or {}).items()):
        kind, namespace, name = (key.split("/", 2) + ["", ""])[:3]
        if (kind, namespace, name) in declared:
            continue
        report = (entry or {}).get("report") or {}
        cond = ready_condition(report)
        detail = ", ".join(dict.fromkeys(x for x in (report.get("phase"), cond.get("reason"), report.get("result")) if x))
        rows.append(f"  {kind:<19} {namespace + '/' + name:<36} " + clip(f"{report.get('state')} (child) | {detail}"))
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    try:
        view = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"unreadable simulator view: {e}", file=sys.stderr)
        return 2
    if argv[1:2] == ["line"] and len(argv) == 5:
        print(object_line(view, argv[2], argv[3], argv[4]))
    elif argv[1:] == ["table"]:
        print(table(view))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
