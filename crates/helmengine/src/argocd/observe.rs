//! Pure mapping: an Argo CD `Application` → [`Observation`].
//!
//! Argo CD has no conditions of the Kubernetes kind on an Application; it reports a sync
//! status, a health status, the last operation's state and a list of error or warning
//! conditions. This module derives the relayed `Ready` (and `Reconciling`, `Stalled`)
//! from them, with Argo CD's own words as reason and message wherever they exist; the
//! table is in docs/api/conditions.md ("Under the argocd engine"). The first match wins:
//!
//! | Argo CD reports | Ready | reason | message |
//! |---|---|---|---|
//! | a condition whose type ends in `Error` (`ComparisonError`, `InvalidSpecError`, `SyncError`, …) | False (+ Stalled for `SyncError`) | the condition type | its message |
//! | last operation `Failed` or `Error`, not yet synced | False (+ Stalled) | `SyncFailed` | `operationState.message` |
//! | an operation `Running` after a failed attempt (`retryCount` > 0) | False | `SyncFailed` | `operationState.message` ("… Retrying attempt #n at …") |
//! | an operation `Running` or `Terminating` | Unknown (+ Reconciling) | the phase | `operationState.message` |
//! | `Synced` and `Healthy` | True | `Healthy` | `health.message`, else what was synced |
//! | health `Degraded` | False | `Degraded` | `health.message` |
//! | `OutOfSync` | Unknown (+ Reconciling) | `OutOfSync` | what differs |
//! | any other health (`Progressing`, `Missing`, `Suspended`, `Unknown`) | Unknown (+ Reconciling) | the health status | `health.message` |
//!
//! # When is the observation current?
//!
//! Argo CD writes no `observedGeneration`. It records in `status.sync.comparedTo` the
//! source and destination its last comparison used, so the observation is current when
//! those are the ones in the spec we wrote. Until then, the status describes an older
//! desired state and the reconciler reports `AwaitingEngine`.

use api::ReleaseRecord;
use api::conditions::types;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::Value;

use crate::{EngineCondition, MAX_HISTORY, Observation, apply};

/// Argo CD's reason of our own for a failed sync (its UI and notifications say "sync failed").
pub const REASON_SYNC_FAILED: &str = "SyncFailed";

/// The engine's view of `application`.
pub fn observe(application: &DynamicObject) -> Observation {
    let spec = application.data.get("spec");
    let status = application.data.get("status");
    let text = |path: &str| {
        status
            .and_then(|s| s.pointer(path))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let sync = text("/sync/status");
    let health = text("/health/status");
    let health_message = text("/health/message");
    let phase = text("/operationState/phase");
    let operation_message = text("/operationState/message");
    let retried = status
        .and_then(|s| s.pointer("/operationState/retryCount"))
        .and_then(Value::as_i64)
        .is_some_and(|n| n > 0);

    let compared = status.and_then(|s| s.pointer("/sync/comparedTo"));
    let observed_generation_current = match (spec, compared) {
        (Some(spec), Some(compared)) => {
            let same = |key: &str| match (spec.get(key), compared.get(key)) {
                // `apply::is_subset` takes a desired null as "anything"; a null here is
                // current only against a null.
                (Some(Value::Null), Some(have)) => have.is_null(),
                // Argo CD may add defaults to what it copies.
                (Some(want), Some(have)) => apply::is_subset(want, have),
                _ => false,
            };
            same("source") && same("destination")
        }
        _ => false,
    };

    let error = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c.get("type")?.as_str()?, c.get("message").and_then(Value::as_str))))
        .find(|(type_, _)| type_.ends_with("Error"));

    let (ready, reason, message, reconciling, stalled) = if let Some((type_, message)) = error {
        // After a failed automated sync Argo CD does not try the same revision again.
        let stalled = type_ == "SyncError";
        (
            "False",
            type_.to_owned(),
            message.unwrap_or_default().to_owned(),
            false,
            stalled,
        )
    } else if matches!(phase, "Failed" | "Error") && sync != "Synced" {
        (
            "False",
            REASON_SYNC_FAILED.to_owned(),
            operation_message.to_owned(),
            false,
            true,
        )
    } else if phase == "Running" && retried {
        // A failed attempt, retried after a backoff (syncPolicy.retry): a failure being retried.
        (
            "False",
            REASON_SYNC_FAILED.to_owned(),
            operation_message.to_owned(),
            false,
            false,
        )
    } else if matches!(phase, "Running" | "Terminating") {
        ("Unknown", phase.to_owned(), operation_message.to_owned(), true, false)
    } else if sync == "Synced" && health == "Healthy" {
        let message = if health_message.is_empty() {
            match text("/sync/revision") {
                "" => "synced and healthy".to_owned(),
                revision => format!("synced chart version {revision}; all resources healthy"),
            }
        } else {
            health_message.to_owned()
        };
        ("True", "Healthy".to_owned(), message, false, false)
    } else if health == "Degraded" {
        ("False", health.to_owned(), health_message.to_owned(), false, false)
    } else if sync == "OutOfSync" {
        let message = out_of_sync(status);
        ("Unknown", sync.to_owned(), message, true, false)
    } else {
        let reason = if health.is_empty() { "Unknown" } else { health };
        ("Unknown", reason.to_owned(), health_message.to_owned(), true, false)
    };

    let condition = |type_: &str, status: &str| EngineCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.clone(),
        message: message.clone(),
    };
    let mut conditions = vec![condition(types::READY, ready)];
    if reconciling {
        conditions.push(condition(types::RECONCILING, "True"));
    }
    if stalled {
        conditions.push(condition(types::STALLED, "True"));
    }

    let history = history(status);
    let suspended = spec.and_then(|s| s.pointer("/syncPolicy/automated")).is_none();
    let last_attempted_revision = [
        "/operationState/syncResult/revision",
        "/operationState/operation/sync/revision",
    ]
    .into_iter()
    .map(text)
    .find(|r| !r.is_empty())
    .map(str::to_owned);
    Observation {
        observed_generation_current,
        conditions,
        source: None,
        deployed_chart_version: history.first().map(|r| r.chart_version.clone()),
        app_version: None,
        materialized_chart_version: spec
            .and_then(|s| s.pointer("/source/targetRevision"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        last_attempted_revision,
        history,
        suspended,
    }
}

/// "`n` resources out of sync: Kind/name, …" (at most five named).
fn out_of_sync(status: Option<&Value>) -> String {
    let resources: Vec<String> = status
        .and_then(|s| s.get("resources"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r.get("status").and_then(Value::as_str) == Some("OutOfSync"))
        .filter_map(|r| Some(format!("{}/{}", r.get("kind")?.as_str()?, r.get("name")?.as_str()?)))
        .collect();
    if resources.is_empty() {
        return "the live state differs from the chart".to_owned();
    }
    let shown: Vec<&str> = resources.iter().take(5).map(String::as_str).collect();
    let more = resources.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{} resources out of sync: {}{tail}", resources.len(), shown.join(", "))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HistoryEntry {
    id: i64,
    #[serde(default)]
    revision: String,
    #[serde(default)]
    deployed_at: Option<Time>,
    #[serde(default)]
    source: Option<HistorySource>,
}

#[derive(Deserialize)]
struct HistorySource {
    #[serde(default)]
    chart: Option<String>,
}

/// Argo CD's sync history (successful syncs only, oldest first) as release records, newest
/// first: the newest is `deployed`, the others `superseded`.
fn history(status: Option<&Value>) -> Vec<ReleaseRecord> {
    let mut entries: Vec<HistoryEntry> = status
        .and_then(|s| s.get("history"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| serde_json::from_value(entry.clone()).ok())
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.id));
    entries
        .into_iter()
        .take(MAX_HISTORY)
        .enumerate()
        .map(|(i, e)| ReleaseRecord {
            revision: e.id,
            chart_name: e.source.and_then(|s| s.chart),
            chart_version: e.revision,
            app_version: None,
            status: if i == 0 { "deployed" } else { "superseded" }.to_owned(),
            deployed_at: e.deployed_at,
        })
        .collect()
}

#[cfg(test)]
mod tests;
