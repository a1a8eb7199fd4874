//! The connectivity agent end to end against a **real Odoo 19** with the reference addon
//! (`odoo/addons/vworkspace`), not the simulator: intent declared in Odoo (as a person does,
//! over JSON-2 as `admin`) becomes a ready release whose status Odoo shows; an explicit
//! deletion removes it; an Operation with a deadline succeeds and an undated one from an old
//! document is refused; Odoo killed for a minute while the cluster changes loses nothing; a
//! wrong, an expired and a wrongly scoped key are each reported clearly; a lowered report
//! limit is followed; and two clusters on one Odoo never receive each other's intent.
//!
//! One Odoo database for the whole binary (`e2e::odoo::database`, created at the first test),
//! one Odoo server per test (`e2e::odoo::OdooProcess`), one cluster record (or more) per test.
//! Run: `hack/cluster.sh exec cargo test -p e2e --offline --test odoo -- --test-threads=4`.
//! Test names start so that the longest (the outage) starts first.

use std::time::{Duration, Instant};

use api::{ApplicationInstance, Operation, OperationPhase};
use e2e::{
    TestContext,
    agent::{AGENT_TIMEOUT, AgentProcess, assert_never_leaked, status_configmap, work_dir},
    apps::{RELEASE_TIMEOUT, start_controller},
    deploy::{self, http_get, metric_sum},
    flux,
    odoo::{self, OdooProcess, conditions, parse_odoo_datetime, start_agent},
    ops::{start_engine, wait_phase},
    peer::Peer,
    process::free_loopback_addr,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{Api, api::ListParams};
use serde_json::{Value, json};

const APP: &str = "vworkspace.application";
const OPERATION: &str = "vworkspace.operation";
const CLUSTER: &str = "vworkspace.cluster";
const DELETION: &str = "vworkspace.deletion";

/// Prints how long a test took when it ends (passed or not).
struct Timer(&'static str, Instant);

impl Drop for Timer {
    fn drop(&mut self) {
        eprintln!(
            "odoo e2e: {} took {:.1} s{}",
            self.0,
            self.1.elapsed().as_secs_f64(),
            if std::thread::panicking() { " (failed)" } else { "" }
        );
    }
}

fn timer(name: &'static str) -> Timer {
    Timer(name, Instant::now())
}

fn in_an_hour() -> jiff::Timestamp {
    jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)
}

async fn kube_system_uid(ctx: &TestContext) -> anyhow::Result<String> {
    Ok(Api::<Namespace>::all(ctx.client.clone())
        .get("kube-system")
        .await?
        .metadata
        .uid
        .unwrap_or_default())
}

async fn app_names(ctx: &TestContext) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = ctx
        .api::<ApplicationInstance>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|a| a.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until the agent says it is unauthorized (HTTP 401, Odoo's `Invalid apikey`) in its
/// log, `/readyz`, metrics and status ConfigMap, and is still running (no crash loop).
async fn assert_unauthorized(ctx: &TestContext, agent: &mut AgentProcess, what: &str) -> anyhow::Result<()> {
    e2e::eventually(
        ctx,
        &format!("{what}: the agent reports Unauthorized"),
        AGENT_TIMEOUT,
        || async {
            let logs = agent.process.logs();
            let readyz = http_get(&agent.admin_addr, "/readyz").await;
            Ok(
                if logs.contains("HTTP 401") && logs.contains("Invalid apikey") && readyz.is_err() {
                    Ok(())
                } else {
                    Err(format!("readyz {readyz:?}"))
                },
            )
        },
    )
    .await?;
    let (status, body) = e2e::agent::http(&format!("http://{}", agent.admin_addr), "GET", "/readyz", None).await?;
    assert_eq!(status, 503, "{what}: {body}");
    assert!(body.contains("ControlPlaneConnected: Unauthorized"), "{what}: {body}");
    assert!(body.contains("HTTP 401"), "{what}: {body}");
    let metrics = http_get(&agent.admin_addr, "/metrics").await?;
    assert_eq!(
        metric_sum(&metrics, "vworkspace_agent_condition", &["reason=\"Unauthorized\""]),
        1.0,
        "{what}"
    );
    e2e::eventually(
        ctx,
        &format!("{what}: status ConfigMap says Unauthorized"),
        AGENT_TIMEOUT,
        || async {
            Ok(match status_configmap(&agent.status_configmap).await? {
                Some(cm) if cm["condition"]["reason"] == "Unauthorized" => Ok(()),
                other => Err(format!("status ConfigMap {other:?}")),
            })
        },
    )
    .await?;
    assert!(agent.process.is_running(), "{what}: a refused key is no crash loop");
    Ok(())
}

#[tokio::test]
async fn a_control_plane_outage_of_a_minute_loses_no_report_and_no_acknowledgement() -> anyhow::Result<()> {
    let _t = timer("outage");
    let ctx = TestContext::new("odoo-outage").await?;
    let _engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    let mut odoo = OdooProcess::start(&ctx).await?;
    let cluster = odoo
        .create_cluster(&ctx, &format!("edge-{}", ctx.namespace), "api-key")
        .await?;
    let agent = start_agent(&ctx, &odoo, &cluster.name, &cluster.key_file, "", &[]).await?;
    let ns = ctx.namespace.as_str();

    let app_id = odoo
        .declare_app(
            cluster.id,
            ns,
            "wiki",
            "demo-app",
            "0.1.0",
            &json!({"greeting": "before"}),
        )
        .await?;
    odoo.wait_record(&ctx, APP, app_id, "acknowledged applied", AGENT_TIMEOUT, |a| {
        a["ack_outcome"] == "applied"
    })
    .await?;
    // An Operation that may start only in 35 s: created on the cluster now, run while Odoo
    // is away.
    let not_before = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(35);
    let op_id = odoo
        .declare_runbook(
            cluster.id,
            ns,
            "wiki",
            "echo after",
            Some(not_before),
            Some(in_an_hour()),
        )
        .await?;
    let op = odoo
        .wait_record(
            &ctx,
            OPERATION,
            op_id,
            "applied and reported waiting for notBefore",
            AGENT_TIMEOUT,
            |o| {
                o["ack_outcome"] == "applied"
                    && o["report_conditions"]
                        .as_str()
                        .is_some_and(|c| c.contains("WaitingForNotBefore"))
            },
        )
        .await?;
    let op_name = op["name"].as_str().expect("operation name").to_owned();
    assert_eq!(op["status"], "pending", "{}", odoo::compact(&op));
    let acks_before = odoo.acks(cluster.id).await?;
    let before = odoo.cluster(cluster.id).await?;
    let app_before = odoo.application(app_id).await?;
    assert!(!acks_before.is_empty());

    // The control plane goes away. Meanwhile the cluster moves on: the application's values
    // change by hand (kubectl), and the Operation runs to completion.
    odoo.kill().await?;
    let stopped = Instant::now();
    deploy::kubectl(
        &[
            "patch",
            "applicationinstance",
            "wiki",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"values":{"greeting":"changed while Odoo was away"}}}"#,
        ],
        None,
    )
    .await?;
    let succeeded = wait_phase(&ctx, &op_name, OperationPhase::Succeeded, "Completed").await?;
    e2e::eventually(&ctx, "agent not ready while Odoo is away", AGENT_TIMEOUT, || async {
        let metrics = http_get(&agent.admin_addr, "/metrics").await?;
        let failures = metric_sum(&metrics, "vworkspace_agent_consecutive_failures", &[]);
        let ready = http_get(&agent.admin_addr, "/readyz").await.is_ok();
        Ok(if failures >= 3.0 && !ready {
            Ok(())
        } else {
            Err(format!("failures {failures}, ready {ready}"))
        })
    })
    .await?;
    e2e::eventually(
        &ctx,
        "status ConfigMap says ConnectionFailed",
        AGENT_TIMEOUT,
        || async {
            Ok(match status_configmap(&agent.status_configmap).await? {
                Some(cm) if cm["condition"]["reason"] == "ConnectionFailed" && cm["condition"]["status"] == "False" => {
                    Ok(())
                }
                other => Err(format!("status ConfigMap {other:?}")),
            })
        },
    )
    .await?;
    // Down for at least a minute, then back on the same port and database.
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(stopped.elapsed())).await;
    let down_for = stopped.elapsed();
    odoo.start_again().await?;
    eprintln!("odoo e2e: Odoo was down for {:.1} s", down_for.as_secs_f64());

    let wiki = ctx.api::<ApplicationInstance>().get("wiki").await?;
    let generation = wiki.metadata.generation.expect("generation");
    let op = odoo
        .wait_record(
            &ctx,
            OPERATION,
            op_id,
            "succeeded after the outage",
            AGENT_TIMEOUT,
            |o| o["status"] == "succeeded",
        )
        .await?;
    assert_eq!(op["phase"], "Succeeded", "{}", odoo::compact(&op));
    assert_eq!(
        op["report_uid"].as_str(),
        succeeded.metadata.uid.as_deref(),
        "the report is of the Operation created before the outage"
    );
    let (start, end) = (
        parse_odoo_datetime(&op["start_time"]),
        parse_odoo_datetime(&op["completion_time"]),
    );
    assert!(start.is_some() && start <= end, "{}", odoo::compact(&op));
    assert!(
        start >= Some(not_before - jiff::SignedDuration::from_secs(1)),
        "started after notBefore: {}",
        odoo::compact(&op)
    );
    let report = odoo
        .wait(&ctx, "Odoo holds the latest report of wiki", AGENT_TIMEOUT, || async {
            let r = odoo.report(cluster.id, "ApplicationInstance", ns, "wiki").await?;
            Ok(match r {
                Some(r) if r["generation"].as_i64() == Some(generation) => Ok(r),
                other => Err(format!("{other:?}, cluster at generation {generation}")),
            })
        })
        .await?;
    assert_eq!(report["uid"].as_str(), wiki.metadata.uid.as_deref());
    let after = odoo
        .wait_record(&ctx, CLUSTER, cluster.id, "the outage on record", AGENT_TIMEOUT, |c| {
            c["last_error_reason"] == "ConnectionFailed"
        })
        .await?;
    assert!(
        after["last_error_attempts"].as_i64().unwrap_or_default() >= 3,
        "{}",
        odoo::compact(&after)
    );
    // Every acknowledgement is still there as it was, none was added: nothing applied again.
    let acks_after = odoo.acks(cluster.id).await?;
    for ack in &acks_before {
        let same = acks_after
            .iter()
            .find(|a| a["epoch"] == ack["epoch"] && a["revision"] == ack["revision"]);
        let same = same.unwrap_or_else(|| panic!("acknowledgement of revision {} kept", ack["revision"]));
        assert_eq!(same["outcome"], ack["outcome"]);
        assert_eq!(same["objects"], ack["objects"]);
    }
    assert_eq!(acks_after.len(), acks_before.len(), "no new acknowledgement");
    assert_eq!(after["revision"], before["revision"]);
    assert_eq!(after["epoch"], before["epoch"]);
    let app = odoo.application(app_id).await?;
    for field in ["ack_epoch", "ack_revision", "ack_outcome", "ack_uid", "ack_generation"] {
        assert_eq!(app[field], app_before[field], "{field}: {}", odoo::compact(&app));
    }
    assert_eq!(
        ctx.api::<ApplicationInstance>().get("wiki").await?.spec.values,
        Some(json!({"greeting": "changed while Odoo was away"})),
        "the document was not applied again over the change"
    );
    e2e::eventually(&ctx, "agent ready again", AGENT_TIMEOUT, || async {
        Ok(match http_get(&agent.admin_addr, "/readyz").await {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        })
    })
    .await?;
    let c = odoo.cluster(cluster.id).await?;
    assert_eq!(c["agent_online"], true, "{}", odoo::compact(&c));
    Ok(())
}

#[tokio::test]
async fn a_wrong_an_expired_and_a_wrongly_scoped_key_are_each_reported_clearly() -> anyhow::Result<()> {
    let _t = timer("keys");
    let ctx = TestContext::new("odoo-keys").await?;
    let odoo = OdooProcess::start(&ctx).await?;
    let name = format!("edge-{}", ctx.namespace);
    let created = Instant::now();
    let record = odoo
        .shell_cluster(&name, &["expired", "scope:odoo.plugin.e2e", "expires-in:45"])
        .await?;
    let dir = work_dir(&ctx)?;
    let write = |file: &str, key: &str| -> anyhow::Result<std::path::PathBuf> {
        let path = dir.join(file);
        std::fs::write(&path, key)?;
        Ok(path)
    };
    let wrong = write("wrong-key", &"0123456789abcdef".repeat(3)[..40])?;
    let expired = write("expired-key", &record.keys["expired"])?;
    let scoped = write("scoped-key", &record.keys["scope:odoo.plugin.e2e"])?;
    let expiring = write("expiring-key", &record.keys["expires-in:45"])?;

    let mut expiring_agent = start_agent(&ctx, &odoo, &name, &expiring, "-expiring", &[]).await?;
    let mut agents = Vec::new();
    for (tag, file) in [("-wrong", &wrong), ("-expired", &expired), ("-scoped", &scoped)] {
        agents.push((tag, start_agent(&ctx, &odoo, &name, file, tag, &[]).await?));
    }
    // A key valid for 45 s works until then.
    e2e::eventually(&ctx, "the key valid for 45 s works", AGENT_TIMEOUT, || async {
        Ok(match status_configmap(&expiring_agent.status_configmap).await? {
            Some(cm) if cm["condition"]["reason"] == "Synced" => Ok(()),
            other => Err(format!("status ConfigMap {other:?}")),
        })
    })
    .await?;
    let bound = odoo.cluster(record.id).await?;
    assert_eq!(bound["bound_uid"].as_str(), Some(kube_system_uid(&ctx).await?.as_str()));
    assert!(
        created.elapsed() < Duration::from_secs(40),
        "in sync before the key expired"
    );
    for (tag, agent) in &mut agents {
        assert_unauthorized(&ctx, agent, &format!("the {} key", &tag[1..])).await?;
    }
    // Then it expires, while the agent runs: refused from then on, and said so.
    assert_unauthorized(&ctx, &mut expiring_agent, "the key once it expired").await?;
    assert!(
        created.elapsed() >= Duration::from_secs(45),
        "refused only once it expired"
    );
    // Odoo answered each refused call 401 (its werkzeug log), and the record stays bound to
    // this cluster (none of the refused keys got in).
    let refused = odoo
        .logs()
        .lines()
        .filter(|l| l.contains("/json/2/vworkspace.cluster/agent_register HTTP/1.1\" 401"))
        .count();
    assert!(refused >= 4, "Odoo logged {refused} refused agent_register calls");
    assert_eq!(odoo.cluster(record.id).await?["bound_uid"], bound["bound_uid"]);
    for key in record.keys.values() {
        for (_, agent) in &agents {
            assert!(
                !agent.process.logs().contains(key.as_str()),
                "a key leaked into an agent's log"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn an_operation_with_a_deadline_succeeds_and_an_undated_one_from_an_old_document_is_refused() -> anyhow::Result<()>
{
    let _t = timer("operations");
    let ctx = TestContext::new("odoo-ops").await?;
    let mut odoo = OdooProcess::start(&ctx).await?;
    let cluster = odoo
        .create_cluster(&ctx, &format!("edge-{}", ctx.namespace), "api-key")
        .await?;
    let agent = start_agent(&ctx, &odoo, &cluster.name, &cluster.key_file, "", &[]).await?;
    let channel = ["--status-channel-endpoint", agent.status_channel.as_str()];
    let _engine = start_engine(&ctx, "runbook-engine", &channel).await?;
    let ns = ctx.namespace.as_str();

    let app_id = odoo
        .declare_app(cluster.id, ns, "wiki", "demo-app", "0.1.0", &json!({}))
        .await?;
    odoo.wait_record(&ctx, APP, app_id, "acknowledged applied", AGENT_TIMEOUT, |a| {
        a["ack_outcome"] == "applied"
    })
    .await?;

    // With a deadline: created, run, and its result in Odoo.
    let op_id = odoo
        .declare_runbook(cluster.id, ns, "wiki", "echo reindexed", None, Some(in_an_hour()))
        .await?;
    let op = odoo
        .wait_record(&ctx, OPERATION, op_id, "succeeded", AGENT_TIMEOUT * 2, |o| {
            o["status"] == "succeeded"
        })
        .await?;
    eprintln!("odoo e2e: the Operation as Odoo shows it: {}", odoo::compact(&op));
    assert_eq!(op["ack_outcome"], "applied");
    assert_eq!(op["phase"], "Succeeded");
    let request_id = op["request_id"].as_str().expect("request id");
    assert!(request_id.starts_with("odoo-op-"), "Odoo's sequence: {request_id}");
    let (start, end) = (
        parse_odoo_datetime(&op["start_time"]),
        parse_odoo_datetime(&op["completion_time"]),
    );
    assert!(start.is_some() && start <= end, "{}", odoo::compact(&op));
    assert!(
        op["succeeded_reason"].as_str().unwrap_or_default().starts_with("True"),
        "{}",
        odoo::compact(&op)
    );
    assert!(
        !op["result"].as_str().unwrap_or_default().is_empty(),
        "a result: {}",
        odoo::compact(&op)
    );
    let on_cluster = ctx.api::<Operation>().get(op["name"].as_str().expect("name")).await?;
    assert_eq!(on_cluster.spec.request_id, request_id);
    assert!(on_cluster.spec.deadline.is_some(), "the deadline reached the cluster");
    assert_eq!(op["report_uid"].as_str(), on_cluster.metadata.uid.as_deref());

    // Odoo's clock two hours late: every document it sends was "generated" two hours ago.
    // An Operation without a deadline from such a document is refused, and nothing created.
    odoo.start_again_with_clock_offset(-7200).await?;
    let late_id = odoo
        .declare_runbook(cluster.id, ns, "wiki", "echo too-late", None, None)
        .await?;
    let late = odoo
        .wait_record(&ctx, OPERATION, late_id, "acknowledged", AGENT_TIMEOUT, |o| {
            o["ack_outcome"].as_str().is_some_and(|s| !s.is_empty())
        })
        .await?;
    assert_eq!(
        (late["ack_outcome"].as_str(), late["ack_reason"].as_str()),
        (Some("refused"), Some("Expired")),
        "{}",
        odoo::compact(&late)
    );
    let message = late["ack_message"].as_str().unwrap_or_default();
    assert!(message.contains("has no spec.deadline"), "{message}");
    assert_eq!(late["status"], "refused", "{}", odoo::compact(&late));
    assert!(late["deadline"] == false, "declared without a deadline");
    let late_name = late["name"].as_str().expect("name");
    assert!(
        ctx.api::<Operation>().get_opt(late_name).await?.is_none(),
        "nothing created for the refused Operation"
    );
    Ok(())
}

#[tokio::test]
async fn intent_declared_in_odoo_becomes_a_ready_release_and_an_explicit_deletion_removes_it() -> anyhow::Result<()> {
    let _t = timer("ready-and-deletion");
    let ctx = TestContext::new("odoo-ready").await?;
    let odoo = OdooProcess::start(&ctx).await?;
    let cluster = odoo
        .create_cluster(&ctx, &format!("edge-{}", ctx.namespace), "api-key")
        .await?;
    let agent = start_agent(&ctx, &odoo, &cluster.name, &cluster.key_file, "", &[]).await?;
    let channel = ["--status-channel-endpoint", agent.status_channel.as_str()];
    let _controller = start_controller(&ctx, &channel).await?;
    let ns = ctx.namespace.as_str();

    let app_id = odoo
        .declare_app(
            cluster.id,
            ns,
            "wiki",
            "demo-app",
            "0.1.0",
            &json!({"greeting": "from odoo"}),
        )
        .await?;
    let app = odoo
        .wait_record(&ctx, APP, app_id, "ready", RELEASE_TIMEOUT, |a| a["status"] == "ready")
        .await?;
    eprintln!("odoo e2e: the application as Odoo shows it: {}", odoo::compact(&app));
    assert_eq!(app["ack_outcome"], "applied");
    assert_eq!(app["deployed_chart_version"], "0.1.0");
    assert_eq!(app["report_state"], "ready");
    let conds = conditions(&app, "report_conditions");
    let ready = conds.iter().find(|c| c["type"] == "Ready").expect("Ready condition");
    assert_eq!(ready["status"], "True", "{ready}");
    assert_eq!(app["ready_reason"], ready["reason"]);
    assert!(
        parse_odoo_datetime(&app["ready_since"]).is_some(),
        "{}",
        odoo::compact(&app)
    );

    // On the cluster: the object the agent applied, its release.
    let ai = ctx.api::<ApplicationInstance>().get("wiki").await?;
    assert_eq!(
        ai.metadata.labels.clone().unwrap_or_default()["app.kubernetes.io/managed-by"],
        "vworkspace-agent"
    );
    assert_eq!(ai.spec.values, Some(json!({"greeting": "from odoo"})));
    assert_eq!(app["report_uid"].as_str(), ai.metadata.uid.as_deref());
    assert!(flux::helm_releases(&ctx).get_opt("wiki").await?.is_some());
    let helm_secrets = ListParams::default().labels("owner=helm,name=wiki");
    assert_eq!(ctx.api::<Secret>().list(&helm_secrets).await?.items.len(), 1);
    // The cluster record: bound to this cluster, online, in sync.
    let c = odoo.cluster(cluster.id).await?;
    assert_eq!(c["bound_uid"].as_str(), Some(kube_system_uid(&ctx).await?.as_str()));
    assert_eq!(c["agent_online"], true);
    assert_eq!(c["intent_acknowledged"], true, "{}", odoo::compact(&c));
    assert_eq!(c["allowed_namespaces"], ns);
    let reports = odoo.reports(cluster.id).await?;
    assert_never_leaked(
        &ctx,
        &cluster.key,
        &agent,
        &[("Odoo's reports", Value::from(reports).to_string())],
    )
    .await?;

    // *Delete on the cluster*: the application leaves the document and an explicit deletion
    // with the UID last reported goes in its place.
    odoo.call(APP, "action_delete_on_cluster", json!({"ids": [app_id]}))
        .await?;
    let deletion = odoo
        .search_read(
            DELETION,
            json!([["cluster_id", "=", cluster.id], ["name", "=", "wiki"]]),
            odoo::DELETION_FIELDS,
        )
        .await?;
    let deletion_id = deletion
        .first()
        .and_then(|d| d["id"].as_i64())
        .expect("a deletion record");
    assert_eq!(deletion[0]["uid"].as_str(), ai.metadata.uid.as_deref());
    let deleted = odoo
        .wait_record(&ctx, DELETION, deletion_id, "deleted", AGENT_TIMEOUT, |d| {
            d["status"] == "deleted"
        })
        .await?;
    assert_eq!(deleted["ack_outcome"], "deleted", "{}", odoo::compact(&deleted));
    e2e::eventually(
        &ctx,
        "ApplicationInstance, HelmRelease and Helm release Secret gone",
        RELEASE_TIMEOUT,
        || async {
            let app = ctx.api::<ApplicationInstance>().get_opt("wiki").await?;
            let hr = flux::helm_releases(&ctx).get_opt("wiki").await?;
            let secrets = ctx.api::<Secret>().list(&helm_secrets).await?.items.len();
            Ok(if app.is_none() && hr.is_none() && secrets == 0 {
                Ok(())
            } else {
                Err(format!(
                    "app {} hr {} helm secrets {secrets}",
                    app.is_some(),
                    hr.is_some()
                ))
            })
        },
    )
    .await?;
    odoo.wait(&ctx, "Odoo's report of wiki says deleted", AGENT_TIMEOUT, || async {
        Ok(
            match odoo.report(cluster.id, "ApplicationInstance", ns, "wiki").await? {
                Some(r) if r["state"] == "deleted" => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
    })
    .await?;
    let app = odoo.application(app_id).await?;
    assert_eq!(
        app["active"],
        false,
        "the application is archived: {}",
        odoo::compact(&app)
    );
    Ok(())
}

#[tokio::test]
async fn the_report_limit_lowered_in_odoo_is_followed() -> anyhow::Result<()> {
    let _t = timer("report-limit");
    let ctx = TestContext::new("odoo-limit").await?;
    let odoo = OdooProcess::start(&ctx).await?;
    let cluster = odoo
        .create_cluster(&ctx, &format!("edge-{}", ctx.namespace), "api-key")
        .await?;
    let agent = start_agent(&ctx, &odoo, &cluster.name, &cluster.key_file, "", &[]).await?;
    let ns = ctx.namespace.as_str();
    const APPS: usize = 5;
    for i in 1..=APPS {
        odoo.declare_app(cluster.id, ns, &format!("app-{i}"), "demo-app", "0.1.0", &json!({}))
            .await?;
    }
    odoo.wait(&ctx, "a report of each application in Odoo", AGENT_TIMEOUT, || async {
        let n = odoo.reports(cluster.id).await?.len();
        Ok(if n == APPS { Ok(()) } else { Err(format!("{n} reports")) })
    })
    .await?;

    // An Administrator lowers the limit to 2 reports per call and asks for a full resync.
    odoo.write(CLUSTER, cluster.id, json!({"max_reports_per_sync": 2}))
        .await?;
    let before = odoo.cluster(cluster.id).await?;
    let resyncs_logged = |logs: &str| logs.lines().filter(|l| l.contains("full resync complete")).count();
    let logged_before = resyncs_logged(&agent.process.logs());
    let asked = Instant::now();
    odoo.call(CLUSTER, "action_request_resync", json!({"ids": [cluster.id]}))
        .await?;
    let after = odoo
        .wait_record(
            &ctx,
            CLUSTER,
            cluster.id,
            "a full resync completed",
            AGENT_TIMEOUT,
            |c| {
                c["resyncs_completed"].as_i64() > before["resyncs_completed"].as_i64() && c["resync_requested"] == false
            },
        )
        .await?;
    eprintln!(
        "odoo e2e: resync asked and completed in {:.1} s",
        asked.elapsed().as_secs_f64()
    );
    assert_eq!(after["max_reports_per_sync"], 2);
    let logs = agent.process.logs();
    let line = logs
        .lines()
        .filter(|l| l.contains("full resync complete"))
        .nth(logged_before)
        .expect("the agent logged the resync");
    let batches: usize = line
        .split("batches=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("batches in {line:?}"));
    assert!(
        batches >= APPS.div_ceil(2),
        "{APPS} reports in batches of at most 2: {line}"
    );
    let syncs = after["syncs"].as_i64().unwrap_or_default() - before["syncs"].as_i64().unwrap_or_default();
    assert!(syncs >= 3, "{syncs} calls for {APPS} reports at 2 per call");
    // Odoo refuses a call over its limit (InvalidParams): none was made.
    assert!(
        !odoo.logs().contains("reports per call"),
        "Odoo refused a call over the limit:\n{}",
        odoo.log_tail(40)
    );
    assert!(
        !logs.contains("reports per call"),
        "the agent got a refusal over the limit"
    );
    assert_ne!(after["last_error_reason"], "InvalidParams", "{}", odoo::compact(&after));
    let received: Vec<Value> = odoo.reports(cluster.id).await?;
    assert_eq!(received.len(), APPS);
    Ok(())
}

#[tokio::test]
async fn two_clusters_on_one_odoo_never_receive_each_others_intent() -> anyhow::Result<()> {
    let _t = timer("two-clusters");
    let ctx = TestContext::new("odoo-two").await?;
    let peer = Peer::from_env()?;
    let ns = ctx.namespace.as_str();
    peer.ensure_namespace(ns).await?;
    peer.ensure_namespace("vworkspace-system").await?;
    let result = two_clusters(&ctx, &peer).await;
    let _ = peer.delete_namespace(ns).await;
    result
}

async fn two_clusters(ctx: &TestContext, peer: &Peer) -> anyhow::Result<()> {
    let ns = ctx.namespace.as_str();
    let odoo = OdooProcess::start(ctx).await?;
    let here = odoo
        .create_cluster(ctx, &format!("here-{}", ctx.namespace), "here-key")
        .await?;
    let there = odoo
        .create_cluster(ctx, &format!("peer-{}", ctx.namespace), "peer-key")
        .await?;
    let peer_port = free_loopback_addr()?.port();
    let _bridge = peer.bridge(ctx, odoo.port, peer_port).await?;
    let _agent = start_agent(ctx, &odoo, &here.name, &here.key_file, "", &[]).await?;
    let mut peer_agent = peer.start_agent(ctx, &odoo, peer_port, &there.name, &there.key_file, "")?;

    // Each cluster gets its own intent, in the same namespace name.
    let only_here = odoo
        .declare_app(here.id, ns, "only-here", "demo-app", "0.1.0", &json!({}))
        .await?;
    let only_peer = odoo
        .declare_app(there.id, ns, "only-peer", "demo-app", "0.1.0", &json!({}))
        .await?;
    for (id, what) in [
        (only_here, "this cluster applied its intent"),
        (only_peer, "the peer applied its intent"),
    ] {
        odoo.wait_record(ctx, APP, id, what, AGENT_TIMEOUT, |a| a["ack_outcome"] == "applied")
            .await?;
    }
    assert_eq!(
        app_names(ctx).await?,
        ["only-here"],
        "this cluster holds only its own intent"
    );
    assert_eq!(
        peer.app_names(ns).await?,
        ["only-peer"],
        "the peer holds only its own intent"
    );
    let (uid_here, uid_peer) = (kube_system_uid(ctx).await?, peer.cluster_uid().await?);
    assert_ne!(uid_here, uid_peer);
    let (h, t) = (odoo.cluster(here.id).await?, odoo.cluster(there.id).await?);
    assert_eq!(h["bound_uid"].as_str(), Some(uid_here.as_str()));
    assert_eq!(t["bound_uid"].as_str(), Some(uid_peer.as_str()));
    let names = |reports: Vec<Value>| -> Vec<String> {
        reports
            .iter()
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect()
    };
    odoo.wait(
        ctx,
        "each record holds the report of its own cluster",
        AGENT_TIMEOUT,
        || async {
            let (h, t) = (
                names(odoo.reports(here.id).await?),
                names(odoo.reports(there.id).await?),
            );
            Ok(if h == ["only-here"] && t == ["only-peer"] {
                Ok(())
            } else {
                Err(format!("here {h:?}, peer {t:?}"))
            })
        },
    )
    .await?;

    // This cluster's key, copied to the peer: refused there (ClusterMismatch: the record is
    // bound to this cluster), and nothing of its intent lands.
    peer_agent.kill().await?;
    let copied = work_dir(ctx)?.join("copied-api-key");
    std::fs::copy(&here.key_file, &copied)?;
    let _thief = peer.start_agent(ctx, &odoo, peer_port, &here.name, &copied, "-copied")?;
    let thief_status = format!("agent-status-copied-{}", ctx.namespace);
    e2e::eventually(
        ctx,
        "the copied key is refused with ClusterMismatch",
        AGENT_TIMEOUT,
        || async {
            let status = peer.agent_status(&thief_status).await?;
            let text = status.as_ref().map(Value::to_string).unwrap_or_default();
            Ok(if text.contains("ClusterMismatch") {
                Ok(())
            } else {
                Err(text)
            })
        },
    )
    .await?;
    let after_copy = odoo
        .declare_app(here.id, ns, "after-copy", "demo-app", "0.1.0", &json!({}))
        .await?;
    odoo.wait_record(
        ctx,
        APP,
        after_copy,
        "this cluster applied the new intent",
        AGENT_TIMEOUT,
        |a| a["ack_outcome"] == "applied",
    )
    .await?;
    // A few of the thief's sync attempts: still nothing of this cluster's intent on the peer.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        peer.app_names(ns).await?,
        ["only-peer"],
        "nothing of this cluster's intent was applied on the peer with the copied key"
    );
    assert_eq!(app_names(ctx).await?, ["after-copy", "only-here"]);
    let h = odoo.cluster(here.id).await?;
    assert_eq!(
        h["bound_uid"].as_str(),
        Some(uid_here.as_str()),
        "the record stays bound to this cluster: {}",
        odoo::compact(&h)
    );
    Ok(())
}
