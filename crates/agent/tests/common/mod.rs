//! What the agent's integration tests share: an in-memory cluster, the simulator's
//! configuration, and a pull loop with test tunables against a simulator URL.

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use std::{path::Path, time::Duration};

use agent::{
    apply::{Cluster, ClusterError},
    client::{ClientConfig, ControlPlaneClient},
    credentials::CredentialSource,
    health::{AgentMetrics, Health},
    status::SharedStatus,
    sync::{SyncLoop, SyncSettings},
};
use api::{ApplicationInstance, Operation};
use controller_kit::{LeaderGate, Metrics, NamespacePolicy, Readiness, WatchScope};
use odoo_sim::SimConfig;
use operations::revisions::AppRevision;
use protocol::{
    backoff::Backoff,
    messages::{AgentInfo, AgentMode, ClusterIdentity, ObjectKind, ObjectReport},
};
use serde_json::{Value, json};

/// A cluster that accepts every application and no Operation.
pub struct Accepting;

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

/// The simulator in memory, without a state file.
pub fn sim_config() -> SimConfig {
    SimConfig {
        state_file: None,
        database: None,
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    }
}

/// A status cache already listed, holding `applications`.
pub fn listed_status(applications: Vec<ObjectReport>) -> SharedStatus {
    let status = SharedStatus::new();
    status.with(|c| {
        c.replace_kind(ObjectKind::ApplicationInstance, applications, jiff::Timestamp::now());
        c.replace_kind(ObjectKind::Operation, vec![], jiff::Timestamp::now());
    });
    status
}

/// A pull loop for cluster `edge-1` against the simulator at `url` over plain HTTP, with
/// the key in `key_file`, quick timings and `batch_size` reports per call at most.
pub fn pull_loop(
    url: &str,
    key_file: &Path,
    status: SharedStatus,
    metrics: &Metrics,
    batch_size: usize,
) -> SyncLoop<Accepting> {
    // A client for an API server that is never called (the status is fed by hand).
    let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    SyncLoop {
        client: ControlPlaneClient::new(&ClientConfig {
            url: url.into(),
            database: None,
            timeout: Duration::from_secs(2),
            max_response_bytes: 1 << 20,
            ca_bundle: None,
            insecure_allow_http: true,
        })
        .unwrap(),
        credentials: CredentialSource::File(key_file.to_path_buf()),
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
            batch_size,
            full_resync_interval: Duration::from_secs(3600),
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
                multiplier: 2.0,
            },
        },
    }
}
