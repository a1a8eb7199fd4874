//! Upgrade and Rollback: what the application's desired state becomes, and what the
//! ApplicationInstance's relayed Flux status says about it (`docs/day-2-operations.md`,
//! "Upgrade" and "Rollback").

use api::conditions::{operation_reasons, types};
use api::{ApplicationInstance, SourceKind};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Map, Value};

use crate::revisions::AppRevision;

/// The desired state an Upgrade or Rollback sets: chart version and inline values.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredState {
    /// `spec.chart.version`.
    pub chart_version: String,
    /// `spec.values`, always an object (no values is `{}`, which Helm treats the same).
    pub values: Value,
}

impl DesiredState {
    /// The state `app` asks for now.
    pub fn of(app: &ApplicationInstance) -> Self {
        Self {
            chart_version: app.spec.chart.version.clone().unwrap_or_else(|| "*".to_owned()),
            values: normalize(app.spec.values.clone()),
        }
    }

    /// The state stored in a revision.
    pub fn of_revision(revision: &AppRevision) -> Self {
        Self {
            chart_version: revision.chart_version.clone(),
            values: normalize(Some(revision.values.clone())),
        }
    }

    /// The state after an Upgrade to `chart_version` with `values_patch`, a JSON merge
    /// patch (RFC 7386, `json_patch::merge`): objects merge key by key, `null` removes a
    /// key, anything else replaces.
    pub fn upgraded(&self, chart_version: &str, values_patch: Option<&Value>) -> Self {
        let mut values = self.values.clone();
        if let Some(patch) = values_patch {
            json_patch::merge(&mut values, patch);
        }
        Self {
            chart_version: chart_version.to_owned(),
            values: normalize(Some(values)),
        }
    }
}

/// `null` or a non-object is no values: `{}`.
fn normalize(values: Option<Value>) -> Value {
    match values {
        Some(Value::Object(map)) => Value::Object(map),
        _ => Value::Object(Map::new()),
    }
}

/// The revision in effect: the newest revision whose state equals the application's
/// desired state now (`None` when the state was never recorded).
pub fn current_revision(history: &[AppRevision], app: &ApplicationInstance) -> Option<i64> {
    let now = DesiredState::of(app);
    history
        .iter()
        .filter(|r| DesiredState::of_revision(r) == now)
        .map(|r| r.number)
        .max()
}

/// The refusal of an Upgrade or Rollback of `app` when its chart comes from a source whose
/// own spec pins the version (OCIRepository, HelmChart): changing `spec.chart.version`
/// would change nothing.
pub fn pinned_by_source(app: &ApplicationInstance) -> Option<crate::Outcome> {
    let source = app.spec.chart.source_ref.as_ref()?;
    matches!(source.kind, SourceKind::OciRepository | SourceKind::HelmChart).then(|| {
        crate::Outcome::failed(
            operation_reasons::NOT_SUPPORTED,
            format!(
                "the chart comes from a {} whose own spec pins the version; change the source instead",
                serde_json::to_value(source.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ),
        )
    })
}

/// What the relayed Flux status says about a desired state the engine set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Flux has not finished with this generation yet.
    Waiting(String),
    /// Released and Ready at this generation.
    Released(String),
    /// Flux gave up or reported a failure for this generation; reason verbatim.
    Failed {
        /// Flux's reason (`Released`'s when it failed, else `Stalled`'s, `SourceReady`'s or `Ready`'s).
        reason: String,
        /// Flux's message.
        message: String,
    },
}

/// The verdict for `app` (read after the engine set `expected_version`).
///
/// Only a status computed from the current generation counts. Then: `Ready=True` (at the
/// expected version, when that is an exact version) is success; `Stalled=True`, a failed
/// chart source, or `Ready=False` once Flux stopped reconciling is failure; anything else
/// is still in progress.
pub fn verdict(app: &ApplicationInstance, expected_version: &str) -> Verdict {
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let Some(status) = app.status.as_ref() else {
        return Verdict::Waiting(format!("waiting for ApplicationInstance {name} to report status"));
    };
    if status.observed_generation.is_none() || status.observed_generation != app.metadata.generation {
        return Verdict::Waiting(format!("waiting for ApplicationInstance {name} to observe the change"));
    }
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let is = |c: Option<&Condition>, value: &str| c.is_some_and(|c| c.status == value);
    let ready = condition(types::READY);
    let released = condition(types::RELEASED);
    let deployed = status.deployed_chart_version.as_deref().unwrap_or("");

    if is(ready, "True") {
        let exact = is_exact_version(expected_version);
        if !exact || is_deployed_version(deployed, expected_version) {
            return Verdict::Released(format!("chart version {deployed} released and Ready"));
        }
        return Verdict::Waiting(format!(
            "Ready at chart version {deployed}, waiting for {expected_version}"
        ));
    }
    let failure = |c: &Condition| Verdict::Failed {
        reason: c.reason.clone(),
        message: c.message.clone(),
    };
    let released_failure = released.filter(|c| c.status == "False");
    if let Some(stalled) = condition(types::STALLED).filter(|c| c.status == "True") {
        return failure(released_failure.unwrap_or(stalled));
    }
    let reconciling = is(condition(types::RECONCILING), "True");
    // A source that has not reported yet (`AwaitingEngine`) is not a failure.
    if let Some(source) = condition(types::SOURCE_READY)
        .filter(|c| c.status == "False" && c.reason != api::conditions::reasons::AWAITING_ENGINE && !reconciling)
    {
        return failure(source);
    }
    if let Some(ready) = ready.filter(|c| c.status == "False")
        && !reconciling
    {
        return failure(released_failure.unwrap_or(ready));
    }
    let detail = ready
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_default();
    Verdict::Waiting(format!(
        "waiting for Flux to release chart version {expected_version} ({detail})"
    ))
}

/// Whether the deployed chart version is the expected one. A chart from an OCIRepository is
/// reported with the artifact digest as build metadata (`0.2.0+8e1052361664`, as
/// helm-controller versions it); build metadata does not change a version's identity in
/// semver, so it only counts when the expected version names it too.
fn is_deployed_version(deployed: &str, expected: &str) -> bool {
    deployed == expected
        || (!expected.contains('+') && deployed.split_once('+').is_some_and(|(core, _)| core == expected))
}

/// Whether `version` names one version rather than a range (`*`, `^1`, `>=1.0 <2`, `1.x`).
fn is_exact_version(version: &str) -> bool {
    let v = version.trim().trim_start_matches('v');
    !v.is_empty()
        && v.chars().next().is_some_and(|c| c.is_ascii_digit())
        && !v.contains(['*', 'x', 'X', '^', '~', '>', '<', '=', ' ', '|', ','])
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{ApplicationInstanceSpec, ApplicationInstanceStatus, ChartSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn app(generation: i64, observed: i64, conditions: &[(&str, &str, &str)], deployed: &str) -> ApplicationInstance {
        let mut app = ApplicationInstance::new(
            "web",
            ApplicationInstanceSpec {
                chart: ChartSpec {
                    name: "demo".into(),
                    version: Some("0.2.0".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        app.metadata.generation = Some(generation);
        app.status = Some(ApplicationInstanceStatus {
            observed_generation: Some(observed),
            deployed_chart_version: Some(deployed.into()),
            conditions: conditions
                .iter()
                .map(|(t, s, r)| Condition {
                    type_: (*t).into(),
                    status: (*s).into(),
                    reason: (*r).into(),
                    message: format!("{r} message"),
                    last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                    observed_generation: Some(observed),
                })
                .collect(),
            ..Default::default()
        });
        app
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let state = |values| DesiredState {
            chart_version: "0.1.0".into(),
            values,
        };
        let patch = json!({"a": null, "b": {"c": 9}, "e": [3], "f": {"g": 1}});
        let next = state(json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]})).upgraded("0.1.0", Some(&patch));
        assert_eq!(next.values, json!({"b": {"c": 9, "d": 3}, "e": [3], "f": {"g": 1}}));
        // A patch member that is not an object replaces; a `null` one removes, and the
        // patch's nulls are not stored.
        let patch = json!({"b": 1, "x": {"y": null, "z": 2}});
        let next = state(json!({"b": {"c": 2}, "x": 3})).upgraded("0.1.0", Some(&patch));
        assert_eq!(next.values, json!({"b": 1, "x": {"z": 2}}));
        // The RFC's own rule on the library: a non-object target becomes an object.
        let mut scalar = json!(1);
        json_patch::merge(&mut scalar, &json!({"x": null, "y": 2}));
        assert_eq!(scalar, json!({"y": 2}));
    }

    #[test]
    fn upgraded_state_merges_values_and_normalizes_none() {
        let state = DesiredState {
            chart_version: "0.1.0".into(),
            values: json!({}),
        };
        let next = state.upgraded("0.2.0", Some(&json!({"replicaCount": 2})));
        assert_eq!(next.chart_version, "0.2.0");
        assert_eq!(next.values, json!({"replicaCount": 2}));
        assert_eq!(normalize(None), json!({}));
        assert_eq!(normalize(Some(Value::Null)), json!({}));
    }

    #[test]
    fn only_the_current_generation_counts() {
        let stale = app(3, 2, &[("Ready", "True", "UpgradeSucceeded")], "0.2.0");
        assert!(matches!(verdict(&stale, "0.2.0"), Verdict::Waiting(_)));
    }

    #[test]
    fn ready_at_the_expected_version_is_released() {
        let ok = app(3, 3, &[("Ready", "True", "UpgradeSucceeded")], "0.2.0");
        assert!(matches!(verdict(&ok, "0.2.0"), Verdict::Released(_)));
        assert!(matches!(verdict(&ok, "0.3.0"), Verdict::Waiting(_)));
        assert!(matches!(verdict(&ok, ">=0.1.0"), Verdict::Released(_)));
    }

    #[test]
    fn an_oci_chart_versioned_with_its_digest_is_the_expected_version() {
        let cases = [
            ("0.2.0+8e1052361664", "0.2.0", true),
            ("0.2.0+8e1052361664", "0.2.0+8e1052361664", true),
            ("0.2.0+8e1052361664", "0.2.0+000000000000", false),
            ("0.2.0+8e1052361664", "0.2", false),
            ("0.20.0+8e1052361664", "0.2.0", false),
            ("0.2.0", "0.2.0+8e1052361664", false),
        ];
        for (deployed, expected, want) in cases {
            let ok = app(3, 3, &[("Ready", "True", "UpgradeSucceeded")], deployed);
            let released = matches!(verdict(&ok, expected), Verdict::Released(_));
            assert_eq!(released, want, "deployed {deployed}, expected {expected}");
        }
    }

    #[test]
    fn failures_keep_flux_reasons_verbatim() {
        let failed = app(
            3,
            3,
            &[
                ("Ready", "False", "RollbackSucceeded"),
                ("Released", "False", "UpgradeFailed"),
                ("Stalled", "True", "RetriesExceeded"),
            ],
            "0.1.0",
        );
        assert_eq!(
            verdict(&failed, "0.2.0"),
            Verdict::Failed {
                reason: "UpgradeFailed".into(),
                message: "UpgradeFailed message".into()
            }
        );
        let settled = app(
            3,
            3,
            &[
                ("Ready", "False", "UpgradeFailed"),
                ("Released", "False", "UpgradeFailed"),
            ],
            "0.1.0",
        );
        assert!(matches!(verdict(&settled, "0.2.0"), Verdict::Failed { reason, .. } if reason == "UpgradeFailed"));
        let source = app(
            3,
            3,
            &[
                ("Ready", "False", "Progressing"),
                ("SourceReady", "False", "ChartPullError"),
            ],
            "",
        );
        assert!(matches!(verdict(&source, "9.9.9"), Verdict::Failed { reason, .. } if reason == "ChartPullError"));
        let pending = app(
            3,
            3,
            &[
                ("Ready", "Unknown", "Progressing"),
                ("SourceReady", "False", "AwaitingEngine"),
            ],
            "",
        );
        assert!(matches!(verdict(&pending, "0.2.0"), Verdict::Waiting(_)));
    }

    #[test]
    fn in_progress_while_flux_reconciles() {
        let busy = app(
            3,
            3,
            &[
                ("Ready", "Unknown", "Progressing"),
                ("Reconciling", "True", "Progressing"),
            ],
            "0.1.0",
        );
        assert!(matches!(verdict(&busy, "0.2.0"), Verdict::Waiting(_)));
        let retrying = app(
            3,
            3,
            &[
                ("Ready", "False", "UpgradeFailed"),
                ("Reconciling", "True", "ProgressingWithRetry"),
            ],
            "0.1.0",
        );
        assert!(matches!(verdict(&retrying, "0.2.0"), Verdict::Waiting(_)));
    }

    #[test]
    fn exact_versions() {
        for v in ["1.2.3", "v1.2.3", "0.1.0-rc.1"] {
            assert!(is_exact_version(v), "{v}");
        }
        for v in ["*", "^1", ">=1.0.0", "1.x", "~1.2", ""] {
            assert!(!is_exact_version(v), "{v}");
        }
    }

    #[test]
    fn current_revision_is_the_newest_matching_state() {
        let at = jiff::Timestamp::UNIX_EPOCH;
        let rev = |number, version: &str| AppRevision {
            number,
            chart_version: version.into(),
            values: json!({}),
            operation: None,
            at,
        };
        let history = vec![rev(1, "0.2.0"), rev(2, "0.1.0"), rev(3, "0.2.0")];
        let app = app(1, 1, &[], "0.2.0");
        assert_eq!(current_revision(&history, &app), Some(3));
        assert_eq!(current_revision(&history[..2], &app), Some(1));
    }
}
