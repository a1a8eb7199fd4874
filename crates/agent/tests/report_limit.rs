//! Issue 18: the agent honours Odoo's `max_reports_per_sync`, and learns a lowered limit
//! without waiting for a 401. The sync loop runs for real against the control-plane
//! simulator (which refuses a call carrying more reports than its limit with 422, as
//! protocol.md tells a module to), with an in-memory cluster.

mod common;

use std::time::Duration;

use api::ApplicationInstance;
use controller_kit::{CancellationToken, Metrics};
use odoo_sim::Sim;
use serde_json::json;

const KEY: &str = "k3y-l1m1t-5ec7e7-0123456789abcdef012345678";

fn application(name: &str, greeting: &str) -> ApplicationInstance {
    let mut app: ApplicationInstance = serde_json::from_value(json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"),
            "resourceVersion": "1", "generation": 1},
        "spec": {"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}},
            "values": {"greeting": greeting}},
    }))
    .unwrap();
    app.metadata.resource_version = Some(format!("{greeting}-{name}"));
    app
}

fn reports(greeting: &str, count: usize) -> Vec<protocol::messages::ObjectReport> {
    (0..count)
        .map(|i| {
            protocol::report::application_report(&application(&format!("app-{i}"), greeting), jiff::Timestamp::now())
        })
        .collect()
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_sends_no_more_reports_than_odoo_accepts_and_follows_a_lowered_limit() {
    let sim = Sim::new(common::sim_config()).unwrap();
    sim.add_cluster("edge-1", KEY).unwrap();
    sim.set_max_reports_per_sync(2);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, odoo_sim::router(sim.clone())).into_future());

    let key_file = std::env::temp_dir().join(format!("agent-limit-test-{}", std::process::id()));
    std::fs::write(&key_file, KEY).unwrap();
    let status = common::listed_status(reports("one", 7));
    let metrics = Metrics::new("vworkspace");
    let sync = common::pull_loop(&url, &key_file, status.clone(), &metrics, 200);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));

    // The limit announced at registration holds from the first call (the full resync).
    let received = |greeting: &str| {
        sim.report_log("edge-1", 0)
            .unwrap()
            .iter()
            .filter(|r| r.resource_version.as_deref().is_some_and(|v| v.starts_with(greeting)))
            .count()
    };
    wait_for("the 7 reports of the resync", || received("one-") >= 7).await;
    assert_eq!(sim.stats().sync.errors, 0, "no call was refused");

    // Odoo's administrator lowers the limit to 1; the next answer announces it, so the
    // next changes go one per call, still without a refused call.
    sim.set_max_reports_per_sync(1);
    wait_for("a sync answer after the change", || sim.stats().sync.calls >= 6).await;
    let calls_before = sim.stats().sync.calls;
    status.with(|c| {
        for r in reports("two", 5) {
            c.upsert(r);
        }
    });
    wait_for("the 5 changes", || received("two-") >= 5).await;
    let stats = sim.stats();
    assert_eq!(stats.sync.errors, 0, "no call was refused: {stats:?}");
    assert!(
        stats.sync.calls - calls_before >= 5,
        "one report per call: {} calls",
        stats.sync.calls - calls_before
    );

    // A limit lowered behind the agent's back (no answer announced it yet): the first call
    // is refused, the agent registers again (which answers the limit in force), and the
    // rest goes within it. The refusal is required: a sync answered between lowering the
    // limit and the changes would announce it first, so the round is tried again (a few
    // times at most) until a call was refused.
    let mut refused_rounds = 0;
    for round in 0..5 {
        sim.set_max_reports_per_sync(2);
        let calls = sim.stats().sync.calls;
        wait_for("the limit of 2 announced", || sim.stats().sync.calls >= calls + 2).await;
        let (registrations, errors) = (sim.stats().register.calls, sim.stats().sync.errors);
        let prefix = format!("three{round}");
        sim.set_max_reports_per_sync(1);
        status.with(|c| {
            for r in reports(&prefix, 4) {
                c.upsert(r);
            }
        });
        wait_for("the 4 changes", || received(&format!("{prefix}-")) >= 4).await;
        let stats = sim.stats();
        let refusals = stats.sync.errors - errors;
        assert!(
            refusals <= 1,
            "at most the one call sent before the agent knew: {stats:?}"
        );
        if refusals == 1 {
            assert!(stats.register.calls > registrations, "it registered again: {stats:?}");
            refused_rounds += 1;
            break;
        }
    }
    assert_eq!(refused_rounds, 1, "no call was ever refused, so the 422 path never ran");
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(key_file);
}
