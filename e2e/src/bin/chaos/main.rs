//! Chaos, measured (issue 18). Run by `just chaos` (hack/chaos.sh), not by CI: it takes
//! about twenty minutes. A binary rather than a test, so `cargo test` never waits for it. Seeded (`CHAOS_SEED`) and reproducible in its choices (which
//! binary, when); the cluster's own timing still varies from run to run.
//!
//! The workload goes through the control-plane simulator and the pull agent, as Odoo's
//! would: rounds of install → upgrade → backup → restore → runbook of one application each. Meanwhile
//! a killer SIGKILLs one binary at a random moment every 1–5 s (app-controller, the upgrade,
//! backup, restore and runbook engines, the agent, helm-controller) and starts it again 0.2–2 s later,
//! until each was killed `CHAOS_KILLS` times (10 by default). Then it checks:
//!
//! * convergence: every application `Ready=True` for its current generation with chart
//!   0.2.0 deployed (`status.deployedChartVersion`), every Operation `Succeeded`;
//! * no duplicate child: one Velero Backup per Backup Operation, one Velero Restore per
//!   Restore Operation, one Job per Runbook Operation (an Operation run twice would make two);
//! * no duplicate Helm revision: two release revisions per application (install, upgrade);
//! * no lost acknowledgement or report: among the acknowledgements the simulator received
//!   (all of them, not its per-object summary), one of a revision at least the one that last
//!   changed each object; at rest, every document the agent processed (the history in its
//!   ledger) has its acknowledgement, exactly as the agent last produced it, among the
//!   simulator's, one to one, within what both still hold ([`protocol::processed::audit`]:
//!   the missing ones are counted, and a run that compared none fails); at rest, the
//!   simulator's latest report of every object is exactly
//!   what the agent would report of the live object now (state, generation, observed
//!   generation, resource version, conditions, deployed chart version, phase: anything
//!   lost after the install shows as an older report); the agent's durable ledger knows the
//!   simulator's latest document, and every acknowledgement it still holds reached the
//!   simulator;
//! * no binary exited on its own: each is checked before it is killed and after every
//!   phase (helm-controller included, by its pid).
//!
//! Then two outages under load: the API server stopped (SIGSTOP) for `CHAOS_API_OUTAGE`
//! seconds (120) while a round runs, and the simulator stopped for `CHAOS_CP_OUTAGE`
//! seconds (300) while the cluster changes; after each, the same checks, and no binary may
//! have exited. Then the same kills with the agent in push mode (the simulator pushes and
//! polls, as the Odoo module would), until the push agent was killed `CHAOS_KILLS` times.
//! Last, the control plane for real ([`odoo_phase`]): real Odoo 19
//! and PostgreSQL in the simulator's place, killed, and an answer Odoo committed lost on its
//! way, `CHAOS_ODOO_FAULTS` times each (5), with the same checks against Odoo's records.
//! `CHAOS_PHASES` (comma-separated: kills, api, control-plane, push, odoo) runs some of the
//! phases only. Figures go to stdout (and into docs/reliability.md by hand).
//!
//! `CHAOS_DROP_ACK_AFTER=<seconds>` breaks it on purpose: that long into the kills phase,
//! the simulator is told to confirm the next acknowledgement it receives without storing it
//! (its fault `drop_ack`), and the first round's application is declared again, unchanged,
//! every 10 s from then on (so the rounds do not wait on the objects of the lost
//! acknowledgement: later documents acknowledge them); the run must then fail with one lost
//! acknowledgement.

mod odoo_phase;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use api::{ApplicationInstance, Operation, OperationPhase};
use e2e::{
    TestContext,
    agent::{
        AgentProcess, PushPki, SimProcess, api_key, runbook_spec, start_agent, start_push_agent, summary, work_dir,
    },
    apps::{app, start_controller},
    cluster_dir,
    ops::start_engine,
    process::ControllerProcess,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ListParams};
use protocol::{
    Cursor, DocumentAck, ObjectKind, ObjectReport,
    processed::{AckAudit, audit},
    report::{application_report, operation_report, same_content},
    revision::LedgerRecord,
};
use serde_json::{Value, json};

const ENGINES: [&str; 4] = ["upgrade-engine", "backup-engine", "restore-engine", "runbook-engine"];
const VICTIMS: [&str; 7] = [
    "app-controller",
    "upgrade-engine",
    "backup-engine",
    "restore-engine",
    "runbook-engine",
    "agent",
    "helm-controller",
];
const STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the simulator's reports may trail the cluster once a phase is at rest (a few
/// syncs and the agent's report batching).
const REPORT_SETTLE: Duration = Duration::from_secs(60);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The phases to run (`CHAOS_PHASES`, comma-separated; all by default, in this order).
const PHASES: [&str; 5] = ["kills", "api", "control-plane", "push", "odoo"];

fn phases() -> Vec<&'static str> {
    let asked = std::env::var("CHAOS_PHASES").unwrap_or_default();
    if asked.trim().is_empty() {
        return PHASES.to_vec();
    }
    PHASES
        .into_iter()
        .filter(|p| asked.split(',').any(|a| a.trim() == *p))
        .collect()
}

/// A small seeded generator (xorshift64*), so a run's choices replay from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = high.saturating_sub(low).as_millis().max(1) as u64;
        low + Duration::from_millis(self.next() % span)
    }
    fn pick(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every binary of ours the workload needs, restartable.
struct Fleet {
    controller: ControllerProcess,
    engines: BTreeMap<&'static str, ControllerProcess>,
    agent: AgentProcess,
    /// Where the agent gets its intent: the simulator (pull, then push), then Odoo.
    mode: AgentMode,
    kills: BTreeMap<&'static str, u32>,
    /// Binaries found not running when their turn to be killed came.
    exited_on_their_own: Vec<String>,
}

/// Where the agent gets its intent, so a restart starts it the same way.
enum AgentMode {
    /// Pulls from the simulator.
    Pull,
    /// The simulator pushes to it.
    Push(Push),
    /// Pulls from a real Odoo (phase 5).
    Odoo(odoo_phase::OdooAgent),
}

/// What a push agent needs to start again where the simulator can find it.
struct Push {
    pki: PushPki,
    token: String,
    token_file: std::path::PathBuf,
}

impl Push {
    fn new(ctx: &TestContext) -> anyhow::Result<Self> {
        let token = api_key("chaos-push");
        let token_file = work_dir(ctx)?.join("push-token-chaos");
        std::fs::write(&token_file, &token)?;
        Ok(Self {
            pki: PushPki::generate(ctx)?,
            token,
            token_file,
        })
    }

    /// Starts the push agent (the same tag, so the same status ConfigMap and ledger) and
    /// points the simulator at its new address.
    async fn start(&self, ctx: &TestContext, sim: &SimProcess) -> anyhow::Result<AgentProcess> {
        let agent = start_push_agent(ctx, &self.pki, &self.token_file, false, "-push").await?;
        let target = json!({"url": agent.url, "token": self.token, "ca_file": self.pki.path("server-ca.pem"),
            "poll_seconds": 1});
        sim.admin("PUT", &format!("/sim/clusters/{}/push", sim.cluster), Some(target))
            .await?;
        Ok(agent.agent)
    }
}

/// Leader election as deployed: each binary's default Lease in the system namespace, the
/// only one its ServiceAccount may hold (chaos runs alone on the cluster).
fn leader_flags() -> Vec<String> {
    [
        "--leader-elect",
        "--lease-namespace",
        e2e::deploy::SYSTEM_NAMESPACE,
        "--lease-duration",
        "6s",
        "--renew-deadline",
        "4s",
        "--retry-period",
        "1s",
    ]
    .map(str::to_owned)
    .to_vec()
}

async fn engine(ctx: &TestContext, binary: &str) -> anyhow::Result<ControllerProcess> {
    let flags = leader_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    start_engine(ctx, binary, &flags).await
}

async fn controller(ctx: &TestContext) -> anyhow::Result<ControllerProcess> {
    let flags = leader_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    start_controller(ctx, &flags).await
}

fn helm_controller_pid() -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(cluster_dir().join("pids").join("helm-controller.pid"))?;
    Ok(text.trim().parse()?)
}

fn signal(pid: i32, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{name} {pid} failed");
    Ok(())
}

async fn hack_cluster(arg: &str) -> anyhow::Result<()> {
    let script = e2e::repo_root().join("hack").join("cluster.sh");
    let out = tokio::process::Command::new("bash")
        .arg(script)
        .arg(arg)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "hack/cluster.sh {arg}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

impl Fleet {
    async fn start(ctx: &TestContext, sim: &SimProcess) -> anyhow::Result<Self> {
        let mut engines = BTreeMap::new();
        for binary in ENGINES {
            engines.insert(binary, engine(ctx, binary).await?);
        }
        Ok(Self {
            controller: controller(ctx).await?,
            engines,
            agent: start_agent(ctx, sim, &sim.key_file, "", &[]).await?,
            mode: AgentMode::Pull,
            kills: BTreeMap::new(),
            exited_on_their_own: Vec::new(),
        })
    }

    /// SIGKILLs `victim`, waits `pause`, starts it again.
    async fn kill_and_restart(
        &mut self,
        ctx: &TestContext,
        sim: &SimProcess,
        victim: &'static str,
        pause: Duration,
    ) -> anyhow::Result<()> {
        if !self.is_running(victim) {
            println!("CHAOS {victim} had exited on its own before its kill");
            self.exited_on_their_own.push(victim.to_owned());
            *self.kills.entry(victim).or_default() += 1;
            return self.restart(ctx, sim, victim).await;
        }
        match victim {
            "app-controller" => self.controller.kill().await?,
            "agent" => self.agent.process.kill().await?,
            "helm-controller" => signal(helm_controller_pid()?, "KILL")?,
            engine => {
                if let Some(p) = self.engines.get_mut(engine) {
                    p.kill().await?;
                }
            }
        }
        *self.kills.entry(victim).or_default() += 1;
        tokio::time::sleep(pause).await;
        self.restart(ctx, sim, victim).await
    }

    async fn restart(&mut self, ctx: &TestContext, sim: &SimProcess, victim: &'static str) -> anyhow::Result<()> {
        match victim {
            "app-controller" => self.controller = controller(ctx).await?,
            "agent" => {
                self.agent = match &self.mode {
                    AgentMode::Push(push) => push.start(ctx, sim).await?,
                    AgentMode::Pull => start_agent(ctx, sim, &sim.key_file, "", &[]).await?,
                    AgentMode::Odoo(odoo) => odoo.start(ctx).await?,
                }
            }
            "helm-controller" => hack_cluster("start-helm-controller").await?,
            engine => {
                let started = self::engine(ctx, engine).await?;
                if let Some(name) = ENGINES.iter().find(|e| **e == engine) {
                    self.engines.insert(name, started);
                }
            }
        }
        Ok(())
    }

    fn min_kills(&self) -> u32 {
        VICTIMS
            .iter()
            .map(|v| self.kills.get(v).copied().unwrap_or_default())
            .min()
            .unwrap_or_default()
    }

    fn is_running(&mut self, victim: &str) -> bool {
        match victim {
            "app-controller" => self.controller.is_running(),
            "agent" => self.agent.process.is_running(),
            "helm-controller" => {
                helm_controller_pid().is_ok_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            }
            engine => self.engines.get_mut(engine).is_some_and(ControllerProcess::is_running),
        }
    }

    /// Binaries that exited on their own since the last call (none may: a lost Lease steps
    /// down, it does not exit): those found dead when their kill came, and those not
    /// running now.
    fn exited(&mut self) -> Vec<String> {
        let mut out = std::mem::take(&mut self.exited_on_their_own);
        for victim in VICTIMS {
            if !self.is_running(victim) {
                out.push(format!("{victim} (not running at the end of the phase)"));
            }
        }
        out
    }
}

fn app_spec(version: &str) -> Value {
    serde_json::to_value(app("x", "demo-app", version, json!({"greeting": "chaos"})).spec).unwrap_or_default()
}

fn deadline() -> String {
    (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2)).to_string()
}

/// One application's round: what to ask for next, and what to wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Install,
    Upgrade,
    Backup,
    Restore,
    Runbook,
    Done,
}

struct Round {
    app: String,
    step: Step,
    asked_at: Instant,
}

impl Round {
    fn names(&self) -> [String; 4] {
        ["up", "bk", "rs", "rb"].map(|s| format!("{}-{s}", self.app))
    }

    async fn ask(&mut self, sim: &SimProcess, ns: &str) -> anyhow::Result<()> {
        let [up, bk, rs, rb] = self.names();
        let app = self.app.as_str();
        match self.step {
            Step::Install => {
                sim.set_app(ns, app, app_spec("0.1.0")).await?;
            }
            Step::Upgrade => {
                sim.set_op(
                    ns,
                    &up,
                    json!({"type": "Upgrade", "applicationRef": {"name": app},
                    "requestId": format!("chaos-{up}"), "deadline": deadline(),
                    "upgrade": {"chartVersion": "0.2.0"}}),
                )
                .await?;
            }
            Step::Backup => {
                sim.set_op(
                    ns,
                    &bk,
                    json!({"type": "Backup", "applicationRef": {"name": app},
                    "requestId": format!("chaos-{bk}"), "deadline": deadline(), "backup": {"ttl": "2h"}}),
                )
                .await?;
            }
            Step::Restore => {
                sim.set_op(
                    ns,
                    &rs,
                    json!({"type": "Restore", "applicationRef": {"name": app},
                    "requestId": format!("chaos-{rs}"), "deadline": deadline(),
                    "restore": {"source": {"operationName": bk}}}),
                )
                .await?;
            }
            Step::Runbook => {
                let mut spec = runbook_spec(app, &format!("chaos-{rb}"), "echo reindexed");
                spec["deadline"] = json!(deadline());
                sim.set_op(ns, &rb, spec).await?;
            }
            Step::Done => {}
        }
        self.asked_at = Instant::now();
        Ok(())
    }

    /// Whether the current step is done, as Odoo sees it (the simulator's view).
    fn done(&self, view: &Value, ns: &str) -> bool {
        let [up, bk, rs, rb] = self.names();
        let status = |name: &str| summary(view, ns, name).and_then(|s| s["status"].as_str().map(str::to_owned));
        match self.step {
            Step::Install => status(&self.app).as_deref() == Some("ready"),
            Step::Upgrade => status(&up).as_deref() == Some("succeeded"),
            Step::Backup => status(&bk).as_deref() == Some("succeeded"),
            Step::Restore => status(&rs).as_deref() == Some("succeeded"),
            Step::Runbook => status(&rb).as_deref() == Some("succeeded"),
            Step::Done => true,
        }
    }

    fn advance(&mut self) {
        self.step = match self.step {
            Step::Install => Step::Upgrade,
            Step::Upgrade => Step::Backup,
            Step::Backup => Step::Restore,
            Step::Restore => Step::Runbook,
            Step::Runbook | Step::Done => Step::Done,
        };
    }
}

/// What was checked after a phase, and what was lost.
#[derive(Debug, Default)]
struct Findings {
    apps: usize,
    operations: usize,
    not_converged: Vec<String>,
    duplicate_children: Vec<String>,
    duplicate_helm_revisions: Vec<String>,
    lost_acks_or_reports: Vec<String>,
    helm_recoveries: usize,
    /// The agent's processed documents against the control plane's acknowledgements, one
    /// to one (its lost ones are among `lost_acks_or_reports` too).
    acks: AckAudit,
    /// Faults that did not test what they name (real Odoo: answers cut to idle syncs only).
    faults_missed: Vec<String>,
}

impl Findings {
    fn lost(&self) -> usize {
        self.not_converged.len()
            + self.duplicate_children.len()
            + self.duplicate_helm_revisions.len()
            + self.lost_acks_or_reports.len()
            + self.faults_missed.len()
    }
}

/// How many times helm-controller ran `unlock` on release `app` of `ns` (its log).
fn helm_recoveries(ns: &str, app: &str) -> usize {
    let log = std::fs::read_to_string(cluster_dir().join("logs").join("helm-controller.log")).unwrap_or_default();
    let release = format!("\"HelmRelease\": {{\"name\":\"{app}\",\"namespace\":\"{ns}\"}}");
    log.lines()
        .filter(|l| l.contains("running 'unlock' action") && l.contains(&release))
        .count()
}

async fn jobs_of(ctx: &TestContext, uid: &str) -> anyhow::Result<usize> {
    let jobs = ctx.api::<k8s_openapi::api::batch::v1::Job>();
    let selector = format!("vworkspace.io/operation-uid={uid}");
    Ok(jobs.list(&ListParams::default().labels(&selector)).await?.items.len())
}

async fn velero_children(kind: &str, plural: &str, uid: &str) -> anyhow::Result<usize> {
    let resource = kube::api::ApiResource {
        group: "velero.io".into(),
        version: "v1".into(),
        api_version: "velero.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(e2e::client().await?, "velero", &resource);
    let selector = format!("vworkspace.io/operation-uid={uid}");
    Ok(api.list(&ListParams::default().labels(&selector)).await?.items.len())
}

/// The kind of child an Operation makes, counted to find one run twice.
#[derive(Clone, Copy)]
enum Child {
    VeleroBackup,
    VeleroRestore,
    Job,
}

/// The live application `name` against what the workload asked: `Ready=True` for its
/// current generation, chart 0.2.0 in the spec and deployed, two Helm revisions (install
/// and upgrade; helm-controller's recoveries after a kill counted apart).
async fn check_live_app(ctx: &TestContext, helm: &[Secret], name: &str, f: &mut Findings) -> anyhow::Result<()> {
    f.apps += 1;
    let app = ctx.api::<ApplicationInstance>().get(name).await?;
    let status = app.status.as_ref();
    let current =
        status.is_some_and(|s| s.observed_generation.is_some() && s.observed_generation == app.metadata.generation);
    let ready = status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let deployed = status.and_then(|s| s.deployed_chart_version.as_deref());
    if !(current && ready) || app.spec.chart.version.as_deref() != Some("0.2.0") || deployed != Some("0.2.0") {
        f.not_converged.push(format!("{name}: {}", e2e::apps::summary(&app)));
    }
    let revisions = helm
        .iter()
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("name"))
                .is_some_and(|n| n.ends_with(name))
        })
        .count();
    // helm-controller SIGKILLed in the middle of a Helm action leaves the release
    // pending; on restart it runs `unlock` and then the action again: one more revision,
    // Flux's recovery rather than an action of ours run twice. Counted apart.
    let recovered = helm_recoveries(&ctx.namespace, name);
    f.helm_recoveries += recovered;
    if revisions > 2 + recovered || revisions < 2 {
        f.duplicate_helm_revisions.push(format!(
            "{name}: {revisions} Helm revisions, want 2 (+{recovered} after helm-controller unlocked a release it was killed on)"
        ));
    }
    Ok(())
}

/// The live Operation `name`: `Succeeded`, and exactly one child of `child`'s kind (an
/// Operation run twice would make two).
async fn check_live_op(ctx: &TestContext, name: &str, child: Option<Child>, f: &mut Findings) -> anyhow::Result<()> {
    f.operations += 1;
    let op = ctx.api::<Operation>().get(name).await?;
    if op.status.as_ref().and_then(|s| s.phase) != Some(OperationPhase::Succeeded) {
        f.not_converged.push(format!("{name}: {}", e2e::ops::summary(&op)));
    }
    let uid = op.metadata.uid.clone().unwrap_or_default();
    let (what, n) = match child {
        None => return Ok(()),
        Some(Child::VeleroBackup) => ("Velero Backups", velero_children("Backup", "backups", &uid).await?),
        Some(Child::VeleroRestore) => ("Velero Restores", velero_children("Restore", "restores", &uid).await?),
        Some(Child::Job) => ("Jobs", jobs_of(ctx, &uid).await?),
    };
    if n != 1 {
        f.duplicate_children.push(format!("{name}: {n} {what}"));
    }
    Ok(())
}

async fn check(
    ctx: &TestContext,
    sim: &SimProcess,
    rounds: &[Round],
    ledger_configmap: &str,
) -> anyhow::Result<Findings> {
    let ns = ctx.namespace.as_str();
    let mut f = Findings::default();
    let view = sim.view().await?;
    let helm = ctx
        .api::<Secret>()
        .list(&ListParams::default().labels("owner=helm"))
        .await?
        .items;
    let received = received_acks(&view);
    for round in rounds.iter().filter(|r| r.step == Step::Done) {
        check_live_app(ctx, &helm, &round.app, &mut f).await?;
        let [up, bk, rs, rb] = round.names();
        for (name, child) in [
            (&up, None),
            (&bk, Some(Child::VeleroBackup)),
            (&rs, Some(Child::VeleroRestore)),
            (&rb, Some(Child::Job)),
        ] {
            check_live_op(ctx, name, child, &mut f).await?;
        }
        for (kind, name) in [
            (ObjectKind::ApplicationInstance, &round.app),
            (ObjectKind::Operation, &up),
            (ObjectKind::Operation, &bk),
            (ObjectKind::Operation, &rs),
            (ObjectKind::Operation, &rb),
        ] {
            let changed = summary(&view, ns, name).and_then(|s| s["intent_revision"].as_u64());
            f.lost_acks_or_reports
                .extend(ack_gap(&received, kind, ns, name, changed, "the simulator"));
        }
    }
    let (gaps, acks) = reports_and_ledger_at_rest(ctx, sim, rounds, ledger_configmap).await?;
    f.lost_acks_or_reports.extend(gaps);
    f.acks = acks;
    Ok(f)
}

/// Every acknowledgement the simulator received in its current epoch.
fn received_acks(view: &Value) -> Vec<DocumentAck> {
    let epoch = view["cursor"]["epoch"].as_str().unwrap_or_default();
    serde_json::from_value::<Vec<DocumentAck>>(view["acks"].clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.epoch == epoch)
        .collect()
}

/// Protocol.md: an object's intent is acknowledged once an acknowledgement of a revision
/// at least the one that last changed it (`changed`) has an entry for it. Read from every
/// acknowledgement the control plane `who` received (`received`, its current epoch), not
/// from a summary that keeps only such ones.
fn ack_gap(
    received: &[DocumentAck],
    kind: ObjectKind,
    ns: &str,
    name: &str,
    changed: Option<u64>,
    who: &str,
) -> Option<String> {
    let acked = received
        .iter()
        .filter(|a| {
            a.objects
                .iter()
                .any(|o| o.kind == kind && o.namespace == ns && o.name == name)
        })
        .map(|a| a.revision)
        .max();
    match (acked, changed) {
        (Some(a), Some(c)) if a >= c => None,
        _ => Some(format!(
            "{name}: intent of revision {changed:?} not acknowledged to {who} (latest acknowledgement naming it: {acked:?})"
        )),
    }
}

/// At rest: what the simulator holds against what the cluster and the agent hold (see the
/// module's list). Re-read until nothing differs or [`REPORT_SETTLE`] passed.
async fn reports_and_ledger_at_rest(
    ctx: &TestContext,
    sim: &SimProcess,
    rounds: &[Round],
    ledger_configmap: &str,
) -> anyhow::Result<(Vec<String>, AckAudit)> {
    let deadline = Instant::now() + REPORT_SETTLE;
    loop {
        let view = sim.view().await?;
        let mut gaps = Vec::new();
        let now = jiff::Timestamp::now();
        let (apps, ops) = (ctx.api::<ApplicationInstance>(), ctx.api::<Operation>());
        let reported = |live: &ObjectReport| {
            e2e::agent::report(&view, live.kind.as_str(), &live.namespace, &live.name)
                .map(|r| serde_json::from_value::<ObjectReport>(r.clone()))
        };
        for round in rounds.iter().filter(|r| r.step == Step::Done) {
            let live = application_report(&apps.get(&round.app).await?, now);
            gaps.extend(report_gap(reported(&live), &live, "the simulator"));
            for name in round.names() {
                let live = operation_report(&ops.get(&name).await?, now);
                gaps.extend(report_gap(reported(&live), &live, "the simulator"));
            }
        }
        let latest: Option<Cursor> = serde_json::from_value(view["cursor"].clone()).ok();
        let received: Vec<DocumentAck> = serde_json::from_value(view["acks"].clone()).unwrap_or_default();
        let ledger = ledger(ledger_configmap).await?;
        let (acks, lost) = acks_one_to_one(
            ledger.as_ref(),
            &received,
            odoo_sim::state::MAX_ACKS_KEPT,
            "the simulator",
        );
        gaps.extend(lost);
        gaps.extend(ledger_gaps(latest, &received, ledger, "the simulator"));
        if gaps.is_empty() || Instant::now() >= deadline {
            return Ok((gaps, acks));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// How the latest report the control plane `who` holds of `live`'s object (`reported`)
/// differs from `live`, the report the agent would send of the object now; `None` when it
/// is the same.
fn report_gap(
    reported: Option<Result<ObjectReport, serde_json::Error>>,
    live: &ObjectReport,
    who: &str,
) -> Option<String> {
    match reported {
        None => Some(format!("{}: {who} has no report of it", live.name)),
        Some(Err(e)) => Some(format!("{}: {who}'s report does not parse: {e}", live.name)),
        Some(Ok(r)) if same_content(&r, live) => None,
        Some(Ok(r)) => Some(format!(
            "{}: {who}'s latest report is not the cluster's state: reported {}; live {}",
            live.name,
            brief(&r),
            brief(live)
        )),
    }
}

fn brief(r: &ObjectReport) -> String {
    format!(
        "{:?}, generation {:?} (observed {:?}), resourceVersion {:?}, deployed {:?}, phase {:?}",
        r.state, r.generation, r.observed_generation, r.resource_version, r.deployed_chart_version, r.phase
    )
}

/// The agent's durable ledger (`ledger.json` of its status ConfigMap), if recorded.
async fn ledger(configmap: &str) -> anyhow::Result<Option<LedgerRecord>> {
    let cm = Api::<ConfigMap>::namespaced(e2e::client().await?, e2e::deploy::SYSTEM_NAMESPACE)
        .get_opt(configmap)
        .await?;
    let stored = cm.and_then(|c| c.data).and_then(|mut d| d.remove("ledger.json"));
    stored.map(|s| serde_json::from_str(&s)).transpose().map_err(Into::into)
}

/// The agent's ledger against the control plane `who`: it knows `who`'s latest document
/// (`latest`), and every acknowledgement it still holds as undelivered is among `received`.
fn ledger_gaps(
    latest: Option<Cursor>,
    received: &[DocumentAck],
    ledger: Option<LedgerRecord>,
    who: &str,
) -> Vec<String> {
    let Some(ledger) = ledger else {
        return vec!["the agent has recorded no ledger".to_owned()];
    };
    let mut gaps = Vec::new();
    if ledger.known != latest {
        gaps.push(format!(
            "the agent's ledger knows document {:?}, {who}'s latest is {latest:?}",
            ledger.known
        ));
    }
    for held in &ledger.acks {
        if !received
            .iter()
            .any(|r| r.epoch == held.epoch && r.revision == held.revision)
        {
            gaps.push(format!(
                "the acknowledgement of {}/{} is in the agent's ledger but never reached {who}",
                held.epoch, held.revision
            ));
        }
    }
    gaps
}

/// Every document the agent processed (its ledger's history) against every acknowledgement
/// the control plane `who` holds (`stored`, all epochs; it keeps `retention`): one line per
/// acknowledgement lost, and one when nothing could be compared (a check that compared
/// nothing would pass whatever was lost).
fn acks_one_to_one(
    ledger: Option<&LedgerRecord>,
    stored: &[DocumentAck],
    retention: usize,
    who: &str,
) -> (AckAudit, Vec<String>) {
    let processed = ledger.map(|l| l.processed.as_slice()).unwrap_or_default();
    let acks = audit(processed, stored, retention);
    let mut lines: Vec<String> = acks.lost.iter().map(|l| format!("{l} ({who})")).collect();
    if acks.compared == 0 {
        lines.push(format!(
            "no processed document of the agent's ledger ({}) could be compared with {who}'s {} acknowledgements",
            processed.len(),
            stored.len()
        ));
    }
    (acks, lines)
}

/// Runs `rounds` to the end while `tick` runs between polls (kills, outages).
async fn drive(
    sim: &SimProcess,
    ns: &str,
    rounds: &mut [Round],
    mut tick: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Vec<String>> {
    let mut stuck = Vec::new();
    loop {
        let keep_going = tick().await?;
        let view = match sim.view().await {
            Ok(v) => v,
            Err(_) => {
                // The simulator is down (an outage phase): nothing to read.
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let mut all_done = true;
        for round in rounds.iter_mut() {
            if round.step == Step::Done {
                continue;
            }
            all_done = false;
            if round.done(&view, ns) {
                round.advance();
                if round.step != Step::Done {
                    round.ask(sim, ns).await?;
                }
            } else if round.asked_at.elapsed() > STEP_TIMEOUT {
                stuck.push(format!("{} stuck at {:?}", round.app, round.step));
                round.step = Step::Done;
            }
        }
        if all_done && !keep_going {
            return Ok(stuck);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn new_rounds(sim: &SimProcess, ns: &str, first: usize, count: usize) -> anyhow::Result<Vec<Round>> {
    let mut rounds = Vec::new();
    for i in first..first + count {
        let mut r = Round {
            app: format!("app{i}"),
            step: Step::Install,
            asked_at: Instant::now(),
        };
        r.ask(sim, ns).await?;
        rounds.push(r);
    }
    Ok(rounds)
}

/// Rounds of the workload, two at a time, with a kill (of `victim(rng)`) every 1–5 s, until
/// `enough(fleet)` once a round ended. Returns every round run.
#[allow(clippy::too_many_arguments)] // the phase's whole context, passed once
async fn kill_phase(
    ctx: &TestContext,
    sim: &SimProcess,
    fleet: &mut Fleet,
    rng: &mut Rng,
    next_round: &mut usize,
    label: &str,
    mut drop_ack_at: Option<Duration>,
    enough: impl Fn(&Fleet) -> bool,
    mut victim: impl FnMut(&mut Rng) -> &'static str,
) -> anyhow::Result<Vec<Round>> {
    let started = Instant::now();
    let mut next_kill = Instant::now() + rng.between(Duration::from_secs(1), Duration::from_secs(5));
    let mut all = Vec::new();
    // After the sabotage, when the workload's application was last declared again.
    let mut touched: Option<Instant> = None;
    while all.is_empty() || !enough(fleet) {
        let mut rounds = new_rounds(sim, &ctx.namespace, *next_round, 2).await?;
        *next_round += 2;
        let first_app = rounds.first().map(|r| r.app.clone()).unwrap_or_default();
        let stuck = drive(sim, &ctx.namespace, &mut rounds, async || {
            if let Some(after) = drop_ack_at
                && started.elapsed() >= after
            {
                // Broken on purpose (CHAOS_DROP_ACK_AFTER): the next acknowledgement the
                // simulator receives is confirmed and not stored.
                sim.admin("PUT", "/sim/fault", Some(json!({"mode": "drop_ack"})))
                    .await?;
                println!(
                    "CHAOS sabotage at {:.1?}: the simulator drops the next acknowledgement it receives",
                    started.elapsed()
                );
                drop_ack_at = None;
                touched = Some(Instant::now());
            }
            // The simulator's status of an object waits for an acknowledgement of its
            // revision or a later one: so that the rounds do not wait on the objects of the
            // lost one, the first round's application is declared again, unchanged, every
            // 10 s; the later documents' entries (`unchanged`) then satisfy the per-object
            // check, as any later document would, and only the one-to-one count sees it.
            if let Some(at) = touched
                && at.elapsed() >= Duration::from_secs(10)
            {
                sim.set_app(&ctx.namespace, &first_app, app_spec("0.1.0")).await?;
                touched = Some(Instant::now());
            }
            if Instant::now() >= next_kill && !enough(fleet) {
                let victim = victim(rng);
                let pause = rng.between(Duration::from_millis(200), Duration::from_secs(2));
                println!("CHAOS kill {victim} at {:.1?}{label}", started.elapsed());
                fleet.kill_and_restart(ctx, sim, victim, pause).await?;
                next_kill = Instant::now() + rng.between(Duration::from_secs(1), Duration::from_secs(5));
            }
            Ok(false)
        })
        .await?;
        anyhow::ensure!(stuck.is_empty(), "stuck under kills{label}: {stuck:?}");
        all.extend(rounds);
    }
    Ok(all)
}

fn report(phase: &str, took: Duration, f: &Findings, extra: &str) {
    println!(
        "CHAOS {phase}: {took:.0?}, {} apps, {} operations; not converged {}, duplicate children {}, duplicate Helm revisions {} (releases recovered by helm-controller after a kill: {}), lost acks/reports {}; acknowledgements compared one to one {} (older than the control plane holds, not compared: {}), lost acknowledgements {} {extra}",
        f.apps,
        f.operations,
        f.not_converged.len(),
        f.duplicate_children.len(),
        f.duplicate_helm_revisions.len(),
        f.helm_recoveries,
        f.lost_acks_or_reports.len(),
        f.acks.compared,
        f.acks.outside_retention,
        f.acks.lost.len()
    );
    for line in f
        .not_converged
        .iter()
        .chain(&f.duplicate_children)
        .chain(&f.duplicate_helm_revisions)
        .chain(&f.lost_acks_or_reports)
        .chain(&f.faults_missed)
    {
        println!("CHAOS   {line}");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seed = env_u64("CHAOS_SEED", 18);
    let kills_each = u32::try_from(env_u64("CHAOS_KILLS", 10))?;
    let api_outage = Duration::from_secs(env_u64("CHAOS_API_OUTAGE", 120));
    let cp_outage = Duration::from_secs(env_u64("CHAOS_CP_OUTAGE", 300));
    println!(
        "CHAOS seed {seed}, {kills_each} kills per binary, outages {api_outage:?} (API server), {cp_outage:?} (control plane)"
    );
    let ctx = TestContext::new("chaos").await?;
    let ns = ctx.namespace.clone();
    let mut sim = SimProcess::start(&ctx).await?;
    let mut fleet = Fleet::start(&ctx, &sim).await?;
    let mut rng = Rng(seed.max(1));

    let phases = phases();
    println!("CHAOS phases: {phases:?}");
    let mut next_round = 0;
    let mut lost = 0;

    if phases.contains(&"kills") {
        // Phase 1: kills during install, upgrade, backup and restore, two rounds at a time,
        // until every binary was killed `kills_each` times.
        let started = Instant::now();
        let all_rounds = kill_phase(
            &ctx,
            &sim,
            &mut fleet,
            &mut rng,
            &mut next_round,
            "",
            std::env::var("CHAOS_DROP_ACK_AFTER")
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Duration::from_secs),
            |fleet| fleet.min_kills() >= kills_each,
            |rng| VICTIMS[rng.pick(VICTIMS.len())],
        )
        .await?;
        let findings = check(&ctx, &sim, &all_rounds, &fleet.agent.status_configmap.clone()).await?;
        let exited = fleet.exited();
        report(
            "kills",
            started.elapsed(),
            &findings,
            &format!(
                "(kills: {:?}; binaries that exited on their own: {exited:?})",
                fleet.kills
            ),
        );
        lost += findings.lost() + exited.len();
    }

    if phases.contains(&"api") {
        // Phase 2: the API server stopped for `api_outage` while a round runs.
        let started = Instant::now();
        let mut rounds = new_rounds(&sim, &ns, next_round, 2).await?;
        next_round += 2;
        let apiserver: i32 = std::fs::read_to_string(cluster_dir().join("pids").join("kube-apiserver.pid"))?
            .trim()
            .parse()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        signal(apiserver, "STOP")?;
        println!("CHAOS API server stopped");
        tokio::time::sleep(api_outage).await;
        signal(apiserver, "CONT")?;
        println!("CHAOS API server resumed after {api_outage:?}");
        let stuck = drive(&sim, &ns, &mut rounds, async || Ok(false)).await?;
        anyhow::ensure!(stuck.is_empty(), "stuck after the API server outage: {stuck:?}");
        let exited = fleet.exited();
        let findings = check(&ctx, &sim, &rounds, &fleet.agent.status_configmap.clone()).await?;
        report(
            "API server outage",
            started.elapsed(),
            &findings,
            &format!("(binaries that exited: {exited:?})"),
        );
        lost += findings.lost() + exited.len();
    }

    if phases.contains(&"control-plane") {
        // Phase 3: the control plane (the simulator) stopped for `cp_outage` while the cluster
        // changes: the rounds asked for before the stop run on; their reports wait.
        let started = Instant::now();
        let mut rounds = new_rounds(&sim, &ns, next_round, 2).await?;
        next_round += 2;
        tokio::time::sleep(Duration::from_secs(3)).await;
        sim.stop().await?;
        println!("CHAOS control plane stopped");
        tokio::time::sleep(cp_outage).await;
        sim.restart().await?;
        println!("CHAOS control plane back after {cp_outage:?}");
        // The steps' timeouts count from now: nothing could be reported during the outage.
        for round in &mut rounds {
            round.asked_at = Instant::now();
        }
        let stuck = drive(&sim, &ns, &mut rounds, async || Ok(false)).await?;
        anyhow::ensure!(stuck.is_empty(), "stuck after the control-plane outage: {stuck:?}");
        let exited = fleet.exited();
        let findings = check(&ctx, &sim, &rounds, &fleet.agent.status_configmap.clone()).await?;
        report(
            "control-plane outage",
            started.elapsed(),
            &findings,
            &format!("(binaries that exited: {exited:?})"),
        );
        lost += findings.lost() + exited.len();
    }

    if phases.contains(&"push") {
        // Phase 4: the agent in push mode (the simulator pushes documents and polls status),
        // killed with the rest until the push agent alone was killed `kills_each` times.
        let started = Instant::now();
        fleet.agent.process.kill().await?;
        let push = Push::new(&ctx)?;
        fleet.agent = push.start(&ctx, &sim).await?;
        fleet.mode = AgentMode::Push(push);
        let kills_before = fleet.kills.get("agent").copied().unwrap_or_default();
        let push_kills = |fleet: &Fleet| fleet.kills.get("agent").copied().unwrap_or_default() - kills_before;
        let push_rounds = kill_phase(
            &ctx,
            &sim,
            &mut fleet,
            &mut rng,
            &mut next_round,
            " (push mode)",
            None,
            |fleet| push_kills(fleet) >= kills_each,
            // Every other kill is the push agent's, the rest as before.
            |rng| {
                if rng.pick(2) == 0 {
                    "agent"
                } else {
                    VICTIMS[rng.pick(VICTIMS.len())]
                }
            },
        )
        .await?;
        let findings = check(&ctx, &sim, &push_rounds, &fleet.agent.status_configmap.clone()).await?;
        let exited = fleet.exited();
        report(
            "push-mode kills",
            started.elapsed(),
            &findings,
            &format!(
                "(push agent killed {} times; binaries that exited on their own: {exited:?})",
                push_kills(&fleet)
            ),
        );
        lost += findings.lost() + exited.len();
    }

    // Phase 5: the control plane for real (Odoo 19, the reference addon, PostgreSQL).
    if phases.contains(&"odoo") {
        let started = Instant::now();
        let faults_each = u32::try_from(env_u64("CHAOS_ODOO_FAULTS", 5))?;
        let (findings, faults) = odoo_phase::run(&ctx, &sim, &mut fleet, &mut rng, faults_each).await?;
        let exited = fleet.exited();
        report(
            "real Odoo",
            started.elapsed(),
            &findings,
            &format!("({faults}; binaries that exited on their own: {exited:?})"),
        );
        lost += findings.lost() + exited.len();
    }

    println!("CHAOS total lost: {lost}");
    anyhow::ensure!(lost == 0, "chaos lost {lost} things; see the CHAOS lines");
    Ok(())
}
