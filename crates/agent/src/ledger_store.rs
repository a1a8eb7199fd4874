//! Where the acknowledgement ledger survives restarts and leader changes (protocol.md,
//! "Revisions and acknowledgements", rule 7): the key `ledger.json` of the agent's status
//! ConfigMap, written by server-side apply under its own field manager, so the condition
//! written beside it (another manager) never removes it.
//!
//! Who can write it: whoever may patch ConfigMaps in the agent's namespace (the agent,
//! and the cluster's administrators). A tenant cannot. Deleting the key makes the agent
//! start as if it had never processed a document (Odoo sends its current one again).

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
/// Acknowledgements that do not fit stay pending in memory (the oldest first).
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
}
