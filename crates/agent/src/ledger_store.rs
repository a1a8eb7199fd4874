//! Where the acknowledgement ledger survives restarts and leader changes (protocol.md,
//! "Revisions and acknowledgements", rule 7): the key `ledger.json` of the agent's status
//! ConfigMap, written by server-side apply under its own field manager, so the condition
//! written beside it (another manager) never removes it.
//!
//! Who can write it: whoever may patch ConfigMaps in the agent's namespace (the agent,
//! and the cluster's administrators). A tenant cannot. Deleting the key makes the agent
//! start as if it had never processed a document (Odoo sends its current one again).
//!
//! Beside `known`, the retired epochs and the undelivered acknowledgements, the record
//! holds the documents processed, each with the acknowledgement last produced for it in
//! short ([`protocol::processed::ProcessedDocument`], the last
//! [`protocol::processed::MAX_PROCESSED`]), for the one-to-one comparison with what the
//! control plane stored (`just chaos`). No decision of the agent reads them: whoever edits
//! them can make that comparison wrong, not make a document apply or be skipped. A record
//! without them (an older agent's) reads as before; a `processed` member that does not
//! read is dropped, not a reason for `LedgerUnreadable`.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use protocol::revision::{AckLedger, LedgerRecord};
use serde_json::json;

/// The ConfigMap key holding the [`LedgerRecord`].
pub const LEDGER_KEY: &str = "ledger.json";

/// Field manager of that key (the condition beside it is written by another).
pub const LEDGER_FIELD_MANAGER: &str = "vworkspace-agent-ledger";

/// Largest record written: a ConfigMap holds at most 1 MiB, shared with the condition.
/// What does not fit is left out of the record, the oldest first: processed documents
/// before any acknowledgement; acknowledgements left out stay pending in memory.
pub const MAX_RECORD_BYTES: usize = 512 * 1024;

/// Why the ledger could not be read or written.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The API server refused or could not be reached.
    #[error("cannot {action} the acknowledgement ledger in ConfigMap {name}: {detail}")]
    Api {
        /// `read` or `write`.
        action: &'static str,
        /// The ConfigMap.
        name: String,
        /// The client error (kube's errors carry no secret: a status or a transport error).
        detail: String,
    },
    /// The stored record is not a ledger record: someone edited it. Not guessed around:
    /// starting from nothing could apply an old document again.
    #[error(
        "ConfigMap {name} key {LEDGER_KEY} is not a ledger record ({detail}); delete the key to start as if no document had been processed"
    )]
    Unreadable {
        /// The ConfigMap.
        name: String,
        /// The parse error.
        detail: String,
    },
}

impl StoreError {
    /// Stable reason code (the agent condition's reason, a metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Api { .. } => "LedgerNotRecorded",
            Self::Unreadable { .. } => "LedgerUnreadable",
        }
    }
}

/// The ledger's home.
#[derive(Clone)]
pub struct LedgerStore {
    api: Api<ConfigMap>,
    name: String,
}

impl std::fmt::Debug for LedgerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerStore").field("configmap", &self.name).finish()
    }
}

impl LedgerStore {
    /// The key [`LEDGER_KEY`] of ConfigMap `namespace/name`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }

    /// The ledger as last recorded; an empty one when there is no record yet.
    pub async fn load(&self) -> Result<AckLedger, StoreError> {
        let configmap = self.api.get_opt(&self.name).await.map_err(|e| StoreError::Api {
            action: "read",
            name: self.name.clone(),
            detail: e.to_string(),
        })?;
        let stored = configmap.and_then(|c| c.data).and_then(|mut d| d.remove(LEDGER_KEY));
        let Some(stored) = stored else {
            return Ok(AckLedger::new());
        };
        let record = parse(&stored).map_err(|detail| StoreError::Unreadable {
            name: self.name.clone(),
            detail,
        })?;
        Ok(AckLedger::from_record(record))
    }

    /// Records `ledger` when it changed since it was last recorded. On success it is
    /// marked saved; on failure it stays unsaved and the caller must not let an
    /// acknowledgement recorded since leave the agent.
    pub async fn save(&self, ledger: &mut AckLedger) -> Result<(), StoreError> {
        if !ledger.unsaved() {
            return Ok(());
        }
        let (record, left_out, changes) = ledger.record_within(MAX_RECORD_BYTES);
        if left_out > 0 {
            tracing::warn!(
                left_out,
                limit = MAX_RECORD_BYTES,
                "acknowledgements too large to record; they stay pending in memory only"
            );
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "labels": {
                "app.kubernetes.io/name": "agent",
                "app.kubernetes.io/part-of": "vworkspace-operator",
            }},
            "data": {LEDGER_KEY: serde_json::to_string(&record).unwrap_or_default()},
        });
        let params = PatchParams::apply(LEDGER_FIELD_MANAGER).force();
        self.api
            .patch(&self.name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| StoreError::Api {
                action: "write",
                name: self.name.clone(),
                detail: e.to_string(),
            })?;
        ledger.saved(changes);
        Ok(())
    }
}

/// A stored record, or why it is not one (the serde error's category and position, never
/// the text: it is an administrator's edit, but may still hold anything).
fn parse(stored: &str) -> Result<LedgerRecord, String> {
    serde_json::from_str(stored)
        .map_err(|e| format!("{:?} error at line {} column {}", e.classify(), e.line(), e.column()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edited_record_is_an_error_not_a_fresh_start() {
        assert!(parse("{\"known\": {\"epoch\": \"a\", \"revision\": \"eight\"}}").is_err());
        assert!(parse("not json").is_err());
        let ok = parse("{\"known\": {\"epoch\": \"a\", \"revision\": 8}}");
        assert_eq!(ok.map(|r| r.known.map(|k| k.revision)), Ok(Some(8)));
        assert_eq!(parse("{}"), Ok(LedgerRecord::default()));
    }

    #[test]
    fn a_record_of_an_older_agent_reads_and_the_processed_documents_fit_the_budget() {
        // As an agent before the processed documents wrote it.
        let old = r#"{"known":{"epoch":"e1","revision":4},"retired_epochs":["e0"],"acks":[{"epoch":"e1","revision":4,"outcome":"applied","processed_at":"2026-12-01T10:00:00Z","objects":[]}]}"#;
        let record = parse(old).unwrap();
        assert_eq!(record.processed, vec![]);
        let mut ledger = AckLedger::from_record(record);
        assert_eq!(ledger.outgoing().len(), 1);
        // Every document from now on is kept, within the ConfigMap budget (documents of 50
        // objects: the 16 pending acknowledgements in full, 128 processed documents short).
        let objects: Vec<protocol::ObjectAck> = (0..50)
            .map(|i| protocol::ObjectAck {
                kind: protocol::ObjectKind::ApplicationInstance,
                namespace: "team-a".into(),
                name: format!("app-{i}"),
                outcome: protocol::ObjectOutcome::Unchanged,
                reason: None,
                message: None,
                uid: Some("00000000-0000-0000-0000-000000000000".into()),
                generation: Some(3),
                conflict: None,
            })
            .collect();
        for revision in 5..=(4 + protocol::processed::MAX_PROCESSED as u64) {
            ledger.record(protocol::DocumentAck {
                epoch: "e1".into(),
                revision,
                outcome: protocol::DocumentOutcome::Applied,
                reason: None,
                message: None,
                processed_at: jiff::Timestamp::UNIX_EPOCH,
                objects: objects.clone(),
            });
        }
        let (record, _, _) = ledger.record_within(MAX_RECORD_BYTES);
        let stored = serde_json::to_string(&record).unwrap();
        assert!(stored.len() <= MAX_RECORD_BYTES, "{}", stored.len());
        let back = parse(&stored).unwrap();
        assert_eq!(
            back.processed.len(),
            protocol::processed::MAX_PROCESSED,
            "short enough that all fit beside the pending acknowledgements"
        );
        assert_eq!(back.processed.last().map(|p| (p.revision, p.entries)), Some((132, 50)));
    }
}
