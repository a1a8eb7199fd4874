#!/usr/bin/env python3
"""Runs the e2e test binaries side by side, in lanes, inside the cluster's network namespace.

Each test file (`e2e/tests/*.rs`) is one job; the e2e crate's own unit tests are one more.
`--lanes` jobs run at once, the longest expected first. Three rules keep suites from
breaking each other (docs/development/README.md, "Suites side by side"):

  * `deploy` and then `bundle` run alone, after every other job: they install the operator's
    Deployments into the cluster (bundle also stops the out-of-cluster Flux), and every other
    suite's first TestContext removes what such a suite left running
    (e2e::setup::ensure_cluster_setup);
  * the suites of one group never overlap: `peer` (they share the peer cluster, and
    engine_not_installed removes Flux's CRDs from it), `velero` (the heavy users of the one
    Velero server, which works off one backup or restore at a time);
  * each lane hands its processes their own slice of the test ports (VWS_E2E_PORT_SLOT).

Each job's output is printed whole when it ends (so `test result:` lines stay intact for
.ci/run), then a table of every job's lane, exit status and duration. Exit 1 when any job
failed; every job runs whatever another does (no fail-fast).

With `--test NAME` (repeatable) only those files are built and run, without the doc tests;
a single one streams its output as it comes (`just e2e-file`).

Usage: hack/e2e-lanes.py [--lanes N] [--threads T] [--test NAME]... [-- ARGS...]   (ARGS go to every binary)
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"

# Run alone, in this order, after all the others.
LAST = ["deploy", "bundle"]
# Suites that must not overlap with another of the same group.
GROUPS = {
    "engine_not_installed": "peer",
    "two_clusters": "peer",
    "odoo": "peer",
    "backup_schedule": "velero",
    "data_protection": "velero",
    "operations": "velero",
}
# Seconds each took side by side in a clean-clone CI run (2026-12-02; backup_schedule and
# maintenance_windows from sequential runs); only the order depends on them.
EXPECTED = {
    "data_protection": 334,
    "backup_schedule": 235,
    "maintenance_windows": 211,
    "odoo": 130,
    "app_controller": 85,
    "engine_not_installed": 73,
    "monitoring": 68,
    "flux_behaviour": 65,
    "operations": 50,
    "kubectl_vws": 43,
}
DEFAULT_EXPECTED = 40


def test_executables(only=()):
    """(name, path) of every e2e test executable (or of the test files `only`), as
    `cargo test --no-run` built them."""
    selection = [a for name in only for a in ("--test", name)]
    out = subprocess.run(
        ["cargo", "test", "-p", "e2e", *selection, "--no-run", "--quiet", "--message-format=json"],
        cwd=REPO,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{kind}:{target['name']}"
        found.append((name, [msg["executable"]]))
    if not only:
        # The e2e library's doc tests (rustdoc builds and runs them; no executable to list).
        found.append(("doc", ["cargo", "test", "-p", "e2e", "--offline", "--quiet", "--doc", "--"]))
    return sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("VWS_E2E_LANES", "3")))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("VWS_E2E_THREADS", "4")))
    parser.add_argument("--test", action="append", default=[], metavar="NAME",
                        help="only the test file e2e/tests/NAME.rs (repeatable)")
    parser.add_argument("args", nargs="*", help="passed to every test binary")
    opts = parser.parse_args()
    if opts.lanes < 1:
        parser.error("--lanes must be at least 1")
    unknown = [n for n in opts.test if not (REPO / "e2e" / "tests" / f"{n}.rs").is_file()]
    if unknown:
        names = sorted(f.stem for f in (REPO / "e2e" / "tests").glob("*.rs"))
        parser.error(f"no test file e2e/tests/{unknown[0]}.rs; the files are: {' '.join(names)}")

    jobs = test_executables(opts.test)
    if not jobs:
        sys.exit("e2e-lanes: cargo built no e2e test executable")
    last = sorted((j for j in jobs if j[0] in LAST), key=lambda j: LAST.index(j[0]))
    queue = sorted((j for j in jobs if j[0] not in LAST), key=lambda j: -EXPECTED.get(j[0], DEFAULT_EXPECTED))
    logs = REPO / "target" / "e2e-logs"
    logs.mkdir(parents=True, exist_ok=True)

    lock = threading.Condition()
    busy_groups = set()
    results = []  # (name, lane, status, seconds)
    t_start = time.monotonic()

    # One job alone has no other output to interleave with: shown as it comes.
    stream = len(jobs) == 1

    def run(name, command, lane):
        log_path = logs / f"{name.replace(':', '-')}.log"
        env = dict(os.environ, VWS_E2E_PORT_SLOT=str(lane), VWS_E2E_PORT_SLOTS=str(opts.lanes))
        cmd = [str(HACK / "cluster.sh"), "exec", *command, f"--test-threads={opts.threads}", *opts.args]
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            if stream:
                proc = subprocess.Popen(cmd, cwd=REPO / "e2e", env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
                for chunk in iter(lambda: proc.stdout.read1(65536), b""):
                    log.write(chunk)
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                status = proc.wait()
            else:
                status = subprocess.run(cmd, cwd=REPO / "e2e", env=env, stdout=log,
                                        stderr=subprocess.STDOUT).returncode
        secs = time.monotonic() - t0
        with lock:
            sys.stdout.write(f"\n===== e2e {name} (lane {lane}): exit {status} after {secs:.0f}s =====\n")
            sys.stdout.flush()
            if not stream:
                with open(log_path, "rb") as log:
                    sys.stdout.buffer.write(log.read())
                sys.stdout.flush()
            results.append((name, lane, status, secs))
        return status

    def lane_worker(lane):
        while True:
            with lock:
                while True:
                    if not queue:
                        return
                    pick = next((j for j in queue if GROUPS.get(j[0]) not in busy_groups), None)
                    if pick is not None:
                        break
                    lock.wait()
                queue.remove(pick)
                group = GROUPS.get(pick[0])
                if group:
                    busy_groups.add(group)
            try:
                run(pick[0], pick[1], lane)
            finally:
                with lock:
                    busy_groups.discard(group)
                    lock.notify_all()

    workers = [threading.Thread(target=lane_worker, args=(lane,)) for lane in range(opts.lanes)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    parallel_secs = time.monotonic() - t_start
    for name, command in last:
        run(name, command, 0)

    total = time.monotonic() - t_start
    print(f"\ne2e lanes: {opts.lanes} lanes, {opts.threads} threads each")
    for name, lane, status, secs in sorted(results, key=lambda r: -r[3]):
        print(f"  {name:<28} lane {lane}  exit {status:<4} {secs:6.0f} s")
    busy = sum(r[3] for r in results if r[0] not in LAST)
    print(f"  side by side: {parallel_secs:.0f} s for {busy:.0f} s of suites; total {total:.0f} s")
    failed = [r[0] for r in results if r[2] != 0]
    if failed:
        print(f"e2e lanes: failed: {' '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
