# vworkspace-operator developer recipes. On a fresh machine use `hack/just <recipe>`,
# which installs `just` first.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List recipes.
default:
    @just --list

# Regenerate CRD YAML in deploy/crds/ from crates/api.
generate:
    cargo run -q -p crdgen -- deploy/crds

# Fail if a generated file is stale: deploy/crds/ (crates/api), the Flux manifests, the Helm
# chart, deploy/monitoring/prometheusrule.yaml (deploy/monitoring/rules.yaml).
check-generated:
    cargo run -q -p crdgen -- --check deploy/crds
    hack/gen-flux-manifests.sh --check
    hack/gen-chart.py --check
    hack/gen-monitoring.py --check

# Format all Rust code.
fmt:
    cargo fmt --all

# Check formatting without changing files.
fmt-check:
    cargo fmt --all --check

# Clippy on every crate and target, warnings are errors; then, on the code that ships (every
# crate's library and binaries, not tests, not the e2e harness), no path to a panic:
# unwrap, expect, panic!, indexing and string slicing are errors there (docs/development/README.md).
lint:
    cargo clippy --workspace --all-targets --quiet -- -D warnings
    cargo clippy --workspace --exclude e2e --lib --bins --quiet -- -D warnings -D clippy::unwrap_used -D clippy::expect_used -D clippy::panic -D clippy::indexing_slicing -D clippy::string_slice

# Dependency policy (deny.toml): licences, duplicate versions, wildcards, sources; no advisories.
deny:
    bin=$(hack/build-cargo-deny.sh) && "$bin" --locked check licenses bans sources

# Install the kubectl plugin (`kubectl vws`, docs/cli.md) into ~/.cargo/bin.
install-plugin:
    cargo install --locked --path crates/kubectl-vws

# Unit tests (no cluster needed).
unit:
    cargo test --workspace --exclude e2e

# The monitoring kit's alerting rules (deploy/monitoring/, docs/operations/README.md):
# `promtool check rules` and `promtool test rules` (one test file per alert). promtool is
# built once from the Go module proxy into the cache (hack/build-promtool.sh).
monitoring-check:
    #!/usr/bin/env bash
    set -euo pipefail
    promtool=$(hack/build-promtool.sh)
    "$promtool" check rules deploy/monitoring/rules.yaml
    "$promtool" test rules deploy/monitoring/tests/*.yaml

# Build (cached) and start the local cluster: etcd, kube-*, kwok, Flux, chart repo.
cluster-up:
    hack/cluster.sh up

# Stop the local cluster and delete its state.
cluster-down:
    hack/cluster.sh down

# Show the local cluster's processes and health.
cluster-status:
    hack/cluster.sh status

# Run a command inside the cluster's network namespace, e.g. `just in-cluster kubectl get ai -A`.
in-cluster +cmd:
    hack/cluster.sh exec {{cmd}}

# End-to-end tests on the real local cluster (starts and stops it if needed).
e2e *args:
    hack/e2e.sh {{args}}

# Builds only that file's test binary, readies what it needs and runs it; ARGS go to the binary
# (e.g. a test name filter).
# One e2e test file (e.g. `just e2e-file odoo`) on the local cluster, started if needed and kept up.
e2e-file file *args:
    hack/e2e.sh --file {{file}} {{args}}

# The reference Odoo addon (odoo/addons/vworkspace) on a REAL Odoo 19 (VWS_ODOO_SRC, default
# ../shared/odoo-19) and Debian's PostgreSQL: its Odoo tests, with the golden files replayed
# (docs/connectivity/odoo-addon.md). Installs the missing Debian packages first.
odoo-check:
    hack/odoo.sh deps
    hack/odoo.sh db-up
    hack/odoo.sh test

# Everything CI runs: generated files, format, dependency policy, lint, unit tests, the
# reference Odoo addon's tests, the monitoring kit's rules, e2e.
test: check-generated fmt-check deny lint unit odoo-check monitoring-check e2e

# The main job: a real local cluster with the operator, a sample app and real Odoo 19 with the
# reference addon as the control plane (`just demo sim`: the simulator instead of Odoo;
# `just demo push`: the agent in push mode, the simulator calling it).
demo mode="odoo":
    hack/demo.sh {{mode}}

# Chaos, measured: SIGKILL each binary at seeded random points, stop the API server and the
# control plane under load, count what was lost (figures in docs/reliability.md).
chaos:
    hack/chaos.sh

# The app controller's runs come last: they keep their last 10,000 apps for inspection, which
# the other benchmarks need not share the cluster with.
# Every benchmark in sequence with its default cases, then the time each took (figures in docs/performance.md).
bench:
    #!/usr/bin/env bash
    set -euo pipefail
    times=()
    total=$SECONDS
    for part in bench-ops bench-agent bench-backup bench-app; do
        start=$SECONDS
        hack/$part.sh
        times+=("$part: $((SECONDS - start)) s")
    done
    echo "elapsed per part:"
    printf '  %s\n' "${times[@]}"
    echo "  total: $((SECONDS - total)) s"

# Benchmark the app controller on the real local cluster (figures in docs/performance.md).
bench-app *args:
    hack/bench-app.sh {{args}}

# Benchmark the runbook engine: 200 Runbook Operations across 20 apps (figures in docs/performance.md).
bench-ops *args:
    hack/bench-ops.sh {{args}}

# Benchmark backup and restore of 1 GiB of volume data on the real node against a plain cp
# (figures in docs/performance.md).
bench-backup *args:
    hack/bench-backup.sh {{args}}

# Benchmark the connectivity agent: status-change latency to the control plane (with and without
# the gRPC status channel), 1,000 simulated agents against one simulator, and the agent with
# 10,000 objects (figures in docs/performance.md).
bench-agent *args:
    hack/bench-agent.sh {{args}}
