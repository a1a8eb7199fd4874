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

use std::collections::VecDeque;

use crate::messages::{Cursor, DocumentAck, DocumentOutcome};

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

/// Acknowledgements still to be delivered, and the `known` cursor.
#[derive(Clone, Debug, Default)]
pub struct AckLedger {
    known: Option<Cursor>,
    pending: VecDeque<DocumentAck>,
}

/// Most acknowledgements kept pending; older ones are superseded by newer revisions.
pub const MAX_PENDING_ACKS: usize = 16;

impl AckLedger {
    /// An empty ledger (agent start: nothing known).
    pub fn new() -> Self {
        Self::default()
    }

    /// The cursor to send as `known`.
    pub fn known(&self) -> Option<&Cursor> {
        self.known.as_ref()
    }

    /// Records the outcome of a processed document (rules 4 and 5). An ack for the same
    /// cursor replaces the pending one.
    pub fn record(&mut self, ack: DocumentAck) {
        let cursor = Cursor {
            epoch: ack.epoch.clone(),
            revision: ack.revision,
        };
        if matches!(ack.outcome, DocumentOutcome::Applied | DocumentOutcome::Refused)
            && crate::validate::epoch_ok(&cursor.epoch)
            && decide(self.known.as_ref(), &cursor) == Decision::Apply
        {
            self.known = Some(cursor);
        }
        self.pending
            .retain(|p| !(p.epoch == ack.epoch && p.revision == ack.revision));
        self.pending.push_back(ack);
        while self.pending.len() > MAX_PENDING_ACKS {
            self.pending.pop_front();
        }
    }

    /// The acknowledgements to put in the next sync, oldest first.
    pub fn outgoing(&self) -> Vec<DocumentAck> {
        self.pending.iter().cloned().collect()
    }

    /// A sync carrying `sent` succeeded: those acks are delivered. Acks recorded since
    /// (not in `sent`) stay pending.
    pub fn delivered(&mut self, sent: &[DocumentAck]) {
        self.pending.retain(|p| !sent.contains(p));
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
}
