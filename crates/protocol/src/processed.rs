//! What the agent processed, and how it compares one to one with what the control plane
//! stored (issue 55).
//!
//! The agent keeps, with its ledger ([`crate::revision::LedgerRecord`]), a bounded history
//! of the documents it processed: for each, the cursor, the outcome and the
//! acknowledgement it produced in short ([`ProcessedDocument`]). A chaos run (or an
//! operator) compares that history with the acknowledgements the control plane holds
//! ([`audit`]): every processed document's acknowledgement, exactly as the agent last
//! produced it, must be there, and a missing or different one counts as lost.
//!
//! Short, because a document carries every object of the cluster (a chaos run's hold
//! about 130, about 19 KiB of entries each): the entries themselves are not kept, only how
//! many there are of each outcome and a digest of the whole acknowledgement as sent
//! (every entry, every field: message, uid, generation, conflict). The digest is FNV-1a
//! (64 bits) of the acknowledgement's JSON as this crate serialises it: it tells two
//! acknowledgements apart for the comparison, and is no integrity protection (whoever can
//! edit the ledger can edit the digest beside it).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::messages::{DocumentAck, DocumentOutcome};

/// Most processed documents the agent keeps (oldest dropped first). More than the
/// control plane's 100 acknowledgements (Odoo's addon and the simulator), so the
/// comparison is bounded by what the control plane holds, not by the agent.
pub const MAX_PROCESSED: usize = 128;

/// One processed document and the acknowledgement the agent produced for it, in short.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessedDocument {
    /// The document's epoch.
    pub epoch: String,
    /// The document's revision.
    pub revision: u64,
    /// The acknowledgement's outcome.
    pub outcome: DocumentOutcome,
    /// Its reason (a refusal's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the agent finished the document (the acknowledgement's `processed_at`).
    pub processed_at: Timestamp,
    /// Entries of the acknowledgement (one per object of the document).
    pub entries: usize,
    /// How many entries had each outcome (`applied`, `unchanged`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outcomes: BTreeMap<String, usize>,
    /// [`digest`] of the acknowledgement as sent.
    pub digest: String,
}

impl ProcessedDocument {
    /// The short form of `ack`: what the agent records of the acknowledgement it
    /// produced, and what the comparison makes of one the control plane stored.
    pub fn of(ack: &DocumentAck) -> Self {
        let mut outcomes = BTreeMap::new();
        for object in &ack.objects {
            *outcomes.entry(outcome_name(object.outcome)).or_insert(0) += 1;
        }
        Self {
            epoch: ack.epoch.clone(),
            revision: ack.revision,
            outcome: ack.outcome,
            reason: ack.reason.clone(),
            processed_at: ack.processed_at,
            entries: ack.objects.len(),
            outcomes,
            digest: digest(ack),
        }
    }

    /// Whether it is the acknowledgement of document `epoch`/`revision`.
    pub fn is_of(&self, epoch: &str, revision: u64) -> bool {
        self.epoch == epoch && self.revision == revision
    }
}

impl std::fmt::Display for ProcessedDocument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} {} at {}, {} entries {:?}, digest {}",
            self.epoch,
            self.revision,
            outcome_name(self.outcome),
            self.processed_at,
            self.entries,
            self.outcomes,
            self.digest
        )
    }
}

fn outcome_name<T: Serialize>(outcome: T) -> String {
    match serde_json::to_value(outcome) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "unknown".to_owned(),
    }
}

/// FNV-1a (64 bits, hex) of `ack`'s JSON as this crate serialises it. The same
/// acknowledgement read back from where it was stored (any JSON layout: Odoo keeps it
/// indented with sorted keys) has the same digest, since it is serialised again here.
pub fn digest(ack: &DocumentAck) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let bytes = serde_json::to_vec(ack).unwrap_or_default();
    let hash = bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME));
    format!("{hash:016x}")
}

/// A processed document whose acknowledgement the control plane does not hold as produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostAck {
    /// What the agent produced.
    pub produced: ProcessedDocument,
    /// What the control plane holds for the same document instead, if anything.
    pub stored: Option<ProcessedDocument>,
}

impl std::fmt::Display for LostAck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.stored {
            None => write!(
                f,
                "the acknowledgement of {}/{} that the agent produced ({}) is not among the control plane's",
                self.produced.epoch, self.produced.revision, self.produced
            ),
            Some(stored) => write!(
                f,
                "the control plane's acknowledgement of {}/{} is not the one the agent produced last: stored {stored}; produced {}",
                self.produced.epoch, self.produced.revision, self.produced
            ),
        }
    }
}

/// The agent's processed documents against the control plane's acknowledgements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckAudit {
    /// Processed documents compared.
    pub compared: usize,
    /// Processed documents not compared: older than what the control plane still holds.
    pub outside_retention: usize,
    /// Compared, and not held by the control plane as produced.
    pub lost: Vec<LostAck>,
}

/// Compares every document in `processed` (the agent's history) one to one with `stored`
/// (every acknowledgement the control plane holds, of any epoch, the latest per document),
/// which keeps at most `retention` of them and drops the rest.
///
/// Only what both sides still hold is compared, so the control plane's retention cannot
/// raise a false alarm: while it holds fewer than `retention`, it has dropped nothing and
/// every processed document is compared; once it holds `retention`, a processed document
/// older than the oldest revision it holds of the same epoch, or of an epoch it holds
/// nothing of, may have been dropped, and is counted in `outside_retention` instead. (So
/// a loss just below that edge is not seen: a dropped and a lost acknowledgement look the
/// same there.)
pub fn audit(processed: &[ProcessedDocument], stored: &[DocumentAck], retention: usize) -> AckAudit {
    let full = stored.len() >= retention;
    let mut oldest: BTreeMap<&str, u64> = BTreeMap::new();
    for ack in stored {
        let low = oldest.entry(ack.epoch.as_str()).or_insert(ack.revision);
        *low = (*low).min(ack.revision);
    }
    let mut out = AckAudit::default();
    for produced in processed {
        let held = oldest
            .get(produced.epoch.as_str())
            .is_some_and(|low| produced.revision >= *low);
        if full && !held {
            out.outside_retention += 1;
            continue;
        }
        out.compared += 1;
        let stored = stored
            .iter()
            .rev()
            .find(|a| produced.is_of(&a.epoch, a.revision))
            .map(ProcessedDocument::of);
        if stored.as_ref() != Some(produced) {
            out.lost.push(LostAck {
                produced: produced.clone(),
                stored,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ObjectAck, ObjectKind, ObjectOutcome};

    fn ack(epoch: &str, revision: u64, objects: &[(&str, ObjectOutcome)]) -> DocumentAck {
        DocumentAck {
            epoch: epoch.into(),
            revision,
            outcome: DocumentOutcome::Applied,
            reason: None,
            message: None,
            processed_at: Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(revision.try_into().unwrap()),
            objects: objects
                .iter()
                .map(|(name, outcome)| ObjectAck {
                    kind: ObjectKind::ApplicationInstance,
                    namespace: "ns".into(),
                    name: (*name).into(),
                    outcome: *outcome,
                    reason: None,
                    message: None,
                    uid: Some(format!("uid-{name}")),
                    generation: Some(1),
                    conflict: None,
                })
                .collect(),
        }
    }

    fn short(acks: &[DocumentAck]) -> Vec<ProcessedDocument> {
        acks.iter().map(ProcessedDocument::of).collect()
    }

    use ObjectOutcome::{Applied, Unchanged};

    #[test]
    fn the_short_form_counts_outcomes_and_survives_any_json_layout() {
        let a = ack("e", 3, &[("a", Applied), ("b", Unchanged), ("c", Unchanged)]);
        let p = ProcessedDocument::of(&a);
        assert_eq!(p.entries, 3);
        assert_eq!(
            p.outcomes,
            BTreeMap::from([("applied".into(), 1), ("unchanged".into(), 2)])
        );
        // As Odoo stores it (indented, keys sorted), read back: the same digest.
        let odoo_text = serde_json::to_string_pretty(&serde_json::to_value(&a).unwrap()).unwrap();
        let back: DocumentAck = serde_json::from_str(&odoo_text).unwrap();
        assert_eq!(ProcessedDocument::of(&back), p);
        // Any field of any entry changes it.
        let mut other = a.clone();
        other.objects[2].generation = Some(2);
        assert_ne!(digest(&other), p.digest);
        let mut other = a.clone();
        other.objects[1].message = Some("x".into());
        assert_ne!(digest(&other), p.digest);
        // The record of an older agent's ledger (or an edited one) still reads.
        let stored = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<ProcessedDocument>(&stored).unwrap(), p);
    }

    #[test]
    fn audit_table() {
        let produced = [
            ack("e", 1, &[("a", Applied)]),
            ack("e", 2, &[("a", Unchanged), ("b", Applied)]),
            ack("e", 3, &[("a", Unchanged), ("b", Unchanged)]),
        ];
        let mut differs = produced[1].clone();
        differs.objects[1].outcome = ObjectOutcome::Failed;
        differs.outcome = DocumentOutcome::Incomplete;
        let other_epoch = ack("old", 9, &[]);
        // (case, what the control plane holds, its retention, compared, outside, lost revisions)
        type Case = (&'static str, Vec<DocumentAck>, usize, usize, usize, Vec<u64>);
        let cases: [Case; 7] = [
            ("all held", produced.to_vec(), 100, 3, 0, vec![]),
            (
                "one lost in the middle: a later `unchanged` does not hide it",
                vec![produced[0].clone(), produced[2].clone()],
                100,
                3,
                0,
                vec![2],
            ),
            (
                "the control plane holds another acknowledgement of revision 2 (an earlier, incomplete one)",
                vec![produced[0].clone(), differs, produced[2].clone()],
                100,
                3,
                0,
                vec![2],
            ),
            ("nothing held", vec![], 100, 3, 0, vec![1, 2, 3]),
            (
                "full: revision 1 may have been dropped, not compared",
                vec![produced[1].clone(), produced[2].clone()],
                2,
                2,
                1,
                vec![],
            ),
            (
                "full, with a loss inside what it holds",
                vec![produced[0].clone(), produced[2].clone()],
                2,
                3,
                0,
                vec![2],
            ),
            (
                "full of another epoch: nothing of this one can be compared",
                vec![other_epoch.clone(), other_epoch],
                2,
                0,
                3,
                vec![],
            ),
        ];
        let processed = short(&produced);
        for (case, stored, retention, compared, outside, lost) in cases {
            let got = audit(&processed, &stored, retention);
            assert_eq!(
                (
                    got.compared,
                    got.outside_retention,
                    got.lost.iter().map(|l| l.produced.revision).collect::<Vec<_>>()
                ),
                (compared, outside, lost),
                "{case}"
            );
        }
    }

    #[test]
    fn a_lost_acknowledgement_says_what_was_produced_and_what_is_held() {
        let produced = ack("e", 2, &[("a", Applied)]);
        let mut held = produced.clone();
        held.processed_at = Timestamp::UNIX_EPOCH;
        let got = audit(&short(std::slice::from_ref(&produced)), &[held], 100);
        let line = got.lost[0].to_string();
        assert!(line.contains("not the one the agent produced last"), "{line}");
        assert!(line.contains("e/2 applied"), "{line}");
        let got = audit(&short(&[produced]), &[], 100);
        assert!(got.lost[0].to_string().contains("is not among the control plane's"));
    }
}
