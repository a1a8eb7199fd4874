//! The agent never takes over what it did not create. A person with kubectl creates an
//! ApplicationInstance and an Operation; Odoo then sends intent naming both (and later a
//! deletion): the agent refuses each with `NotManagedByAgent`, and the objects stay as
//! they were, without the agent's label, so no later intent can delete them either.
//! A control-plane URL carrying a password stops the agent at start without showing it.

use std::time::Duration;

use api::{ApplicationInstance, LABEL_MANAGED_BY, Operation};
use e2e::{
    TestContext,
    agent::{SimProcess, object_ack, start_agent, wait_sim, work_dir},
    apps::{app, apply_app},
    ops::{create_operation, operation},
    process::ControllerProcess,
};
use serde_json::{Value, json};

const ACK_TIMEOUT: Duration = Duration::from_secs(60);

/// (outcome, reason) of the acknowledgement of `name` in `revision`, once there is one.
fn outcome(view: &Value, revision: u64, ns: &str, name: &str) -> Option<(String, String)> {
    let a = object_ack(view, revision, ns, name)?;
    Some((
        a["outcome"].as_str().unwrap_or_default().to_owned(),
        a["reason"].as_str().unwrap_or_default().to_owned(),
    ))
}

fn refused() -> (String, String) {
    ("refused".to_owned(), "NotManagedByAgent".to_owned())
}

#[tokio::test]
async fn the_agent_refuses_to_take_over_objects_created_by_kubectl() -> anyhow::Result<()> {
    let ctx = TestContext::new("tenant-takeover").await?;
    let ns = ctx.namespace.as_str();
    // Created by hand (the test's admin client, as `kubectl apply` would).
    let by_hand = apply_app(
        &ctx,
        &app("handmade", "demo-app", "0.1.0", json!({"owner": "a person"})),
    )
    .await?;
    let op_by_hand = create_operation(&ctx, &operation("by-hand", "handmade", "Backup", Value::Null)).await?;

    let sim = SimProcess::start(&ctx).await?;
    let _agent = start_agent(&ctx, &sim, &sim.key_file, "", &[]).await?;
    // Another spec for the app; exactly the live spec for the Operation (which the agent
    // would otherwise report `unchanged`, i.e. claim as its own).
    let other = serde_json::to_value(app("x", "demo-app", "0.1.0", json!({"owner": "odoo"})).spec)?;
    sim.set_app(ns, "handmade", other).await?;
    let rev = sim
        .set_op(ns, "by-hand", serde_json::to_value(&op_by_hand.spec)?)
        .await?;
    let view = wait_sim(&ctx, &sim, "both refused", ACK_TIMEOUT, |v| {
        (outcome(v, rev, ns, "handmade").is_some() && outcome(v, rev, ns, "by-hand").is_some()).then(|| v.clone())
    })
    .await?;
    assert_eq!(outcome(&view, rev, ns, "handmade"), Some(refused()), "the app");
    assert_eq!(outcome(&view, rev, ns, "by-hand"), Some(refused()), "the Operation");

    let apps = ctx.api::<ApplicationInstance>();
    let live = apps.get("handmade").await?;
    assert_eq!(live.spec, by_hand.spec, "the spec is the person's");
    assert!(
        !live.metadata.labels.unwrap_or_default().contains_key(LABEL_MANAGED_BY),
        "not labelled as the agent's"
    );
    let live_op = ctx.api::<Operation>().get("by-hand").await?;
    assert_eq!(live_op.metadata.uid, op_by_hand.metadata.uid);
    assert!(
        !live_op
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(LABEL_MANAGED_BY)
    );

    // Nor can a deletion intent remove it.
    let rev = sim.delete_app(ns, "handmade").await?;
    let view = wait_sim(&ctx, &sim, "the deletion refused", ACK_TIMEOUT, |v| {
        outcome(v, rev, ns, "handmade").map(|_| v.clone())
    })
    .await?;
    assert_eq!(outcome(&view, rev, ns, "handmade"), Some(refused()));
    assert_eq!(apps.get("handmade").await?.metadata.uid, by_hand.metadata.uid);
    Ok(())
}

#[tokio::test]
async fn a_control_plane_url_with_a_password_stops_the_agent_without_showing_it() -> anyhow::Result<()> {
    let ctx = TestContext::new("tenant-url").await?;
    let password = "s3cret-in-the-url-0f9e";
    let key = work_dir(&ctx)?.join("api-key");
    std::fs::write(&key, "vwsk-unused-key-0123456789abcdef")?;
    let url = format!("https://bot:{password}@odoo.example.com");
    let key_arg = key.to_string_lossy().into_owned();
    let mut agent = ControllerProcess::start(
        ctx.process_scope(),
        "agent",
        &format!("agent-{}-url", ctx.namespace),
        &[
            "--control-plane-url",
            &url,
            "--api-key-file",
            &key_arg,
            "--cluster-name",
            "url-test",
            "--watch-namespace",
            &ctx.namespace,
            "--allowed-namespaces",
            &ctx.namespace,
            "--admin-addr",
            "127.0.0.1:0",
            "--status-channel-addr",
            "off",
        ],
        &[("RUST_LOG", "debug"), ("POD_NAMESPACE", e2e::deploy::SYSTEM_NAMESPACE)],
    )
    .await?;
    agent.expect_exit();
    e2e::eventually(&ctx, "the agent exits", Duration::from_secs(30), || {
        let running = agent.is_running();
        async move {
            Ok(if running {
                Err("still running".to_owned())
            } else {
                Ok(())
            })
        }
    })
    .await?;
    assert!(!agent.exit_status().is_some_and(|s| s.success()), "a failed start");
    let logs = agent.logs();
    assert!(logs.contains("must not carry credentials"), "{logs}");
    assert!(logs.contains("https://***@odoo.example.com"), "{logs}");
    assert!(!logs.contains(password), "the password is never shown: {logs}");
    Ok(())
}
