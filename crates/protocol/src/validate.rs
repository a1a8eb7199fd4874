//! Validation of a desired-state document as a whole, before anything is applied.
//!
//! A document that fails any rule is refused whole (`outcome: refused`, reason
//! `InvalidDocument`): the agent never applies part of a malformed document. Per-object
//! policy (the namespace allow-list) is not a validity rule: it yields per-object
//! refusals in an otherwise applied document.

use std::collections::BTreeSet;

use crate::messages::{DesiredState, ObjectKey, ObjectKind};

/// Size limits of the protocol.
pub mod limits {
    /// Default largest HTTP answer the agent reads (`--max-response-size`).
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;
    /// Most objects (applications + operations + deletions) in one document.
    pub const MAX_OBJECTS: usize = 5_000;
    /// Largest serialized `spec` of one object (Kubernetes objects must stay well under
    /// the API server's 1.5 MB limit).
    pub const MAX_SPEC_BYTES: usize = 512 * 1024;
    /// Default and largest number of reports per sync call.
    pub const MAX_REPORTS_PER_SYNC: usize = 500;
    /// Longest epoch.
    pub const MAX_EPOCH_LEN: usize = 64;
    /// Longest deletion `reason`.
    pub const MAX_REASON_LEN: usize = 1024;
}

/// Why a document is invalid. The message names the offending entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The epoch is empty, too long or has characters outside `[A-Za-z0-9._-]`.
    #[error("invalid epoch {0:?}: 1 to 64 characters of [A-Za-z0-9._-]")]
    Epoch(String),
    /// Revision 0.
    #[error("revision must be at least 1")]
    Revision,
    /// Too many objects.
    #[error("the document has {count} objects; at most {max} are allowed")]
    TooManyObjects {
        /// Objects in the document.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A namespace or name breaks the Kubernetes naming rules.
    #[error("{entry}: {problem}")]
    Name {
        /// `applications[3]`, …
        entry: String,
        /// What is wrong.
        problem: String,
    },
    /// The same object appears twice.
    #[error("{entry}: {key} appears more than once")]
    Duplicate {
        /// The second occurrence.
        entry: String,
        /// The object.
        key: String,
    },
    /// An object is both desired and to be deleted.
    #[error("{entry}: {key} is both desired and listed for deletion")]
    DesiredAndDeleted {
        /// The deletion entry.
        entry: String,
        /// The object.
        key: String,
    },
    /// A spec is larger than the limit.
    #[error("{entry}: spec is {size} bytes; at most {max} are allowed")]
    SpecTooLarge {
        /// The entry.
        entry: String,
        /// Its serialized size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A field value the CRD would reject for sure, caught early.
    #[error("{entry}: {problem}")]
    Spec {
        /// The entry.
        entry: String,
        /// What is wrong.
        problem: String,
    },
}

/// DNS-1123 label: namespaces, ApplicationInstance names.
pub fn dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 63 {
        return Err(format!("{s:?} must be 1 to 63 characters"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!("{s:?} may contain only lowercase letters, digits and '-'"));
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(format!("{s:?} must start and end with a letter or digit"));
    }
    Ok(())
}

/// DNS-1123 subdomain of at most 63 characters: Operation names.
pub fn short_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 63 {
        return Err(format!("{s:?} must be 1 to 63 characters"));
    }
    s.split('.').try_for_each(dns_label)
}

fn name_rule(kind: ObjectKind) -> fn(&str) -> Result<(), String> {
    match kind {
        ObjectKind::ApplicationInstance => dns_label,
        ObjectKind::Operation => short_subdomain,
    }
}

/// Whether `epoch` is a valid epoch: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn epoch_ok(epoch: &str) -> bool {
    !epoch.is_empty()
        && epoch.len() <= limits::MAX_EPOCH_LEN
        && epoch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z, in Unix seconds: the times a Kubernetes
/// `metav1.Time` can hold and write back.
const MIN_STORED_SECOND: i64 = -62_135_596_800;
const MAX_STORED_SECOND: i64 = 253_402_300_799;

/// Checks a whole document. `Ok` means every entry may be acted on (subject to the
/// agent's namespace policy); `Err` means nothing may be.
pub fn validate_document(doc: &DesiredState) -> Result<(), ValidationError> {
    if !epoch_ok(&doc.epoch) {
        return Err(ValidationError::Epoch(doc.epoch.clone()));
    }
    if doc.revision == 0 {
        return Err(ValidationError::Revision);
    }
    let count = doc.applications.len() + doc.operations.len() + doc.deletions.len();
    if count > limits::MAX_OBJECTS {
        return Err(ValidationError::TooManyObjects {
            count,
            max: limits::MAX_OBJECTS,
        });
    }

    let mut desired = BTreeSet::new();
    let mut check = |entry: String, kind: ObjectKind, namespace: &str, name: &str, spec_size: Option<usize>| {
        dns_label(namespace).map_err(|p| ValidationError::Name {
            entry: entry.clone(),
            problem: format!("namespace {p}"),
        })?;
        name_rule(kind)(name).map_err(|p| ValidationError::Name {
            entry: entry.clone(),
            problem: format!("name {p}"),
        })?;
        if let Some(size) = spec_size
            && size > limits::MAX_SPEC_BYTES
        {
            return Err(ValidationError::SpecTooLarge {
                entry,
                size,
                max: limits::MAX_SPEC_BYTES,
            });
        }
        let key = ObjectKey {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        if !desired.insert(key.clone()) {
            return Err(ValidationError::Duplicate {
                entry,
                key: key.to_string(),
            });
        }
        Ok(())
    };

    for (i, app) in doc.applications.iter().enumerate() {
        let entry = format!("applications[{i}]");
        let size = serde_json::to_vec(&app.spec).map(|v| v.len()).unwrap_or(usize::MAX);
        check(
            entry.clone(),
            ObjectKind::ApplicationInstance,
            &app.namespace,
            &app.name,
            Some(size),
        )?;
        if app.spec.chart.name.is_empty() {
            return Err(ValidationError::Spec {
                entry,
                problem: "spec.chart.name is empty".into(),
            });
        }
        if app.spec.chart.repository.is_some() == app.spec.chart.source_ref.is_some() {
            return Err(ValidationError::Spec {
                entry,
                problem: "exactly one of spec.chart.repository or spec.chart.sourceRef must be set".into(),
            });
        }
        if let Some(values) = &app.spec.values
            && !values.is_object()
        {
            return Err(ValidationError::Spec {
                entry,
                problem: "spec.values must be an object".into(),
            });
        }
        if let Some(schedule) = &app.spec.backup_schedule {
            crate::schedule::check(schedule).map_err(|problem| ValidationError::Spec {
                entry: entry.clone(),
                problem,
            })?;
        }
        crate::maintenance::check(&app.spec.maintenance_windows).map_err(|problem| ValidationError::Spec {
            entry: entry.clone(),
            problem,
        })?;
        if let Some(verification) = &app.spec.restore_verification {
            crate::verification::check(verification).map_err(|problem| ValidationError::Spec {
                entry: entry.clone(),
                problem,
            })?;
        }
        if let Some(test) = &app.spec.test {
            crate::release_test::check(test).map_err(|problem| ValidationError::Spec {
                entry: entry.clone(),
                problem,
            })?;
        }
    }
    for (i, op) in doc.operations.iter().enumerate() {
        let entry = format!("operations[{i}]");
        let size = serde_json::to_vec(&op.spec).map(|v| v.len()).unwrap_or(usize::MAX);
        check(
            entry.clone(),
            ObjectKind::Operation,
            &op.namespace,
            &op.name,
            Some(size),
        )?;
        let id = &op.spec.request_id;
        let id_ok = !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if !id_ok {
            return Err(ValidationError::Spec {
                entry,
                problem: format!("spec.requestId {id:?} must be 1 to 128 characters of [A-Za-z0-9._:-]"),
            });
        }
        // Kubernetes stores times in whole seconds, from year 1 to 9999: a time outside that
        // range cannot be written back, and sub-second order is lost on the way (the CRD's
        // rule then refuses the one object instead of the whole document).
        for (field, time) in [("notBefore", &op.spec.not_before), ("deadline", &op.spec.deadline)] {
            if let Some(time) = time
                && !(MIN_STORED_SECOND..=MAX_STORED_SECOND).contains(&time.0.as_second())
            {
                return Err(ValidationError::Spec {
                    entry,
                    problem: format!("spec.{field} must be between the years 0001 and 9999"),
                });
            }
        }
        if let (Some(not_before), Some(deadline)) = (&op.spec.not_before, &op.spec.deadline)
            && deadline.0.as_second() <= not_before.0.as_second()
        {
            return Err(ValidationError::Spec {
                entry,
                problem: "spec.deadline must be later than spec.notBefore".into(),
            });
        }
    }

    let mut deleted = BTreeSet::new();
    for (i, del) in doc.deletions.iter().enumerate() {
        let entry = format!("deletions[{i}]");
        dns_label(&del.namespace).map_err(|p| ValidationError::Name {
            entry: entry.clone(),
            problem: format!("namespace {p}"),
        })?;
        name_rule(del.kind)(&del.name).map_err(|p| ValidationError::Name {
            entry: entry.clone(),
            problem: format!("name {p}"),
        })?;
        if del.reason.as_ref().is_some_and(|r| r.len() > limits::MAX_REASON_LEN) {
            return Err(ValidationError::Spec {
                entry,
                problem: format!("reason is longer than {} characters", limits::MAX_REASON_LEN),
            });
        }
        let key = ObjectKey {
            kind: del.kind,
            namespace: del.namespace.clone(),
            name: del.name.clone(),
        };
        if desired.contains(&key) {
            return Err(ValidationError::DesiredAndDeleted {
                entry,
                key: key.to_string(),
            });
        }
        if !deleted.insert(key.clone()) {
            return Err(ValidationError::Duplicate {
                entry,
                key: key.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use api::{ChartRepository, ChartSpec, OperationType};
    use serde_json::json;

    use super::*;
    use crate::messages::{ApplicationIntent, DeletionIntent, OperationIntent};

    pub(crate) fn app(ns: &str, name: &str) -> ApplicationIntent {
        ApplicationIntent {
            namespace: ns.into(),
            name: name.into(),
            spec: api::ApplicationInstanceSpec {
                chart: ChartSpec {
                    name: "wiki".into(),
                    version: Some("1.2.3".into()),
                    repository: Some(ChartRepository {
                        url: "https://charts.example.com".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            },
        }
    }

    fn op(ns: &str, name: &str) -> OperationIntent {
        OperationIntent {
            namespace: ns.into(),
            name: name.into(),
            spec: api::OperationSpec {
                type_: OperationType::Backup,
                application_ref: api::ApplicationReference { name: "wiki".into() },
                request_id: "odoo-42".into(),
                ..Default::default()
            },
        }
    }

    fn del(kind: ObjectKind, ns: &str, name: &str) -> DeletionIntent {
        DeletionIntent {
            kind,
            namespace: ns.into(),
            name: name.into(),
            uid: None,
            reason: None,
        }
    }

    fn doc() -> DesiredState {
        DesiredState {
            epoch: "e1".into(),
            revision: 3,
            generated_at: None,
            applications: vec![app("team-a", "wiki")],
            operations: vec![op("team-a", "wiki-backup-1")],
            deletions: vec![del(ObjectKind::ApplicationInstance, "team-a", "old")],
        }
    }

    #[test]
    fn a_good_document_and_an_empty_one_pass() {
        validate_document(&doc()).unwrap();
        let mut empty = doc();
        empty.applications.clear();
        empty.operations.clear();
        empty.deletions.clear();
        validate_document(&empty).unwrap();
    }

    #[test]
    fn every_rule_rejects() {
        type Mutation = Box<dyn Fn(&mut DesiredState)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("epoch", Box::new(|d| d.epoch = String::new())),
            ("epoch", Box::new(|d| d.epoch = "a/b".into())),
            ("epoch", Box::new(|d| d.epoch = "x".repeat(65))),
            ("revision", Box::new(|d| d.revision = 0)),
            ("namespace", Box::new(|d| d.applications[0].namespace = "Team".into())),
            ("name", Box::new(|d| d.applications[0].name = "wiki.a".into())),
            ("name", Box::new(|d| d.operations[0].name = "x".repeat(64))),
            (
                "more than once",
                Box::new(|d| d.applications.push(app("team-a", "wiki"))),
            ),
            (
                "both desired",
                Box::new(|d| d.deletions.push(del(ObjectKind::ApplicationInstance, "team-a", "wiki"))),
            ),
            (
                "more than once",
                Box::new(|d| d.deletions.push(del(ObjectKind::ApplicationInstance, "team-a", "old"))),
            ),
            (
                "sourceRef",
                Box::new(|d| d.applications[0].spec.chart.repository = None),
            ),
            ("values", Box::new(|d| d.applications[0].spec.values = Some(json!([1])))),
            (
                "spec.backupSchedule: cron",
                Box::new(|d| {
                    d.applications[0].spec.backup_schedule = Some(api::schedule::BackupSchedule {
                        cron: "every night".into(),
                        keep_last: Some(7),
                        ..Default::default()
                    })
                }),
            ),
            (
                "spec.maintenanceWindows[0]: start",
                Box::new(|d| {
                    d.applications[0].spec.maintenance_windows = vec![api::maintenance::MaintenanceWindow {
                        days: vec![api::maintenance::Weekday::Saturday],
                        start: "25:00".into(),
                        duration: "2h".into(),
                        time_zone: None,
                    }]
                }),
            ),
            (
                "bytes",
                Box::new(|d| d.applications[0].spec.values = Some(json!({"big": "x".repeat(600 * 1024)}))),
            ),
            (
                "requestId",
                Box::new(|d| d.operations[0].spec.request_id = "a b".into()),
            ),
            (
                "deadline",
                Box::new(|d| {
                    let t = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH);
                    d.operations[0].spec.not_before = Some(t.clone());
                    d.operations[0].spec.deadline = Some(t);
                }),
            ),
            (
                "deadline must be later",
                Box::new(|d| {
                    // Later by 0.6 s, the same second once stored: refused whole here.
                    let at = |s: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(s.parse().unwrap());
                    d.operations[0].spec.not_before = Some(at("2026-11-21T10:00:00.2Z"));
                    d.operations[0].spec.deadline = Some(at("2026-11-21T10:00:00.8Z"));
                }),
            ),
            (
                "between the years 0001 and 9999",
                Box::new(|d| {
                    let at = |s: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(s.parse().unwrap());
                    d.operations[0].spec.not_before = Some(at("-000001-06-01T00:00:00Z"));
                }),
            ),
            (
                "at most",
                Box::new(|d| {
                    d.deletions = (0..5_000)
                        .map(|i| del(ObjectKind::Operation, "team-a", &format!("op-{i}")))
                        .collect()
                }),
            ),
        ];
        for (want, mutate) in cases {
            let mut d = doc();
            mutate(&mut d);
            let err = validate_document(&d).unwrap_err().to_string();
            assert!(err.contains(want), "expected {want:?} in {err:?}");
        }
    }

    #[test]
    fn the_same_name_in_two_kinds_is_fine() {
        let mut d = doc();
        d.operations[0].name = "wiki".into();
        d.deletions = vec![del(ObjectKind::Operation, "team-a", "old")];
        validate_document(&d).unwrap();
    }
}
