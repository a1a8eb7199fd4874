//! May this Operation act now? The checks every engine runs before creating
//! children, in the order of `docs/api/operation.md` ("Order of checks";
//! namespace, application and payload checks come first and are the engine's):
//!
//! 1. already terminal → [`Gate::Terminal`] (do nothing);
//! 2. already started → [`Gate::Proceed`] (a started Operation keeps going: it is never
//!    expired, re-queued or turned into a duplicate);
//! 3. another Operation of the application carries the same `requestId` and came first →
//!    [`Gate::Duplicate`];
//! 4. `spec.deadline` reached → [`Gate::Expired`];
//! 5. `spec.notBefore` not reached → [`Gate::WaitUntil`];
//! 6. an Upgrade, Rollback or Restore that is not `urgent` (nor a child of another
//!    Operation), outside the application's maintenance windows → [`Gate::WaitForWindow`];
//! 7. a conflicting Operation runs or is ahead in the queue → [`Gate::Queued`];
//! 8. otherwise → [`Gate::Proceed`].
//!
//! The engine's own checks belong between 3 and 4 (`docs/api/operation.md` puts the
//! application and payload checks after the duplicate check and before the schedule): an
//! engine computes the gate once, ends a [`Gate::Duplicate`] at once, then validates, and
//! only then applies the rest of the gate.
//!
//! The decision is a pure function of the Operation, its [`Siblings`] and `now`, so two
//! engines looking at the same snapshot agree on who goes first. (Two engines acting on
//! different snapshots is prevented by the optimistic-concurrency claim the controllers
//! make before starting; see `docs/day-2-operations.md`.)
//!
//! ## Serialization
//!
//! Two Operations *conflict* when both are mutating (Upgrade, Rollback, Restore), or when
//! one is a Restore and the other a Backup or Snapshot. Runbooks conflict with nothing.
//! An Operation waits behind a conflicting sibling that
//! - has started (whatever its creation time): it holds the application until it ends; or
//! - has not started but is ahead in the queue and could start now: not terminal, its
//!   `notBefore` passed and its maintenance window open (a waiting Operation holds no
//!   place), its deadline not reached (it is about to expire), and not a duplicate (it is
//!   about to end without acting).
//!
//! Queue order is creation time, then name. A child Operation (owner reference to a parent
//! Operation) takes its root ancestor's place in the queue, and never waits for its own
//! ancestors or descendants: the parent waits for the child, so anything else would
//! deadlock. Taking the root's place matters too: a Restore created while an Upgrade runs
//! must not get ahead of the Backup that Upgrade creates with `backupFirst`.
//!
//! Strict order across conflicts means a Backup created after a queued Restore waits for
//! that Restore, even while only an Upgrade runs. That is the price of never starving a
//! Restore behind a stream of Backups.

use api::conditions::operation_reasons;
use api::{Operation, OperationPhase, OperationType};
use jiff::Timestamp;

use crate::maintenance::{WindowState, Windows};
use crate::meta;
use crate::status::Outcome;

/// What the engine does with an Operation now. A gate that stops the Operation carries the
/// outcome to write, so the engine writes it as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Already Succeeded, Failed or Expired: nothing to do, nothing to write.
    Terminal,
    /// An earlier Operation of the same application carries the same `requestId`: end at
    /// once (before the engine's own checks) with this outcome, pointing at it.
    Duplicate(Outcome),
    /// Not started by `spec.deadline`: once the engine's own checks pass, end with this
    /// outcome without acting.
    Expired(Outcome),
    /// `spec.notBefore` not reached: once the engine's own checks pass, stay Pending with
    /// this outcome and look again at [`wake_at`].
    WaitUntil(Outcome),
    /// A conflicting Operation runs or is ahead in the queue: once the engine's own checks
    /// pass, stay Pending with this outcome. Siblings of other types are not watched, so the
    /// engine looks again by polling.
    Queued(Outcome),
    /// Outside the application's maintenance windows (or they cannot be used): once the
    /// engine's own checks pass, stay Pending with this outcome, and look again at [`wake_at`]
    /// or sooner (the ApplicationInstance, whose windows may change, is not watched).
    WaitForWindow(Outcome),
    /// Act (create or drive children).
    Proceed,
}

/// The decision behind a [`Gate`], before its outcome is worded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    Terminal,
    Duplicate {
        /// Name of the Operation that carries the request.
        first: String,
    },
    Expired,
    WaitUntil(Timestamp),
    Queued {
        /// Name of the Operation waited for (a started one if any, else the first queued one).
        behind: String,
    },
    WaitForWindow {
        /// When the next window opens and which it is.
        opens: Timestamp,
        window: String,
    },
    InvalidWindows(String),
    Proceed,
}

impl Decision {
    /// The gate, with the status outcome of a decision that stops the Operation.
    fn into_gate(self, op: &Operation, siblings: &Siblings) -> Gate {
        let namespace = op.metadata.namespace.as_deref().unwrap_or_default();
        match self {
            Decision::Terminal => Gate::Terminal,
            Decision::Proceed => Gate::Proceed,
            Decision::Duplicate { first } => Gate::Duplicate(Outcome::Duplicate {
                message: format!(
                    "requestId {} was already handled by Operation {first}",
                    op.spec.request_id
                ),
                first,
            }),
            Decision::Expired => {
                let deadline = op.spec.deadline.as_ref().map(|d| d.0.to_string()).unwrap_or_default();
                Gate::Expired(Outcome::Expired {
                    message: format!("Not started before the deadline {deadline} (spec.deadline)"),
                })
            }
            Decision::WaitUntil(at) => Gate::WaitUntil(Outcome::Pending {
                reason: operation_reasons::WAITING_FOR_NOT_BEFORE.to_owned(),
                message: format!("Waiting until {at} (spec.notBefore)"),
            }),
            Decision::WaitForWindow { opens, window } => Gate::WaitForWindow(Outcome::Pending {
                reason: operation_reasons::QUEUED_FOR_MAINTENANCE_WINDOW.to_owned(),
                message: format!(
                    "Waiting for the maintenance window {window}, which opens at {opens}{} (spec.urgent starts it at once)",
                    deadline_note(op, opens)
                ),
            }),
            Decision::InvalidWindows(problem) => Gate::WaitForWindow(Outcome::Pending {
                reason: operation_reasons::INVALID_MAINTENANCE_WINDOW.to_owned(),
                message: format!(
                    "The application's maintenance windows cannot be used, so this Operation waits until they are fixed (or spec.urgent): {problem}"
                ),
            }),
            Decision::Queued { behind } => {
                let detail = siblings
                    .get(&behind)
                    .map(|s| {
                        let phase = if s.is_started() { "Running" } else { "Pending" };
                        format!(" ({}, {phase})", s.type_.as_str())
                    })
                    .unwrap_or_default();
                Gate::Queued(Outcome::Pending {
                    reason: operation_reasons::QUEUED.to_owned(),
                    message: format!("Queued behind Operation {namespace}/{behind}{detail}"),
                })
            }
        }
    }
}

/// `, after spec.deadline …: it will expire unless the windows change` when the window opens too late.
fn deadline_note(op: &Operation, opens: Timestamp) -> String {
    match op.spec.deadline.as_ref().map(|d| d.0) {
        Some(deadline) if deadline <= opens => {
            format!(", after spec.deadline {deadline}: it will expire unless the windows change")
        }
        _ => String::new(),
    }
}

/// Whether an Operation of this kind waits for the application's maintenance windows:
/// Upgrade, Rollback and Restore, unless `urgent` or a child of another Operation (its
/// parent started in due form, e.g. the Restore of an Upgrade's `RollbackAndRestore`).
pub fn waits_for_window(type_: OperationType, urgent: bool, has_parent: bool) -> bool {
    type_.is_mutating() && !urgent && !has_parent
}

/// The application's maintenance windows as the gate sees them.
#[derive(Debug, Clone)]
pub enum Maintenance {
    /// Checked windows (possibly none: always open).
    Windows(Windows),
    /// `spec.maintenanceWindows` cannot be used: the problem, naming the window.
    Invalid(String),
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance::Windows(Windows::none())
    }
}

impl Maintenance {
    /// The windows of `app` (none when there is no application: the engine refuses it anyway).
    pub fn of(app: Option<&api::ApplicationInstance>) -> Self {
        match app.map(|a| Windows::parse(&a.spec.maintenance_windows)) {
            None => Self::default(),
            Some(Ok(windows)) => Maintenance::Windows(windows),
            Some(Err(problem)) => Maintenance::Invalid(problem),
        }
    }

    fn state(&self, now: Timestamp) -> Result<WindowState, &str> {
        match self {
            Maintenance::Windows(windows) => Ok(windows.at(now)),
            Maintenance::Invalid(problem) => Err(problem),
        }
    }

    fn is_open(&self, now: Timestamp) -> bool {
        self.state(now).is_ok_and(|s| s.is_open())
    }
}

/// What the lifecycle needs to know about one Operation of the application.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sibling {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `spec.type`.
    pub type_: OperationType,
    /// `status.phase` (`None`: no engine has written a status yet).
    pub phase: Option<OperationPhase>,
    /// Whether it has started acting (`status.startTime` set, or phase Running).
    pub started: bool,
    /// `metadata.creationTimestamp` (`None` sorts last).
    pub created: Option<Timestamp>,
    /// `spec.requestId`.
    pub request_id: String,
    /// `status.duplicateOf`: it ended as a duplicate and carries no request of its own.
    pub duplicate_of: Option<String>,
    /// Name of the parent Operation (controller owner reference), for child Operations.
    pub parent: Option<String>,
    /// `spec.notBefore`.
    pub not_before: Option<Timestamp>,
    /// `spec.deadline`.
    pub deadline: Option<Timestamp>,
    /// `spec.urgent`.
    pub urgent: bool,
    /// A verified restore (`restore.verify`): it restores into a scratch namespace and leaves
    /// the application as it is, so it does not wait for maintenance windows.
    pub verifies_only: bool,
}

impl Sibling {
    /// The view of `op`.
    pub fn from_operation(op: &Operation) -> Self {
        let status = op.status.as_ref();
        let phase = status.and_then(|s| s.phase);
        Self {
            name: op.metadata.name.clone().unwrap_or_default(),
            uid: op.metadata.uid.clone(),
            type_: op.spec.type_,
            phase,
            started: status.is_some_and(|s| s.start_time.is_some()) || phase == Some(OperationPhase::Running),
            created: op.metadata.creation_timestamp.as_ref().map(|t| t.0),
            request_id: op.spec.request_id.clone(),
            duplicate_of: status.and_then(|s| s.duplicate_of.clone()),
            parent: meta::parent_operation(&op.metadata).map(str::to_owned),
            not_before: op.spec.not_before.as_ref().map(|t| t.0),
            deadline: op.spec.deadline.as_ref().map(|t| t.0),
            urgent: op.spec.urgent,
            verifies_only: op.spec.type_ == OperationType::Restore
                && op.spec.restore.as_ref().is_some_and(api::RestoreParams::verifies),
        }
    }

    /// Whether it waits for the application's maintenance windows ([`waits_for_window`]).
    pub fn waits_for_window(&self) -> bool {
        !self.verifies_only && waits_for_window(self.type_, self.urgent, self.parent.is_some())
    }

    /// Terminal phases never change again.
    pub fn is_terminal(&self) -> bool {
        self.phase.is_some_and(OperationPhase::is_terminal)
    }

    /// Whether it has started acting (`started`, or phase Running in a hand-built view).
    pub fn is_started(&self) -> bool {
        self.started || self.phase == Some(OperationPhase::Running)
    }

    /// Creation order: creation time, then name. Unknown creation times sort last.
    fn order_key(&self) -> (Timestamp, &str) {
        (self.created.unwrap_or(Timestamp::MAX), &self.name)
    }
}

/// The other Operations of the same application (same namespace, same
/// `spec.applicationRef.name`). The Operation being decided may be included; it is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Siblings {
    items: Vec<Sibling>,
}

impl Siblings {
    /// Siblings from prepared views (the caller has filtered by namespace and application).
    pub fn new(items: Vec<Sibling>) -> Self {
        Self { items }
    }

    /// The Operations in `all` that share `op`'s namespace and application, except `op`.
    pub fn of<'a>(op: &Operation, all: impl IntoIterator<Item = &'a Operation>) -> Self {
        let same_app = |other: &Operation| {
            other.metadata.namespace == op.metadata.namespace
                && other.spec.application_ref.name == op.spec.application_ref.name
                && other.metadata.name != op.metadata.name
        };
        Self::new(
            all.into_iter()
                .filter(|other| same_app(other))
                .map(Sibling::from_operation)
                .collect(),
        )
    }

    /// The sibling named `name`.
    pub fn get(&self, name: &str) -> Option<&Sibling> {
        self.items.iter().find(|s| s.name == name)
    }

    /// Every sibling.
    pub fn iter(&self) -> impl Iterator<Item = &Sibling> {
        self.items.iter()
    }
}

/// Decides what the engine may do with `op` now (see the module documentation), given the
/// application's maintenance windows.
pub fn gate(op: &Operation, now: Timestamp, siblings: &Siblings, maintenance: &Maintenance) -> Gate {
    decide(op, now, siblings, maintenance).into_gate(op, siblings)
}

fn decide(op: &Operation, now: Timestamp, siblings: &Siblings, maintenance: &Maintenance) -> Decision {
    let me = Sibling::from_operation(op);
    if me.is_terminal() {
        return Decision::Terminal;
    }
    if me.is_started() {
        return Decision::Proceed;
    }
    let family = Family::new(&me, siblings);

    if let Some(first) = family.request_holder(&me.request_id)
        && first.name != me.name
    {
        return Decision::Duplicate {
            first: first.name.clone(),
        };
    }
    if me.deadline.is_some_and(|deadline| now >= deadline) {
        return Decision::Expired;
    }
    if let Some(not_before) = me.not_before.filter(|not_before| now < *not_before) {
        return Decision::WaitUntil(not_before);
    }
    if me.waits_for_window() {
        match maintenance.state(now) {
            Err(problem) => return Decision::InvalidWindows(problem.to_owned()),
            Ok(WindowState::Closed { opens, window }) => return Decision::WaitForWindow { opens, window },
            Ok(WindowState::Unrestricted | WindowState::Open { .. }) => {}
        }
    }
    match family.first_blocker(&me, now, maintenance) {
        Some(blocker) => Decision::Queued {
            behind: blocker.name.clone(),
        },
        None => Decision::Proceed,
    }
}

/// When the gate of a not-yet-started Operation can change by itself (its `notBefore`,
/// deadline, or the opening of its maintenance window), so the engine can requeue for that
/// moment. `None` once started or terminal, or when no such time lies ahead.
pub fn wake_at(op: &Operation, now: Timestamp, maintenance: &Maintenance) -> Option<Timestamp> {
    let me = Sibling::from_operation(op);
    if me.is_terminal() || me.is_started() {
        return None;
    }
    let window_opens = match maintenance.state(now) {
        Ok(WindowState::Closed { opens, .. }) if me.waits_for_window() => Some(opens),
        _ => None,
    };
    [me.not_before, me.deadline, window_opens]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min()
}

/// Whether `a` and `b` may not run at the same time on one application.
pub fn conflicts(a: OperationType, b: OperationType) -> bool {
    use OperationType::{Backup, Restore, Snapshot};
    (a.is_mutating() && b.is_mutating())
        || matches!((a, b), (Restore, Backup | Snapshot) | (Backup | Snapshot, Restore))
}

/// Bounds the walk up parent links (a loop of owner references must not hang us).
const MAX_DEPTH: usize = 16;

/// The Operation being decided together with its siblings.
struct Family<'a> {
    all: Vec<&'a Sibling>,
}

impl<'a> Family<'a> {
    fn new(me: &'a Sibling, siblings: &'a Siblings) -> Self {
        let mut all = vec![me];
        all.extend(siblings.iter().filter(|s| s.name != me.name));
        Self { all }
    }

    fn get(&self, name: &str) -> Option<&'a Sibling> {
        self.all.iter().copied().find(|s| s.name == name)
    }

    /// `s` and its ancestors found in the family, nearest first.
    fn lineage(&self, s: &'a Sibling) -> Vec<&'a Sibling> {
        let mut chain = vec![s];
        let mut current = s;
        while let Some(parent) = current.parent.as_deref().and_then(|p| self.get(p)) {
            if chain.len() > MAX_DEPTH || chain.iter().any(|c| c.name == parent.name) {
                break;
            }
            chain.push(parent);
            current = parent;
        }
        chain
    }

    /// Whether one of `a` and `b` is an ancestor of the other.
    fn related(&self, a: &Sibling, b: &Sibling) -> bool {
        self.lineage_names(a).contains(&b.name.as_str()) || self.lineage_names(b).contains(&a.name.as_str())
    }

    fn lineage_names(&self, s: &Sibling) -> Vec<&'a str> {
        match self.get(&s.name) {
            Some(s) => self.lineage(s).into_iter().map(|l| l.name.as_str()).collect(),
            None => Vec::new(),
        }
    }

    /// Queue position: the root ancestor's creation order, then the Operation's own.
    fn queue_key(&self, s: &'a Sibling) -> ((Timestamp, &'a str), (Timestamp, &'a str)) {
        let lineage = self.lineage(s);
        let root = lineage.last().copied().unwrap_or(s);
        (root.order_key(), s.order_key())
    }

    /// The Operation that carries `request_id`: the first one that started acting if any
    /// did (a replay may have been created in the same second with a smaller name, after
    /// the original already started), otherwise the first created. Operations that ended
    /// as duplicates carry nothing: if the original was deleted, a replay acts again.
    fn request_holder(&self, request_id: &str) -> Option<&'a Sibling> {
        let candidates = || {
            self.all
                .iter()
                .copied()
                .filter(|s| s.request_id == request_id && s.duplicate_of.is_none())
        };
        candidates()
            .filter(|s| s.is_started())
            .min_by_key(|s| s.order_key())
            .or_else(|| candidates().min_by_key(|s| s.order_key()))
    }

    /// Whether a not-started `s` could start now, i.e. holds its place in the queue.
    fn is_ready(&self, s: &'a Sibling, now: Timestamp, maintenance: &Maintenance) -> bool {
        !s.is_terminal()
            && s.not_before.is_none_or(|t| now >= t)
            && s.deadline.is_none_or(|t| now < t)
            && (!s.waits_for_window() || maintenance.is_open(now))
            && self.request_holder(&s.request_id).is_none_or(|h| h.name == s.name)
    }

    /// The sibling `me` must wait for: a started one first, else the first in the queue.
    fn first_blocker(&self, me: &'a Sibling, now: Timestamp, maintenance: &Maintenance) -> Option<&'a Sibling> {
        let my_key = self.queue_key(me);
        let blocking = |s: &&'a Sibling| {
            s.name != me.name
                && conflicts(me.type_, s.type_)
                && !s.is_terminal()
                && !self.related(me, s)
                && (s.is_started() || (self.queue_key(s) < my_key && self.is_ready(s, now, maintenance)))
        };
        let mut blockers: Vec<&'a Sibling> = self.all.iter().copied().filter(blocking).collect();
        blockers.sort_by_key(|s| (!s.is_started(), self.queue_key(s)));
        blockers.first().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::OperationStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    use OperationPhase::{Failed, Pending, Running, Succeeded};
    use OperationType::{Backup, Restore, Rollback, Runbook, Snapshot, Upgrade};

    const NOW: &str = "2026-12-01T02:00:00Z";

    fn at(minutes: i64) -> Timestamp {
        let now: Timestamp = NOW.parse().expect("timestamp");
        now + jiff::SignedDuration::from_mins(minutes)
    }

    /// A sibling created `created` minutes from NOW.
    fn sib(name: &str, type_: OperationType, phase: Option<OperationPhase>, created: i64) -> Sibling {
        Sibling {
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            type_,
            phase,
            started: phase == Some(Running),
            created: Some(at(created)),
            request_id: format!("req-{name}"),
            ..Default::default()
        }
    }

    fn with(mut s: Sibling, f: impl FnOnce(&mut Sibling)) -> Sibling {
        f(&mut s);
        s
    }

    /// An Operation matching a sibling view (so the gated Operation and siblings share one model).
    fn op_of(s: &Sibling) -> Operation {
        let mut op = crate::meta::tests::op(&s.name, s.type_);
        op.spec.request_id = s.request_id.clone();
        op.metadata.creation_timestamp = s.created.map(Time);
        op.spec.not_before = s.not_before.map(Time);
        op.spec.deadline = s.deadline.map(Time);
        op.spec.urgent = s.urgent;
        if s.verifies_only {
            op.spec.restore = Some(api::RestoreParams {
                verify: Some(true),
                ..api::RestoreParams::default()
            });
        }
        if let Some(parent) = &s.parent {
            op.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "vworkspace.io/v1alpha1".into(),
                kind: "Operation".into(),
                name: parent.clone(),
                uid: format!("uid-{parent}"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]);
        }
        if s.phase.is_some() || s.started || s.duplicate_of.is_some() {
            op.status = Some(OperationStatus {
                phase: s.phase,
                start_time: s.started.then(|| Time(at(0))),
                duplicate_of: s.duplicate_of.clone(),
                ..Default::default()
            });
        }
        op
    }

    fn decide(me: &Sibling, others: &[Sibling], now: i64) -> Decision {
        super::decide(
            &op_of(me),
            at(now),
            &Siblings::new(others.to_vec()),
            &Maintenance::default(),
        )
    }

    fn queued(behind: &str) -> Decision {
        Decision::Queued { behind: behind.into() }
    }

    #[test]
    fn conflicts_matrix() {
        let expected = |a: OperationType, b: OperationType| -> bool {
            match (a, b) {
                (Runbook, _) | (_, Runbook) => false,
                (Upgrade | Rollback | Restore, Upgrade | Rollback | Restore) => true,
                (Restore, Backup | Snapshot) | (Backup | Snapshot, Restore) => true,
                _ => false,
            }
        };
        for a in OperationType::ALL {
            for b in OperationType::ALL {
                assert_eq!(conflicts(a, b), expected(a, b), "{a:?} / {b:?}");
                assert_eq!(conflicts(a, b), conflicts(b, a), "symmetric");
            }
        }
    }

    #[test]
    fn own_state_table() {
        let base = sib("me", Backup, None, 0);
        let cases = [
            ("no status: proceed", base.clone(), 0, Decision::Proceed),
            (
                "succeeded: terminal",
                with(base.clone(), |s| s.phase = Some(Succeeded)),
                0,
                Decision::Terminal,
            ),
            (
                "failed: terminal",
                with(base.clone(), |s| s.phase = Some(Failed)),
                0,
                Decision::Terminal,
            ),
            (
                "expired: terminal",
                with(base.clone(), |s| s.phase = Some(OperationPhase::Expired)),
                0,
                Decision::Terminal,
            ),
            (
                "notBefore ahead: wait",
                with(base.clone(), |s| s.not_before = Some(at(30))),
                0,
                Decision::WaitUntil(at(30)),
            ),
            (
                "notBefore reached exactly: proceed",
                with(base.clone(), |s| s.not_before = Some(at(30))),
                30,
                Decision::Proceed,
            ),
            (
                "deadline ahead: proceed",
                with(base.clone(), |s| s.deadline = Some(at(30))),
                29,
                Decision::Proceed,
            ),
            (
                "deadline reached exactly: expired",
                with(base.clone(), |s| s.deadline = Some(at(30))),
                30,
                Decision::Expired,
            ),
            (
                "waiting for notBefore past the deadline: expired",
                with(base.clone(), |s| {
                    s.not_before = Some(at(10));
                    s.deadline = Some(at(20));
                }),
                25,
                Decision::Expired,
            ),
            (
                "running past the deadline: never expired",
                with(base.clone(), |s| {
                    s.phase = Some(Running);
                    s.started = true;
                    s.deadline = Some(at(10));
                }),
                60,
                Decision::Proceed,
            ),
            (
                "startTime set but phase lost: still started",
                with(base.clone(), |s| {
                    s.phase = Some(Pending);
                    s.started = true;
                    s.deadline = Some(at(10));
                }),
                60,
                Decision::Proceed,
            ),
        ];
        for (name, me, now, expected) in cases {
            assert_eq!(decide(&me, &[], now), expected, "{name}");
        }
    }

    #[test]
    fn duplicate_table() {
        let me = with(sib("me", Backup, None, 5), |s| s.request_id = "r".into());
        let same = |name: &str, created: i64, phase: Option<OperationPhase>| {
            with(sib(name, Backup, phase, created), |s| s.request_id = "r".into())
        };
        let dup = |first: &str| Decision::Duplicate { first: first.into() };
        let cases = [
            ("earlier, pending", vec![same("first", 0, None)], dup("first")),
            (
                "earlier, succeeded",
                vec![same("first", 0, Some(Succeeded))],
                dup("first"),
            ),
            (
                "earlier, failed before acting",
                vec![same("first", 0, Some(Failed))],
                dup("first"),
            ),
            (
                "earlier, other type",
                vec![with(same("first", 0, None), |s| s.type_ = Runbook)],
                dup("first"),
            ),
            (
                "same time, smaller name",
                vec![same("a-first", 5, None)],
                dup("a-first"),
            ),
            (
                "same time, larger name",
                vec![same("z-later", 5, None)],
                Decision::Proceed,
            ),
            ("later", vec![same("later", 9, None)], Decision::Proceed),
            (
                "other requestId, earlier",
                vec![sib("other", Backup, None, 0)],
                Decision::Proceed,
            ),
            (
                "earliest of several",
                vec![same("second", 2, Some(Succeeded)), same("first", 1, Some(Succeeded))],
                dup("first"),
            ),
            (
                "earlier one is itself a duplicate of a deleted original: act again",
                vec![with(same("replay", 0, Some(Succeeded)), |s| {
                    s.duplicate_of = Some("gone".into())
                })],
                Decision::Proceed,
            ),
            (
                "a later replay already started: it holds the request",
                vec![with(same("z-started", 5, Some(Running)), |s| s.started = true)],
                dup("z-started"),
            ),
        ];
        for (name, others, expected) in cases {
            assert_eq!(decide(&me, &others, 10), expected, "{name}");
        }
        // Duplicate is decided before the deadline and notBefore.
        let late = with(me.clone(), |s| {
            s.not_before = Some(at(6));
            s.deadline = Some(at(7));
        });
        assert_eq!(decide(&late, &[same("first", 0, None)], 60), dup("first"));
    }

    #[test]
    fn queue_table() {
        let up = |name: &str, phase, created| sib(name, Upgrade, phase, created);
        let running = |s: Sibling| {
            with(s, |s| {
                s.phase = Some(Running);
                s.started = true;
            })
        };
        let cases: Vec<(&str, Sibling, Vec<Sibling>, Decision)> = vec![
            ("alone", up("me", None, 5), vec![], Decision::Proceed),
            (
                "behind a running upgrade",
                up("me", None, 5),
                vec![running(up("u1", None, 0))],
                queued("u1"),
            ),
            (
                "behind a running one created later",
                up("me", None, 5),
                vec![running(up("u9", None, 9))],
                queued("u9"),
            ),
            (
                "behind an earlier pending rollback",
                up("me", None, 5),
                vec![sib("rb", Rollback, Some(Pending), 1)],
                queued("rb"),
            ),
            (
                "behind an earlier op without status",
                up("me", None, 5),
                vec![sib("rs", Restore, None, 1)],
                queued("rs"),
            ),
            (
                "ahead of a later pending upgrade",
                up("me", None, 5),
                vec![up("u9", Some(Pending), 9)],
                Decision::Proceed,
            ),
            (
                "same time: name breaks the tie",
                up("me", None, 5),
                vec![up("a", None, 5)],
                queued("a"),
            ),
            (
                "same time: I come first",
                up("me", None, 5),
                vec![up("z", None, 5)],
                Decision::Proceed,
            ),
            (
                "terminal siblings hold nothing",
                up("me", None, 5),
                vec![up("u1", Some(Succeeded), 0), up("u2", Some(Failed), 1)],
                Decision::Proceed,
            ),
            (
                "earlier sibling waiting for notBefore holds no place",
                up("me", None, 5),
                vec![with(up("u1", Some(Pending), 0), |s| s.not_before = Some(at(60)))],
                Decision::Proceed,
            ),
            (
                "earlier sibling past its deadline holds no place",
                up("me", None, 5),
                vec![with(up("u1", Some(Pending), 0), |s| s.deadline = Some(at(8)))],
                Decision::Proceed,
            ),
            (
                "earlier sibling that is a duplicate holds no place",
                up("me", None, 5),
                vec![
                    with(up("orig", Some(Succeeded), 0), |s| s.request_id = "r".into()),
                    with(up("replay", Some(Pending), 1), |s| s.request_id = "r".into()),
                ],
                Decision::Proceed,
            ),
            (
                "a running one is named before an earlier queued one",
                up("me", None, 5),
                vec![up("u1", Some(Pending), 1), running(up("u2", None, 2))],
                queued("u2"),
            ),
            (
                "upgrade ignores running backups",
                up("me", None, 5),
                vec![running(sib("b", Backup, None, 0))],
                Decision::Proceed,
            ),
            (
                "upgrade ignores pending snapshots",
                up("me", None, 5),
                vec![sib("s", Snapshot, None, 0)],
                Decision::Proceed,
            ),
            (
                "restore waits for a running backup",
                sib("me", Restore, None, 5),
                vec![running(sib("b", Backup, None, 0))],
                queued("b"),
            ),
            (
                "restore waits for an earlier pending snapshot",
                sib("me", Restore, None, 5),
                vec![sib("s", Snapshot, Some(Pending), 0)],
                queued("s"),
            ),
            (
                "restore goes before a later pending backup",
                sib("me", Restore, None, 5),
                vec![sib("b", Backup, Some(Pending), 9)],
                Decision::Proceed,
            ),
            (
                "backup waits for a running restore",
                sib("me", Backup, None, 5),
                vec![running(sib("r", Restore, None, 9))],
                queued("r"),
            ),
            (
                "backup waits for an earlier pending restore",
                sib("me", Backup, None, 5),
                vec![sib("r", Restore, Some(Pending), 1)],
                queued("r"),
            ),
            (
                "backups and snapshots run side by side",
                sib("me", Backup, None, 5),
                vec![
                    running(sib("b", Backup, None, 0)),
                    running(sib("s", Snapshot, None, 1)),
                    sib("b2", Backup, None, 2),
                ],
                Decision::Proceed,
            ),
            (
                "backup beside a running upgrade",
                sib("me", Backup, None, 5),
                vec![running(up("u", None, 0))],
                Decision::Proceed,
            ),
            (
                "runbooks are never queued",
                sib("me", Runbook, None, 5),
                vec![running(up("u", None, 0)), running(sib("r", Restore, None, 1))],
                Decision::Proceed,
            ),
            (
                "runbooks block nobody",
                up("me", None, 5),
                vec![running(sib("rb", Runbook, None, 0))],
                Decision::Proceed,
            ),
        ];
        for (name, me, others, expected) in cases {
            assert_eq!(decide(&me, &others, 10), expected, "{name}");
        }
    }

    #[test]
    fn children_never_wait_for_their_family() {
        let parent = with(sib("up", Upgrade, Some(Running), 0), |s| s.started = true);
        let child =
            |name: &str, type_, created| with(sib(name, type_, None, created), |s| s.parent = Some("up".into()));
        let cases: Vec<(&str, Sibling, Vec<Sibling>, Decision)> = vec![
            (
                "pre-upgrade backup",
                child("up-backup", Backup, 1),
                vec![parent.clone()],
                Decision::Proceed,
            ),
            (
                "onFailure rollback",
                child("up-rollback", Rollback, 3),
                vec![parent.clone()],
                Decision::Proceed,
            ),
            (
                "onFailure restore",
                child("up-restore", Restore, 4),
                vec![parent.clone()],
                Decision::Proceed,
            ),
            (
                "grandchild",
                with(sib("gc", Backup, None, 5), |s| s.parent = Some("up-restore".into())),
                vec![parent.clone(), child("up-restore", Restore, 4)],
                Decision::Proceed,
            ),
            (
                "a restore queued after the parent does not get ahead of its backup",
                child("up-backup", Backup, 3),
                vec![parent.clone(), sib("other-restore", Restore, Some(Pending), 1)],
                Decision::Proceed,
            ),
            (
                "a child still waits for a running stranger",
                child("up-restore", Restore, 4),
                vec![
                    parent.clone(),
                    with(sib("b", Backup, Some(Running), 2), |s| s.started = true),
                ],
                queued("b"),
            ),
            (
                "parent of a stranger is no excuse",
                with(sib("me", Upgrade, None, 5), |s| s.parent = Some("elsewhere".into())),
                vec![parent.clone()],
                queued("up"),
            ),
        ];
        for (name, me, others, expected) in cases {
            assert_eq!(decide(&me, &others, 10), expected, "{name}");
        }
        // The stranger restore, in turn, waits (behind the running parent).
        let stranger = sib("other-restore", Restore, Some(Pending), 1);
        assert_eq!(
            decide(&stranger, &[parent.clone(), child("up-backup", Backup, 3)], 10),
            queued("up")
        );
    }

    /// NOW is a Tuesday, 02:00 UTC; this window opens an hour later.
    fn tuesday_at_three() -> Maintenance {
        Maintenance::of(Some(&api::ApplicationInstance::new(
            "app",
            api::ApplicationInstanceSpec {
                maintenance_windows: vec![api::maintenance::MaintenanceWindow {
                    days: vec![api::maintenance::Weekday::Tuesday],
                    start: "03:00".into(),
                    duration: "1h".into(),
                    time_zone: None,
                }],
                ..Default::default()
            },
        )))
    }

    fn decide_in(me: &Sibling, others: &[Sibling], now: i64, maintenance: &Maintenance) -> Decision {
        super::decide(&op_of(me), at(now), &Siblings::new(others.to_vec()), maintenance)
    }

    /// Name, the Operation, its siblings, minutes from NOW, the windows, expected.
    type WindowCase<'a> = (&'static str, Sibling, Vec<Sibling>, i64, &'a Maintenance, Decision);

    #[test]
    fn maintenance_windows_gate_upgrades_rollbacks_and_restores() {
        let windows = tuesday_at_three();
        let invalid = Maintenance::Invalid(
            "spec.maintenanceWindows[0]: timeZone \"Mars/Olympus\" is not in the time zone database".into(),
        );
        let waiting = Decision::WaitForWindow {
            opens: at(60),
            window: "Tuesday 03:00 for 1h (UTC)".into(),
        };
        let urgent = |s: Sibling| with(s, |s| s.urgent = true);
        let restore_waiting = sib("rs", Restore, Some(Pending), 0);
        let cases: Vec<WindowCase<'_>> = vec![
            (
                "an upgrade waits",
                sib("me", Upgrade, None, 5),
                vec![],
                0,
                &windows,
                waiting.clone(),
            ),
            (
                "a rollback waits",
                sib("me", Rollback, None, 5),
                vec![],
                0,
                &windows,
                waiting.clone(),
            ),
            (
                "a restore waits",
                sib("me", Restore, None, 5),
                vec![],
                0,
                &windows,
                waiting.clone(),
            ),
            (
                "an urgent one does not",
                urgent(sib("me", Upgrade, None, 5)),
                vec![],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "a backup does not",
                sib("me", Backup, None, 5),
                vec![],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "a snapshot does not",
                sib("me", Snapshot, None, 5),
                vec![],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "a runbook does not",
                sib("me", Runbook, None, 5),
                vec![],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "a child of a started Operation does not",
                with(sib("me", Restore, None, 5), |s| s.parent = Some("up".into())),
                vec![with(sib("up", Upgrade, Some(Running), 0), |s| s.started = true)],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "inside the window: proceed",
                sib("me", Upgrade, None, 5),
                vec![],
                60,
                &windows,
                Decision::Proceed,
            ),
            (
                "after it closed: wait a week",
                sib("me", Upgrade, None, 5),
                vec![],
                120,
                &windows,
                Decision::WaitForWindow {
                    opens: at(60 + 7 * 24 * 60),
                    window: "Tuesday 03:00 for 1h (UTC)".into(),
                },
            ),
            (
                "the deadline comes first",
                with(sib("me", Upgrade, None, 5), |s| s.deadline = Some(at(30))),
                vec![],
                30,
                &windows,
                Decision::Expired,
            ),
            (
                "notBefore comes first",
                with(sib("me", Upgrade, None, 5), |s| s.not_before = Some(at(30))),
                vec![],
                0,
                &windows,
                Decision::WaitUntil(at(30)),
            ),
            (
                "a duplicate comes first",
                with(sib("me", Upgrade, None, 5), |s| s.request_id = "req-first".into()),
                vec![sib("first", Upgrade, Some(Succeeded), 0)],
                0,
                &windows,
                Decision::Duplicate { first: "first".into() },
            ),
            (
                "unusable windows: wait, named",
                sib("me", Upgrade, None, 5),
                vec![],
                0,
                &invalid,
                Decision::InvalidWindows(
                    "spec.maintenanceWindows[0]: timeZone \"Mars/Olympus\" is not in the time zone database".into(),
                ),
            ),
            (
                "unusable windows do not stop a backup",
                sib("me", Backup, None, 5),
                vec![],
                0,
                &invalid,
                Decision::Proceed,
            ),
            (
                "a restore waiting for the window holds no place in the queue",
                sib("me", Backup, None, 5),
                vec![restore_waiting.clone()],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "once the window opens, it does",
                sib("me", Backup, None, 5),
                vec![restore_waiting.clone()],
                60,
                &windows,
                queued("rs"),
            ),
            (
                "an urgent restore holds its place outside the window",
                sib("me", Backup, None, 5),
                vec![urgent(restore_waiting)],
                0,
                &windows,
                queued("rs"),
            ),
            (
                "a verified restore does not wait for the window: the application is not touched",
                with(sib("me", Restore, None, 5), |s| s.verifies_only = true),
                vec![],
                0,
                &windows,
                Decision::Proceed,
            ),
            (
                "a running upgrade still blocks an urgent one",
                urgent(sib("me", Upgrade, None, 5)),
                vec![with(sib("u1", Upgrade, Some(Running), 0), |s| s.started = true)],
                0,
                &windows,
                queued("u1"),
            ),
        ];
        for (name, me, others, now, maintenance, expected) in cases {
            assert_eq!(decide_in(&me, &others, now, maintenance), expected, "{name}");
        }
    }

    #[test]
    fn waiting_for_a_window_is_worded_and_woken() {
        let windows = tuesday_at_three();
        let me = with(sib("me", Upgrade, None, 5), |s| s.deadline = Some(at(45)));
        let op = op_of(&me);
        assert_eq!(
            gate(&op, at(0), &Siblings::default(), &windows),
            Gate::WaitForWindow(Outcome::Pending {
                reason: "QueuedForMaintenanceWindow".into(),
                message: "Waiting for the maintenance window Tuesday 03:00 for 1h (UTC), which opens at \
                          2026-12-01T03:00:00Z, after spec.deadline 2026-12-01T02:45:00Z: it will expire unless the \
                          windows change (spec.urgent starts it at once)"
                    .into(),
            })
        );
        // The deadline is the earlier wake-up; without it, the window's opening.
        assert_eq!(wake_at(&op, at(0), &windows), Some(at(45)));
        let no_deadline = op_of(&sib("me", Upgrade, None, 5));
        assert_eq!(wake_at(&no_deadline, at(0), &windows), Some(at(60)));
        assert_eq!(wake_at(&no_deadline, at(0), &Maintenance::default()), None);
        let backup = op_of(&sib("me", Backup, None, 5));
        assert_eq!(wake_at(&backup, at(0), &windows), None);
        let invalid = Maintenance::Invalid("spec.maintenanceWindows[0]: bad".into());
        assert!(matches!(
            gate(&no_deadline, at(0), &Siblings::default(), &invalid),
            Gate::WaitForWindow(Outcome::Pending { reason, message })
                if reason == "InvalidMaintenanceWindow" && message.ends_with("(or spec.urgent): spec.maintenanceWindows[0]: bad")
        ));
    }

    #[test]
    fn parent_loops_terminate() {
        let a = with(sib("a", Upgrade, None, 0), |s| s.parent = Some("b".into()));
        let b = with(sib("b", Upgrade, None, 1), |s| s.parent = Some("a".into()));
        // Related both ways: neither blocks the other; the point is that it terminates.
        assert_eq!(decide(&a, std::slice::from_ref(&b), 10), Decision::Proceed);
        assert_eq!(decide(&b, &[a], 10), Decision::Proceed);
    }

    #[test]
    fn stopping_gates_carry_their_outcome() {
        let me = with(sib("me", Upgrade, None, 5), |s| {
            s.request_id = "odoo-op-4711".into();
            s.deadline = Some(at(60));
        });
        let op = op_of(&me);
        let siblings = Siblings::new(vec![with(sib("u1", Upgrade, Some(Running), 0), |s| s.started = true)]);
        let cases = [
            (Decision::Terminal, Gate::Terminal),
            (Decision::Proceed, Gate::Proceed),
            (
                Decision::Duplicate { first: "first".into() },
                Gate::Duplicate(Outcome::Duplicate {
                    first: "first".into(),
                    message: "requestId odoo-op-4711 was already handled by Operation first".into(),
                }),
            ),
            (
                Decision::Expired,
                Gate::Expired(Outcome::Expired {
                    message: "Not started before the deadline 2026-12-01T03:00:00Z (spec.deadline)".into(),
                }),
            ),
            (
                Decision::WaitUntil(at(30)),
                Gate::WaitUntil(Outcome::Pending {
                    reason: "WaitingForNotBefore".into(),
                    message: "Waiting until 2026-12-01T02:30:00Z (spec.notBefore)".into(),
                }),
            ),
            (
                queued("u1"),
                Gate::Queued(Outcome::Pending {
                    reason: "Queued".into(),
                    message: "Queued behind Operation team-a/u1 (Upgrade, Running)".into(),
                }),
            ),
            (
                queued("unknown"),
                Gate::Queued(Outcome::Pending {
                    reason: "Queued".into(),
                    message: "Queued behind Operation team-a/unknown".into(),
                }),
            ),
        ];
        for (decision, expected) in cases {
            assert_eq!(decision.clone().into_gate(&op, &siblings), expected, "{decision:?}");
        }
        // `gate` is the decision and its wording in one step.
        assert_eq!(
            gate(&op, at(10), &siblings, &Maintenance::default()),
            queued("u1").into_gate(&op, &siblings),
            "gate = decide + into_gate"
        );
    }

    #[test]
    fn wake_at_table() {
        let base = sib("me", Backup, None, 0);
        let cases = [
            ("nothing scheduled", base.clone(), None),
            (
                "notBefore ahead",
                with(base.clone(), |s| s.not_before = Some(at(30))),
                Some(at(30)),
            ),
            (
                "notBefore passed, deadline ahead",
                with(base.clone(), |s| {
                    s.not_before = Some(at(-5));
                    s.deadline = Some(at(40));
                }),
                Some(at(40)),
            ),
            (
                "both ahead: the earlier",
                with(base.clone(), |s| {
                    s.not_before = Some(at(30));
                    s.deadline = Some(at(40));
                }),
                Some(at(30)),
            ),
            (
                "started",
                with(base.clone(), |s| {
                    s.phase = Some(Running);
                    s.started = true;
                    s.deadline = Some(at(40));
                }),
                None,
            ),
            (
                "terminal",
                with(base.clone(), |s| {
                    s.phase = Some(Succeeded);
                    s.deadline = Some(at(40));
                }),
                None,
            ),
        ];
        for (name, me, expected) in cases {
            assert_eq!(wake_at(&op_of(&me), at(0), &Maintenance::default()), expected, "{name}");
        }
    }

    #[test]
    fn siblings_of_filters_and_views() {
        let mut me = crate::meta::tests::op("me", Upgrade);
        me.metadata.creation_timestamp = Some(Time(at(0)));
        let mut other_app = crate::meta::tests::op("other-app", Upgrade);
        other_app.spec.application_ref.name = "wiki".into();
        let mut other_ns = crate::meta::tests::op("other-ns", Upgrade);
        other_ns.metadata.namespace = Some("team-b".into());
        let mut child = crate::meta::tests::op("child", Backup);
        child.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "vworkspace.io/v1alpha1".into(),
            kind: "Operation".into(),
            name: "me".into(),
            uid: "uid-me".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        child.status = Some(OperationStatus {
            phase: Some(Pending),
            start_time: Some(Time(at(1))),
            duplicate_of: Some("x".into()),
            ..Default::default()
        });
        let all = [me.clone(), other_app, other_ns, child];
        let siblings = Siblings::of(&me, &all);
        let names: Vec<_> = siblings.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["child"]);
        let view = siblings.get("child").expect("child");
        assert_eq!(view.parent.as_deref(), Some("me"));
        assert!(view.started, "startTime counts as started");
        assert_eq!(view.duplicate_of.as_deref(), Some("x"));
        assert_eq!(view.type_, Backup);
        assert_eq!(view.request_id, "odoo:op:4711");

        let me_view = Sibling::from_operation(&me);
        assert_eq!(me_view.created, Some(at(0)));
        assert_eq!(me_view.phase, None);
        assert!(!me_view.started);
    }

    #[test]
    fn the_decided_operation_in_its_own_siblings_is_ignored() {
        let me = sib("me", Upgrade, None, 5);
        let others = vec![me.clone(), sib("later", Upgrade, None, 9)];
        assert_eq!(decide(&me, &others, 10), Decision::Proceed);
    }

    #[test]
    fn missing_creation_time_sorts_last() {
        let me = sib("me", Upgrade, None, 5);
        let unknown = with(sib("unknown", Upgrade, None, 0), |s| s.created = None);
        assert_eq!(decide(&me, std::slice::from_ref(&unknown), 10), Decision::Proceed);
        assert_eq!(decide(&unknown, &[me], 10), queued("me"));
    }
}
