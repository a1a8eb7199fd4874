#!/usr/bin/env python3
"""Where the time of bench-app's real installs went, read from helm-controller's log.

Usage: python3 hack/helm-install-timeline.py [LOG]   (default: the dev cluster's helm-controller.log)

bench-app's pairs install 100 releases per side (`app-NNNNN` in `bench-app-N`). A side starts
when helm-controller creates a HelmChart for a release it already created one for in the side
before. Per side it prints:
- over how long helm-controller created the sides' HelmCharts (its first reconcile of each release);
- HelmChart created -> seen ready, p50 and max (waiting for source-controller and for a free worker);
- install action -> "release in-sync", p50 and max, and how many installs took under 2 s: helm-controller's
  wait polls the release's objects every 5 s, so an install is about 0.5 s when the Deployment is
  current at the first poll and about 5.4 s when it is not;
- the last release in sync, from the side's first HelmChart.
Lines that are not console-encoded log entries are skipped; a figure with nothing to measure
prints n/a, and a log that cannot be read is a one-line error.
"""

import datetime
import re
import signal
import statistics
import sys
from pathlib import Path

ENTRY = re.compile(r"(\S+)\t\w+\t(.*?)\t(\{.*)")
RELEASE = re.compile(r'"name": "(app-\d+)"')
NAMESPACE = re.compile(r'"namespace": "(bench-app-\d+)"')
FAST_INSTALL_S = 2.0


def entries(path):
    with open(path, errors="replace") as log:
        for line in log:
            m = ENTRY.match(line)
            if not m:
                continue
            name, ns = RELEASE.search(m.group(3)), NAMESPACE.search(m.group(3))
            if not name or not ns:
                continue
            stamp = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            yield stamp, f"{ns.group(1)}/{name.group(1)}", m.group(2)


def sides(path):
    found, side = [], None
    for t, release, message in entries(path):
        if message.startswith("Created HelmChart"):
            if side is None or release in side["created"]:
                side = {"created": {}, "chart_ready": {}, "install": {}, "in_sync": {}}
                found.append(side)
            side["created"][release] = t
        if side is None:
            continue
        if message.startswith("HelmChart/") and "is in-sync" in message and release in side["created"]:
            side["chart_ready"].setdefault(release, t)
        if message.startswith("running 'install'"):
            side["install"].setdefault(release, t)
        if message.startswith("release in-sync") and release in side["install"]:
            side["in_sync"].setdefault(release, t)
    return found


def p50_and_max(durations):
    """'p50 X s, max Y s', or 'n/a' when the side has none (e.g. a log cut short)."""
    if not durations:
        return "n/a"
    return f"p50 {statistics.median(durations):.1f} s, max {max(durations):.1f} s"


def main():
    # Piped into head: stop quietly, as other command-line tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    default = Path(__file__).resolve().parent.parent / "target/e2e-cluster/logs/helm-controller.log"
    path = sys.argv[1] if len(sys.argv) > 1 else default
    try:
        found = sides(path)
    except OSError as e:
        sys.exit(f"helm-install-timeline: cannot read {path}: {e.strerror}")
    for i, side in enumerate(found, 1):
        created = side["created"]
        if not side["in_sync"]:
            continue
        t0 = min(created.values())
        chart_wait = [t - created[r] for r, t in side["chart_ready"].items()]
        installs = [t - side["install"][r] for r, t in side["in_sync"].items()]
        print(
            f"side {i}: {len(created)} releases; HelmCharts created over {max(created.values()) - t0:.1f} s; "
            f"HelmChart created -> ready {p50_and_max(chart_wait)}; "
            f"install {p50_and_max(installs)}, "
            f"{sum(d < FAST_INSTALL_S for d in installs)} under {FAST_INSTALL_S:.0f} s; "
            f"last in sync after {max(side['in_sync'].values()) - t0:.1f} s"
        )


if __name__ == "__main__":
    main()
