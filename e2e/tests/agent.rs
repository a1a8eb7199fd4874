//! The connectivity agent end to end, against the control-plane simulator (`odoo-sim`,
//! a simulator of the Odoo module, not Odoo): intent becomes CRs, Flux installs, status
//! and acknowledgements come back with timestamps; the namespace allow-list refuses and
//! reports; empty, partial and malformed documents delete nothing, explicit deletions
//! do; the simulator goes away and comes back without losing status; a wrong API key is
//! reported clearly; and the key never shows up in logs, events, metrics or reports.
//!
//! The agent runs as its ServiceAccount with the deploy bundle's RBAC (least privilege),
//! like the other controllers of the e2e suite.

use api::{ApplicationInstance, Operation, OperationPhase};
use e2e::{
    TestContext,
    agent::{
        AGENT_TIMEOUT, SimProcess, api_key, assert_never_leaked, object_ack, report, runbook_spec, start_agent,
        status_configmap, summary, wait_sim, work_dir,
    },
    apps::{RELEASE_TIMEOUT, app, start_controller},
    deploy::{self, http_get, metric_sum},
    ops::{create_operation, operation, start_engine, wait_phase},
};
use k8s_openapi::api::core::v1::Event;
use kube::{Api, api::ListParams};
use serde_json::{Value, json};

fn app_spec(values: Value) -> Value {
    serde_json::to_value(app("x", "demo-app", "0.1.0", values).spec).expect("spec")
}

fn time_of(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str()?.parse().ok()
}

#[tokio::test]
async fn intent_becomes_a_ready_release_and_an_operation_result_with_timestamps() -> anyhow::Result<()> {
    let ctx = TestContext::new("agent-ready").await?;
    let sim = SimProcess::start(&ctx).await?;
    let agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    // The controllers publish their status changes to the agent's gRPC status channel.
    let channel = ["--status-channel-endpoint", agent.status_channel.as_str()];
    let _controller = start_controller(&ctx, &channel).await?;
    let _engine = start_engine(&ctx, "runbook-engine", &channel).await?;
    let ns = ctx.namespace.as_str();

    let rev = sim
        .set_app(ns, "wiki", app_spec(json!({"greeting": "from odoo"})))
        .await?;
    let ready = wait_sim(&ctx, &sim, "wiki reported ready", RELEASE_TIMEOUT, |v| {
        (summary(v, ns, "wiki")?["status"] == "ready").then(|| v.clone())
    })
    .await?;
    let ack = object_ack(&ready, rev, ns, "wiki").expect("ack of the revision");
    assert_eq!(ack["outcome"], "applied");
    let r = report(&ready, "ApplicationInstance", ns, "wiki").expect("report");
    assert_eq!(r["state"], "ready");
    assert_eq!(r["generation"], r["observed_generation"]);
    assert_eq!(r["deployed_chart_version"], "0.1.0");
    assert_eq!(r["managed_by_agent"], true);
    let ready_cond = r["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .expect("Ready condition");
    assert_eq!(ready_cond["status"], "True");
    let since = time_of(&ready_cond["last_transition_time"]).expect("lastTransitionTime");
    let observed = time_of(&r["observed_at"]).expect("observed_at");
    assert!(since <= observed, "{since} <= {observed}");
    assert!(time_of(&ready["last_seen"]).is_some() && ready["agent_online"] == true);
    assert_eq!(ready["intent_acknowledged"], true);

    // The object was applied by the agent, under its own field manager, labelled as its own.
    let ai = ctx.api::<ApplicationInstance>().get("wiki").await?;
    assert_eq!(
        ai.metadata.labels.clone().unwrap_or_default()["app.kubernetes.io/managed-by"],
        "vworkspace-agent"
    );
    let managers: Vec<String> = ai
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.iter().any(|m| m == "vworkspace-agent"), "{managers:?}");

    // A day-2 Operation intent runs and its result comes back.
    let op_rev = sim
        .set_op(ns, "reindex", runbook_spec("wiki", "odoo-op-1", "echo reindexed"))
        .await?;
    let done = wait_sim(&ctx, &sim, "operation reindex succeeded", AGENT_TIMEOUT * 2, |v| {
        (summary(v, ns, "reindex")?["status"] == "succeeded").then(|| v.clone())
    })
    .await?;
    assert_eq!(
        object_ack(&done, op_rev, ns, "reindex").expect("ack")["outcome"],
        "applied"
    );
    let r = report(&done, "Operation", ns, "reindex").expect("report");
    assert_eq!(
        (r["phase"].as_str(), r["request_id"].as_str()),
        (Some("Succeeded"), Some("odoo-op-1"))
    );
    let (start, end) = (time_of(&r["start_time"]), time_of(&r["completion_time"]));
    assert!(start.is_some() && end.is_some() && start <= end, "{r}");

    // At rest: the agent's condition, metrics and ConfigMap say it is in sync.
    let metrics = http_get(&agent.admin_addr, "/metrics").await?;
    assert_eq!(
        metric_sum(&metrics, "vworkspace_agent_control_plane_connected", &[]),
        1.0
    );
    assert!(metric_sum(&metrics, "vworkspace_agent_objects_total", &["outcome=\"applied\""]) >= 2.0);
    // Both controllers connected (a resync each) and published status changes on the channel.
    assert!(
        metric_sum(
            &metrics,
            "vworkspace_agent_status_channel_events_total",
            &["kind=\"resync\""]
        ) >= 2.0,
        "resync events"
    );
    assert!(
        metric_sum(
            &metrics,
            "vworkspace_agent_status_channel_events_total",
            &["kind=\"object\""]
        ) >= 2.0,
        "object events"
    );
    http_get(&agent.admin_addr, "/readyz").await?;
    let cm = status_configmap(&agent.status_configmap)
        .await?
        .expect("status ConfigMap");
    assert_eq!(cm["condition"]["reason"], "Synced");

    let view = sim.view().await?;
    assert_never_leaked(
        &ctx,
        &sim.key,
        &agent,
        &[("reports and acknowledgements", view.to_string())],
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn allow_list_refusals_wrong_documents_and_explicit_deletion() -> anyhow::Result<()> {
    let ctx = TestContext::new("agent-intent").await?;
    let sim = SimProcess::start(&ctx).await?;
    let _agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let ns = ctx.namespace.as_str();
    let apps = ctx.api::<ApplicationInstance>();

    // One allowed application, one in a namespace the cluster owner did not allow, one
    // whose target namespace is outside the allow-list.
    sim.set_app(ns, "kept", app_spec(json!({}))).await?;
    sim.set_app("kube-system", "intruder", app_spec(json!({}))).await?;
    let mut escape = app_spec(json!({}));
    escape["targetNamespace"] = json!("kube-system");
    let rev = sim.set_app(ns, "escape", escape).await?;
    let view = wait_sim(&ctx, &sim, "revision acknowledged", AGENT_TIMEOUT, |v| {
        object_ack(v, rev, ns, "escape").map(|_| v.clone())
    })
    .await?;
    // `applied`, or `unchanged` when the agent already pulled an earlier revision that held
    // only `kept` (the simulator's revisions are not atomic with the agent's polls).
    let kept = object_ack(&view, rev, ns, "kept").expect("kept");
    assert!(
        matches!(kept["outcome"].as_str(), Some("applied" | "unchanged")),
        "{kept}"
    );
    apps.get("kept").await?;
    for (namespace, name) in [("kube-system", "intruder"), (ns, "escape")] {
        let a = object_ack(&view, rev, namespace, name).expect("ack");
        assert_eq!(
            (a["outcome"].as_str(), a["reason"].as_str()),
            (Some("refused"), Some("NamespaceNotAllowed")),
            "{a}"
        );
        assert!(a["message"].as_str().unwrap_or_default().contains("allow-list"), "{a}");
        assert_eq!(summary(&view, namespace, name).expect("summary")["status"], "refused");
    }
    assert!(apps.get_opt("kept").await?.is_some());
    assert!(apps.get_opt("escape").await?.is_none());
    let intruder = Api::<ApplicationInstance>::namespaced(ctx.client.clone(), "kube-system");
    assert!(intruder.get_opt("intruder").await?.is_none());

    // A buggy control plane: an empty document, then one that does not parse, then an
    // invalid one. Nothing is deleted, nothing is applied.
    let rev = sim.reset_intent().await?;
    let view = wait_sim(&ctx, &sim, "empty document acknowledged", AGENT_TIMEOUT, |v| {
        e2e::agent::ack_of(v, rev).cloned()
    })
    .await?;
    assert_eq!(view["outcome"], "applied");
    assert_eq!(view["objects"], json!([]));
    let rev = sim
        .set_document(json!({"applications": "all of them", "deletions": 42}))
        .await?;
    let ack = wait_sim(&ctx, &sim, "malformed document refused", AGENT_TIMEOUT, |v| {
        e2e::agent::ack_of(v, rev).cloned()
    })
    .await?;
    assert_eq!(
        (ack["outcome"].as_str(), ack["reason"].as_str()),
        (Some("refused"), Some("MalformedDocument"))
    );
    let dup = json!({"namespace": ns, "name": "dup", "spec": app_spec(json!({}))});
    let rev = sim.set_document(json!({"applications": [dup.clone(), dup]})).await?;
    let ack = wait_sim(&ctx, &sim, "invalid document refused", AGENT_TIMEOUT, |v| {
        e2e::agent::ack_of(v, rev).cloned()
    })
    .await?;
    assert_eq!(
        (ack["outcome"].as_str(), ack["reason"].as_str()),
        (Some("refused"), Some("InvalidDocument"))
    );
    assert!(
        ack["message"].as_str().unwrap_or_default().contains("more than once"),
        "{ack}"
    );
    assert!(
        apps.get_opt("kept").await?.is_some(),
        "no document without a deletion entry deletes"
    );
    assert!(
        apps.get_opt("dup").await?.is_none(),
        "nothing of an invalid document is applied"
    );

    // An explicit deletion does delete (with the uid the agent reported).
    sim.set_document(Value::Null).await?;
    let rev = sim.delete_app(ns, "kept").await?;
    let ack = wait_sim(&ctx, &sim, "deletion acknowledged", AGENT_TIMEOUT, |v| {
        object_ack(v, rev, ns, "kept").cloned()
    })
    .await?;
    assert_eq!(ack["outcome"], "deleted", "{ack}");
    e2e::eventually(&ctx, "kept deleted", AGENT_TIMEOUT, || {
        let apps = apps.clone();
        async move {
            Ok(match apps.get_opt("kept").await? {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            })
        }
    })
    .await?;
    wait_sim(&ctx, &sim, "kept reported deleted", AGENT_TIMEOUT, |v| {
        (report(v, "ApplicationInstance", ns, "kept")?["state"] == "deleted").then_some(())
    })
    .await?;
    assert!(
        events_with_reason(&ctx, "DeletedByIntent").await? >= 1,
        "the deletion is on record in an Event"
    );
    Ok(())
}

#[tokio::test]
async fn simulator_outage_loses_no_status_and_a_wrong_key_is_reported() -> anyhow::Result<()> {
    let ctx = TestContext::new("agent-outage").await?;
    let _engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    let mut sim = SimProcess::start(&ctx).await?;
    let agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let ns = ctx.namespace.as_str();

    // The application first, on its own document: the Operation's document then leaves it
    // `unchanged` whichever sync picks it up, so the last acknowledgement is known.
    sim.set_app(ns, "wiki", app_spec(json!({}))).await?;
    wait_sim(&ctx, &sim, "wiki applied", AGENT_TIMEOUT, |v| {
        (summary(v, ns, "wiki")?["ack"]["outcome"] == "applied").then_some(())
    })
    .await?;
    sim.set_op(ns, "first", runbook_spec("wiki", "odoo-op-first", "true"))
        .await?;
    wait_sim(&ctx, &sim, "first succeeded", AGENT_TIMEOUT * 2, |v| {
        (summary(v, ns, "first")?["status"] == "succeeded").then_some(())
    })
    .await?;
    let resyncs_before = sim.view().await?["resync"]["completed"].as_u64().unwrap_or_default();

    // The control plane goes away. Meanwhile the cluster moves on: an Operation created by
    // hand runs to completion, and the Operation "first" is deleted by hand.
    sim.stop().await?;
    let stopped = tokio::time::Instant::now();
    create_operation(
        &ctx,
        &operation(
            "during-outage",
            "wiki",
            "Runbook",
            runbook_spec("wiki", "x", "true")["runbook"].clone(),
        ),
    )
    .await?;
    wait_phase(&ctx, "during-outage", OperationPhase::Succeeded, "Completed").await?;
    ctx.api::<Operation>().delete("first", &Default::default()).await?;
    // The agent notices: failures, not ready, the condition in metrics and its ConfigMap.
    e2e::eventually(
        &ctx,
        "agent not ready while the control plane is away",
        AGENT_TIMEOUT,
        || async {
            let metrics = http_get(&agent.admin_addr, "/metrics").await?;
            let failures = metrics_value(&metrics, "vworkspace_agent_consecutive_failures");
            let ready = http_get(&agent.admin_addr, "/readyz").await.is_ok();
            Ok(if failures >= 3.0 && !ready {
                Ok(())
            } else {
                Err(format!("failures {failures}, ready {ready}"))
            })
        },
    )
    .await?;
    let cm = status_configmap(&agent.status_configmap)
        .await?
        .expect("status ConfigMap");
    assert_eq!(cm["condition"]["status"], "False", "{cm}");
    assert_eq!(cm["condition"]["reason"], "ConnectionFailed", "{cm}");

    // Down for at least 10 s, then back with its state file: a full resync brings
    // everything up to date.
    tokio::time::sleep(std::time::Duration::from_secs(10).saturating_sub(stopped.elapsed())).await;
    sim.restart().await?;
    let view = wait_sim(&ctx, &sim, "resync after the outage", AGENT_TIMEOUT, |v| {
        let resynced = v["resync"]["completed"].as_u64().unwrap_or_default() > resyncs_before;
        let during = report(v, "Operation", ns, "during-outage")?;
        let first = report(v, "Operation", ns, "first")?;
        (resynced && during["state"] == "succeeded" && first["state"] == "deleted").then(|| v.clone())
    })
    .await?;
    let err = &view["last_agent_error"];
    assert_eq!(err["reason"], "ConnectionFailed", "the outage is on record: {err}");
    assert!(err["attempts"].as_u64().unwrap_or_default() >= 3, "{err}");
    assert_eq!(
        report(&view, "Operation", ns, "during-outage").expect("r")["managed_by_agent"],
        false
    );
    // Nothing was lost or applied again: the last document is still acknowledged, and
    // left the application as it was.
    let wiki_ack = &summary(&view, ns, "wiki").expect("wiki")["ack"];
    assert_eq!(wiki_ack["outcome"], "unchanged", "{wiki_ack}");
    assert!(wiki_ack["reason"].is_null(), "{wiki_ack}");
    assert_eq!(view["agent_online"], true);
    e2e::eventually(&ctx, "agent ready again", AGENT_TIMEOUT, || async {
        Ok(match http_get(&agent.admin_addr, "/readyz").await {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        })
    })
    .await?;

    // A second agent with a wrong key: refused by the control plane, and it says so.
    let wrong = api_key("wrong");
    let wrong_file = work_dir(&ctx)?.join("wrong-key");
    std::fs::write(&wrong_file, &wrong)?;
    let mut bad = start_agent(&ctx, &sim, &wrong_file, "-bad", &[]).await?;
    e2e::eventually(&ctx, "wrong key reported", AGENT_TIMEOUT, || async {
        let logs = bad.process.logs();
        let readyz = deploy::http_get(&bad.admin_addr, "/readyz").await;
        Ok(
            if logs.contains("Unauthorized") && logs.contains("Invalid apikey") && readyz.is_err() {
                Ok(())
            } else {
                Err(format!("readyz {readyz:?}"))
            },
        )
    })
    .await?;
    let (status, body) = e2e::agent::http(&format!("http://{}", bad.admin_addr), "GET", "/readyz", None).await?;
    assert_eq!(status, 503);
    assert!(body.contains("ControlPlaneConnected: Unauthorized"), "{body}");
    assert!(body.contains("HTTP 401"), "{body}");
    let metrics = http_get(&bad.admin_addr, "/metrics").await?;
    assert_eq!(
        metric_sum(&metrics, "vworkspace_agent_condition", &["reason=\"Unauthorized\""]),
        1.0
    );
    // The status ConfigMap is written by its own task, a moment after /readyz turns: poll it.
    e2e::eventually(&ctx, "status ConfigMap says Unauthorized", AGENT_TIMEOUT, || async {
        Ok(match status_configmap(&bad.status_configmap).await? {
            Some(cm) if cm["condition"]["reason"] == "Unauthorized" => Ok(()),
            other => Err(format!("status ConfigMap {other:?}")),
        })
    })
    .await?;
    assert!(bad.process.is_running(), "a wrong key is no crash loop");
    let view = sim.view().await?;
    for (key, who) in [(&wrong, &bad), (&wrong, &agent), (&sim.key, &bad), (&sim.key, &agent)] {
        assert_never_leaked(&ctx, key, who, &[("reports and acknowledgements", view.to_string())]).await?;
    }
    Ok(())
}

async fn events_with_reason(ctx: &TestContext, reason: &str) -> anyhow::Result<usize> {
    let events: Vec<Event> = ctx.api::<Event>().list(&ListParams::default()).await?.items;
    Ok(events.iter().filter(|e| e.reason.as_deref() == Some(reason)).count())
}

fn metrics_value(text: &str, name: &str) -> f64 {
    metric_sum(text, name, &[])
}

#[tokio::test]
async fn an_upgrade_is_never_reverted_by_stale_intent_and_the_conflict_is_reported() -> anyhow::Result<()> {
    let ctx = TestContext::new("agent-adr4").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _engine = start_engine(&ctx, "upgrade-engine", &[]).await?;
    let sim = SimProcess::start(&ctx).await?;
    let _agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    let ns = ctx.namespace.as_str();
    let apps = ctx.api::<ApplicationInstance>();

    sim.set_app(ns, "shop", app_spec(json!({"greeting": "hello"}))).await?;
    wait_sim(&ctx, &sim, "shop ready", RELEASE_TIMEOUT, |v| {
        (summary(v, ns, "shop")?["status"] == "ready").then_some(())
    })
    .await?;

    // Odoo asks for an Upgrade: the upgrade engine takes chart.version and values over.
    let upgrade = json!({"type": "Upgrade", "applicationRef": {"name": "shop"}, "requestId": "odoo-up-1",
        "upgrade": {"chartVersion": "0.2.0", "valuesPatch": {"greeting": "hi"}}});
    sim.set_op(ns, "up", upgrade).await?;
    wait_sim(&ctx, &sim, "upgrade succeeded", RELEASE_TIMEOUT, |v| {
        (summary(v, ns, "up")?["status"] == "succeeded").then_some(())
    })
    .await?;

    // Odoo's intent is stale (still 0.1.0) but changes something else: the agent applies
    // that change, leaves the Operation's version alone, and reports the conflict.
    let mut stale = app_spec(json!({"greeting": "hello"}));
    stale["timeout"] = json!("2m");
    let rev = sim.set_app(ns, "shop", stale).await?;
    let ack = wait_sim(&ctx, &sim, "conflict acknowledged", AGENT_TIMEOUT, |v| {
        object_ack(v, rev, ns, "shop").cloned()
    })
    .await?;
    assert_eq!(
        (ack["outcome"].as_str(), ack["reason"].as_str()),
        (Some("conflict"), Some("OwnedByOperation")),
        "{ack}"
    );
    let c = &ack["conflict"];
    assert_eq!(c["chart_version_in_force"], "0.2.0", "{c}");
    assert_eq!(c["values_in_force"], json!({"greeting": "hi"}), "{c}");
    assert_eq!(c["managers"], json!(["vworkspace-upgrade-engine"]), "{c}");
    assert_eq!(
        (c["revision_in_effect"].as_i64(), c["operation"].as_str()),
        (Some(2), Some("up")),
        "{c}"
    );
    let fields: Vec<&str> = c["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(fields.contains(&"spec.chart.version"), "{fields:?}");
    let shop = apps.get("shop").await?;
    assert_eq!(
        shop.spec.chart.version.as_deref(),
        Some("0.2.0"),
        "the upgrade was not reverted"
    );
    assert_eq!(shop.spec.values, Some(json!({"greeting": "hi"})));
    assert!(
        events_with_reason(&ctx, "IntentConflict").await? >= 1,
        "an Event on the application"
    );
    assert_eq!(
        shop.spec.timeout.as_deref(),
        Some("2m"),
        "the rest of the intent was applied"
    );

    // Odoo adopts what is in force: no conflict any more.
    let mut adopted = serde_json::to_value(app("x", "demo-app", "0.2.0", json!({"greeting": "hi"})).spec)?;
    adopted["timeout"] = json!("2m");
    let rev = sim.set_app(ns, "shop", adopted).await?;
    let ack = wait_sim(&ctx, &sim, "adopted intent acknowledged", AGENT_TIMEOUT, |v| {
        object_ack(v, rev, ns, "shop").cloned()
    })
    .await?;
    assert!(
        ["applied", "unchanged"].contains(&ack["outcome"].as_str().unwrap_or_default()),
        "{ack}"
    );
    assert_eq!(apps.get("shop").await?.spec.chart.version.as_deref(), Some("0.2.0"));
    Ok(())
}
