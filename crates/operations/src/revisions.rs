//! The application revision history a Rollback picks its target from.
//!
//! A revision is the desired state of an ApplicationInstance that the operator applied:
//! chart version and inline values, numbered 1, 2, 3… per application and never reused.
//! A Rollback applies an earlier revision's chart version and values again (a declarative
//! rollback: Flux makes a new Helm revision with old content; no `helm rollback`). Helm's
//! own history (`status.history`) cannot serve: it has no values and at most ten entries.
//!
//! ## Storage: a ConfigMap per application
//!
//! `<app>-revisions` in the application's namespace, key [`DATA_KEY`], a versioned JSON
//! document, owned by the ApplicationInstance (garbage-collected with it). Not an
//! annotation on the ApplicationInstance, because
//! - the ApplicationInstance is the agent's object, applied from Odoo's intent: a second
//!   writer on it invites conflicts, and every history write would wake every watcher of
//!   ApplicationInstances (the app controller reconciles on each);
//! - annotations share 256 KiB per object, values can be large, and twenty of them would
//!   crowd out everything else; a ConfigMap holds 1 MiB.
//!
//! Inline values are as visible as in the ApplicationInstance itself; secrets belong in
//! `valuesFrom`, which the history does not copy.
//!
//! The history keeps the newest [`MAX_REVISIONS`] revisions, fewer if the document would
//! outgrow [`MAX_DOCUMENT_BYTES`].

use api::{ApplicationInstance, LABEL_MANAGED_BY, MANAGED_BY, RollbackParams};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::meta::LABEL_APPLICATION;
use crate::{Error, names};

/// Revisions kept per application.
pub const MAX_REVISIONS: usize = 20;
/// Largest serialized history kept (a ConfigMap holds at most 1 MiB, metadata included).
pub const MAX_DOCUMENT_BYTES: usize = 900 * 1024;
/// Key of the history document in the ConfigMap.
pub const DATA_KEY: &str = "revisions.json";
/// Version of the history document format.
pub const FORMAT_VERSION: u32 = 1;

/// One applied desired state of an application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppRevision {
    /// 1, 2, 3… per application, never reused.
    pub number: i64,
    /// The chart version (or range) applied.
    pub chart_version: String,
    /// The inline values applied (`spec.values`; `null` when none).
    #[serde(default)]
    pub values: Value,
    /// The Operation (Upgrade or Rollback) that applied it; `None` for a state recorded
    /// without one (e.g. the baseline before the first Upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// When it was recorded.
    pub at: Timestamp,
}

/// The stored document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct HistoryDocument {
    version: u32,
    revisions: Vec<AppRevision>,
}

/// The number the next recorded revision gets: one more than the highest ever kept.
pub fn next_revision(history: &[AppRevision]) -> i64 {
    history.iter().map(|r| r.number).max().unwrap_or(0) + 1
}

/// The history after recording `chart_version` and `values` applied by `operation` at `at`,
/// and the number of the revision that holds that state.
///
/// Idempotent, so an engine that restarts mid-way records nothing twice: a revision already
/// recorded by the same Operation is returned as it is, and a baseline (no Operation) equal
/// to the newest revision's state is not recorded again. A state applied by an Operation is
/// always recorded under its name, even when it equals the newest state: the engine finds
/// its target again by the Operation's name after a restart.
pub fn record(
    history: &[AppRevision],
    chart_version: &str,
    values: &Value,
    operation: Option<&str>,
    at: Timestamp,
) -> (Vec<AppRevision>, i64) {
    let mut history = sorted(history);
    if let Some(op) = operation
        && let Some(existing) = history.iter().find(|r| r.operation.as_deref() == Some(op))
    {
        return (history.clone(), existing.number);
    }
    if operation.is_none()
        && let Some(newest) = history.last()
        && newest.chart_version == chart_version
        && newest.values == *values
    {
        return (history.clone(), newest.number);
    }
    let number = next_revision(&history);
    history.push(AppRevision {
        number,
        chart_version: chart_version.to_owned(),
        values: values.clone(),
        operation: operation.map(str::to_owned),
        at,
    });
    (cap(history, MAX_REVISIONS, MAX_DOCUMENT_BYTES), number)
}

/// The newest `max_revisions` revisions, fewer while the document exceeds `max_bytes`
/// (the newest revision is always kept).
pub fn cap(history: Vec<AppRevision>, max_revisions: usize, max_bytes: usize) -> Vec<AppRevision> {
    let mut history = sorted(&history);
    let excess = history.len().saturating_sub(max_revisions.max(1));
    history.drain(..excess);
    while history.len() > 1 && document_len(&history) > max_bytes {
        history.remove(0);
    }
    history
}

/// The revision a Rollback returns to, given the `current` revision number (the one in
/// effect; `None` means the newest):
/// - neither field: the revision before `current`;
/// - `revision`: exactly that revision;
/// - `chartVersion`: the newest revision before `current` with that chart version (a
///   rollback goes back: the current revision is what is being left).
pub fn find_target<'h>(
    history: &'h [AppRevision],
    params: &RollbackParams,
    current: Option<i64>,
) -> Result<&'h AppRevision, Error> {
    let not_found = |message: String| Error::RevisionNotFound(message);
    let (Some(oldest), Some(newest)) = (
        history.iter().map(|r| r.number).min(),
        history.iter().map(|r| r.number).max(),
    ) else {
        return Err(not_found(
            "the application has no revision history; there is nothing to roll back to".into(),
        ));
    };
    let current = current.unwrap_or(newest);
    let before_current = || history.iter().filter(move |r| r.number < current);

    if let Some(number) = params.revision {
        return history.iter().find(|r| r.number == number).ok_or_else(|| {
            not_found(format!(
                "revision {number} is not in the history (it holds revisions {oldest} to {newest}; older ones are not kept)"
            ))
        });
    }
    if let Some(version) = params.chart_version.as_deref() {
        return before_current()
            .filter(|r| r.chart_version == version)
            .max_by_key(|r| r.number)
            .ok_or_else(|| {
                not_found(format!(
                    "no revision before the current one ({current}) deployed chart version {version}"
                ))
            });
    }
    before_current().max_by_key(|r| r.number).ok_or_else(|| {
        not_found(format!(
            "revision {current} is the oldest in the history; there is no previous revision"
        ))
    })
}

/// Name of an application's history ConfigMap.
pub fn config_map_name(app_name: &str) -> String {
    names::with_suffix(app_name, "revisions")
}

/// The history stored in a ConfigMap (the whole object as JSON); empty when the ConfigMap
/// has no history yet. A document that does not parse is an error, never silently reset:
/// losing the history would make a later Rollback pick the wrong target.
pub fn parse_history(config_map: &Value) -> Result<Vec<AppRevision>, Error> {
    let Some(text) = config_map.pointer(&format!("/data/{DATA_KEY}")) else {
        return Ok(Vec::new());
    };
    let corrupt = |why: String| {
        Error::CorruptHistory(format!(
            "revision history {}: {why}",
            crate::meta::display_name(config_map)
        ))
    };
    let text = text
        .as_str()
        .ok_or_else(|| corrupt(format!("data.{DATA_KEY} is not a string")))?;
    let document: HistoryDocument = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    if document.version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {} is not supported (expected {FORMAT_VERSION})",
            document.version
        )));
    }
    Ok(sorted(&document.revisions))
}

/// The history ConfigMap of `app` holding `history`, owned by the ApplicationInstance.
pub fn history_config_map(app: &ApplicationInstance, history: &[AppRevision]) -> Result<Value, Error> {
    let field = |value: &Option<String>, field| {
        value
            .clone()
            .filter(|v| !v.is_empty())
            .ok_or(Error::missing("ApplicationInstance", field))
    };
    let name = field(&app.metadata.name, "name")?;
    let namespace = field(&app.metadata.namespace, "namespace")?;
    let uid = field(&app.metadata.uid, "uid")?;
    let document = HistoryDocument {
        version: FORMAT_VERSION,
        revisions: sorted(history),
    };
    let text = serde_json::to_string(&document)
        .map_err(|e| Error::CorruptHistory(format!("revision history cannot be serialized: {e}")))?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(&name),
            "namespace": namespace,
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_APPLICATION: name,
                api::LABEL_COMPONENT: "revision-history",
            },
            "ownerReferences": [{
                "apiVersion": api::API_VERSION,
                "kind": "ApplicationInstance",
                "name": name,
                "uid": uid,
            }],
        },
        "data": { DATA_KEY: text },
    }))
}

fn sorted(history: &[AppRevision]) -> Vec<AppRevision> {
    let mut history = history.to_vec();
    history.sort_by_key(|r| r.number);
    history.dedup_by_key(|r| r.number);
    history
}

fn document_len(history: &[AppRevision]) -> usize {
    let document = HistoryDocument {
        version: FORMAT_VERSION,
        revisions: history.to_vec(),
    };
    serde_json::to_string(&document).map_or(usize::MAX, |s| s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + minute * 60).expect("timestamp")
    }

    fn rev(number: i64, chart_version: &str) -> AppRevision {
        AppRevision {
            number,
            chart_version: chart_version.into(),
            values: json!({"replicas": number}),
            operation: Some(format!("op-{number}")),
            at: at(number),
        }
    }

    fn history() -> Vec<AppRevision> {
        vec![
            rev(3, "6.6.4"),
            rev(4, "6.6.5"),
            rev(5, "6.6.4"),
            rev(6, "7.0.0"),
            rev(7, "7.0.1"),
        ]
    }

    fn params(revision: Option<i64>, chart_version: Option<&str>) -> RollbackParams {
        RollbackParams {
            revision,
            chart_version: chart_version.map(str::to_owned),
        }
    }

    #[test]
    fn next_revision_table() {
        assert_eq!(next_revision(&[]), 1);
        assert_eq!(next_revision(&history()), 8);
        assert_eq!(next_revision(&[rev(9, "x"), rev(2, "y")]), 10);
    }

    #[test]
    fn find_target_table() {
        let h = history();
        let cases = [
            ("previous of newest", params(None, None), None, Ok(6)),
            ("previous of an explicit current", params(None, None), Some(5), Ok(4)),
            ("previous skips a gap", params(None, None), Some(100), Ok(7)),
            ("exact revision", params(Some(4), None), None, Ok(4)),
            ("exact revision, the current one", params(Some(7), None), None, Ok(7)),
            (
                "exact revision, newer than current",
                params(Some(7), None),
                Some(5),
                Ok(7),
            ),
            ("newest with chart version", params(None, Some("6.6.4")), None, Ok(5)),
            (
                "chart version before an explicit current",
                params(None, Some("6.6.4")),
                Some(5),
                Ok(3),
            ),
            (
                "chart version only current",
                params(None, Some("7.0.1")),
                None,
                Err("no revision before the current one (7) deployed chart version 7.0.1"),
            ),
            (
                "unknown chart version",
                params(None, Some("1.0.0")),
                None,
                Err("no revision before the current one (7) deployed chart version 1.0.0"),
            ),
            (
                "revision capped away",
                params(Some(1), None),
                None,
                Err("revision 1 is not in the history (it holds revisions 3 to 7; older ones are not kept)"),
            ),
            (
                "no previous",
                params(None, None),
                Some(3),
                Err("revision 3 is the oldest in the history; there is no previous revision"),
            ),
        ];
        for (name, p, current, expected) in cases {
            let got = find_target(&h, &p, current).map(|r| r.number);
            let expected = expected.map_err(|m| Error::RevisionNotFound(m.into()));
            assert_eq!(got, expected, "{name}");
        }
        assert_eq!(
            find_target(&[], &params(None, None), None),
            Err(Error::RevisionNotFound(
                "the application has no revision history; there is nothing to roll back to".into()
            ))
        );
        // Unsorted input works the same.
        let mut shuffled = history();
        shuffled.reverse();
        assert_eq!(
            find_target(&shuffled, &params(None, None), None).map(|r| r.number),
            Ok(6)
        );
    }

    #[test]
    fn record_table() {
        let h = history();
        // A new state gets the next number.
        let (after, number) = record(&h, "7.1.0", &json!({"a": 1}), Some("up-71"), at(60));
        assert_eq!(number, 8);
        assert_eq!(after.len(), 6);
        assert_eq!(after.last().map(|r| r.operation.as_deref()), Some(Some("up-71")));
        // Replaying the same Operation records nothing.
        let (again, number) = record(&after, "7.1.0", &json!({"a": 1}), Some("up-71"), at(61));
        assert_eq!((again.clone(), number), (after.clone(), 8));
        // Same Operation, different content (it was recorded before): still the first record.
        let (again, number) = record(&after, "9.9.9", &json!({}), Some("op-4"), at(62));
        assert_eq!((again, number), (after.clone(), 4));
        // The same state as the newest, without an Operation: nothing new.
        let (again, number) = record(&after, "7.1.0", &json!({"a": 1}), None, at(63));
        assert_eq!((again, number), (after.clone(), 8));
        // Same version, other values: a new revision.
        let (again, number) = record(&after, "7.1.0", &json!({"a": 2}), None, at(64));
        assert_eq!((again.len(), number), (7, 9));
        // Baseline into an empty history.
        let (first, number) = record(&[], "6.0.0", &Value::Null, None, at(0));
        assert_eq!(number, 1);
        assert_eq!(first[0].operation, None);
    }

    #[test]
    fn record_caps_at_twenty_and_numbers_keep_growing() {
        let mut h = Vec::new();
        for i in 0..30 {
            let (next, number) = record(&h, &format!("1.0.{i}"), &Value::Null, None, at(i));
            assert_eq!(number, i + 1);
            h = next;
        }
        assert_eq!(h.len(), MAX_REVISIONS);
        assert_eq!(h.first().map(|r| r.number), Some(11));
        assert_eq!(h.last().map(|r| r.number), Some(30));
        assert_eq!(next_revision(&h), 31);
    }

    #[test]
    fn cap_table() {
        let h = history();
        assert_eq!(
            cap(h.clone(), 3, usize::MAX)
                .iter()
                .map(|r| r.number)
                .collect::<Vec<_>>(),
            [5, 6, 7]
        );
        assert_eq!(cap(h.clone(), 0, usize::MAX).len(), 1, "the newest is always kept");
        assert_eq!(cap(h.clone(), 20, usize::MAX).len(), 5);
        let small = document_len(&h[3..]);
        assert_eq!(
            cap(h.clone(), 20, small).iter().map(|r| r.number).collect::<Vec<_>>(),
            [6, 7]
        );
        assert_eq!(cap(h.clone(), 20, 1).len(), 1, "the newest is kept even if too big");
        // Duplicated numbers collapse.
        assert_eq!(cap(vec![rev(1, "a"), rev(1, "a")], 20, usize::MAX).len(), 1);
    }

    fn app() -> ApplicationInstance {
        let mut app = ApplicationInstance::new("nextcloud", Default::default());
        app.metadata.namespace = Some("team-a".into());
        app.metadata.uid = Some("uid-app".into());
        app
    }

    #[test]
    fn config_map_round_trip() {
        let h = history();
        let cm = history_config_map(&app(), &h).expect("builds");
        assert_eq!(cm["kind"], "ConfigMap");
        assert_eq!(cm["metadata"]["name"], "nextcloud-revisions");
        assert_eq!(cm["metadata"]["namespace"], "team-a");
        assert_eq!(cm["metadata"]["ownerReferences"][0]["uid"], "uid-app");
        assert_eq!(cm["metadata"]["ownerReferences"][0]["kind"], "ApplicationInstance");
        assert_eq!(cm["metadata"]["labels"]["vworkspace.io/application"], "nextcloud");
        assert_eq!(parse_history(&cm), Ok(h.clone()));
        let text = cm["data"][DATA_KEY].as_str().expect("string");
        assert!(text.contains("\"chartVersion\":\"6.6.4\""), "{text}");
        assert!(text.contains("\"at\":\""), "{text}");

        let mut no_uid = app();
        no_uid.metadata.uid = None;
        assert_eq!(
            history_config_map(&no_uid, &h),
            Err(Error::missing("ApplicationInstance", "uid"))
        );
    }

    #[test]
    fn parse_history_table() {
        let cm =
            |data: Value| json!({"metadata": {"name": "nextcloud-revisions", "namespace": "team-a"}, "data": data});
        assert_eq!(parse_history(&json!({})), Ok(vec![]));
        assert_eq!(parse_history(&cm(json!({}))), Ok(vec![]));
        let unsorted = json!({"version": 1, "revisions": [
            {"number": 2, "chartVersion": "2", "at": "2026-12-01T00:00:00Z"},
            {"number": 1, "chartVersion": "1", "values": {"a": 1}, "operation": "up", "at": "2026-11-01T00:00:00Z"}
        ]});
        let parsed = parse_history(&cm(json!({DATA_KEY: unsorted.to_string()}))).expect("parses");
        assert_eq!(parsed.iter().map(|r| r.number).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(parsed[1].values, Value::Null);

        let bad = [
            json!({DATA_KEY: 5}),
            json!({DATA_KEY: "not json"}),
            json!({DATA_KEY: json!({"version": 2, "revisions": []}).to_string()}),
        ];
        for data in bad {
            match parse_history(&cm(data.clone())) {
                Err(Error::CorruptHistory(message)) => {
                    assert!(
                        message.starts_with("revision history team-a/nextcloud-revisions: "),
                        "{message}"
                    );
                }
                other => panic!("{data}: {other:?}"),
            }
        }
    }
}
