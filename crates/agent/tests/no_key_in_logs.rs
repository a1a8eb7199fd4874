//! The API key never reaches the logs (at TRACE level, HTTP and TLS libraries included),
//! the metrics or what the agent reports, whether the key is right or wrong. The sync loop
//! runs for real against the control-plane simulator, with an in-memory cluster.
//! (The e2e suite repeats the check on the real cluster, with Events and the ConfigMap.)

mod common;

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use controller_kit::{CancellationToken, Metrics};
use odoo_sim::Sim;
use serde_json::json;

const GOOD: &str = "k3y-g00d-5ec7e7-0123456789abcdef0123456789";
const BAD: &str = "k3y-b4d-5ec7e7-fedcba9876543210fedcba9876";

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn run_agent(url: &str, key: &str, metrics: &Metrics, run_for: Duration) {
    let dir = std::env::temp_dir().join(format!("agent-key-test-{}-{}", std::process::id(), &key[..5]));
    std::fs::write(&dir, key).unwrap();
    let sync = common::pull_loop(url, &dir, common::listed_status(vec![]), metrics, 10);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sync.run(shutdown.clone()));
    tokio::time::sleep(run_for).await;
    shutdown.cancel();
    task.await.unwrap();
    let _ = std::fs::remove_file(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_never_logged_measured_or_reported() {
    let logs = Buffer::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let sim = Sim::new(common::sim_config()).unwrap();
    sim.add_cluster("edge-1", GOOD).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = odoo_sim::router(sim.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    sim.edit("edge-1", |r, rev| {
        r.applications.insert(
            "team-a/wiki".into(),
            (
                rev,
                serde_json::from_value(json!({"namespace": "team-a", "name": "wiki", "spec":
                    {"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}}}}))
                .unwrap(),
            ),
        );
    })
    .unwrap();

    let metrics = Metrics::new("vworkspace");
    run_agent(&url, GOOD, &metrics, Duration::from_millis(1500)).await;
    let bad_metrics = Metrics::new("vworkspace");
    run_agent(&url, BAD, &bad_metrics, Duration::from_millis(800)).await;

    let view = sim.view("edge-1").unwrap();
    assert_eq!(
        view["objects"][0]["ack"]["outcome"], "applied",
        "the good agent worked: {view}"
    );
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("TRACE") || logs.contains("DEBUG"),
        "verbose logs were captured"
    );
    assert!(logs.contains("Invalid apikey"), "the bad key was reported");
    for (what, text) in [
        ("logs", logs.as_str()),
        ("metrics", &metrics.encode().unwrap()),
        ("metrics of the bad agent", &bad_metrics.encode().unwrap()),
        ("reports and acknowledgements", &view.to_string()),
    ] {
        for key in [GOOD, BAD] {
            assert!(!text.contains(key), "a key leaked into the {what}");
            assert!(!text.contains(&key[8..24]), "part of a key leaked into the {what}");
        }
    }
}
