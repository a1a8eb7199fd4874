//! Phase 5: the control plane for real (issue 42). A real Odoo 19 with the reference addon
//! (`odoo/addons/vworkspace`) on Debian's PostgreSQL takes the simulator's place: the
//! workload is declared as Odoo records (install, upgrade by the application's chart
//! version, backup, runbook), and the agent pulls from Odoo through [`LosingProxy`]. Every
//! other kill is one of the control plane's faults: Odoo SIGKILLed and started again,
//! PostgreSQL SIGKILLed (crash recovery on its restart), or the answer to a call Odoo had
//! already committed cut before it reached the agent; the rest are the fleet's binaries as
//! before. It runs until each of the three faults happened `CHAOS_ODOO_FAULTS` times (5),
//! then checks what phases 1 to 4 check, against Odoo's own records: its acknowledgements
//! (as received, every one, and one to one against the documents the agent's ledger says it
//! processed), its latest report of every object against the live object, its cursor
//! against the agent's ledger.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use api::{ApplicationInstance, Operation};
use e2e::{
    TestContext,
    agent::{AgentProcess, SimProcess},
    odoo::{OdooCluster, OdooProcess, odoo_datetime},
    process::free_loopback_addr,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use protocol::{
    Cursor, DocumentAck, ObjectKind, ObjectReport,
    report::{application_report, operation_report},
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use crate::{
    Child, Findings, Fleet, REPORT_SETTLE, Rng, STEP_TIMEOUT, VICTIMS, ack_gap, acks_one_to_one, check_live_app,
    check_live_op, ledger, ledger_gaps, report_gap,
};

/// Acknowledgements the reference addon keeps per cluster (`ACKS_KEPT` in
/// `odoo/addons/vworkspace/models/cluster.py`: the highest revisions).
const ODOO_ACKS_KEPT: usize = 100;

/// The control plane's faults, each counted.
const FAULTS: [&str; 3] = ["odoo", "postgresql", "lost answer"];

/// How the agent reaches Odoo (through the proxy), so a restart starts it the same way.
pub(crate) struct OdooAgent {
    url: String,
    database: String,
    cluster: String,
    key_file: PathBuf,
}

impl OdooAgent {
    /// Starts the pull agent against Odoo (its own status ConfigMap and ledger).
    pub(crate) async fn start(&self, ctx: &TestContext) -> anyhow::Result<AgentProcess> {
        e2e::odoo::start_agent_at(
            ctx,
            &self.url,
            &self.database,
            &self.cluster,
            &self.key_file,
            "-odoo",
            &[],
        )
        .await
    }
}

/// A TCP proxy in front of Odoo that can lose the answer to a call Odoo committed: while
/// answers are owed to it ([`Self::lose_next_answer`]), the first bytes of an answer from
/// Odoo close both sides instead of reaching the agent. Odoo writes an answer only after
/// its transaction committed (`odoo/service/model.py`, `retrying`: `env.cr.commit()` before
/// it returns the result), so what the agent misses has taken effect. It counts how many of
/// the answers it cut were to calls that carried acknowledgements or reports up (read in
/// the request's JSON as the agent writes it), so a run whose cuts hit idle syncs only is
/// told apart.
struct LosingProxy {
    url: String,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

/// The proxy's counters.
#[derive(Default)]
struct Counts {
    owed: AtomicU32,
    lost: AtomicU32,
    lost_with_acks: AtomicU32,
    lost_with_reports: AtomicU32,
    lost_with_either: AtomicU32,
}

/// How many of the cut answers were to calls that carried something up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) answers: u32,
    pub(crate) with_acks: u32,
    pub(crate) with_reports: u32,
    pub(crate) with_either: u32,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (to calls carrying acknowledgements or reports: {}; acknowledgements {}, reports {})",
            self.answers, self.with_either, self.with_acks, self.with_reports
        )
    }
}

impl LosingProxy {
    async fn start(upstream_port: u16) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(free_loopback_addr()?).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let counts = Arc::new(Counts::default());
        let task_counts = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = task_counts.clone();
                tokio::spawn(async move {
                    // A connection that fails (Odoo down) simply closes: the agent retries.
                    let _ = relay(client, upstream_port, &counts).await;
                });
            }
        });
        Ok(Self { url, counts, task })
    }

    fn lose_next_answer(&self) {
        self.counts.owed.fetch_add(1, Ordering::SeqCst);
    }

    /// Answers cut so far, and what their calls carried.
    fn cut(&self) -> Cut {
        let c = &self.counts;
        Cut {
            answers: c.lost.load(Ordering::SeqCst),
            with_acks: c.lost_with_acks.load(Ordering::SeqCst),
            with_reports: c.lost_with_reports.load(Ordering::SeqCst),
            with_either: c.lost_with_either.load(Ordering::SeqCst),
        }
    }
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the call on a connection whose answer comes next carried up. HTTP/1.1 calls on one
/// connection follow each other (the agent's client does not pipeline), and Odoo answers
/// only once it read the whole body, so when an answer starts these are its call's.
#[derive(Default)]
struct Carried {
    acks: AtomicBool,
    reports: AtomicBool,
}

/// Where a call starts, and what the agent's JSON (serde_json, compact) holds when it
/// carries something: a non-empty `acks` or `reports` array.
const CALL_START: &[u8] = b"POST /json/2/";
const WITH_ACKS: &[u8] = b"\"acks\":[{";
const WITH_REPORTS: &[u8] = b"\"reports\":[{";

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// Relays the agent's bytes to Odoo, noting in `carried` what the latest call carries. A
/// marker split between two reads is found in the last bytes of the one before, kept.
async fn relay_requests(
    mut from_client: tokio::net::tcp::OwnedReadHalf,
    mut to_odoo: tokio::net::tcp::OwnedWriteHalf,
    carried: &Carried,
) -> std::io::Result<()> {
    const KEEP: usize = 32;
    let mut window: Vec<u8> = Vec::with_capacity(16 * 1024 + KEEP);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from_client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let chunk = buf.get(..n).unwrap_or_default();
        window.extend_from_slice(chunk);
        let from = match rfind(&window, CALL_START) {
            Some(at) => {
                carried.acks.store(false, Ordering::SeqCst);
                carried.reports.store(false, Ordering::SeqCst);
                at
            }
            None => 0,
        };
        let this_call = window.get(from..).unwrap_or_default();
        if find(this_call, WITH_ACKS).is_some() {
            carried.acks.store(true, Ordering::SeqCst);
        }
        if find(this_call, WITH_REPORTS).is_some() {
            carried.reports.store(true, Ordering::SeqCst);
        }
        to_odoo.write_all(chunk).await?;
        let drop = window.len().saturating_sub(KEEP);
        window.drain(..drop);
    }
}

async fn relay(client: TcpStream, upstream_port: u16, counts: &Counts) -> std::io::Result<()> {
    let upstream = TcpStream::connect(("127.0.0.1", upstream_port)).await?;
    let (from_client, mut to_client) = client.into_split();
    let (mut from_odoo, to_odoo) = upstream.into_split();
    let carried = Arc::new(Carried::default());
    let requests = {
        let carried = carried.clone();
        tokio::spawn(async move { relay_requests(from_client, to_odoo, &carried).await })
    };
    let mut buf = vec![0u8; 16 * 1024];
    let result = loop {
        let n = match from_odoo.read(&mut buf).await {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(e),
        };
        if counts
            .owed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| o.checked_sub(1))
            .is_ok()
        {
            counts.lost.fetch_add(1, Ordering::SeqCst);
            let (acks, reports) = (
                carried.acks.load(Ordering::SeqCst),
                carried.reports.load(Ordering::SeqCst),
            );
            for (counter, yes) in [
                (&counts.lost_with_acks, acks),
                (&counts.lost_with_reports, reports),
                (&counts.lost_with_either, acks || reports),
            ] {
                if yes {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
            println!(
                "CHAOS an answer of Odoo lost after its commit (its call carried acknowledgements: {acks}, reports: {reports})"
            );
            break Ok(());
        }
        if let Err(e) = to_client.write_all(buf.get(..n).unwrap_or_default()).await {
            break Err(e);
        }
    };
    // Dropping both halves closes the agent's connection, mid-answer when one was lost.
    requests.abort();
    result
}

/// `hack/odoo.sh ARGS`, in the host's network namespace when `on_host` (PostgreSQL listens
/// on TCP there; only its Unix socket is shared with the cluster's namespace): `hack/chaos.sh`
/// names it `VWS_HOST_NETNS` for the run.
async fn odoo_sh(args: &[&str], on_host: bool) -> anyhow::Result<()> {
    let script = e2e::repo_root().join("hack/odoo.sh");
    let mut cmd = if on_host {
        let host = std::env::var("VWS_HOST_NETNS")
            .context("VWS_HOST_NETNS is not set: run the real-Odoo phase through hack/chaos.sh")?;
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &host]).arg(&script);
        cmd
    } else {
        tokio::process::Command::new(&script)
    };
    let out = cmd.args(args).output().await.context("running hack/odoo.sh")?;
    anyhow::ensure!(
        out.status.success(),
        "hack/odoo.sh {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// PostgreSQL up again after a kill: `db-up` until it answers (its backends may still be
/// exiting at the first try).
async fn postgresql_up() -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..20 {
        match odoo_sh(&["db-up"], true).await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("PostgreSQL did not come up")))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Install,
    Upgrade,
    Backup,
    Restore,
    Runbook,
    Done,
}

/// One application's round through Odoo's records.
struct Round {
    app: String,
    step: Step,
    /// Whether the current step's record was written (a failed call is tried again).
    asked: bool,
    asked_at: Instant,
    app_id: Option<i64>,
    /// Operation records by type (`Backup`, `Restore`, `Runbook`), once created.
    ops: BTreeMap<&'static str, i64>,
}

impl Round {
    fn new(app: String) -> Self {
        Self {
            app,
            step: Step::Install,
            asked: false,
            asked_at: Instant::now(),
            app_id: None,
            ops: BTreeMap::new(),
        }
    }

    /// Writes the current step's record, once: a record a lost answer may have created is
    /// found before another is made.
    async fn ask(&mut self, odoo: &OdooProcess, cluster: i64, ns: &str) -> anyhow::Result<()> {
        let deadline = odoo_datetime(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2));
        match self.step {
            Step::Install => {
                let found = odoo
                    .search_read(
                        "vworkspace.application",
                        json!([
                            ["cluster_id", "=", cluster],
                            ["namespace", "=", ns],
                            ["name", "=", self.app]
                        ]),
                        &["name"],
                    )
                    .await?;
                let id = match found.first().and_then(|r| r["id"].as_i64()) {
                    Some(id) => id,
                    None => {
                        odoo.declare_app(
                            cluster,
                            ns,
                            &self.app,
                            "demo-app",
                            "0.1.0",
                            &json!({"greeting": "chaos"}),
                        )
                        .await?
                    }
                };
                self.app_id = Some(id);
            }
            Step::Upgrade => {
                let id = self.app_id.context("no application record")?;
                odoo.write("vworkspace.application", id, json!({"chart_version": "0.2.0"}))
                    .await?;
            }
            Step::Backup | Step::Restore | Step::Runbook => {
                let op_type = match self.step {
                    Step::Backup => "Backup",
                    Step::Restore => "Restore",
                    _ => "Runbook",
                };
                let found = odoo
                    .search_read(
                        "vworkspace.operation",
                        json!([
                            ["cluster_id", "=", cluster],
                            ["namespace", "=", ns],
                            ["application_name", "=", self.app],
                            ["op_type", "=", op_type]
                        ]),
                        &["name"],
                    )
                    .await?;
                let id = match found.first().and_then(|r| r["id"].as_i64()) {
                    Some(id) => id,
                    None if op_type == "Backup" => {
                        odoo.create(
                            "vworkspace.operation",
                            json!({
                                "cluster_id": cluster, "namespace": ns, "application_name": self.app,
                                "op_type": "Backup", "payload_json": json!({"ttl": "2h"}).to_string(),
                                "deadline": deadline,
                            }),
                        )
                        .await?
                    }
                    None if op_type == "Restore" => {
                        // From this round's Backup, by the name Odoo gave it on the cluster.
                        let backup = self.operation(odoo, "Backup").await?;
                        let source = json!({"source": {"operationName": text(&backup["name"])}});
                        odoo.create(
                            "vworkspace.operation",
                            json!({
                                "cluster_id": cluster, "namespace": ns, "application_name": self.app,
                                "op_type": "Restore", "payload_json": source.to_string(),
                                "deadline": deadline,
                            }),
                        )
                        .await?
                    }
                    None => {
                        let deadline = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2);
                        odoo.declare_runbook(cluster, ns, &self.app, "echo reindexed", None, Some(deadline))
                            .await?
                    }
                };
                self.ops.insert(op_type, id);
            }
            Step::Done => {}
        }
        self.asked = true;
        self.asked_at = Instant::now();
        Ok(())
    }

    /// Whether the current step is done, as Odoo shows it.
    async fn done(&self, odoo: &OdooProcess) -> anyhow::Result<bool> {
        Ok(match self.step {
            Step::Install => self.application(odoo).await?["status"] == "ready",
            Step::Upgrade => {
                let rec = self.application(odoo).await?;
                rec["status"] == "ready" && rec["deployed_chart_version"] == "0.2.0"
            }
            Step::Backup => self.operation(odoo, "Backup").await?["status"] == "succeeded",
            Step::Restore => self.operation(odoo, "Restore").await?["status"] == "succeeded",
            Step::Runbook => self.operation(odoo, "Runbook").await?["status"] == "succeeded",
            Step::Done => true,
        })
    }

    async fn application(&self, odoo: &OdooProcess) -> anyhow::Result<Value> {
        odoo.application(self.app_id.context("no application record")?).await
    }

    async fn operation(&self, odoo: &OdooProcess, op_type: &str) -> anyhow::Result<Value> {
        odoo.operation(*self.ops.get(op_type).context("no Operation record")?)
            .await
    }

    fn advance(&mut self) {
        self.step = match self.step {
            Step::Install => Step::Upgrade,
            Step::Upgrade => Step::Backup,
            Step::Backup => Step::Restore,
            Step::Restore => Step::Runbook,
            Step::Runbook | Step::Done => Step::Done,
        };
        self.asked = false;
    }
}

/// The control plane's side of the phase.
struct ControlPlane {
    odoo: OdooProcess,
    cluster: OdooCluster,
    proxy: LosingProxy,
    faults: BTreeMap<&'static str, u32>,
}

impl ControlPlane {
    async fn fault(&mut self, fault: &'static str, pause: Duration) -> anyhow::Result<()> {
        match fault {
            "odoo" => {
                self.odoo.kill().await?;
                tokio::time::sleep(pause).await;
                self.odoo.start_again().await?;
            }
            "postgresql" => {
                odoo_sh(&["db-kill"], false).await?;
                tokio::time::sleep(pause).await;
                postgresql_up().await?;
            }
            _ => self.proxy.lose_next_answer(),
        }
        *self.faults.entry(fault).or_default() += 1;
        Ok(())
    }

    fn enough(&self, each: u32) -> bool {
        FAULTS
            .iter()
            .all(|f| self.faults.get(f).copied().unwrap_or_default() >= each)
    }
}

/// Runs the phase; what was checked, and a line on the faults.
pub(crate) async fn run(
    ctx: &TestContext,
    sim: &SimProcess,
    fleet: &mut Fleet,
    rng: &mut Rng,
    faults_each: u32,
) -> anyhow::Result<(Findings, String)> {
    let ns = ctx.namespace.clone();
    let odoo = OdooProcess::start(ctx).await?;
    let cluster = odoo.create_cluster(ctx, "chaos-odoo", "odoo-chaos-key").await?;
    let proxy = LosingProxy::start(odoo.port).await?;
    fleet.agent.process.kill().await?;
    let agent = OdooAgent {
        url: proxy.url.clone(),
        database: odoo.database.clone(),
        cluster: cluster.name.clone(),
        key_file: cluster.key_file.clone(),
    };
    fleet.agent = agent.start(ctx).await?;
    fleet.mode = crate::AgentMode::Odoo(agent);
    let mut cp = ControlPlane {
        odoo,
        cluster,
        proxy,
        faults: BTreeMap::new(),
    };

    let started = Instant::now();
    let mut next_kill = Instant::now() + rng.between(Duration::from_secs(1), Duration::from_secs(5));
    let mut all: Vec<Round> = Vec::new();
    let mut batch = 0;
    while all.is_empty() || !cp.enough(faults_each) {
        let mut rounds: Vec<Round> = (0..2).map(|i| Round::new(format!("odoo{batch}x{i}"))).collect();
        batch += 1;
        loop {
            if Instant::now() >= next_kill && !cp.enough(faults_each) {
                let pause = rng.between(Duration::from_millis(200), Duration::from_secs(2));
                if rng.pick(2) == 0 {
                    let fault = FAULTS[rng.pick(FAULTS.len())];
                    println!("CHAOS fault {fault} at {:.1?} (real Odoo)", started.elapsed());
                    cp.fault(fault, pause).await?;
                } else {
                    let victim = VICTIMS[rng.pick(VICTIMS.len())];
                    println!("CHAOS kill {victim} at {:.1?} (real Odoo)", started.elapsed());
                    fleet.kill_and_restart(ctx, sim, victim, pause).await?;
                }
                next_kill = Instant::now() + rng.between(Duration::from_secs(1), Duration::from_secs(5));
            }
            let mut all_done = true;
            for round in &mut rounds {
                if round.step == Step::Done {
                    continue;
                }
                all_done = false;
                // Calls fail while Odoo or PostgreSQL is down: tried again at the next poll.
                if !round.asked {
                    let _ = round.ask(&cp.odoo, cp.cluster.id, &ns).await;
                } else if round.done(&cp.odoo).await.unwrap_or(false) {
                    round.advance();
                } else if round.asked_at.elapsed() > STEP_TIMEOUT {
                    anyhow::bail!("stuck with real Odoo: {} at {:?}", round.app, round.step);
                }
            }
            if all_done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        all.extend(rounds);
    }
    let findings = check(ctx, &cp, &all, &fleet.agent.status_configmap.clone()).await?;
    let cut = cp.proxy.cut();
    let mut findings = findings;
    // The lost-answer fault must have hit calls that carried something up, or it tested
    // idle syncs only.
    if cut.answers > 0 && cut.with_either == 0 {
        findings.faults_missed.push(format!(
            "none of the {} answers cut after Odoo's commit was to a call carrying acknowledgements or reports",
            cut.answers
        ));
    }
    let faults = format!(
        "control-plane faults: {:?}, answers lost after Odoo's commit: {cut}",
        cp.faults
    );
    Ok((findings, faults))
}

/// What Odoo received, as it received it (`raw`): acknowledgements of its current epoch,
/// every acknowledgement it holds (any epoch), latest reports by `Kind/namespace/name`, and
/// its cursor.
async fn odoo_records(
    cp: &ControlPlane,
) -> anyhow::Result<(
    Vec<DocumentAck>,
    Vec<DocumentAck>,
    BTreeMap<String, Result<ObjectReport, serde_json::Error>>,
    Option<Cursor>,
)> {
    let odoo = &cp.odoo;
    let cluster = odoo.cluster(cp.cluster.id).await?;
    let epoch = cluster["epoch"].as_str().unwrap_or_default().to_owned();
    let latest = cluster["revision"].as_u64().map(|revision| Cursor {
        epoch: epoch.clone(),
        revision,
    });
    let all: Vec<DocumentAck> = odoo
        .search_read("vworkspace.ack", json!([["cluster_id", "=", cp.cluster.id]]), &["raw"])
        .await?
        .iter()
        .filter_map(|r| {
            r["raw"]
                .as_str()
                .and_then(|raw| serde_json::from_str::<DocumentAck>(raw).ok())
        })
        .collect();
    let acks = all.iter().filter(|a| a.epoch == epoch).cloned().collect();
    let reports = odoo
        .search_read(
            "vworkspace.report",
            json!([["cluster_id", "=", cp.cluster.id]]),
            &["kind", "namespace", "name", "raw"],
        )
        .await?
        .iter()
        .map(|r| {
            let key = format!("{}/{}/{}", text(&r["kind"]), text(&r["namespace"]), text(&r["name"]));
            (key, serde_json::from_str::<ObjectReport>(text(&r["raw"])))
        })
        .collect();
    Ok((acks, all, reports, latest))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

async fn check(
    ctx: &TestContext,
    cp: &ControlPlane,
    rounds: &[Round],
    ledger_configmap: &str,
) -> anyhow::Result<Findings> {
    let ns = ctx.namespace.as_str();
    let odoo = &cp.odoo;
    let mut f = Findings::default();
    let helm = ctx
        .api::<Secret>()
        .list(&ListParams::default().labels("owner=helm"))
        .await?
        .items;
    // Cluster-side names and the revisions that last changed each object, from Odoo.
    let mut objects = Vec::new();
    for round in rounds.iter().filter(|r| r.step == Step::Done) {
        let app = odoo.application(round.app_id.context("no application record")?).await?;
        objects.push((
            ObjectKind::ApplicationInstance,
            round.app.clone(),
            app["changed_revision"].as_u64(),
            None,
        ));
        for (op_type, child) in [
            ("Backup", Child::VeleroBackup),
            ("Restore", Child::VeleroRestore),
            ("Runbook", Child::Job),
        ] {
            let op = odoo
                .operation(*round.ops.get(op_type).context("no Operation record")?)
                .await?;
            let name = text(&op["name"]).to_owned();
            objects.push((
                ObjectKind::Operation,
                name,
                op["changed_revision"].as_u64(),
                Some(child),
            ));
        }
    }
    let (acks, _, _, _) = odoo_records(cp).await?;
    for (kind, name, changed, child) in &objects {
        match kind {
            ObjectKind::ApplicationInstance => check_live_app(ctx, &helm, name, &mut f).await?,
            _ => check_live_op(ctx, name, *child, &mut f).await?,
        }
        f.lost_acks_or_reports
            .extend(ack_gap(&acks, *kind, ns, name, *changed, "Odoo"));
    }
    // At rest: Odoo's latest reports against the live objects, its cursor against the
    // agent's ledger; re-read until nothing differs or REPORT_SETTLE passed.
    let deadline = Instant::now() + REPORT_SETTLE;
    let (gaps, audit) = loop {
        let (acks, all, mut reports, latest) = odoo_records(cp).await?;
        let now = jiff::Timestamp::now();
        let mut gaps = Vec::new();
        for (kind, name, _, _) in &objects {
            let live = match kind {
                ObjectKind::ApplicationInstance => {
                    application_report(&ctx.api::<ApplicationInstance>().get(name).await?, now)
                }
                _ => operation_report(&ctx.api::<Operation>().get(name).await?, now),
            };
            let reported = reports.remove(&format!("{}/{ns}/{name}", kind.as_str()));
            gaps.extend(report_gap(reported, &live, "Odoo"));
        }
        let ledger = ledger(ledger_configmap).await?;
        let (audit, lost) = acks_one_to_one(ledger.as_ref(), &all, ODOO_ACKS_KEPT, "Odoo");
        gaps.extend(lost);
        gaps.extend(ledger_gaps(latest, &acks, ledger, "Odoo"));
        if gaps.is_empty() || Instant::now() >= deadline {
            break (gaps, audit);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    f.lost_acks_or_reports.extend(gaps);
    f.acks = audit;
    Ok(f)
}
