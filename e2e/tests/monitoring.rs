//! The monitoring kit against the real binaries (deploy/monitoring/, docs/operations/README.md):
//! every metric that the Grafana dashboard and the Prometheus alerting rules query is exported
//! by one of our binaries.
//!
//! The test starts the whole product on the local cluster, as `just demo` does, confined to
//! its namespace: the control-plane simulator, the agent, the app controller and the four
//! engines, the controllers publishing to the agent's status channel. It scrapes each
//! binary's `/metrics` and checks each metric name found in the PromQL of
//! `deploy/monitoring/dashboard.json` and `deploy/monitoring/rules.yaml` against what was
//! exported. A family that has no sample yet (a counter no event has incremented, a gauge
//! family without series) still prints its `# TYPE` line in OpenMetrics, which counts as
//! exported: its name is then known with the suffixes of its type (`_total` for a counter;
//! `_bucket`, `_sum`, `_count` for a histogram). But a family prints nothing at all before it
//! has a series (prometheus-client 0.25), so the test makes each one exist as production does:
//! intent through the agent (an application that cannot become Ready), and an application
//! backed up every minute (scheduled Backup Operations, carried out by Velero). Along the way
//! it checks values it can know: the status channel is connected in every publisher, the agent
//! reaches the simulator, the applications are counted, the backups succeed.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use api::{BackupParams, schedule::BackupSchedule};
use e2e::{
    TestContext,
    agent::{SimProcess, start_agent},
    apps::{app, apply_app},
    deploy::{http_get, metric_sum},
    eventually,
    process::ControllerProcess,
};
use serde_json::{Value, json};

/// How long a value may take to show on `/metrics`: the gauges refresh every 30 s, and a
/// scheduled backup runs at the next minute (the app installs first), then Velero backs up.
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(240);

/// Families with series only after a failed reconcile, which this test does not provoke
/// (nothing in the product fails on purpose): their encoding is unit-tested
/// (`controller_kit::metrics` tests), and every binary registers them through controller-kit.
const ONLY_AFTER_A_FAILURE: [&str; 1] = ["vworkspace_reconcile_failures_total"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `vworkspace_*` metric name in `promql` (our binaries' prefix).
fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = promql.as_bytes();
    let mut i = 0;
    while let Some(pos) = promql[i..].find("vworkspace_") {
        let start = i + pos;
        // Not the tail of a longer identifier.
        let preceded = start > 0
            && bytes
                .get(start - 1)
                .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
        let end = promql[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(promql.len(), |n| start + n);
        if !preceded {
            names.insert(promql[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// Every `expr` string anywhere in the dashboard JSON.
fn dashboard_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// The metric names queried by the dashboard and by the rules, each with where it is queried.
fn queried() -> anyhow::Result<BTreeMap<String, BTreeSet<&'static str>>> {
    let monitoring = repo_root().join("deploy/monitoring");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(monitoring.join("dashboard.json"))?)?;
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    // Template variables query too (label_values(...)).
    let mut sources: Vec<(&'static str, String)> = exprs.into_iter().map(|e| ("dashboard.json", e)).collect();
    if let Some(vars) = dashboard.pointer("/templating/list").and_then(Value::as_array) {
        for var in vars {
            if let Some(q) = var.get("definition").and_then(Value::as_str) {
                sources.push(("dashboard.json", q.to_owned()));
            }
        }
    }
    let rules: Value = serde_saphyr::from_str(&std::fs::read_to_string(monitoring.join("rules.yaml"))?)?;
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            if let Some(alert) = rule["alert"].as_str() {
                alerts.insert(alert.to_owned());
            }
            let expr = rule["expr"].as_str().unwrap_or_default();
            anyhow::ensure!(!expr.is_empty(), "a rule without expr: {rule}");
            sources.push(("rules.yaml", expr.to_owned()));
        }
    }
    for required in [
        "VWorkspaceApplicationNotReady",
        "VWorkspaceOperationsFailing",
        "VWorkspaceBackupOverdue",
        "VWorkspaceAgentControlPlaneUnreachable",
        "VWorkspaceStatusChannelDisconnected",
    ] {
        anyhow::ensure!(
            alerts.contains(required),
            "rules.yaml has no alert {required}: {alerts:?}"
        );
    }
    let mut out: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    for (source, expr) in sources {
        for name in metric_names(&expr) {
            out.entry(name).or_default().insert(source);
        }
    }
    Ok(out)
}

/// The metric names an exposition makes queryable: sample names, and for every `# TYPE`
/// line the family's name with the suffixes of its type (a family without samples yet).
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

#[test]
fn names_are_parsed_from_promql_and_expositions() {
    let promql = r#"histogram_quantile(0.9, sum by (le) (rate(vworkspace_x_seconds_bucket[5m]))) / on(pod) group_left vworkspace_leader == 1 and not my_vworkspace_other"#;
    let want: BTreeSet<String> = ["vworkspace_x_seconds_bucket", "vworkspace_leader"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(metric_names(promql), want);
    let text =
        "# HELP a_runs Runs.\n# TYPE a_runs counter\n# TYPE a_d_seconds histogram\n# TYPE a_up gauge\na_up 1\n# EOF\n";
    let got = exported(text);
    for name in [
        "a_runs",
        "a_runs_total",
        "a_d_seconds_bucket",
        "a_d_seconds_count",
        "a_up",
    ] {
        assert!(got.contains(name), "{name} in {got:?}");
    }
    assert!(!got.contains("a_up_total"));
}

/// Starts `binary` for the test namespace with an admin server, publishing to `channel`.
async fn start_binary(ctx: &TestContext, binary: &str, channel: &str) -> anyhow::Result<(ControllerProcess, String)> {
    let ns = ctx.namespace.clone();
    let channel = channel.to_owned();
    let app_controller = binary == "app-controller";
    ControllerProcess::start_with_admin(
        ctx.process_scope(),
        binary,
        &format!("{binary}-{}", ctx.namespace),
        move |admin| {
            let mut args: Vec<String> = [
                "--watch-namespace",
                &ns,
                "--allowed-namespaces",
                &ns,
                "--admin-addr",
                admin,
                "--status-channel-endpoint",
                &channel,
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            if app_controller {
                args.extend(["--insecure-repository-hosts".to_owned(), "127.0.0.1".to_owned()]);
            }
            args
        },
        &[("RUST_LOG", "info")],
    )
    .await
}

/// (binary, metric, label matchers, what its value must satisfy).
type Expectation<'a> = (&'a str, &'a str, Vec<&'a str>, fn(f64) -> bool);

#[tokio::test]
async fn every_metric_the_dashboard_and_the_rules_query_is_exported() -> anyhow::Result<()> {
    let queried = queried()?;
    anyhow::ensure!(queried.len() >= 20, "too few metric names found: {queried:?}");

    let ctx = TestContext::new("monitoring").await?;
    let sim = SimProcess::start(&ctx).await?;
    let agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let mut scraped: Vec<(&str, String)> = vec![("agent", agent.admin_addr.clone())];
    let mut processes = Vec::new();
    for binary in [
        "app-controller",
        "backup-engine",
        "restore-engine",
        "upgrade-engine",
        "runbook-engine",
    ] {
        let (process, admin) = start_binary(&ctx, binary, &agent.status_channel).await?;
        process.wait_http_ok(&admin, "/readyz", Duration::from_secs(60)).await?;
        processes.push(process);
        scraped.push((binary, admin));
    }
    // OpenMetrics prints a family only once it has a series: the test makes each one exist
    // the way production does. Through the agent, an application that cannot become Ready
    // (no such chart version): documents, objects and reports, the readiness gauges. And
    // directly, an application backed up every minute: scheduled Backup Operations that
    // Velero carries out, so the Operation metrics and both backup schedule gauges appear.
    let ns = ctx.namespace.clone();
    sim.set_app(
        &ns,
        "broken",
        serde_json::to_value(app("broken", "demo-app", "9.9.9", json!({})).spec)?,
    )
    .await?;
    let mut nightly = app("nightly", "demo-app", "0.1.0", json!({}));
    nightly.spec.backup_schedule = Some(BackupSchedule {
        cron: "* * * * *".into(),
        keep_last: Some(1),
        backup: Some(BackupParams::default()),
        ..BackupSchedule::default()
    });
    apply_app(&ctx, &nightly).await?;

    // Values the test can know: every publisher's stream is open, the agent reaches the
    // simulator, the broken application is not Ready, the scheduled backups succeed.
    let namespace = format!("namespace=\"{ns}\"");
    let mut expectations: Vec<Expectation<'_>> = vec![
        ("agent", "vworkspace_agent_control_plane_connected", vec![], |v| {
            (v - 1.0).abs() < 0.5
        }),
        ("agent", "vworkspace_agent_objects_total", vec![], |v| v >= 1.0),
        (
            "app-controller",
            "vworkspace_applicationinstances",
            vec![namespace.as_str()],
            |v| (v - 2.0).abs() < 0.5,
        ),
        (
            "app-controller",
            "vworkspace_applicationinstances_not_ready_since_timestamp_seconds",
            vec![namespace.as_str()],
            |v| v > 0.0,
        ),
        (
            "backup-engine",
            "vworkspace_backup_schedule_last_success_timestamp_seconds",
            vec![namespace.as_str()],
            |v| v > 0.0,
        ),
        (
            "backup-engine",
            "vworkspace_backup_schedule_due_timestamp_seconds",
            vec![namespace.as_str()],
            |v| v > 0.0,
        ),
        (
            "backup-engine",
            "vworkspace_operations_finished_total",
            vec!["phase=\"Succeeded\""],
            |v| v >= 1.0,
        ),
        ("backup-engine", "vworkspace_operations", vec!["type=\"Backup\""], |v| {
            v >= 1.0
        }),
    ];
    for binary in [
        "app-controller",
        "backup-engine",
        "restore-engine",
        "upgrade-engine",
        "runbook-engine",
    ] {
        expectations.push((binary, "vworkspace_status_channel_connected", vec![], |v| {
            (v - 1.0).abs() < 0.5
        }));
    }
    for (binary, metric, labels, ok) in &expectations {
        let admin = &scraped
            .iter()
            .find(|(b, _)| b == binary)
            .expect("every binary is scraped")
            .1;
        eventually(
            &ctx,
            &format!("{binary}: {metric}{labels:?}"),
            SCHEDULE_TIMEOUT,
            || async {
                let text = http_get(admin, "/metrics").await?;
                let value = metric_sum(&text, metric, labels);
                Ok(if ok(value) {
                    Ok(())
                } else {
                    Err(format!("{metric}{labels:?} = {value}"))
                })
            },
        )
        .await?;
    }

    // The check itself: every queried name is exported by some binary.
    let mut by_binary: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (binary, admin) in &scraped {
        by_binary.insert(binary, exported(&http_get(admin, "/metrics").await?));
    }
    let all: BTreeSet<&String> = by_binary.values().flatten().collect();
    let missing: Vec<String> = queried
        .iter()
        .filter(|(name, _)| !all.contains(name) && !ONLY_AFTER_A_FAILURE.contains(&name.as_str()))
        .map(|(name, sources)| {
            format!(
                "{name} (queried in {})",
                sources.iter().copied().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "queried but exported by none of {:?}:\n  {}",
        by_binary.keys().collect::<Vec<_>>(),
        missing.join("\n  ")
    );

    // Where each family comes from, as docs/operations/README.md's inventory says.
    for (binary, name) in [
        (
            "app-controller",
            "vworkspace_applicationinstances_not_ready_since_timestamp_seconds",
        ),
        ("backup-engine", "vworkspace_backup_schedule_due_timestamp_seconds"),
        ("backup-engine", "vworkspace_operations_finished_total"),
        ("restore-engine", "vworkspace_operations_finished_total"),
        ("backup-engine", "vworkspace_operation_duration_seconds_bucket"),
        ("upgrade-engine", "vworkspace_operation_duration_seconds_bucket"),
        ("runbook-engine", "vworkspace_operations_started_total"),
        ("agent", "vworkspace_agent_control_plane_connected"),
        ("agent", "vworkspace_agent_status_channel_refused_total"),
    ] {
        assert!(
            by_binary.get(binary).is_some_and(|names| names.contains(name)),
            "{binary} does not export {name}"
        );
    }
    drop(processes);
    Ok(())
}
