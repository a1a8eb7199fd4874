//! The API key never reaches the logs (at TRACE level, HTTP and TLS libraries included),
//! the metrics or what the agent reports, whether the key is right or wrong. The sync loop
//! runs for real against the control-plane simulator, with an in-memory cluster.
//! (The e2e suite repeats the check on the real cluster, with Events and the ConfigMap.)

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent::{
    apply::{Cluster, ClusterError},
    client::{ClientConfig, ControlPlaneClient},
    credentials::CredentialSource,
    health::{AgentMetrics, Health},
    status::SharedStatus,
    sync::{SyncLoop, SyncSettings},
};
use api::{ApplicationInstance, Operation};
use controller_kit::{CancellationToken, LeaderGate, Metrics, NamespacePolicy, Readiness, WatchScope};
use odoo_sim::{Sim, SimConfig};
use operations::revisions::AppRevision;
use protocol::{
    backoff::Backoff,
    messages::{AgentInfo, AgentMode, ClusterIdentity, ObjectKind},
};
use serde_json::{Value, json};

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

/// A cluster that accepts everything.
struct Accepting;

impl Cluster for Accepting {
    async fn get_application(&self, _: &str, _: &str) -> Result<Option<ApplicationInstance>, ClusterError> {
        Ok(None)
    }
    async fn apply_application(&self, _: &str, name: &str, body: &Value) -> Result<ApplicationInstance, ClusterError> {
        let mut a = ApplicationInstance::new(name, serde_json::from_value(body["spec"].clone()).unwrap());
        a.metadata.uid = Some("uid-1".into());
        a.metadata.generation = Some(1);
        Ok(a)
    }
    async fn get_operation(&self, _: &str, _: &str) -> Result<Option<Operation>, ClusterError> {
        Ok(None)
    }
    async fn apply_operation(&self, _: &str, _: &str, _: &Value) -> Result<Operation, ClusterError> {
        Err(ClusterError::Invalid("not in this test".into()))
    }
    async fn delete(&self, _: ObjectKind, _: &str, _: &str, _: &str) -> Result<(), ClusterError> {
        Ok(())
    }
    async fn revision_history(&self, _: &str, _: &str) -> Result<Option<Vec<AppRevision>>, ClusterError> {
        Ok(None)
    }
}

async fn run_agent(url: &str, key: &str, metrics: &Metrics, run_for: Duration) {
    let dir = std::env::temp_dir().join(format!("agent-key-test-{}-{}", std::process::id(), &key[..5]));
    std::fs::write(&dir, key).unwrap();
    // A client for an API server that is never called (the status is fed by hand).
    let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let status = SharedStatus::new();
    status.with(|c| {
        c.replace_kind(ObjectKind::ApplicationInstance, vec![], jiff::Timestamp::now());
        c.replace_kind(ObjectKind::Operation, vec![], jiff::Timestamp::now());
    });
    let sync = SyncLoop {
        client: ControlPlaneClient::new(&ClientConfig {
            url: url.into(),
            database: None,
            timeout: Duration::from_secs(2),
            max_response_bytes: 1 << 20,
            ca_bundle: None,
            insecure_allow_http: true,
        })
        .unwrap(),
        credentials: CredentialSource::File(dir.clone()),
        kube,
        cluster: Accepting,
        scope: WatchScope::new(NamespacePolicy::All, None).unwrap(),
        identity: ClusterIdentity {
            uid: "uid-cluster".into(),
            name: "edge-1".into(),
        },
        agent: AgentInfo {
            version: "0.1.0".into(),
            instance: "agent-test".into(),
            mode: AgentMode::Pull,
            started_at: jiff::Timestamp::now(),
        },
        status,
        resync_wanted: Default::default(),
        health: Health::new(Readiness::new(), AgentMetrics::register(metrics), None, json!({})),
        gate: LeaderGate::always_leader(),
        recorder: None,
        ledger_store: None,
        settings: SyncSettings {
            interval: Duration::from_millis(200),
            report_delay: Duration::from_millis(10),
            batch_size: 10,
            full_resync_interval: Duration::from_secs(3600),
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
                multiplier: 2.0,
            },
        },
    };
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

    let sim = Sim::new(SimConfig {
        state_file: None,
        database: None,
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    })
    .unwrap();
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
