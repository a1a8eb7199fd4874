//! (b) Fleet: many simulated agents, tasks of this process speaking the real protocol
//! through the agent's own client, against one simulator.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use agent::client::{ClientConfig, ControlPlaneClient};
use anyhow::Context as _;
use controller_kit::Redacted;
use e2e::{
    apps::app,
    bench::{cpu_seconds, pause, percentile, rss_kib},
};
use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use protocol::{
    METHOD_REGISTER, METHOD_SYNC, PROTOCOL_VERSION,
    messages::{
        AgentInfo, AgentMode, ClusterIdentity, Cursor, DocumentAck, DocumentOutcome, ObjectAck, ObjectKind,
        ObjectOutcome, ObjectReport, ObjectState, RegisterParams, ReportCondition, ResyncMarker, SyncParams,
        SyncResult,
    },
};
use serde_json::{Value, json};

use crate::{Args, Sim, api_key, mib};

#[derive(Default)]
struct FleetCounters {
    registered: AtomicU64,
    synced: AtomicU64,
    acknowledged: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    /// (when, round trip in ms) of every successful sync.
    round_trips: Mutex<Vec<(Instant, f32)>>,
}

impl FleetCounters {
    fn error(&self, reason: &str) {
        *self.errors.lock().expect("lock").entry(reason.to_owned()).or_default() += 1;
    }
}

struct FleetAgent {
    index: usize,
    key: Redacted<String>,
    client: ControlPlaneClient,
    interval: Duration,
    objects: usize,
    counters: Arc<FleetCounters>,
}

const FLEET_NS: &str = "apps";
const FLEET_APP: &str = "app-0";

fn fleet_reports(index: usize, objects: usize, now: Timestamp) -> Vec<ObjectReport> {
    let created: Timestamp = "2026-11-21T09:00:00Z".parse().expect("timestamp");
    let base = |kind, name: String, state| ObjectReport {
        kind,
        namespace: FLEET_NS.into(),
        uid: Some(format!("{index:04}-{name}-5b1c0e7a-8d2f-4e3b-9a61")),
        name,
        state,
        generation: Some(1),
        observed_generation: None,
        resource_version: Some(format!("{}", 100_000 + index)),
        managed_by_agent: true,
        conditions: Vec::new(),
        phase: None,
        result: None,
        start_time: None,
        completion_time: None,
        request_id: None,
        deployed_chart_version: None,
        desired_chart_version: None,
        backup_schedule: None,
        verification: None,
        created_at: Some(created),
        observed_at: now,
    };
    let mut app = base(ObjectKind::ApplicationInstance, FLEET_APP.into(), ObjectState::Ready);
    app.observed_generation = Some(1);
    app.deployed_chart_version = Some("0.1.0".into());
    app.desired_chart_version = Some("0.1.0".into());
    app.conditions = vec![ReportCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "InstallSucceeded".into(),
        message: "Helm install succeeded for release apps/app-0.v1 with chart demo-app@0.1.0".into(),
        last_transition_time: created,
        observed_generation: Some(1),
    }];
    let mut out = vec![app];
    for n in 1..objects {
        let mut op = base(ObjectKind::Operation, format!("backup-{n:02}"), ObjectState::Succeeded);
        op.phase = Some("Succeeded".into());
        op.start_time = Some(created);
        op.completion_time = Some(created);
        op.request_id = Some(format!("odoo-req-{index}-{n}"));
        out.push(op);
    }
    out
}

fn ack_of(doc: &protocol::DesiredState, index: usize) -> DocumentAck {
    DocumentAck {
        epoch: doc.epoch.clone(),
        revision: doc.revision,
        outcome: DocumentOutcome::Applied,
        reason: None,
        message: None,
        processed_at: Timestamp::now(),
        objects: doc
            .applications
            .iter()
            .map(|a| ObjectAck {
                kind: ObjectKind::ApplicationInstance,
                namespace: a.namespace.clone(),
                name: a.name.clone(),
                outcome: ObjectOutcome::Unchanged,
                reason: None,
                message: None,
                uid: Some(format!("{index:04}-{}-5b1c0e7a-8d2f-4e3b-9a61", a.name)),
                generation: Some(1),
                conflict: None,
            })
            .collect(),
    }
}

impl FleetAgent {
    /// What a real agent does, minus Kubernetes: register, full resync, acknowledge the
    /// document, then sync every interval with nothing to say.
    async fn run(self, start_after: Duration) {
        tokio::time::sleep(start_after).await;
        let started_at = Timestamp::now();
        let instance = format!("fleet-agent-{:04}-7d9f8b6c4-x2x9q", self.index);
        let register = RegisterParams {
            protocol_version: PROTOCOL_VERSION,
            cluster: ClusterIdentity {
                uid: format!("{:04}0000-1b2c-4d5e-8f90-a1b2c3d4e5f6", self.index),
                name: format!("fleet-{:04}", self.index),
            },
            agent: AgentInfo {
                version: env!("CARGO_PKG_VERSION").into(),
                instance: instance.clone(),
                mode: AgentMode::Pull,
                started_at,
            },
            allowed_namespaces: vec![FLEET_NS.into()],
            capabilities: vec!["conflict_report".into(), "deletions".into()],
        };
        let backoff = protocol::backoff::Backoff::default();
        let mut failures = 0u32;
        let mut registered = false;
        let mut known: Option<Cursor> = None;
        let mut acks: Vec<DocumentAck> = Vec::new();
        let mut resyncs = 0u32;
        let mut resync = true;
        loop {
            if !registered {
                match self.client.call(&self.key, METHOD_REGISTER, &register).await {
                    Ok(_) => {
                        registered = true;
                        self.counters.registered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.counters.error(&format!("register: {}", e.reason()));
                        failures += 1;
                        tokio::time::sleep(backoff.delay(failures, fastrand::f64())).await;
                        continue;
                    }
                }
            }
            let marker = resync.then(|| {
                resyncs += 1;
                ResyncMarker {
                    id: format!("{instance}-{}-{resyncs}", started_at.as_millisecond()),
                    batch: 0,
                    last_batch: true,
                }
            });
            let params = SyncParams {
                protocol_version: PROTOCOL_VERSION,
                cluster_uid: register.cluster.uid.clone(),
                agent_instance: instance.clone(),
                known: known.clone(),
                acks: acks.clone(),
                reports: if resync {
                    fleet_reports(self.index, self.objects, Timestamp::now())
                } else {
                    Vec::new()
                },
                resync: marker,
                more: false,
                last_error: None,
            };
            let sent = Instant::now();
            let answer = match self.client.call(&self.key, METHOD_SYNC, &params).await {
                Ok(v) => v,
                Err(e) => {
                    self.counters.error(&format!("sync: {}", e.reason()));
                    failures += 1;
                    resync = true;
                    tokio::time::sleep(backoff.delay(failures, fastrand::f64())).await;
                    continue;
                }
            };
            self.counters
                .round_trips
                .lock()
                .expect("lock")
                .push((sent, sent.elapsed().as_secs_f32() * 1000.0));
            failures = 0;
            if resync {
                self.counters.synced.fetch_add(1, Ordering::Relaxed);
            }
            if !acks.is_empty() {
                self.counters.acknowledged.fetch_add(1, Ordering::Relaxed);
            }
            resync = false;
            acks.clear();
            // Read as the agent reads Odoo's answers (the simulator writes Odoo's datetimes).
            match protocol::odoo_compat::decode::<SyncResult>(&answer) {
                Ok(result) => {
                    if let Some(doc) = result.desired
                        && known.as_ref() != Some(&doc.cursor())
                    {
                        // Applied (nothing to write: the fleet's clusters are as desired);
                        // the acknowledgement goes at once, as the agent does.
                        acks.push(ack_of(&doc, self.index));
                        known = Some(doc.cursor());
                        continue;
                    }
                }
                Err(_) => self.counters.error("sync: MalformedResult"),
            }
            tokio::time::sleep(self.interval).await;
        }
    }
}

fn client_config(url: &str) -> ClientConfig {
    ClientConfig {
        url: url.to_owned(),
        database: None,
        timeout: Duration::from_secs(15),
        max_response_bytes: 8 * 1024 * 1024,
        ca_bundle: None,
        insecure_allow_http: true,
    }
}

fn per_call(total: u64, calls: u64) -> f64 {
    total as f64 / calls.max(1) as f64
}

/// The calls and bytes between two readings of the simulator's counters.
pub(crate) fn diff(a: &odoo_sim::CallCounters, b: &odoo_sim::CallCounters) -> odoo_sim::CallCounters {
    odoo_sim::CallCounters {
        calls: a.calls - b.calls,
        errors: a.errors - b.errors,
        request_body_bytes: a.request_body_bytes - b.request_body_bytes,
        request_header_bytes: a.request_header_bytes - b.request_header_bytes,
        response_body_bytes: a.response_body_bytes - b.response_body_bytes,
        response_header_bytes: a.response_header_bytes - b.response_header_bytes,
    }
}

pub(crate) async fn run(args: &Args) -> anyhow::Result<()> {
    let n = args.agents;
    let interval = args.sync_interval;
    println!(
        "(b) fleet: {n} simulated agents (tasks of this process, the agent's own client{}) against one odoo-sim, \
         sync interval {}s, {} objects each, window {}s after a {}s ramp",
        if args.client_per_agent {
            ", one client each"
        } else {
            ", one shared connection pool"
        },
        interval.as_secs(),
        args.objects,
        args.fleet_window.as_secs(),
        interval.as_secs() + 5
    );
    let sim = Sim::start("bench-agent-odoo-sim-fleet", None).await?;
    let sim_pid = sim.pid().context("odoo-sim pid")?;
    let keys: Vec<String> = (0..n).map(|i| api_key(&format!("f{i:04}"))).collect();
    let t = Instant::now();
    let records: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"name": format!("fleet-{i:04}"), "api_key": k}))
        .collect();
    sim.admin("POST", "/sim/clusters", Some(json!(records))).await?;
    let spec = serde_json::to_value(app(FLEET_APP, "demo-app", "0.1.0", json!({"replicaCount": 1})).spec)?;
    stream::iter(0..n)
        .map(|i| {
            let (sim, spec) = (&sim, spec.clone());
            async move {
                sim.admin(
                    "PUT",
                    &format!("/sim/clusters/fleet-{i:04}/applications/{FLEET_NS}/{FLEET_APP}"),
                    Some(spec),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!(
        "  {n} cluster records (one bulk call) and {n} application intents in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let me = std::process::id();
    let rss_before = rss_kib(me).unwrap_or_default();
    let sim_rss_before = rss_kib(sim_pid).unwrap_or_default();
    let counters = Arc::new(FleetCounters::default());
    let shared = ControlPlaneClient::new(&client_config(&sim.url))?;
    let mut tasks = tokio::task::JoinSet::new();
    let ramp_start = Instant::now();
    for (index, key) in keys.into_iter().enumerate() {
        let client = if args.client_per_agent {
            ControlPlaneClient::new(&client_config(&sim.url))?
        } else {
            shared.clone()
        };
        let agent = FleetAgent {
            index,
            key: Redacted::new(key),
            client,
            interval,
            objects: args.objects,
            counters: counters.clone(),
        };
        let offset = interval.mul_f64(fastrand::f64());
        tasks.spawn(agent.run(offset));
    }
    let rss_spawned = rss_kib(me).unwrap_or_default();

    // Ramp: every agent starts within one interval, then registers, resyncs and acks.
    pause("the fleet to ramp up", interval + Duration::from_secs(5)).await?;
    let ramp = sim.stats().await?;
    let (registered, synced, acked) = (
        counters.registered.load(Ordering::Relaxed),
        counters.synced.load(Ordering::Relaxed),
        counters.acknowledged.load(Ordering::Relaxed),
    );
    println!(
        "  ramp ({:.0} s): {registered}/{n} registered, {synced}/{n} full resyncs delivered, {acked}/{n} documents acknowledged",
        ramp_start.elapsed().as_secs_f64()
    );
    let first = diff(&ramp.sync, &ramp.sync_at_rest);
    println!(
        "    {} register calls ({:.0} B up, {:.0} B down each), {} syncs carrying something ({:.0} B up, {:.0} B down each: \
         resyncs of {} reports, the document, its acknowledgement)",
        ramp.register.calls,
        per_call(ramp.register.request_body_bytes, ramp.register.calls),
        per_call(ramp.register.response_body_bytes, ramp.register.calls),
        first.calls,
        per_call(first.request_body_bytes, first.calls),
        per_call(first.response_body_bytes, first.calls),
        args.objects,
    );

    // Window: at rest.
    let cpu_fleet_0 = cpu_seconds(me).unwrap_or_default();
    let cpu_sim_0 = cpu_seconds(sim_pid).unwrap_or_default();
    let window_start = Instant::now();
    let mut rss_peak = rss_kib(me).unwrap_or_default();
    let mut sim_rss_peak = rss_kib(sim_pid).unwrap_or_default();
    while window_start.elapsed() < args.fleet_window {
        pause("the fleet window to end", Duration::from_secs(1)).await?;
        rss_peak = rss_peak.max(rss_kib(me).unwrap_or_default());
        sim_rss_peak = sim_rss_peak.max(rss_kib(sim_pid).unwrap_or_default());
    }
    let end = sim.stats().await?;
    let cpu_fleet = cpu_seconds(me).unwrap_or_default() - cpu_fleet_0;
    let cpu_sim = cpu_seconds(sim_pid).unwrap_or_default() - cpu_sim_0;
    let rss_end = rss_kib(me).unwrap_or_default();
    let sim_rss_end = rss_kib(sim_pid).unwrap_or_default();
    tasks.abort_all();

    let secs = end.now.duration_since(ramp.now).as_secs_f64();
    let reg = diff(&end.register, &ramp.register);
    let sync = diff(&end.sync, &ramp.sync);
    let rest = diff(&end.sync_at_rest, &ramp.sync_at_rest);
    let other = diff(&end.other, &ramp.other);
    let calls = reg.calls + sync.calls + other.calls;
    let errors = reg.errors + sync.errors + other.errors;
    let window_secs = window_start.elapsed().as_secs_f64();
    let mut trips: Vec<f64> = counters
        .round_trips
        .lock()
        .expect("lock")
        .iter()
        .filter(|(at, _)| *at >= window_start)
        .map(|(_, ms)| f64::from(*ms))
        .collect();
    trips.sort_by(f64::total_cmp);

    println!("  window {secs:.0} s, at the simulator:");
    println!(
        "    requests: {calls} ({:.1}/s; expected {n}/{}s = {:.1}/s), of which syncs {} and at rest {}; errors {errors}",
        calls as f64 / secs,
        interval.as_secs(),
        n as f64 / interval.as_secs_f64(),
        sync.calls,
        rest.calls
    );
    println!(
        "    bytes per sync at rest: {:.0} B up + {:.0} B down (JSON bodies); with HTTP/1.1 framing {:.0} B up + {:.0} B down",
        per_call(rest.request_body_bytes, rest.calls),
        per_call(rest.response_body_bytes, rest.calls),
        per_call(rest.request_body_bytes + rest.request_header_bytes, rest.calls),
        per_call(rest.response_body_bytes + rest.response_header_bytes, rest.calls),
    );
    let wire =
        (rest.request_body_bytes + rest.request_header_bytes + rest.response_body_bytes + rest.response_header_bytes)
            as f64
            / secs;
    println!(
        "    control-plane traffic at rest: {:.1} KiB/s for {n} clusters ({:.1} MiB/day)",
        wire / 1024.0,
        wire * 86_400.0 / 1024.0 / 1024.0
    );
    println!(
        "    simulator: CPU {:.1} % of one core, RSS {:.1} MiB before the fleet, {:.1} MiB peak, {:.1} MiB at the end (not Odoo)",
        cpu_sim / window_secs * 100.0,
        mib(sim_rss_before),
        mib(sim_rss_peak),
        mib(sim_rss_end)
    );
    println!(
        "  at the agents: sync round trip n {}, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        trips.len(),
        percentile(&trips, 0.5),
        percentile(&trips, 0.99),
        trips.last().copied().unwrap_or(f64::NAN)
    );
    let client_errors = counters.errors.lock().expect("lock").clone();
    if !client_errors.is_empty() {
        println!("    errors seen by the agents (whole run): {client_errors:?}");
    }
    let per_agent = rss_end.saturating_sub(rss_before) as f64 / n as f64;
    println!(
        "  fleet process: RSS {:.1} MiB before the agents, {:.1} MiB with {n} spawned, {:.1} MiB peak, {:.1} MiB at the end \
         → about {:.1} KiB per simulated agent; CPU {:.1} % of one core",
        mib(rss_before),
        mib(rss_spawned),
        mib(rss_peak),
        mib(rss_end),
        per_agent,
        cpu_fleet / window_secs * 100.0
    );
    println!(
        "    (a simulated agent is a task with its protocol state; the real agent's RSS, with its Kubernetes \
         client, watches and caches, is part (a)'s figure)"
    );
    drop(sim);
    Ok(())
}
