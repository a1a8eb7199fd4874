//! The runtime's reconcile against a scripted API server (`test-support`), with a fake
//! driver that counts its calls: each test lists every request one reconcile makes, in
//! order, with the answers, and checks what was sent. An unscripted request fails the test.

use std::sync::Mutex;

use anyhow::{Context as _, ensure};
use http::Method;
use operations::Outcome;
use serde_json::{Value, json};
use test_support::{ApiServer, Seen, Step};

use super::*;

const FIELD_MANAGER: &str = "vworkspace-backup-engine";
const OPS_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/operations";
const OP_STATUS_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/operations/wiki-backup-1/status";
const APP_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/applicationinstances/wiki";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

/// A driver that refuses or reports what it is told, and records what it was given.
struct Fake {
    refusal: Option<Outcome>,
    outcome: Outcome,
    /// The resourceVersion of the Operation each `drive` got.
    driven: Arc<Mutex<Vec<Option<String>>>>,
    validated: Arc<AtomicUsize>,
    /// What [`Driver::reads_application_once_started`] answers.
    reads_application: bool,
    /// What [`Driver::claim_outcome`] answers.
    claims: Option<Outcome>,
    /// `drive` fails with an API error of this code instead of reporting.
    fails_with: Option<u16>,
}

impl Fake {
    fn reporting(outcome: Outcome) -> Self {
        Self {
            refusal: None,
            outcome,
            driven: Arc::default(),
            validated: Arc::default(),
            reads_application: true,
            claims: None,
            fails_with: None,
        }
    }

    fn driven(&self) -> Vec<Option<String>> {
        self.driven.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

impl Driver for Fake {
    fn op_type(&self) -> OperationType {
        OperationType::Backup
    }

    fn reads_application_once_started(&self) -> bool {
        self.reads_application
    }

    async fn validate(&self, _cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        self.validated.fetch_add(1, Ordering::SeqCst);
        Ok(self.refusal.clone())
    }

    fn claim_outcome(&self, _cx: &Cx) -> Option<Outcome> {
        self.claims.clone()
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        if let Ok(mut driven) = self.driven.lock() {
            driven.push(cx.op.metadata.resource_version.clone());
        }
        match self.fails_with {
            Some(code) => Err(api_error(code)),
            None => Ok(self.outcome.clone()),
        }
    }
}

fn api_error(code: u16) -> DriverError {
    DriverError::Kube(kube::Error::Api(Box::new(kube::core::Status {
        code,
        reason: "Forbidden".into(),
        message: "jobs \"x\" is forbidden: exceeded quota: team-a, requested: count/jobs.batch=1".into(),
        ..Default::default()
    })))
}

fn running(message: &str) -> Outcome {
    Outcome::Running {
        message: message.into(),
        children: Vec::new(),
    }
}

/// A runtime context for `driver` on the scripted client; every namespace but the system
/// ones is allowed, or only `allowed`.
fn context(driver: Fake, allowed: Option<&str>) -> anyhow::Result<(Arc<Context<Fake>>, ApiServer)> {
    let (client, server) = test_support::pair();
    let settings = EngineSettings::for_tests(&client, allowed)?;
    let ctx = Context {
        driver,
        client,
        cached_children: ChildCache::default(),
        metrics: settings.metrics.controller(controller_name(OperationType::Backup)),
        settings,
        failures: RetryBackoff::new(Duration::from_secs(1), Duration::from_secs(300)),
        fast_lane: Mutex::default(),
    };
    Ok((Arc::new(ctx), server))
}

/// A Backup Operation `team-a/wiki-backup-1` for the application `wiki`, at `resource_version`.
fn operation(resource_version: &str, status: Option<OperationStatus>) -> anyhow::Result<Operation> {
    let mut op: Operation = serde_json::from_value(json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation",
        "metadata": {"name": "wiki-backup-1", "namespace": "team-a", "uid": "op-uid", "generation": 1},
        "spec": {"type": "Backup", "applicationRef": {"name": "wiki"}, "requestId": "req-1"},
    }))?;
    op.metadata.resource_version = Some(resource_version.into());
    op.status = status;
    Ok(op)
}

fn application() -> Value {
    json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": "wiki", "namespace": "team-a", "uid": "app-uid", "generation": 1},
        "spec": {"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}}},
    })
}

fn list(ops: &[&Operation]) -> anyhow::Result<Value> {
    Ok(json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "OperationList",
        "metadata": {"resourceVersion": "50"},
        "items": ops.iter().map(serde_json::to_value).collect::<Result<Vec<_>, _>>()?,
    }))
}

/// The application's Operations (the one reconciled among them) and the application.
fn reads(op: &Operation) -> anyhow::Result<Vec<Step>> {
    Ok(vec![
        Step::get(OPS_PATH, list(&[op])?),
        Step::get(APP_PATH, application()),
    ])
}

/// What a started Operation reads: only the application (its siblings no longer matter).
fn reads_once_started() -> Vec<Step> {
    vec![Step::get(APP_PATH, application())]
}

async fn reconcile_once(
    server: &mut ApiServer,
    ctx: &Arc<Context<Fake>>,
    op: &Operation,
    script: Vec<Step>,
) -> anyhow::Result<(Result<Action, DriverError>, Vec<Seen>)> {
    let guard = Arc::new(DeserializeGuard(Ok(op.clone())));
    server.run(script, reconcile(guard, ctx.clone())).await
}

/// A status as written at `second` for `outcome` on top of `current`.
fn status_at(current: Option<&OperationStatus>, outcome: Outcome, second: i64) -> anyhow::Result<OperationStatus> {
    Ok(status::next_status(
        current,
        Some(1),
        outcome,
        Timestamp::from_second(second)?,
    ))
}

/// The status write (answered with `written`) and the Event that follows it.
fn status_written_with_event(written: &Operation) -> anyhow::Result<[Step; 2]> {
    Ok([
        Step::ok(Method::PATCH, OP_STATUS_PATH, serde_json::to_value(written)?),
        Step::echo(Method::POST, EVENTS_PATH),
    ])
}

fn phase(write: &Seen) -> anyhow::Result<&str> {
    write.body()?["status"]["phase"].as_str().context("no status.phase")
}

/// Starting is a claim: the Running write carries the resourceVersion the decision was
/// made on, it is a forced apply with the engine's field manager, one `Started` Event
/// follows, and the driver acts on the Operation as the claim returned it. Its progress
/// is then written conditional on the claimed copy's resourceVersion.
#[tokio::test]
async fn start_claims_with_the_resource_version_then_drives() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Fake::reporting(running("Backup InProgress")), None)?;
    let op = operation("41", None)?;
    let claimed = operation("42", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
    let mut script = reads(&op)?;
    script.extend(status_written_with_event(&claimed)?);
    script.push(Step::ok(Method::PATCH, OP_STATUS_PATH, serde_json::to_value(&claimed)?));
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(
        matches!(&result, Ok(a) if *a == Action::requeue(Duration::from_secs(10))),
        "{result:?}"
    );

    let selector = seen[0].query("fieldSelector").unwrap_or_default();
    ensure!(
        selector.contains("spec.applicationRef.name") && selector.ends_with("wiki"),
        "{selector}"
    );

    let claim = &seen[2];
    ensure!(claim.query("fieldManager") == Some(FIELD_MANAGER) && claim.query("force") == Some("true"));
    let body = claim.body()?;
    ensure!(body["metadata"] == json!({"resourceVersion": "41"}), "{body}");
    ensure!(
        phase(claim)? == "Running" && body["status"]["startTime"].is_string(),
        "{body}"
    );

    let event = seen[3].body()?;
    ensure!(event["type"] == "Normal" && event["reason"] == "Started", "{event}");
    ensure!(event["action"] == "Backup" && event["regarding"]["name"] == "wiki-backup-1");

    ensure!(ctx.driver.validated.load(Ordering::SeqCst) == 1);
    ensure!(
        ctx.driver.driven() == vec![Some("42".to_owned())],
        "the driver acts on the claimed copy"
    );

    let progress = &seen[4];
    let body = progress.body()?;
    ensure!(
        body["metadata"] == json!({"resourceVersion": "42"}),
        "progress is conditional on the claimed copy: {body}"
    );
    ensure!(
        body["status"]["conditions"][0]["message"] == "Backup InProgress",
        "{body}"
    );
    Ok(())
}

/// A driver that can tell what it will report once its children exist (the runbook engine:
/// a Job just created) has the claim write it: one status write to start, none after the
/// children's creation.
#[tokio::test]
async fn a_claim_that_says_what_the_driver_will_report_spares_the_next_write() -> anyhow::Result<()> {
    let job = api::ObjectReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: "wiki-backup-1".into(),
        namespace: Some("team-a".into()),
    };
    let expected = Outcome::Running {
        message: "Job team-a/wiki-backup-1 is running".into(),
        children: vec![job],
    };
    let mut fake = Fake::reporting(expected.clone());
    fake.claims = Some(expected.clone());
    let (ctx, mut server) = context(fake, None)?;
    let op = operation("41", None)?;
    let claimed = operation("42", Some(status_at(None, expected, 1_800_000_000)?))?;
    let mut script = reads(&op)?;
    script.extend(status_written_with_event(&claimed)?);
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(result.is_ok(), "{result:?}");
    ensure!(seen.iter().filter(|s| s.is_write()).count() == 2, "{seen:?}");
    let body = seen[2].body()?;
    ensure!(body["metadata"] == json!({"resourceVersion": "41"}), "{body}");
    ensure!(
        body["status"]["conditions"][0]["message"] == "Job team-a/wiki-backup-1 is running"
            && body["status"]["children"][0]["name"] == "wiki-backup-1",
        "{body}"
    );
    ensure!(ctx.driver.driven() == vec![Some("42".to_owned())]);
    Ok(())
}

/// A started Operation whose driver is refused for good (here a quota) says so while the
/// reconcile is retried; an error that passes by itself (a conflict, a server error) is
/// only retried, without a write.
#[tokio::test]
async fn a_lasting_refusal_is_shown_while_it_is_retried() -> anyhow::Result<()> {
    let started = status_at(None, running("Starting"), 1_800_000_000)?;
    let op = operation("43", Some(started))?;

    let mut fake = Fake::reporting(running("unused"));
    fake.fails_with = Some(403);
    let (ctx, mut server) = context(fake, None)?;
    let mut script = reads_once_started();
    script.push(Step::ok(Method::PATCH, OP_STATUS_PATH, serde_json::to_value(&op)?));
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(
        matches!(&result, Err(DriverError::Kube(kube::Error::Api(s))) if s.code == 403),
        "{result:?}"
    );
    let body = seen[1].body()?;
    ensure!(body["metadata"]["resourceVersion"] == "43", "{body}");
    let message = body["status"]["conditions"][0]["message"].as_str().unwrap_or_default();
    ensure!(
        phase(&seen[1])? == "Running"
            && message.starts_with(
                "the Kubernetes API refused a request (403 Forbidden): jobs \"x\" is forbidden: exceeded quota"
            ),
        "{message}"
    );

    for code in [409, 429, 500, 503] {
        let mut fake = Fake::reporting(running("unused"));
        fake.fails_with = Some(code);
        let (ctx, mut server) = context(fake, None)?;
        let (result, seen) = reconcile_once(&mut server, &ctx, &op, reads_once_started()).await?;
        ensure!(result.is_err(), "{code}: {result:?}");
        ensure!(seen.iter().all(|s| !s.is_write()), "{code}: {seen:?}");
    }
    Ok(())
}

/// Another engine (or an older copy of this one) claimed first: the claim gets 409 Conflict,
/// the reconcile fails without driving, without an Event and without another write, and the
/// error policy backs off. The next reconcile, on the fresh (started) copy, does not claim
/// again and, with nothing new to report, writes nothing.
#[tokio::test]
async fn a_lost_claim_backs_off_without_acting() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Fake::reporting(running("Starting")), None)?;
    let op = operation("41", None)?;
    let mut script = reads(&op)?;
    script.push(Step::fail(Method::PATCH, OP_STATUS_PATH, 409, "Conflict"));
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    let err = result.err().context("a lost claim fails the reconcile")?;
    ensure!(
        matches!(&err, DriverError::Kube(kube::Error::Api(s)) if s.is_conflict()),
        "{err}"
    );
    ensure!(seen[2].body()?["metadata"]["resourceVersion"] == "41");
    ensure!(ctx.driver.driven().is_empty(), "nothing was driven");

    let guard = Arc::new(DeserializeGuard(Ok(op.clone())));
    let first = error_policy(guard.clone(), &err, ctx.clone());
    let second = error_policy(guard, &err, ctx.clone());
    ensure!(first == Action::requeue(Duration::from_secs(1)), "{first:?}");
    ensure!(second == Action::requeue(Duration::from_secs(2)), "{second:?}");

    // The winner's write, as the watch delivers it.
    let fresh = operation("42", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
    let (result, seen) = reconcile_once(&mut server, &ctx, &fresh, reads_once_started()).await?;
    ensure!(result.is_ok(), "{result:?}");
    ensure!(seen.iter().all(|s| !s.is_write()), "{seen:?}");
    ensure!(ctx.driver.driven() == vec![Some("42".to_owned())]);
    ensure!(
        ctx.driver.validated.load(Ordering::SeqCst) == 1,
        "a started Operation is not validated again"
    );
    Ok(())
}

/// A running Operation whose driver reports what the status already says: one read (the
/// application; the siblings are not listed once started), no write, no Event, the driver's
/// poll interval.
#[tokio::test]
async fn at_rest_a_running_operation_only_reads() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Fake::reporting(running("Backup InProgress")), None)?;
    let started = status_at(None, running("Starting"), 1_800_000_000)?;
    let status = status_at(Some(&started), running("Backup InProgress"), 1_800_000_060)?;
    let op = operation("43", Some(status))?;
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, reads_once_started()).await?;
    ensure!(
        matches!(&result, Ok(a) if *a == Action::requeue(Duration::from_secs(10))),
        "{result:?}"
    );
    ensure!(seen.len() == 1 && seen.iter().all(|s| !s.is_write()), "{seen:?}");
    Ok(())
}

/// The end is written once, with one Event; a terminal Operation is then never read again.
#[tokio::test]
async fn the_end_is_written_once_with_one_event() -> anyhow::Result<()> {
    let succeeded = Outcome::Succeeded {
        result: "Backup Completed".into(),
        children: Vec::new(),
        report: Default::default(),
    };
    let (ctx, mut server) = context(Fake::reporting(succeeded), None)?;
    let started = status_at(None, running("Starting"), 1_800_000_000)?;
    let op = operation("43", Some(started))?;
    let mut script = reads_once_started();
    script.extend(status_written_with_event(&op)?);
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(phase(&seen[1])? == "Succeeded");
    // The end is conditional on the version it was decided on.
    ensure!(seen[1].body()?["metadata"]["resourceVersion"] == "43");
    let event = seen[2].body()?;
    ensure!(event["type"] == "Normal" && event["reason"] == "Succeeded" && event["note"] == "Backup Completed");

    let written: OperationStatus = serde_json::from_value(seen[1].body()?["status"].clone())?;
    let done = operation("44", Some(written))?;
    let (result, seen) = reconcile_once(&mut server, &ctx, &done, Vec::new()).await?;
    ensure!(
        matches!(&result, Ok(a) if *a == Action::await_change()) && seen.is_empty(),
        "{result:?} {seen:?}"
    );
    Ok(())
}

/// A status decided on a stale copy loses with a conflict: an end (our own end is not in the
/// cache yet) gets no second Event, a Running write (an end written meanwhile) does not turn
/// the ended Operation back to Running; no failure counted, a look again soon.
#[tokio::test]
async fn a_status_decided_on_a_stale_copy_is_not_written() -> anyhow::Result<()> {
    let ended = Outcome::failed("BackoffLimitExceeded", "Job wiki-backup-1 failed");
    for outcome in [ended, running("Backup InProgress")] {
        let (ctx, mut server) = context(Fake::reporting(outcome.clone()), None)?;
        let op = operation("43", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
        let mut script = reads_once_started();
        script.push(Step::fail(Method::PATCH, OP_STATUS_PATH, 409, "Conflict"));
        let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
        ensure!(
            matches!(&result, Ok(a) if *a == Action::requeue(STALE_END_RECHECK)),
            "{outcome:?}: {result:?}"
        );
        ensure!(seen.len() == 2, "{outcome:?}: nothing after the lost write: {seen:?}");
        ensure!(
            seen[1].body()?["metadata"] == json!({"resourceVersion": "43"}),
            "{outcome:?}: {seen:?}"
        );
    }
    Ok(())
}

/// A store holding `op`, as the Operation watch would.
fn store_of(op: &Operation) -> Store<DeserializeGuard<Operation>> {
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Apply(DeserializeGuard(Ok(op.clone()))));
    reader
}

/// The fast lane: a child's event that ends a started Operation writes the end at once,
/// conditional on the cached copy's resourceVersion, with its Event; nothing else is read.
#[tokio::test]
async fn the_fast_lane_writes_an_end_from_the_caches() -> anyhow::Result<()> {
    let mut driver = Fake::reporting(Outcome::failed("BackoffLimitExceeded", "Job wiki-backup-1 failed"));
    driver.reads_application = false;
    let (ctx, mut server) = context(driver, None)?;
    let op = operation("43", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
    let store = store_of(&op);
    let op_ref = ObjectRef::from_obj(&DeserializeGuard(Ok(op.clone())));
    let script = status_written_with_event(&op)?.to_vec();
    let (result, seen) = server.run(script, end_from_child_event(&op_ref, &store, &ctx)).await?;
    ensure!(matches!(result, Ok(FastEnd::Ended)), "{result:?}");
    ensure!(phase(&seen[0])? == "Failed", "{seen:?}");
    ensure!(seen[0].body()?["metadata"] == json!({"resourceVersion": "43"}));
    ensure!(seen[1].body()?["reason"] == "Failed");

    // Lost to a newer version: nothing else written, the caller looks again.
    let script = vec![Step::fail(Method::PATCH, OP_STATUS_PATH, 409, "Conflict")];
    let (result, seen) = server.run(script, end_from_child_event(&op_ref, &store, &ctx)).await?;
    ensure!(matches!(result, Ok(FastEnd::Stale)), "{result:?}");
    ensure!(seen.len() == 1, "{seen:?}");
    Ok(())
}

/// The fast lane leaves to the work queue what does not end a started Operation: progress,
/// and an Operation not started yet (its start needs the queue's fresh sibling list).
#[tokio::test]
async fn the_fast_lane_writes_nothing_but_ends_of_started_operations() -> anyhow::Result<()> {
    let mut driver = Fake::reporting(running("Job running"));
    driver.reads_application = false;
    let (ctx, mut server) = context(driver, None)?;
    let started = operation("43", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
    let op_ref = ObjectRef::from_obj(&DeserializeGuard(Ok(started.clone())));
    let (result, seen) = server
        .run(Vec::new(), end_from_child_event(&op_ref, &store_of(&started), &ctx))
        .await?;
    ensure!(
        matches!(result, Ok(FastEnd::Left)) && seen.is_empty(),
        "{result:?} {seen:?}"
    );

    let mut driver = Fake::reporting(Outcome::failed("BackoffLimitExceeded", "Job wiki-backup-1 failed"));
    driver.reads_application = false;
    let (ctx, mut server) = context(driver, None)?;
    let pending = operation("41", None)?;
    let (result, seen) = server
        .run(Vec::new(), end_from_child_event(&op_ref, &store_of(&pending), &ctx))
        .await?;
    ensure!(
        matches!(result, Ok(FastEnd::Left)) && seen.is_empty(),
        "{result:?} {seen:?}"
    );
    ensure!(ctx.driver.driven().is_empty(), "not driven before the start");
    Ok(())
}

/// The work queue, woken by the child event the fast lane is ending the Operation from,
/// leaves the end to it (writing it too would only lose with a conflict) and looks again
/// soon; once the fast lane is done with it, the work queue writes an end itself.
#[tokio::test]
async fn the_work_queue_leaves_an_end_to_the_fast_lane_deciding_it() -> anyhow::Result<()> {
    let mut driver = Fake::reporting(Outcome::failed("BackoffLimitExceeded", "Job wiki-backup-1 failed"));
    driver.reads_application = false;
    let (ctx, mut server) = context(driver, None)?;
    let op = operation("43", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
    let op_ref = ObjectRef::from_obj(&DeserializeGuard(Ok(op.clone())));
    ctx.fast_lane_handles(&op_ref, true);
    ctx.fast_lane_handles(&op_ref, true);
    ctx.fast_lane_handles(&op_ref, false);
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, Vec::new()).await?;
    ensure!(
        matches!(&result, Ok(a) if *a == Action::requeue(STALE_END_RECHECK)) && seen.is_empty(),
        "{result:?} {seen:?}"
    );

    ctx.fast_lane_handles(&op_ref, false);
    let script = status_written_with_event(&op)?.to_vec();
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(phase(&seen[0])? == "Failed", "{seen:?}");
    Ok(())
}

/// A started Operation whose driver does not use the application (a Runbook's Job is built
/// from the Operation alone): the terminal status is the reconcile's first request.
#[tokio::test]
async fn a_started_operation_whose_driver_ignores_the_application_writes_its_end_first() -> anyhow::Result<()> {
    let failed = Outcome::failed("BackoffLimitExceeded", "Job wiki-backup-1 failed");
    let mut driver = Fake::reporting(failed);
    driver.reads_application = false;
    let (ctx, mut server) = context(driver, None)?;
    let op = operation("43", Some(status_at(None, running("Starting"), 1_800_000_000)?))?;
    let script = status_written_with_event(&op)?.to_vec();
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(phase(&seen[0])? == "Failed", "{seen:?}");
    ensure!(seen[1].body()?["reason"] == "Failed");
    ensure!(ctx.driver.driven() == vec![Some("43".to_owned())]);
    Ok(())
}

/// Refused before starting (its application does not exist): Failed without a claim, without
/// validating or driving, one Warning Event.
#[tokio::test]
async fn a_refusal_before_start_fails_without_claiming() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Fake::reporting(running("never")), None)?;
    let op = operation("41", None)?;
    let mut script = vec![Step::get(OPS_PATH, list(&[&op])?), Step::not_found(APP_PATH)];
    script.extend(status_written_with_event(&op)?);
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    let body = seen[2].body()?;
    // Not a claim (no startTime), but an end: written once, on the version decided on.
    ensure!(body["metadata"]["resourceVersion"] == "41", "{body}");
    ensure!(
        phase(&seen[2])? == "Failed" && body["status"].get("startTime").is_none(),
        "{body}"
    );
    ensure!(
        body["status"]["conditions"][0]["reason"] == "ApplicationNotFound",
        "{body}"
    );
    let event = seen[3].body()?;
    ensure!(event["type"] == "Warning" && event["reason"] == "Failed", "{event}");
    ensure!(ctx.driver.validated.load(Ordering::SeqCst) == 0 && ctx.driver.driven().is_empty());
    Ok(())
}

/// The driver's own refusal (its payload checks) ends the Operation the same way, after
/// the reads and before any claim.
#[tokio::test]
async fn a_driver_refusal_fails_without_claiming() -> anyhow::Result<()> {
    let mut driver = Fake::reporting(running("never"));
    driver.refusal = Some(Outcome::failed("InvalidSpec", "spec.backup.ttl is too long"));
    let (ctx, mut server) = context(driver, None)?;
    let op = operation("41", None)?;
    let mut script = reads(&op)?;
    script.extend(status_written_with_event(&op)?);
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(result.is_ok(), "{result:?}");
    ensure!(phase(&seen[2])? == "Failed" && seen[2].body()?["status"].get("startTime").is_none());
    ensure!(seen[2].body()?["status"]["result"] == "spec.backup.ttl is too long");
    ensure!(ctx.driver.validated.load(Ordering::SeqCst) == 1 && ctx.driver.driven().is_empty());
    Ok(())
}

/// In a namespace the engine may not manage: Failed NamespaceNotAllowed before anything is
/// read (not even the siblings).
#[tokio::test]
async fn a_refused_namespace_fails_before_any_read() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Fake::reporting(running("never")), Some("team-b"))?;
    let op = operation("41", None)?;
    let script = status_written_with_event(&op)?.to_vec();
    let (result, seen) = reconcile_once(&mut server, &ctx, &op, script).await?;
    ensure!(result.is_ok(), "{result:?}");
    let body = seen[0].body()?;
    ensure!(
        body["status"]["conditions"][0]["reason"] == "NamespaceNotAllowed",
        "{body}"
    );
    ensure!(ctx.driver.driven().is_empty());
    Ok(())
}
