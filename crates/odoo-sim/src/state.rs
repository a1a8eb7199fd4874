//! What the simulator holds, and saves in its state file: the cluster records (what the
//! Odoo model `vworkspace.cluster` holds), their intent, acknowledgements and reports.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use jiff::Timestamp;
use protocol::messages::{
    AgentInfo, ApplicationIntent, DeletionIntent, DocumentAck, ObjectKind, ObjectReport, ObjectState, OperationIntent,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::push;

/// Acknowledgements kept per cluster (the latest per document; the oldest received dropped
/// first), as the reference addon keeps `ACKS_KEPT`.
pub const MAX_ACKS_KEPT: usize = 100;
/// Entries of the report log kept per cluster (oldest dropped first).
pub const REPORT_LOG_MAX: usize = 10_000;

/// One report as it arrived, in the per-cluster report log: every report received, in
/// order, where [`StoredReport`] keeps only the latest per object. For measurements
/// (`just bench-agent` reads when each state of each object arrived); a real module
/// needs no such log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReceivedReport {
    /// Position in the cluster's log (from 1, never reused).
    pub seq: u64,
    /// `Kind/namespace/name`.
    pub key: String,
    /// The reported state.
    pub state: ObjectState,
    /// The reported `resource_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The reported Operation phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Whether it came as part of a full resync.
    #[serde(default)]
    pub resync: bool,
    /// When the simulator received it (nanosecond precision, RFC 3339).
    pub received_at: Timestamp,
    /// The same instant in Unix milliseconds, for tools that do not parse RFC 3339.
    pub received_at_ms: i64,
}

/// A stored report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredReport {
    /// The last report received.
    pub report: ObjectReport,
    /// When it was received.
    pub received_at: Timestamp,
    /// Marked deleted because a full resync did not include it.
    #[serde(default)]
    pub absent_after_resync: bool,
}

/// Progress of the current full resync.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// Its id.
    pub id: String,
    /// Keys reported so far.
    pub seen: BTreeSet<String>,
    /// When the last batch arrived (None while in progress).
    pub completed_at: Option<Timestamp>,
    /// Completed resyncs.
    pub completed: u64,
    /// The batch expected next (protocol.md, "Questions a module author asks").
    #[serde(default)]
    pub next_batch: u32,
    /// A batch arrived out of order (another id without batch 0, a gap, a repeat): this
    /// resync sweeps nothing at its last batch, and the answer asks for a new one.
    #[serde(default)]
    pub broken: bool,
}

/// What a resync marker does to the resync in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncStep {
    /// Batch 0: a new resync starts.
    Start,
    /// The next batch of the current resync.
    Continue,
    /// Out of order: the resync is abandoned.
    Break,
}

/// The rule for a marker `(id, batch)` given the resync in progress.
pub fn resync_step(progress: &ResyncProgress, id: &str, batch: u32) -> ResyncStep {
    if batch == 0 {
        ResyncStep::Start
    } else if id == progress.id && batch == progress.next_batch && !progress.broken {
        ResyncStep::Continue
    } else {
        ResyncStep::Break
    }
}

/// One cluster record: what the Odoo model `vworkspace.cluster` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// Record id.
    pub id: i64,
    /// Human name (the admin's key for the record).
    pub name: String,
    /// Bound cluster UID (set by the first `agent_register`).
    pub uid: Option<String>,
    /// First registration.
    pub registered_at: Option<Timestamp>,
    /// Last call of any kind from the agent.
    pub last_seen: Option<Timestamp>,
    /// The agent as it last registered.
    pub agent: Option<AgentInfo>,
    /// The agent's allow-list as it last registered.
    pub allowed_namespaces: Vec<String>,
    /// The document sequence.
    pub epoch: String,
    /// Current revision (0: no intent yet, no document sent).
    pub revision: u64,
    /// Desired applications by `namespace/name`, with the revision that last changed them.
    pub applications: BTreeMap<String, (u64, ApplicationIntent)>,
    /// Desired operations by `namespace/name`.
    pub operations: BTreeMap<String, (u64, OperationIntent)>,
    /// Deletion intents by `Kind/namespace/name`.
    pub deletions: BTreeMap<String, (u64, DeletionIntent)>,
    /// A raw document replacing the built one (tests of malformed or empty documents).
    pub raw_document: Option<Value>,
    /// Acknowledgements, oldest first (latest per revision).
    pub acks: Vec<DocumentAck>,
    /// Reports by `Kind/namespace/name`.
    pub reports: BTreeMap<String, StoredReport>,
    /// Full resync progress.
    pub resync: ResyncProgress,
    /// Number of successful syncs.
    pub syncs: u64,
    /// The last error streak the agent reported.
    pub last_agent_error: Option<protocol::messages::AgentError>,
    /// Push mode: the agent's endpoint and how calls to it went (`None`: pull mode).
    #[serde(default)]
    pub push: Option<push::PushLink>,
    /// Every report received, oldest first, at most [`REPORT_LOG_MAX`] (not saved in the
    /// state file).
    #[serde(skip)]
    pub report_log: VecDeque<ReceivedReport>,
    /// Last `seq` of the report log.
    #[serde(skip)]
    pub report_log_seq: u64,
}

impl ClusterRecord {
    /// Records an acknowledgement (the latest per revision; the oldest dropped beyond
    /// [`MAX_ACKS_KEPT`]).
    pub(crate) fn store_ack(&mut self, ack: DocumentAck) {
        self.acks
            .retain(|a| !(a.epoch == ack.epoch && a.revision == ack.revision));
        self.acks.push(ack);
        let overflow = self.acks.len().saturating_sub(MAX_ACKS_KEPT);
        self.acks.drain(..overflow);
    }

    /// Stores reports received at `now`; `in_resync` counts them as seen by the full
    /// resync in progress.
    pub(crate) fn store_reports(&mut self, reports: Vec<ObjectReport>, in_resync: bool, now: Timestamp) {
        for report in reports {
            let key = report_key(report.kind, &report.namespace, &report.name);
            if in_resync {
                self.resync.seen.insert(key.clone());
            }
            self.report_log_seq += 1;
            if self.report_log.len() >= REPORT_LOG_MAX {
                self.report_log.pop_front();
            }
            self.report_log.push_back(ReceivedReport {
                seq: self.report_log_seq,
                key: key.clone(),
                state: report.state,
                resource_version: report.resource_version.clone(),
                phase: report.phase.clone(),
                resync: in_resync,
                received_at: now,
                received_at_ms: now.as_millisecond(),
            });
            // Latest per object: a late duplicate of the same object (same uid, a smaller
            // resource_version) does not replace what is stored.
            if self
                .reports
                .get(&key)
                .is_some_and(|stored| older(&report, &stored.report))
            {
                continue;
            }
            self.reports.insert(
                key,
                StoredReport {
                    report,
                    received_at: now,
                    absent_after_resync: false,
                },
            );
        }
    }

    /// Applies a resync marker; returns whether the resync in progress was abandoned.
    pub(crate) fn resync_marker(&mut self, id: &str, batch: u32) -> bool {
        match resync_step(&self.resync, id, batch) {
            ResyncStep::Start => {
                self.resync.id = id.to_owned();
                self.resync.seen.clear();
                self.resync.completed_at = None;
                self.resync.next_batch = 1;
                self.resync.broken = false;
            }
            ResyncStep::Continue => self.resync.next_batch += 1,
            ResyncStep::Break => {
                self.resync.id = id.to_owned();
                self.resync.broken = true;
            }
        }
        self.resync.broken
    }

    /// Ends a full resync: every object not reported during it is marked deleted.
    pub(crate) fn complete_resync(&mut self, now: Timestamp) {
        for (key, stored) in self.reports.iter_mut() {
            if !self.resync.seen.contains(key) && stored.report.state != ObjectState::Deleted {
                stored.report.state = ObjectState::Deleted;
                stored.absent_after_resync = true;
                stored.received_at = now;
            }
        }
        self.resync.completed_at = Some(now);
        self.resync.completed += 1;
    }
}

/// Everything persisted.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SimState {
    /// Records by name.
    pub clusters: BTreeMap<String, ClusterRecord>,
    /// API key → cluster name. Never shown by the admin API.
    pub(crate) keys: BTreeMap<String, String>,
    /// Cluster name → push target (with its token). Never shown by the admin API.
    #[serde(default)]
    pub(crate) push_targets: BTreeMap<String, push::PushTarget>,
    pub(crate) next_id: i64,
}

pub(crate) fn report_key(kind: ObjectKind, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", kind.as_str())
}

pub(crate) fn new_epoch() -> String {
    format!("sim-{}", Timestamp::now().as_millisecond())
}

/// `new` is an older state of the object than `stored`: the same uid, and a smaller
/// `resource_version` (both read as integers; anything else is not comparable).
fn older(new: &ObjectReport, stored: &ObjectReport) -> bool {
    let number = |r: &ObjectReport| r.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
    new.uid.is_some() && new.uid == stored.uid && matches!((number(new), number(stored)), (Some(n), Some(s)) if n < s)
}

#[cfg(test)]
mod resync_rule_tests {
    use super::*;

    #[test]
    fn a_resync_out_of_order_is_abandoned() {
        let mut r = ResyncProgress::default();
        let mut step = |id: &str, batch: u32| {
            let s = resync_step(&r, id, batch);
            match s {
                ResyncStep::Start => {
                    r.id = id.into();
                    r.next_batch = 1;
                    r.broken = false;
                }
                ResyncStep::Continue => r.next_batch += 1,
                ResyncStep::Break => {
                    r.id = id.into();
                    r.broken = true;
                }
            }
            s
        };
        assert_eq!(step("a", 0), ResyncStep::Start);
        assert_eq!(step("a", 1), ResyncStep::Continue);
        assert_eq!(step("a", 3), ResyncStep::Break, "a missing batch");
        assert_eq!(step("a", 4), ResyncStep::Break, "stays abandoned");
        assert_eq!(step("b", 0), ResyncStep::Start, "batch 0 starts afresh");
        assert_eq!(step("c", 1), ResyncStep::Break, "another id without batch 0");
        assert_eq!(step("c", 0), ResyncStep::Start);
        assert_eq!(step("c", 1), ResyncStep::Continue);
        assert_eq!(step("c", 1), ResyncStep::Break, "a repeat");
    }
}
