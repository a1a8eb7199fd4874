//! Pull mode: register once, then sync every interval (and at once when status changed):
//! acknowledgements and status reports go up, the desired-state document comes down and
//! is applied. Failures are retried with exponential backoff and jitter; nothing here
//! ever exits the process.

use std::{sync::Arc, time::Duration};

use controller_kit::{CancellationToken, LeaderGate, Redacted, WatchScope};
use jiff::Timestamp;
use kube::runtime::events::Recorder;
use protocol::{
    METHOD_REGISTER, METHOD_SYNC, PROTOCOL_VERSION,
    backoff::Backoff,
    error::ErrorClass,
    messages::{
        AgentError, AgentInfo, ClusterIdentity, DocumentAck, DocumentOutcome, RegisterParams, RegisterResult,
        ResyncMarker, SyncParams, SyncResult,
    },
    odoo_compat::AnswerError,
    revision::{AckLedger, Decision},
};
use tokio::sync::Notify;

use crate::{
    apply::{Cluster, apply_received, cursor_of, refuse_malformed},
    client::{CallError, ControlPlaneClient},
    credentials::CredentialSource,
    health::{Health, Transition},
    ledger_store::LedgerStore,
    status::{SharedStatus, Taken},
};

/// Tunables of the loop.
#[derive(Clone, Debug)]
pub struct SyncSettings {
    /// Periodic sync interval (when nothing changed).
    pub interval: Duration,
    /// Delay after a status change before syncing, to batch a burst.
    pub report_delay: Duration,
    /// Most reports per call.
    pub batch_size: usize,
    /// Full resync (and relist) period.
    pub full_resync_interval: Duration,
    /// Retry policy.
    pub backoff: Backoff,
}

/// Everything the loop needs.
pub struct SyncLoop<C: Cluster> {
    /// HTTP client.
    pub client: ControlPlaneClient,
    /// Where the key comes from.
    pub credentials: CredentialSource,
    /// Kubernetes client (credentials in a Secret, relists).
    pub kube: kube::Client,
    /// The apply target.
    pub cluster: C,
    /// Namespace policy.
    pub scope: WatchScope,
    /// Cluster identity.
    pub identity: ClusterIdentity,
    /// This agent.
    pub agent: AgentInfo,
    /// Status cache.
    pub status: SharedStatus,
    /// Signalled when a full resync is wanted (status-channel resync).
    pub resync_wanted: Arc<Notify>,
    /// Health.
    pub health: Health,
    /// Leader gate: only the leader talks to the control plane and writes.
    pub gate: LeaderGate,
    /// Tunables.
    pub settings: SyncSettings,
    /// Events on the objects intent touched (conflicts, deletions, refusals of existing
    /// objects); `None` to publish none.
    pub recorder: Option<Recorder>,
    /// Where `known` and the undelivered acknowledgements survive a restart or a leader
    /// change; `None` keeps them in memory only (tests).
    pub ledger_store: Option<LedgerStore>,
}

struct Resync {
    id: String,
    batch: u32,
    remaining: Vec<Taken>,
    covered_version: u64,
}

enum Wake {
    Timer,
    Changed,
    Resync,
    Shutdown,
}

/// The allow-list as announced to Odoo: `["*"]` for all namespaces.
pub fn allowed_list(scope: &WatchScope) -> Vec<String> {
    let mut list = match scope.policy() {
        controller_kit::NamespacePolicy::All => vec!["*".to_owned()],
        controller_kit::NamespacePolicy::AllowList(set) => set.iter().cloned().collect(),
    };
    if let Some(ns) = scope.watch_namespace() {
        list = vec![ns.to_owned()];
    }
    list
}

impl<C: Cluster> SyncLoop<C> {
    async fn api_key(&self) -> Result<Redacted<String>, CallError> {
        self.credentials
            .load(&self.kube)
            .await
            .map_err(|e| CallError::Credentials(e.to_string()))
    }

    async fn register(&self, key: &Redacted<String>) -> Result<RegisterResult, CallError> {
        let params = RegisterParams {
            protocol_version: PROTOCOL_VERSION,
            cluster: self.identity.clone(),
            agent: self.agent.clone(),
            allowed_namespaces: allowed_list(&self.scope),
            capabilities: vec!["conflict_report".into(), "deletions".into()],
        };
        let value = self.client.call(key, METHOD_REGISTER, &params).await?;
        crate::client::decode(METHOD_REGISTER, &value)
    }

    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        tokio::select! {
            () = self.status.wait_synced() => {}
            () = shutdown.cancelled() => return,
        }
        self.health.set_caches_synced();
        let mut ledger = AckLedger::new();
        // Read back before the first document is processed, and again by each new leader:
        // another replica may have processed documents since.
        let mut ledger_loaded = self.ledger_store.is_none();
        let mut interval = self.settings.interval;
        let mut key: Option<Redacted<String>> = None;
        let mut registered = false;
        let mut resync: Option<Resync> = None;
        let mut want_resync = true;
        let mut resync_counter = 0u32;
        let mut streak: Option<AgentError> = None;
        let mut last_full = tokio::time::Instant::now();
        // An incomplete document comes back at every sync (its cursor stays unknown): it is
        // retried once per interval, not in a tight loop.
        let mut retry_hold: Option<(protocol::Cursor, tokio::time::Instant)> = None;
        // Odoo's limit on reports per call (register and sync answers), and a cap after
        // Odoo refused a call carrying several (a limit lowered without being announced).
        let mut odoo_limit: Option<usize> = None;
        let mut refused_cap: Option<usize> = None;
        let mut batch = Batch::default();
        let mut resync_started: Option<tokio::time::Instant> = None;
        // After a `413`: most reports and acknowledgements per call, halved down to 1 (a
        // proxy's body limit is not announced, so it stays for the life of the process).
        let mut body_cap = BodyCap::default();
        // The `agent_sync` that timed out, sent again as it was (see `PendingCall`).
        let mut retry: Option<PendingCall> = None;

        loop {
            if shutdown.is_cancelled() {
                return;
            }
            if !self.gate.is_leader() {
                self.health.set_leading(false);
                tracing::info!("not the leader: waiting for the Lease before talking to the control plane");
                tokio::select! {
                    leads = self.gate.wait_for_leadership() => if !leads { return },
                    () = shutdown.cancelled() => return,
                }
                self.health.set_leading(true);
                registered = false;
                want_resync = true;
                ledger_loaded = self.ledger_store.is_none();
                // Another leader may have delivered or changed all of it since; and the resync
                // starts again, since the dropped call held one of its batches.
                retry = None;
                resync = None;
            }

            // What the failed step sent, if it reached `agent_sync` (a failed registration
            // must not shrink the batches).
            batch.sent = 0;
            batch.acks_sent = 0;
            batch.bytes = 0;

            let step = async {
                if !ledger_loaded && let Some(store) = &self.ledger_store {
                    ledger = store.load().await?;
                    tracing::info!(known = ?ledger.known(), "acknowledgement ledger read back");
                    ledger_loaded = true;
                }
                let k = match &key {
                    Some(k) => k.clone(),
                    None => {
                        let k = self.api_key().await?;
                        key = Some(k.clone());
                        k
                    }
                };
                if !registered {
                    let r = self.register(&k).await?;
                    tracing::info!(
                        cluster_id = r.cluster_id,
                        protocol = %r.protocol_version,
                        server_time = %r.server_time,
                        url = self.client.base_url(),
                        "registered with the control plane"
                    );
                    if let Some(s) = r.sync_interval_seconds.filter(|s| (5..=3600).contains(s)) {
                        interval = Duration::from_secs(u64::from(s));
                    }
                    if let Some(limit) = r.max_reports_per_sync {
                        odoo_limit = Some(limit_of(limit));
                        refused_cap = None;
                    }
                    registered = true;
                }
                // A timed-out call is repeated first, with its resync batch as it was.
                if want_resync && resync.is_none() && retry.is_none() {
                    resync_counter += 1;
                    let remaining = self.status.with(|c| c.snapshot());
                    let covered_version = self.status.with(|c| c.version());
                    tracing::info!(objects = remaining.len(), "full resync of status");
                    resync = Some(Resync {
                        // Unique across restarts of a pod that keeps its name.
                        id: format!(
                            "{}-{}-{resync_counter}",
                            self.agent.instance,
                            self.agent.started_at.as_millisecond()
                        ),
                        batch: 0,
                        remaining,
                        covered_version,
                    });
                    want_resync = false;
                    resync_started = Some(tokio::time::Instant::now());
                }
                batch = Batch {
                    size: batch_size(
                        self.settings.batch_size,
                        odoo_limit,
                        refused_cap.into_iter().chain(body_cap.reports).min(),
                    ),
                    acks: body_cap.acks.unwrap_or(usize::MAX),
                    interval,
                    ..Batch::default()
                };
                let slots = Slots {
                    ledger: &mut ledger,
                    resync: &mut resync,
                    streak: &mut streak,
                    retry_hold: &mut retry_hold,
                    batch: &mut batch,
                    retry: &mut retry,
                };
                self.sync_once(&k, slots).await
            };
            let result = step.await;
            let more = match result {
                Ok(outcome) => {
                    if let Some(limit) = outcome.max_reports {
                        odoo_limit = Some(limit_of(limit));
                        refused_cap = None;
                    }
                    if let Some(secs) = outcome.next_sync {
                        interval = Duration::from_secs(u64::from(secs.clamp(1, 3600)));
                    }
                    let mut more = outcome.more;
                    if outcome.resync_requested {
                        want_resync = true;
                        // Served at once, but a resync starts at most once per interval: a
                        // control plane that keeps asking cannot make the agent spin.
                        more |= resync.is_none() && resync_started.is_none_or(|at| at.elapsed() >= interval);
                    }
                    if self.health.success() == Transition::Changed {
                        tracing::info!(url = self.client.base_url(), "in sync with the control plane");
                        self.health.persist(ledger.known().map(ToString::to_string)).await;
                    }
                    more
                }
                Err(err) => {
                    // Shrinking the call (a `422` or `413` for one carrying several) is the
                    // agent's own answer: retried soon, not waiting for someone.
                    let mut shrinking = false;
                    let mut err = err;
                    let mut note = String::new();
                    if err.class() == Some(ErrorClass::RequestTooLarge) && batch.bytes > 0 {
                        if body_cap.shrink(&batch) {
                            shrinking = true;
                            note = body_cap.describe();
                        } else {
                            err = CallError::RequestTooLarge {
                                method: METHOD_SYNC.to_owned(),
                                acks: batch.acks_sent,
                                reports: batch.sent,
                                bytes: batch.bytes,
                            };
                        }
                    }
                    let reason = err.reason();
                    match err.class() {
                        Some(ErrorClass::NotRegistered) | Some(ErrorClass::ClusterMismatch) => registered = false,
                        Some(ErrorClass::Unauthorized) => {
                            // Re-read the key: it may have been rotated.
                            key = None;
                            registered = false;
                        }
                        // Odoo refused a call carrying several reports: its limit may have
                        // been lowered. Send half as many, and register again, which
                        // answers the limit in force.
                        Some(ErrorClass::Rejected) if batch.sent > 1 => {
                            refused_cap = Some((batch.sent / 2).max(1));
                            registered = false;
                            shrinking = true;
                        }
                        _ => {}
                    }
                    if matches!(err, CallError::Credentials(_)) {
                        key = None;
                    }
                    if retry.is_some() && matches!(err, CallError::Timeout { .. }) {
                        // Odoo may have committed it all the same (it retries a serialisation
                        // failure for up to about 30 s before answering): the same call goes
                        // again, which Odoo stores as it did the first (protocol.md, "Timing,
                        // retries and backoff"), and its answer brings what the lost one had.
                        tracing::warn!("no answer in time: repeating the same agent_sync");
                    } else {
                        retry = None;
                        // A reconnect starts with a full resync.
                        want_resync = true;
                        resync = None;
                    }
                    let now = Timestamp::now();
                    let s = streak.get_or_insert(AgentError {
                        reason: reason.to_owned(),
                        message: String::new(),
                        since: now,
                        attempts: 0,
                    });
                    s.attempts += 1;
                    s.reason = reason.to_owned();
                    s.message = format!("{err}{note}");
                    let needs_attention = err.needs_attention() && !shrinking;
                    let (transition, failures) = self.health.failure(reason, format!("{err}{note}"), needs_attention);
                    let attempt = if needs_attention {
                        // Someone has to act (a key, the module, versions): retry about
                        // once a minute, so a fix is picked up soon without hammering.
                        6
                    } else {
                        failures.saturating_sub(1)
                    };
                    // "Register first" is answered by registering at once, once; only a
                    // repeated one backs off.
                    let delay = if matches!(err.class(), Some(ErrorClass::NotRegistered)) && failures == 1 {
                        Duration::ZERO
                    } else {
                        self.settings.backoff.delay(attempt, fastrand::f64())
                    };
                    tracing::error!(
                        reason,
                        error = %err,
                        failures,
                        retry_in = ?delay,
                        "sync with the control plane failed"
                    );
                    if transition == Transition::Changed {
                        self.health.persist(ledger.known().map(ToString::to_string)).await;
                    }
                    // What waits while the control plane is away.
                    self.health.metrics().pending(self.status.with(|c| c.pending()));
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = shutdown.cancelled() => return,
                    }
                    continue;
                }
            };
            self.health.metrics().pending(self.status.with(|c| c.pending()));
            if more {
                tokio::task::yield_now().await;
                continue;
            }
            if last_full.elapsed() >= self.settings.full_resync_interval {
                last_full = tokio::time::Instant::now();
                match crate::status::relist(&self.kube, &self.scope, &self.status).await {
                    Ok(changed) => tracing::debug!(changed, "periodic relist"),
                    Err(e) => tracing::warn!(error = %e, "periodic relist failed; the watches stay the source"),
                }
                want_resync = true;
                continue;
            }
            match self.wait(interval, &shutdown).await {
                Wake::Shutdown => return,
                Wake::Resync => want_resync = true,
                Wake::Timer | Wake::Changed => {}
            }
        }
    }

    async fn wait(&self, interval: Duration, shutdown: &CancellationToken) -> Wake {
        if self.status.with(|c| c.pending()) > 0 {
            tokio::select! {
                () = tokio::time::sleep(self.settings.report_delay) => return Wake::Changed,
                () = shutdown.cancelled() => return Wake::Shutdown,
            }
        }
        let wake = tokio::select! {
            () = tokio::time::sleep(interval) => Wake::Timer,
            () = self.status.changed() => Wake::Changed,
            () = self.resync_wanted.notified() => Wake::Resync,
            () = shutdown.cancelled() => Wake::Shutdown,
        };
        if matches!(wake, Wake::Changed) {
            // Batch a burst of changes into one call.
            tokio::select! {
                () = tokio::time::sleep(self.settings.report_delay) => {}
                () = shutdown.cancelled() => return Wake::Shutdown,
            }
        }
        wake
    }

    async fn sync_once(&self, key: &Redacted<String>, slots: Slots<'_>) -> Result<SyncOutcome, CallError> {
        let Slots {
            ledger,
            resync,
            streak,
            retry_hold,
            batch,
            retry,
        } = slots;
        let (batch_size, interval) = (batch.size, batch.interval);
        let call = match retry.take() {
            Some(call) => call,
            None => {
                let (reports, marker, delta_versions): (Vec<Taken>, Option<ResyncMarker>, bool) = match resync.as_mut()
                {
                    Some(r) => {
                        let take = r.remaining.len().min(batch_size);
                        let batch: Vec<Taken> = r.remaining.drain(..take).collect();
                        let marker = ResyncMarker {
                            id: r.id.clone(),
                            batch: r.batch,
                            last_batch: r.remaining.is_empty(),
                        };
                        (batch, Some(marker), false)
                    }
                    None => (self.status.with(|c| c.deltas(batch_size)), None, true),
                };
                let more_reports = match resync.as_ref() {
                    Some(r) => !r.remaining.is_empty(),
                    None => self.status.with(|c| c.pending()) > reports.len(),
                };
                // Oldest first; the rest waits for the next call (after a `413`).
                let mut acks = ledger.outgoing();
                acks.truncate(batch.acks.max(1));
                PendingCall {
                    reports,
                    marker,
                    delta_versions,
                    more_reports,
                    acks,
                }
            }
        };
        // Nothing leaves before it is recorded: an acknowledgement Odoo holds for a document
        // the next process (or leader) does not know of would let that document run again.
        if let Some(store) = &self.ledger_store {
            store.save(ledger).await?;
        }
        let params = SyncParams {
            protocol_version: PROTOCOL_VERSION,
            cluster_uid: self.identity.uid.clone(),
            agent_instance: self.agent.instance.clone(),
            known: ledger.known().cloned(),
            acks: call.acks.clone(),
            reports: call.reports.iter().map(|(_, _, r)| r.clone()).collect(),
            resync: call.marker.clone(),
            more: call.more_reports || call.acks.len() < ledger.pending_len(),
            last_error: streak.clone(),
        };
        let bytes = serde_json::to_vec(&params).map(|v| v.len()).unwrap_or_default();
        batch.sent = params.reports.len();
        batch.acks_sent = params.acks.len();
        batch.bytes = bytes;
        // On failure the caller restarts with a full resync, so nothing sent here is lost;
        // after a timeout it sends this very call again instead.
        let value = match self.client.call(key, METHOD_SYNC, &params).await {
            Ok(value) => value,
            Err(e) => {
                if matches!(e, CallError::Timeout { .. }) {
                    *retry = Some(call);
                }
                return Err(e);
            }
        };
        let PendingCall {
            reports,
            delta_versions,
            more_reports,
            acks,
            ..
        } = call;

        // Delivered: acks, reports, and the streak of errors.
        *streak = None;
        ledger.delivered(&acks);
        self.health.metrics().sent(reports.len(), bytes);
        if delta_versions {
            self.status
                .with(|c| c.delivered(reports.iter().map(|(k, v, _)| (k.clone(), *v))));
        } else if let Some(r) = resync.as_mut() {
            r.batch += 1;
            if r.remaining.is_empty() {
                let covered = r.covered_version;
                self.status.with(|c| {
                    // Everything up to the snapshot is now known to the control plane;
                    // later changes stay pending and go as deltas.
                    let all: Vec<(protocol::ObjectKey, u64)> = c
                        .snapshot()
                        .into_iter()
                        .filter(|(_, v, _)| *v <= covered)
                        .map(|(k, v, _)| (k, v))
                        .collect();
                    c.delivered(all);
                    c.drop_tombstones_before(covered);
                });
                tracing::info!(batches = r.batch, "full resync complete");
                *resync = None;
            }
        }
        let parsed: Result<SyncResult, AnswerError> = protocol::odoo_compat::decode(&value);
        let mut outcome = SyncOutcome {
            // Acknowledgements left out of this call (after a `413`) go in the next, at once.
            more: more_reports || resync.is_some() || ledger.pending_len() > 0,
            next_sync: None,
            resync_requested: false,
            // Read even when the rest does not parse: it is what makes the next call fit.
            max_reports: value
                .get("max_reports_per_sync")
                .and_then(serde_json::Value::as_u64)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        };
        let result = match parsed {
            Ok(r) => r,
            // The answer's own fields (`server_time`, …) are not the document's fault: the
            // call failed, naming the field, and no document is refused for it.
            Err(e) if !e.in_member("desired") => {
                return Err(CallError::Malformed {
                    method: METHOD_SYNC.to_owned(),
                    detail: e.to_string(),
                });
            }
            Err(e) => {
                // The path and what is expected only: what came goes to Odoo in the
                // refusal, not to the logs.
                tracing::error!(
                    path = %e.path,
                    expected = %e.expected,
                    "the control plane's document does not follow the protocol; nothing applied"
                );
                let hold = retry_hold.as_ref().map(|(cursor, at)| (cursor, at.elapsed()));
                match malformed_step(value.get("desired"), ledger, hold, interval) {
                    MalformedStep::Refuse(cursor) => {
                        let ack =
                            refuse_malformed(cursor.epoch.clone(), cursor.revision, e.to_string(), Timestamp::now());
                        self.health.metrics().document("refused");
                        ledger.record(ack);
                        *retry_hold = Some((cursor, tokio::time::Instant::now()));
                        // Deliver the refusal at once (once: the hold keeps the next one away).
                        outcome.more = true;
                    }
                    MalformedStep::Ignore(why) => tracing::debug!(why, "malformed document not refused again"),
                    MalformedStep::Fail => {
                        return Err(CallError::Malformed {
                            method: METHOD_SYNC.to_owned(),
                            detail: format!("the answer has no readable document epoch and revision: {e}"),
                        });
                    }
                }
                return Ok(outcome);
            }
        };
        outcome.next_sync = result.next_sync_seconds;
        outcome.resync_requested = result.resync_requested;
        if let Some(doc) = result.desired {
            let cursor = doc.cursor();
            match ledger.decide(&cursor) {
                Decision::Apply => {
                    if !self.gate.is_leader() {
                        return Ok(outcome);
                    }
                    if let Some((held, at)) = retry_hold.as_ref()
                        && *held == cursor
                        && at.elapsed() < interval
                    {
                        return Ok(outcome);
                    }
                    let ack = apply_received(
                        &self.cluster,
                        &self.scope,
                        self.health.metrics(),
                        self.recorder.as_ref(),
                        &doc,
                    )
                    .await;
                    *retry_hold = (ack.outcome == DocumentOutcome::Incomplete)
                        .then(|| (cursor.clone(), tokio::time::Instant::now()));
                    ledger.record(ack);
                    // Deliver the acknowledgement at once.
                    outcome.more = true;
                }
                Decision::AlreadyProcessed => {}
                Decision::Stale => tracing::warn!(
                    revision = %cursor,
                    known = ?ledger.known(),
                    "ignoring a document older than the one already processed"
                ),
            }
        }
        Ok(outcome)
    }
}

/// What one `agent_sync` carries, kept whole after a timeout so the same call is sent
/// again (the reports with their versions, the resync batch, the acknowledgements).
struct PendingCall {
    reports: Vec<Taken>,
    marker: Option<ResyncMarker>,
    /// Reports are deltas (marked delivered by version), not a resync batch.
    delta_versions: bool,
    /// More reports were waiting when the call was made.
    more_reports: bool,
    acks: Vec<DocumentAck>,
}

/// The loop's state one sync reads and updates.
struct Slots<'a> {
    ledger: &'a mut AckLedger,
    resync: &'a mut Option<Resync>,
    streak: &'a mut Option<AgentError>,
    retry_hold: &'a mut Option<(protocol::Cursor, tokio::time::Instant)>,
    batch: &'a mut Batch,
    retry: &'a mut Option<PendingCall>,
}

/// Caps after a `413`, halved each time down to 1: `None` until one was refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct BodyCap {
    reports: Option<usize>,
    acks: Option<usize>,
}

impl BodyCap {
    /// A call of `batch` was refused with `413`: halve what it carried more than one of.
    /// `false` when it carried at most one report and one acknowledgement: nothing is left
    /// to split, and the limit must be raised.
    fn shrink(&mut self, batch: &Batch) -> bool {
        if batch.sent <= 1 && batch.acks_sent <= 1 {
            return false;
        }
        if batch.sent > 1 {
            self.reports = Some(batch.sent / 2);
        }
        if batch.acks_sent > 1 {
            self.acks = Some(batch.acks_sent / 2);
        }
        true
    }

    /// What the condition's message adds while the calls shrink.
    fn describe(&self) -> String {
        let caps: Vec<String> = [(self.reports, "report(s)"), (self.acks, "acknowledgement(s)")]
            .into_iter()
            .filter_map(|(cap, what)| cap.map(|n| format!("{n} {what}")))
            .collect();
        format!("; from now on the agent sends at most {} per call", caps.join(" and "))
    }
}

struct SyncOutcome {
    more: bool,
    next_sync: Option<u32>,
    resync_requested: bool,
    max_reports: Option<u32>,
}

/// The pace of one call: how many reports and acknowledgements may go and how many went
/// (and the body's size), and the sync interval (a refused or incomplete document is
/// retried at most once per interval).
#[derive(Clone, Copy, Debug, Default)]
struct Batch {
    size: usize,
    sent: usize,
    acks: usize,
    acks_sent: usize,
    bytes: usize,
    interval: Duration,
}

/// Odoo's announced limit as a count (at least 1: a limit of 0 would stop status for good).
fn limit_of(announced: u32) -> usize {
    usize::try_from(announced).unwrap_or(usize::MAX).max(1)
}

/// Reports per call: the agent's own batch size, never more than Odoo's limit nor the cap
/// set after Odoo (or a proxy) refused a call carrying several.
fn batch_size(own: usize, odoo_limit: Option<usize>, refused_cap: Option<usize>) -> usize {
    own.min(odoo_limit.unwrap_or(usize::MAX))
        .min(refused_cap.unwrap_or(usize::MAX))
        .max(1)
}

/// What the pull loop does with an answer that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MalformedStep {
    /// Refuse its document (an acknowledgement Odoo sees) and deliver that at once.
    Refuse(protocol::Cursor),
    /// Nothing now: why (already refused and known, refused within this interval, stale).
    Ignore(&'static str),
    /// Nothing to acknowledge (no document, or no readable epoch and revision): the call
    /// failed, so the loop backs off, reports itself not in sync, and tells Odoo in
    /// `last_error`.
    Fail,
}

/// The revision rule for a document that does not parse, as for any other: only a newer
/// one (or one of another epoch) is refused, and the same one at most once per `interval`
/// (a garbled epoch never becomes `known`, so it would come back at every sync). `desired`
/// is the answer's `desired` member; `hold` the cursor last refused or left incomplete,
/// with the time since.
fn malformed_step(
    desired: Option<&serde_json::Value>,
    ledger: &AckLedger,
    hold: Option<(&protocol::Cursor, Duration)>,
    interval: Duration,
) -> MalformedStep {
    let Some((epoch, revision)) = desired.filter(|d| !d.is_null()).and_then(cursor_of) else {
        return MalformedStep::Fail;
    };
    let cursor = protocol::Cursor { epoch, revision };
    if hold.is_some_and(|(held, since)| *held == cursor && since < interval) {
        return MalformedStep::Ignore("refused within this interval");
    }
    match ledger.decide(&cursor) {
        Decision::Apply => MalformedStep::Refuse(cursor),
        Decision::AlreadyProcessed => MalformedStep::Ignore("already refused"),
        Decision::Stale => MalformedStep::Ignore("older than the document already processed"),
    }
}

#[cfg(test)]
mod body_cap_tests {
    use super::*;

    #[test]
    fn a_413_halves_what_the_call_carried_more_than_one_of_down_to_one() {
        let batch = |sent, acks_sent| Batch {
            sent,
            acks_sent,
            bytes: 1,
            ..Batch::default()
        };
        let mut cap = BodyCap::default();
        assert!(cap.shrink(&batch(200, 5)));
        assert_eq!(
            cap,
            BodyCap {
                reports: Some(100),
                acks: Some(2)
            }
        );
        assert_eq!(
            cap.describe(),
            "; from now on the agent sends at most 100 report(s) and 2 acknowledgement(s) per call"
        );
        assert!(cap.shrink(&batch(3, 1)));
        assert_eq!(
            cap,
            BodyCap {
                reports: Some(1),
                acks: Some(2)
            },
            "acknowledgements kept as they were"
        );
        assert!(cap.shrink(&batch(1, 2)));
        assert_eq!(
            cap,
            BodyCap {
                reports: Some(1),
                acks: Some(1)
            }
        );
        assert!(!cap.shrink(&batch(1, 1)), "the smallest call: nothing left to split");
        assert!(!cap.shrink(&batch(0, 0)));
        assert_eq!(batch_size(200, None, cap.reports), 1);
    }
}

#[cfg(test)]
mod malformed_tests {
    use serde_json::json;

    use super::*;

    fn c(epoch: &str, revision: u64) -> protocol::Cursor {
        protocol::Cursor {
            epoch: epoch.into(),
            revision,
        }
    }

    /// Name, the answer's `desired`, the hold, and the step wanted.
    type Case<'a> = (
        &'a str,
        Option<serde_json::Value>,
        Option<(&'a protocol::Cursor, Duration)>,
        MalformedStep,
    );

    #[test]
    fn a_malformed_document_follows_the_revision_rule_and_cannot_make_the_loop_spin() {
        let minute = Duration::from_secs(60);
        let doc = |epoch: &str, revision: Value| json!({"epoch": epoch, "revision": revision, "applications": "nope"});
        use serde_json::Value;
        let (known, held) = (c("e1", 7), c("e1", 8));
        let mut cases: Vec<Case<'_>> = vec![
            (
                "newer: refused",
                Some(doc("e1", json!(8))),
                None,
                MalformedStep::Refuse(c("e1", 8)),
            ),
            (
                "the same again within the interval: held",
                Some(doc("e1", json!(8))),
                Some((&held, Duration::from_secs(1))),
                MalformedStep::Ignore("refused within this interval"),
            ),
            (
                "the same after the interval: refused again",
                Some(doc("e1", json!(8))),
                Some((&held, Duration::from_secs(61))),
                MalformedStep::Refuse(c("e1", 8)),
            ),
            (
                "older: ignored, known stays",
                Some(doc("e1", json!(3))),
                None,
                MalformedStep::Ignore("older than the document already processed"),
            ),
            (
                "already known",
                Some(doc("e1", json!(7))),
                None,
                MalformedStep::Ignore("already refused"),
            ),
            (
                "an unreadable revision: a failed call",
                Some(doc("e1", json!("eight"))),
                None,
                MalformedStep::Fail,
            ),
            ("no document at all: a failed call", None, None, MalformedStep::Fail),
            (
                "a null document: a failed call",
                Some(Value::Null),
                None,
                MalformedStep::Fail,
            ),
        ];
        let mut ledger = AckLedger::new();
        for (epoch, revision) in [("e0", 3), (known.epoch.as_str(), known.revision)] {
            ledger.record(refuse_malformed(
                epoch.into(),
                revision,
                String::new(),
                Timestamp::UNIX_EPOCH,
            ));
        }
        cases.push((
            "of an epoch left since: stale, not a new epoch",
            Some(doc("e0", json!(4))),
            None,
            MalformedStep::Ignore("older than the document already processed"),
        ));
        for (name, desired, hold, want) in cases {
            assert_eq!(malformed_step(desired.as_ref(), &ledger, hold, minute), want, "{name}");
        }
    }
}
