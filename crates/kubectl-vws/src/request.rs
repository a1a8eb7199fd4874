//! The Operations that `backup`, `restore`, `upgrade`, `rollback` and `runbook` create.
//!
//! An Operation's name is derived from its application, type and `requestId`, so running the
//! same command again with the same `--request-id` names the same Operation: it is not
//! created twice, and `--wait` follows the one that exists. Without `--request-id` a fresh
//! id is generated (`kubectl-vws-<UTC time>-<random>`).

use std::collections::BTreeMap;

use api::{
    ApplicationReference, BackupParams, Operation, OperationSpec, OperationType, RestoreParams, RestoreSource,
    RollbackParams, RunbookParams, UpgradeFailurePolicy, UpgradeParams, WorkflowTemplateReference,
};
use jiff::Timestamp;
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::Error;

/// Labels every Operation of ours carries, so `kubectl get operations -l …` finds them.
pub const CREATED_BY_LABEL: &str = "vworkspace.io/created-by";
/// The value of [`CREATED_BY_LABEL`].
pub const CREATED_BY: &str = "kubectl-vws";

/// What the caller asked for, before it becomes an Operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    Backup(BackupParams),
    Restore(RestoreParams),
    Upgrade(UpgradeParams),
    Rollback(RollbackParams),
    Runbook(RunbookParams),
}

impl Intent {
    /// The Operation type this intent creates.
    pub fn type_(&self) -> OperationType {
        match self {
            Intent::Backup(_) => OperationType::Backup,
            Intent::Restore(_) => OperationType::Restore,
            Intent::Upgrade(_) => OperationType::Upgrade,
            Intent::Rollback(_) => OperationType::Rollback,
            Intent::Runbook(_) => OperationType::Runbook,
        }
    }
}

/// A fresh `requestId`: `kubectl-vws-20261127t120000z-<8 hex>`, within the CRD's pattern.
pub fn generated_request_id(now: Timestamp, random: u32) -> String {
    let time = now.strftime("%Y%m%dt%H%M%Sz");
    format!("{CREATED_BY}-{time}-{random:08x}")
}

/// Checks a `--request-id` against the CRD's rule (1–128 of `[A-Za-z0-9._:-]`, alphanumeric
/// at both ends), so a bad one is refused here with the rule rather than by the API server.
pub fn check_request_id(id: &str) -> Result<(), Error> {
    let inner_ok = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    let ends_ok = id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if id.len() <= 128 && inner_ok && ends_ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "--request-id {id:?} must be 1 to 128 characters of [A-Za-z0-9._:-], starting and ending with a letter or digit"
        )))
    }
}

/// The Operation's name: `<app>-<type>-<requestId>` as a DNS label with a hash of the parts,
/// so the same request always names the same Operation.
pub fn operation_name(app: &str, type_: OperationType, request_id: &str) -> String {
    operations::names::pair(&format!("{app}-{}", type_.as_str().to_ascii_lowercase()), request_id)
}

/// The Operation for `intent` on `namespace/app`.
pub fn operation(namespace: &str, app: &str, request_id: &str, intent: Intent) -> Operation {
    let type_ = intent.type_();
    let mut spec = OperationSpec {
        type_,
        application_ref: ApplicationReference { name: app.to_owned() },
        request_id: request_id.to_owned(),
        ..OperationSpec::default()
    };
    match intent {
        Intent::Backup(p) => spec.backup = Some(p),
        Intent::Restore(p) => spec.restore = Some(p),
        Intent::Upgrade(p) => spec.upgrade = Some(p),
        Intent::Rollback(p) => spec.rollback = Some(p),
        Intent::Runbook(p) => spec.runbook = Some(p),
    }
    Operation {
        metadata: ObjectMeta {
            name: Some(operation_name(app, type_, request_id)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(CREATED_BY_LABEL.to_owned(), CREATED_BY.to_owned())])),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// `--on-failure` as the API spells it.
pub fn failure_policy(value: &str) -> Result<UpgradeFailurePolicy, Error> {
    match value.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
        "none" => Ok(UpgradeFailurePolicy::None),
        "rollback" => Ok(UpgradeFailurePolicy::Rollback),
        "rollbackandrestore" => Ok(UpgradeFailurePolicy::RollbackAndRestore),
        _ => Err(Error::Usage(format!(
            "--on-failure {value:?}: expected none, rollback or rollback-and-restore"
        ))),
    }
}

/// A YAML or JSON document read from `what` (a file name), which must be a mapping.
pub fn mapping(what: &str, text: &str) -> Result<Value, Error> {
    let value: Value = serde_saphyr::from_str(text).map_err(|e| Error::Parse {
        what: what.to_owned(),
        message: e.to_string(),
    })?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(Error::Parse {
            what: what.to_owned(),
            message: "expected a mapping (key: value) at the top".to_owned(),
        })
    }
}

/// `--param key=value` pairs; a key may not repeat.
pub fn parameters(pairs: &[String]) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(Error::Usage(format!("--param {pair:?}: expected KEY=VALUE")));
        };
        if key.is_empty() {
            return Err(Error::Usage(format!("--param {pair:?}: the key is empty")));
        }
        if out.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(Error::Usage(format!("--param {key:?} is given twice")));
        }
    }
    Ok(out)
}

/// A runbook from a Job spec (`--job-file`) or a WorkflowTemplate (`--workflow-template`).
pub fn runbook(
    job: Option<Value>,
    workflow_template: Option<String>,
    cluster_scope: bool,
    parameters: BTreeMap<String, String>,
) -> Result<RunbookParams, Error> {
    match (job, workflow_template) {
        (Some(_), Some(_)) | (None, None) => Err(Error::Usage(
            "runbook takes exactly one of --job-file or --workflow-template".to_owned(),
        )),
        (job, template) => Ok(RunbookParams {
            job,
            workflow_template_ref: template.map(|name| WorkflowTemplateReference { name, cluster_scope }),
            parameters,
        }),
    }
}

/// A restore from an earlier Backup Operation (`--from-operation`) or a Velero Backup by
/// name (`--from-backup`).
pub fn restore_source(from_operation: Option<String>, from_backup: Option<String>) -> Result<RestoreSource, Error> {
    match (from_operation, from_backup) {
        (Some(_), Some(_)) | (None, None) => Err(Error::Usage(
            "restore takes exactly one of --from-operation or --from-backup".to_owned(),
        )),
        (operation_name, velero_backup_name) => Ok(RestoreSource {
            operation_name,
            velero_backup_name,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_pass_the_crd_rule_and_differ_by_random_part() {
        let now: Timestamp = "2026-11-27T12:00:05Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
        let id = generated_request_id(now, 0xabc);
        assert_eq!(id, "kubectl-vws-20261127t120005z-00000abc");
        assert!(check_request_id(&id).is_ok());
        assert_ne!(id, generated_request_id(now, 0xabd));
    }

    #[test]
    fn request_ids_outside_the_crd_rule_are_refused_with_the_rule() {
        for bad in ["", "-a", "a-", "a b", "é", &"a".repeat(129)] {
            let err = check_request_id(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("[A-Za-z0-9._:-]"), "{bad:?}: {err}");
        }
        for good in ["a", "odoo-42", "A.b_c:d-9", &"a".repeat(128)] {
            assert!(check_request_id(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn the_same_request_names_the_same_operation_and_another_one_another() {
        let a = operation_name("wiki", OperationType::Backup, "req-1");
        assert_eq!(a, operation_name("wiki", OperationType::Backup, "req-1"));
        assert!(a.starts_with("wiki-backup-req-1-"), "{a}");
        assert_ne!(a, operation_name("wiki", OperationType::Backup, "req-2"));
        assert_ne!(a, operation_name("wiki", OperationType::Upgrade, "req-1"));
        let long = operation_name(&"x".repeat(60), OperationType::Runbook, &"r".repeat(128));
        assert!(long.len() <= 63, "{long}");
    }

    #[test]
    fn an_upgrade_intent_becomes_an_operation_with_its_payload_only() -> Result<(), Error> {
        let values = mapping("values.yaml", "replicas: 2\nimage:\n  tag: \"1.2\"\n")?;
        let intent = Intent::Upgrade(UpgradeParams {
            chart_version: "6.2.0".into(),
            values_patch: Some(values),
            backup_first: Some(true),
            on_failure: Some(failure_policy("rollback-and-restore")?),
            ..UpgradeParams::default()
        });
        let op = operation("team-a", "wiki", "req-1", intent);
        let json = serde_json::to_value(&op).map_err(|e| Error::Output(e.to_string()))?;
        assert_eq!(json["metadata"]["namespace"], "team-a");
        assert_eq!(json["metadata"]["labels"][CREATED_BY_LABEL], CREATED_BY);
        assert_eq!(json["spec"]["type"], "Upgrade");
        assert_eq!(json["spec"]["applicationRef"]["name"], "wiki");
        assert_eq!(json["spec"]["requestId"], "req-1");
        assert_eq!(json["spec"]["upgrade"]["chartVersion"], "6.2.0");
        assert_eq!(json["spec"]["upgrade"]["valuesPatch"]["image"]["tag"], "1.2");
        assert_eq!(json["spec"]["upgrade"]["onFailure"], "RollbackAndRestore");
        assert!(json["spec"].get("backup").is_none() && json["spec"].get("runbook").is_none());
        Ok(())
    }

    #[test]
    fn bad_flags_are_refused_with_what_was_expected() {
        let cases: Vec<(Result<(), Error>, &str)> = vec![
            (
                failure_policy("sometimes").map(drop),
                "expected none, rollback or rollback-and-restore",
            ),
            (mapping("v.yaml", "- a\n- b\n").map(drop), "v.yaml: expected a mapping"),
            (mapping("v.yaml", "a: [").map(drop), "v.yaml:"),
            (parameters(&["novalue".into()]).map(drop), "expected KEY=VALUE"),
            (parameters(&["=x".into()]).map(drop), "the key is empty"),
            (parameters(&["a=1".into(), "a=2".into()]).map(drop), "given twice"),
            (
                runbook(None, None, false, BTreeMap::new()).map(drop),
                "exactly one of --job-file",
            ),
            (restore_source(None, None).map(drop), "exactly one of --from-operation"),
            (
                restore_source(Some("a".into()), Some("b".into())).map(drop),
                "exactly one of --from-operation",
            ),
        ];
        for (result, want) in cases {
            let err = result.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
    }

    #[test]
    fn parameters_keep_values_with_equals_signs() -> Result<(), Error> {
        let p = parameters(&["query=a=b".into(), "empty=".into()])?;
        assert_eq!(p.get("query").map(String::as_str), Some("a=b"));
        assert_eq!(p.get("empty").map(String::as_str), Some(""));
        Ok(())
    }
}
