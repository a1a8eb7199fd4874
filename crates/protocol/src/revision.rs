//! Revisions and acknowledgements: which documents to apply, and which acknowledgements
//! to (re)send.
//!
//! Rules (also in `docs/connectivity/protocol.md`):
//!
//! 1. Odoo numbers documents per cluster with a [`Cursor`]: an `epoch` and a `revision`
//!    that increases within the epoch whenever the desired state changes.
//! 2. The agent sends `known`, the cursor of the last document it processed; Odoo sends a
//!    document only when its current cursor differs.
//! 3. A document is applied when its epoch differs from `known`'s, or its revision is
//!    greater ([`decide`]). A lower or equal revision in the same epoch is ignored.
//! 4. Every processed document yields one [`DocumentAck`]. Acks are delivered at least
//!    once: they stay pending until a sync carrying them succeeds ([`AckLedger`]).
//! 5. `known` advances when a document is `applied` or `refused`; after an `incomplete`
//!    one (a transient per-object failure) it stays, so Odoo sends the same revision again
//!    and the agent retries it (applying is idempotent). It never moves back (an
//!    acknowledgement of an older revision of the same epoch leaves it), and a cursor whose
//!    epoch is not a valid epoch never becomes `known`: a refused document with a garbled
//!    epoch must not switch the stale-revision rule off for the real one.
//! 6. An epoch the agent has left is never entered again: when `known` moves to a new
//!    epoch, the old one is retired, and a document of a retired epoch is stale (a delayed
//!    push of the old sequence must not look like a new one).
//! 7. `known`, the retired epochs and the acknowledgements not yet delivered survive
//!    restarts and leader changes ([`LedgerRecord`]): the agent records them before an
//!    acknowledgement leaves it, and reads them back before it processes a document.
//!
//! Beside them the ledger keeps what was processed ([`ProcessedDocument`], the last
//! [`MAX_PROCESSED`]): no rule reads it; it is there to be compared with what the control
//! plane stored ([`crate::processed::audit`]).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{
    messages::{Cursor, DocumentAck, DocumentOutcome},
    processed::{MAX_PROCESSED, ProcessedDocument},
};

/// What to do with an incoming document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Newer (or of another epoch): validate and apply it.
    Apply,
    /// Already processed (the same cursor): nothing to do.
    AlreadyProcessed,
    /// Older than what was processed, in the same epoch: ignore it (and log).
    Stale,
}

/// Rule 3.
pub fn decide(known: Option<&Cursor>, incoming: &Cursor) -> Decision {
    match known {
        None => Decision::Apply,
        Some(k) if k.epoch != incoming.epoch => Decision::Apply,
        Some(k) if incoming.revision > k.revision => Decision::Apply,
        Some(k) if incoming.revision == k.revision => Decision::AlreadyProcessed,
        Some(_) => Decision::Stale,
    }
}

/// Acknowledgements still to be delivered, the `known` cursor and the retired epochs.
#[derive(Clone, Debug, Default)]
pub struct AckLedger {
    known: Option<Cursor>,
    retired: VecDeque<String>,
    pending: VecDeque<DocumentAck>,
    /// Documents processed, oldest first, the latest acknowledgement of each.
    processed: VecDeque<ProcessedDocument>,
    /// Changes made, and the count when last recorded durably ([`AckLedger::unsaved`]).
    changes: u64,
    saved: u64,
}

/// Most acknowledgements kept pending; older ones are superseded by newer revisions.
pub const MAX_PENDING_ACKS: usize = 16;

/// Most retired epochs remembered (an epoch changes when Odoo's cluster record is created
/// or its database restored: a handful in a cluster's life).
pub const MAX_RETIRED_EPOCHS: usize = 32;

/// What survives a restart or a leader change (rule 7), as the agent stores it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerRecord {
    /// The last document processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<Cursor>,
    /// Epochs left, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_epochs: Vec<String>,
    /// Acknowledgements not known to be delivered, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acks: Vec<DocumentAck>,
    /// Documents processed, oldest first, each with the acknowledgement last produced for
    /// it, in short. Absent in a record of an agent before issue 55; a member that does not
    /// read is dropped rather than stopping the agent (no rule depends on it).
    #[serde(
        default,
        deserialize_with = "lenient_processed",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub processed: Vec<ProcessedDocument>,
}

/// [`LedgerRecord::processed`] as stored, or nothing when it does not read.
fn lenient_processed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ProcessedDocument>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}

impl AckLedger {
    /// An empty ledger (nothing ever processed, or its record lost).
    pub fn new() -> Self {
        Self::default()
    }

    /// The ledger as recorded: what it holds is taken as already saved. Entries that break
    /// the rules (an invalid epoch as `known`) are dropped rather than trusted.
    pub fn from_record(record: LedgerRecord) -> Self {
        let mut retired: VecDeque<String> = record
            .retired_epochs
            .into_iter()
            .filter(|e| crate::validate::epoch_ok(e))
            .collect();
        while retired.len() > MAX_RETIRED_EPOCHS {
            retired.pop_front();
        }
        let known = record
            .known
            .filter(|k| crate::validate::epoch_ok(&k.epoch) && !retired.contains(&k.epoch));
        let mut pending: VecDeque<DocumentAck> = record.acks.into_iter().collect();
        while pending.len() > MAX_PENDING_ACKS {
            pending.pop_front();
        }
        let mut processed: VecDeque<ProcessedDocument> = record.processed.into_iter().collect();
        while processed.len() > MAX_PROCESSED {
            processed.pop_front();
        }
        Self {
            known,
            retired,
            pending,
            processed,
            changes: 0,
            saved: 0,
        }
    }

    /// What to store, with the change count to pass to [`AckLedger::saved`] once stored.
    /// What does not fit in `max_bytes` (serialised) is left out, the oldest first: the
    /// processed documents before any acknowledgement (they only serve the comparison with
    /// the control plane; they stay in memory), then the acknowledgements; the second
    /// value counts the acknowledgements left out (they stay pending in memory).
    pub fn record_within(&self, max_bytes: usize) -> (LedgerRecord, usize, u64) {
        let mut record = LedgerRecord {
            known: self.known.clone(),
            retired_epochs: self.retired.iter().cloned().collect(),
            acks: self.pending.iter().cloned().collect(),
            processed: self.processed.iter().cloned().collect(),
        };
        let too_big = |r: &LedgerRecord| serde_json::to_vec(r).map_or(usize::MAX, |v| v.len()) > max_bytes;
        while !record.processed.is_empty() && too_big(&record) {
            record.processed.remove(0);
        }
        let mut left_out = 0;
        while !record.acks.is_empty() && too_big(&record) {
            record.acks.remove(0);
            left_out += 1;
        }
        (record, left_out, self.changes)
    }

    /// Whether something changed since it was last recorded.
    pub fn unsaved(&self) -> bool {
        self.changes != self.saved
    }

    /// The record taken at change count `changes` was stored.
    pub fn saved(&mut self, changes: u64) {
        self.saved = self.saved.max(changes);
    }

    /// The cursor to send as `known`.
    pub fn known(&self) -> Option<&Cursor> {
        self.known.as_ref()
    }

    /// Rules 3 and 6: [`decide`], with a document of a retired epoch stale.
    pub fn decide(&self, incoming: &Cursor) -> Decision {
        if self.retired.contains(&incoming.epoch) {
            return Decision::Stale;
        }
        decide(self.known.as_ref(), incoming)
    }

    /// Records the outcome of a processed document (rules 4 to 6). An ack for the same
    /// cursor replaces the pending one.
    pub fn record(&mut self, ack: DocumentAck) {
        let cursor = Cursor {
            epoch: ack.epoch.clone(),
            revision: ack.revision,
        };
        if matches!(ack.outcome, DocumentOutcome::Applied | DocumentOutcome::Refused)
            && crate::validate::epoch_ok(&cursor.epoch)
            && self.decide(&cursor) == Decision::Apply
        {
            if let Some(left) = self.known.take().filter(|k| k.epoch != cursor.epoch) {
                self.retired.push_back(left.epoch);
                while self.retired.len() > MAX_RETIRED_EPOCHS {
                    self.retired.pop_front();
                }
            }
            self.known = Some(cursor);
        }
        self.processed.retain(|p| !p.is_of(&ack.epoch, ack.revision));
        self.processed.push_back(ProcessedDocument::of(&ack));
        while self.processed.len() > MAX_PROCESSED {
            self.processed.pop_front();
        }
        self.pending
            .retain(|p| !(p.epoch == ack.epoch && p.revision == ack.revision));
        self.pending.push_back(ack);
        while self.pending.len() > MAX_PENDING_ACKS {
            self.pending.pop_front();
        }
        self.changes += 1;
    }

    /// The documents processed, oldest first, with the acknowledgement last produced for
    /// each (delivered or not), in short.
    pub fn processed(&self) -> impl Iterator<Item = &ProcessedDocument> {
        self.processed.iter()
    }

    /// The acknowledgements to put in the next sync, oldest first.
    pub fn outgoing(&self) -> Vec<DocumentAck> {
        self.pending.iter().cloned().collect()
    }

    /// The acknowledgement held for `cursor`, if any (a repeated push is answered with it).
    pub fn ack_of(&self, cursor: &Cursor) -> Option<&DocumentAck> {
        self.pending
            .iter()
            .rev()
            .find(|a| a.epoch == cursor.epoch && a.revision == cursor.revision)
    }

    /// A sync carrying `sent` succeeded: those acks are delivered. Acks recorded since
    /// (not in `sent`) stay pending.
    pub fn delivered(&mut self, sent: &[DocumentAck]) {
        let before = self.pending.len();
        self.pending.retain(|p| !sent.contains(p));
        if self.pending.len() != before {
            self.changes += 1;
        }
    }

    /// Number of pending acknowledgements.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(epoch: &str, revision: u64) -> Cursor {
        Cursor {
            epoch: epoch.into(),
            revision,
        }
    }

    fn ack(epoch: &str, revision: u64, outcome: DocumentOutcome) -> DocumentAck {
        DocumentAck {
            epoch: epoch.into(),
            revision,
            outcome,
            reason: None,
            message: None,
            processed_at: jiff::Timestamp::UNIX_EPOCH,
            objects: vec![],
        }
    }

    #[test]
    fn decide_table() {
        let cases = [
            (None, c("a", 1), Decision::Apply),
            (Some(c("a", 1)), c("a", 2), Decision::Apply),
            (Some(c("a", 7)), c("a", 7), Decision::AlreadyProcessed),
            (Some(c("a", 7)), c("a", 6), Decision::Stale),
            (Some(c("a", 7)), c("b", 1), Decision::Apply),
        ];
        for (known, incoming, want) in cases {
            assert_eq!(decide(known.as_ref(), &incoming), want, "{known:?} -> {incoming:?}");
        }
    }

    #[test]
    fn known_advances_on_applied_and_refused_only() {
        let mut l = AckLedger::new();
        assert_eq!(l.known(), None);
        l.record(ack("a", 1, DocumentOutcome::Applied));
        assert_eq!(l.known(), Some(&c("a", 1)));
        l.record(ack("a", 2, DocumentOutcome::Incomplete));
        assert_eq!(l.known(), Some(&c("a", 1)), "an incomplete revision is retried");
        l.record(ack("a", 2, DocumentOutcome::Refused));
        assert_eq!(l.known(), Some(&c("a", 2)));
        assert_eq!(l.pending_len(), 2, "the retried revision's ack replaced the first one");
    }

    #[test]
    fn known_never_moves_back_nor_to_an_invalid_epoch() {
        let mut l = AckLedger::new();
        l.record(ack("a", 7, DocumentOutcome::Applied));
        // A malformed document of an older revision, refused: acknowledged, not known.
        l.record(ack("a", 3, DocumentOutcome::Refused));
        assert_eq!(
            l.known(),
            Some(&c("a", 7)),
            "a refusal of revision 3 must not reopen 4..7"
        );
        // A garbled epoch, refused: acknowledged, not known, so a stale revision of the
        // real epoch is still recognised as stale.
        l.record(ack("bad epoch 2!", 9, DocumentOutcome::Refused));
        assert_eq!(l.known(), Some(&c("a", 7)));
        assert_eq!(decide(l.known(), &c("a", 6)), Decision::Stale);
        assert_eq!(l.pending_len(), 3, "every refusal is still acknowledged");
        // A new, valid epoch is taken (protocol.md: an epoch change restarts the count).
        l.record(ack("b", 1, DocumentOutcome::Applied));
        assert_eq!(l.known(), Some(&c("b", 1)));
    }

    #[test]
    fn acks_are_delivered_at_least_once() {
        let mut l = AckLedger::new();
        l.record(ack("a", 1, DocumentOutcome::Applied));
        let sent = l.outgoing();
        // The sync failed: nothing delivered, the same acks go again.
        assert_eq!(l.outgoing(), sent);
        // A new ack arrives while the retry is in flight.
        l.record(ack("a", 2, DocumentOutcome::Applied));
        l.delivered(&sent);
        let left = l.outgoing();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].revision, 2);
        l.delivered(&left);
        assert_eq!(l.pending_len(), 0);
    }

    #[test]
    fn pending_is_bounded() {
        let mut l = AckLedger::new();
        for r in 1..=40 {
            l.record(ack("a", r, DocumentOutcome::Applied));
        }
        assert_eq!(l.pending_len(), MAX_PENDING_ACKS);
        assert_eq!(l.outgoing()[0].revision, 40 - MAX_PENDING_ACKS as u64 + 1);
    }

    #[test]
    fn a_left_epoch_is_never_entered_again() {
        let mut l = AckLedger::new();
        l.record(ack("a", 50, DocumentOutcome::Applied));
        l.record(ack("b", 1, DocumentOutcome::Applied));
        assert_eq!(l.known(), Some(&c("b", 1)));
        // A delayed push of the old sequence is not a new epoch.
        assert_eq!(l.decide(&c("a", 51)), Decision::Stale);
        l.record(ack("a", 51, DocumentOutcome::Refused));
        assert_eq!(l.known(), Some(&c("b", 1)), "a refusal cannot reopen a retired epoch");
        assert_eq!(l.decide(&c("c", 1)), Decision::Apply, "a new epoch is still taken");
    }

    #[test]
    fn the_record_survives_a_restart_with_the_revision_rule() {
        let mut l = AckLedger::new();
        l.record(ack("a", 4, DocumentOutcome::Applied));
        l.record(ack("b", 7, DocumentOutcome::Applied));
        assert!(l.unsaved());
        let (record, left_out, changes) = l.record_within(usize::MAX);
        assert_eq!(left_out, 0);
        l.saved(changes);
        assert!(!l.unsaved());
        // Stored as JSON and read back by the next process (or the next leader).
        let stored = serde_json::to_string(&record).unwrap();
        let back = AckLedger::from_record(serde_json::from_str(&stored).unwrap());
        assert!(!back.unsaved());
        assert_eq!(back.known(), Some(&c("b", 7)));
        assert_eq!(
            back.decide(&c("b", 6)),
            Decision::Stale,
            "a delayed retry of revision 6"
        );
        assert_eq!(back.decide(&c("a", 5)), Decision::Stale, "the retired epoch");
        assert_eq!(back.decide(&c("b", 7)), Decision::AlreadyProcessed);
        assert_eq!(
            back.ack_of(&c("b", 7)).map(|a| a.revision),
            Some(7),
            "a repeated push is answered with its acknowledgement"
        );
        assert_eq!(back.outgoing().len(), 2, "undelivered acks go again");
    }

    #[test]
    fn delivering_acks_is_a_change_to_record() {
        let mut l = AckLedger::new();
        l.record(ack("a", 1, DocumentOutcome::Applied));
        let (_, _, changes) = l.record_within(usize::MAX);
        l.saved(changes);
        l.delivered(&[]);
        assert!(!l.unsaved(), "nothing delivered, nothing to record");
        let sent = l.outgoing();
        l.delivered(&sent);
        assert!(l.unsaved());
    }

    #[test]
    fn the_record_fits_its_budget_by_leaving_out_the_oldest_acks() {
        let mut l = AckLedger::new();
        for r in 1..=5 {
            let mut a = ack("a", r, DocumentOutcome::Applied);
            a.message = Some("x".repeat(1000));
            l.record(a);
        }
        let (record, left_out, _) = l.record_within(2500);
        assert_eq!(left_out, 3);
        assert_eq!(record.acks.iter().map(|a| a.revision).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(record.known, Some(c("a", 5)));
        let (record, left_out, _) = l.record_within(10);
        assert_eq!(
            (record.acks.len(), left_out),
            (0, 5),
            "known is kept even when no ack fits"
        );
    }

    #[test]
    fn a_record_that_breaks_the_rules_is_not_trusted() {
        let back = AckLedger::from_record(LedgerRecord {
            known: Some(c("bad epoch!", 9)),
            retired_epochs: vec!["ok".into(), "not ok!".into()],
            ..LedgerRecord::default()
        });
        assert_eq!(back.known(), None);
        assert_eq!(back.decide(&c("ok", 1)), Decision::Stale);
        let retired_known = AckLedger::from_record(LedgerRecord {
            known: Some(c("a", 3)),
            retired_epochs: vec!["a".into()],
            ..LedgerRecord::default()
        });
        assert_eq!(retired_known.known(), None, "known cannot be in a retired epoch");
    }

    #[test]
    fn processed_documents_are_kept_one_per_document_bounded_and_recorded() {
        let mut l = AckLedger::new();
        l.record(ack("a", 1, DocumentOutcome::Incomplete));
        l.record(ack("a", 1, DocumentOutcome::Applied));
        let sent = l.outgoing();
        l.delivered(&sent);
        assert_eq!(
            l.processed().map(|p| (p.revision, p.outcome)).collect::<Vec<_>>(),
            [(1, DocumentOutcome::Applied)],
            "the latest acknowledgement of a document replaces the retried one, and stays once delivered"
        );
        for r in 2..=(MAX_PROCESSED as u64 + 10) {
            l.record(ack("a", r, DocumentOutcome::Applied));
        }
        assert_eq!(l.processed().count(), MAX_PROCESSED);
        assert_eq!(
            l.processed().next().map(|p| p.revision),
            Some(11),
            "the oldest dropped first"
        );
        let (record, left_out, _) = l.record_within(usize::MAX);
        assert_eq!((record.processed.len(), left_out), (MAX_PROCESSED, 0));
        let back = AckLedger::from_record(serde_json::from_str(&serde_json::to_string(&record).unwrap()).unwrap());
        assert!(back.processed().eq(l.processed()), "read back as recorded");
    }

    #[test]
    fn processed_documents_give_way_to_acknowledgements_in_the_budget() {
        let mut l = AckLedger::new();
        for r in 1..=5 {
            l.record(ack("a", r, DocumentOutcome::Applied));
        }
        let (full, _, _) = l.record_within(usize::MAX);
        let size = |r: &LedgerRecord| serde_json::to_vec(r).unwrap().len();
        let (mut fits, _, _) = l.record_within(size(&full) - 1);
        assert_eq!(fits.acks.len(), 5, "every acknowledgement kept");
        assert_eq!(fits.processed.len(), 4, "the oldest processed document left out");
        assert_eq!(fits.processed[0].revision, 2);
        assert!(size(&fits) < size(&full));
        fits.processed.clear();
        let (none, left_out, _) = l.record_within(size(&fits));
        assert_eq!((none.processed.len(), none.acks.len(), left_out), (0, 5, 0));
    }

    #[test]
    fn an_old_or_edited_record_reads_without_processed_documents() {
        let old: LedgerRecord = serde_json::from_str(r#"{"known":{"epoch":"a","revision":3},"acks":[]}"#).unwrap();
        assert_eq!(old.processed, vec![]);
        assert_eq!(old.known, Some(c("a", 3)));
        let edited: LedgerRecord =
            serde_json::from_str(r#"{"known":{"epoch":"a","revision":3},"processed":[{"epoch":7}]}"#).unwrap();
        assert_eq!(edited.processed, vec![], "dropped, not a reason to stop processing");
        assert_eq!(edited.known, Some(c("a", 3)));
        let from_old = AckLedger::from_record(LedgerRecord {
            processed: (1..=(MAX_PROCESSED as u64 + 3))
                .map(|r| ProcessedDocument::of(&ack("a", r, DocumentOutcome::Applied)))
                .collect(),
            ..LedgerRecord::default()
        });
        assert_eq!(
            from_old.processed().count(),
            MAX_PROCESSED,
            "bounded when read back too"
        );
    }
}
