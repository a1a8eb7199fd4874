//! The `batch/v1` Job of a Runbook Operation, and what its conditions mean
//! (`docs/api/conditions.md` §3.5).
//!
//! The Job is created in the Operation's namespace, named after the Operation and owned
//! by it, so deleting the Operation stops and removes the run. The given JobSpec is used
//! as it is, with these changes: `parameters` become environment variables of every
//! container (init containers included: they are containers of the Job too), the pod
//! template gets our labels, `restartPolicy` defaults to `Never` (a Job requires `Never`
//! or `OnFailure`; `Never` keeps failed pods for their logs), and the pod is held to Pod
//! Security `restricted` and runs as the ServiceAccount `vworkspace-runbook` without an
//! API token ([`pod_security`]: compliant defaults where a field is absent, `InvalidSpec`
//! naming the field where one is set to a value `restricted` does not allow).
//! Scheduling fields (`nodeName`, `nodeSelector`, `affinity`, `tolerations`) are left as
//! given: they are not a Pod Security matter.
//!
//! `ttlSecondsAfterFinished` is refused: the Job is the only record of the run's outcome,
//! and a Job that deletes itself could be re-created by an engine that restarts before
//! recording the outcome, running the runbook twice. The Job goes away with its Operation.
//!
//! [`service_account_object`] is the ServiceAccount the engine ensures before it creates
//! the Job: without it the API server refuses the Job's pods.

use std::collections::BTreeMap;

use api::conditions::operation_reasons;
use api::{LABEL_MANAGED_BY, MANAGED_BY, Operation};
use serde_json::{Map, Value, json};

use crate::meta::{self, OpId};
use crate::progress::Progress;
use crate::status::Report;
use crate::status::is_valid_reason;
use crate::{Error, names, pod_security};

pub use crate::pod_security::SERVICE_ACCOUNT;

/// API version of Jobs.
pub const API_VERSION: &str = "batch/v1";
/// Kind of Jobs.
pub const KIND: &str = "Job";

/// The deterministic name of `op`'s Job: the Operation's own name (made a DNS-1123 label
/// if it holds dots), so `kubectl logs job/<operation>` just works.
pub fn job_name(op: &OpId<'_>) -> String {
    names::dns_label(op.name)
}

/// The Job for a Runbook Operation from its `runbook.job` (`job_spec`, a JobSpec) and
/// `runbook.parameters`. Errors are [`Error::InvalidSpec`] with a message naming the field.
pub fn job_object(op: &Operation, job_spec: &Value, parameters: &BTreeMap<String, String>) -> Result<Value, Error> {
    let id = OpId::of(op)?;
    if let Some(bad) = parameters.keys().find(|name| !is_env_name(name)) {
        return Err(invalid(format!(
            "runbook.parameters: {bad:?} is not a valid environment variable name (expected [A-Za-z_][A-Za-z0-9_]*)"
        )));
    }
    let spec = restricted_job_spec(&id, "runbook.job", job_spec, parameters)?;
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta::child_metadata(&id, &job_name(&id), id.namespace),
        "spec": spec,
    }))
}

/// `job_spec` (the JobSpec at `field` of an Operation or application) made ready to run:
/// `op`'s labels on the pod template, `restartPolicy` defaulted to `Never`, `parameters`
/// as environment variables of every container, and the pod held to Pod Security
/// `restricted` ([`pod_security`]). `ttlSecondsAfterFinished` is refused (see the module
/// docs). Errors are [`Error::InvalidSpec`] naming the field.
pub(crate) fn restricted_job_spec(
    id: &OpId<'_>,
    field: &str,
    job_spec: &Value,
    parameters: &BTreeMap<String, String>,
) -> Result<Map<String, Value>, Error> {
    let Some(spec) = job_spec.as_object() else {
        return Err(invalid(format!("{field}: must be an object (a batch/v1 JobSpec)")));
    };
    let mut spec = spec.clone();
    if spec.contains_key("ttlSecondsAfterFinished") {
        return Err(invalid(format!(
            "{field}.ttlSecondsAfterFinished: not allowed; the Job records the run's outcome and is removed with its Operation"
        )));
    }

    let labels = meta::labels(id);
    let template = object_field(&mut spec, "template", &format!("{field}.template"))?;
    let template_meta = object_field(template, "metadata", &format!("{field}.template.metadata"))?;
    let template_labels = object_field(template_meta, "labels", &format!("{field}.template.metadata.labels"))?;
    for (key, value) in &labels {
        template_labels.insert(key.clone(), json!(value));
    }

    let pod = object_field(template, "spec", &format!("{field}.template.spec"))?;
    match pod.get("restartPolicy") {
        None => {
            pod.insert("restartPolicy".into(), json!("Never"));
        }
        Some(Value::String(policy)) if policy == "Never" || policy == "OnFailure" => {}
        Some(other) => {
            return Err(invalid(format!(
                "{field}.template.spec.restartPolicy: {other} is not supported for a Job (Never or OnFailure)"
            )));
        }
    }
    let has_containers = pod
        .get("containers")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    if !has_containers {
        return Err(invalid(format!(
            "{field}: spec.template.spec.containers: Required value"
        )));
    }
    for list in ["initContainers", "containers"] {
        let Some(containers) = pod.get_mut(list) else {
            continue;
        };
        let Some(containers) = containers.as_array_mut() else {
            return Err(invalid(format!("{field}.template.spec.{list}: must be a list")));
        };
        for (index, container) in containers.iter_mut().enumerate() {
            let Some(container) = container.as_object_mut() else {
                return Err(invalid(format!(
                    "{field}.template.spec.{list}[{index}]: must be an object"
                )));
            };
            inject_env(container, parameters)
                .map_err(|e| invalid(format!("{field}.template.spec.{list}[{index}].{e}")))?;
        }
    }
    pod_security::restrict(template, &format!("{field}.template"))?;
    Ok(spec)
}

/// The ServiceAccount runbook pods run as ([`SERVICE_ACCOUNT`]), in `namespace`: no API
/// token mounted by default, and bound to nothing, so it has no rights. It is shared by
/// every Runbook of the namespace, so it has no owner and outlives the Operations.
pub fn service_account_object(namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": SERVICE_ACCOUNT,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        },
        "automountServiceAccountToken": false,
    })
}

/// Whether the ServiceAccount as read (`None`: it does not exist) must be applied: it is
/// missing, or it does not say `automountServiceAccountToken: false`. One that does is left
/// alone, whoever created it, so an engine at rest writes nothing.
pub fn service_account_needs_apply(existing: Option<&Value>) -> bool {
    existing.is_none_or(|account| account.get("automountServiceAccountToken") != Some(&Value::Bool(false)))
}

/// Maps a Job (the whole object as JSON) to progress.
///
/// Only the terminal conditions `Complete` and `Failed` end the Operation. Kubernetes sets
/// the interim `SuccessCriteriaMet` and `FailureTarget` as soon as the outcome is decided,
/// and the terminal condition once every pod has terminated: ending earlier would let the
/// next Operation start while the Job's pods are still running.
pub fn map_job(job: &Value) -> Progress {
    let name = meta::display_name(job);
    let condition = |type_: &str| {
        job.pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
            .filter(|c| c.get("status").and_then(Value::as_str) == Some("True"))
    };
    let text = |c: &Value, key: &str| c.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    let count = |key: &str| {
        job.pointer(&format!("/status/{key}"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };

    if condition("Complete").is_some() {
        return Progress::Succeeded {
            message: format!("Job {name} completed ({} succeeded pods)", count("succeeded")),
            report: Report::default(),
        };
    }
    if let Some(failed) = condition("Failed") {
        let reason = text(failed, "reason");
        let reason = if is_valid_reason(&reason) {
            reason
        } else {
            operation_reasons::FAILED.to_owned()
        };
        let detail = text(failed, "message");
        let detail = if detail.is_empty() { reason.clone() } else { detail };
        return Progress::Failed {
            message: format!("Job {name} failed: {detail}"),
            reason,
            report: Report::default(),
        };
    }
    // The message names a coming failure and the pods that failed so far, nothing that changes
    // with every pod or interim condition (`SuccessCriteriaMet` comes just before `Complete`):
    // each such change cost a status write per Operation and raced the write of its end.
    let failed = count("failed");
    let message = if let Some(target) = condition("FailureTarget") {
        format!(
            "Job {name} is failing ({}), waiting for its pods to terminate: {failed} failed pods",
            text(target, "reason")
        )
    } else if condition("Suspended").is_some() {
        format!("Job {name} is suspended")
    } else if failed > 0 {
        format!("Job {name} is running, {failed} failed pods so far")
    } else {
        format!("Job {name} is running")
    };
    Progress::Running { message }
}

/// Whether `name` is a C identifier (`^[A-Za-z_][A-Za-z0-9_]*$`), the portable subset of
/// environment variable names that every shell can expand.
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Sets each parameter as an env var of `container`. An existing entry of the same name
/// is replaced in place (the parameter is the per-run input; the JobSpec holds defaults).
fn inject_env(container: &mut Map<String, Value>, parameters: &BTreeMap<String, String>) -> Result<(), String> {
    if parameters.is_empty() {
        return Ok(());
    }
    let env = container.entry("env").or_insert_with(|| json!([]));
    if env.is_null() {
        *env = json!([]);
    }
    let Some(env) = env.as_array_mut() else {
        return Err("env: must be a list".into());
    };
    for (name, value) in parameters {
        let entry = json!({ "name": name, "value": value });
        match env
            .iter_mut()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(name.as_str()))
        {
            Some(existing) => *existing = entry,
            None => env.push(entry),
        }
    }
    Ok(())
}

/// `map[key]` as an object, created when absent (or null).
fn object_field<'m>(
    map: &'m mut Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'m mut Map<String, Value>, Error> {
    let value = map.entry(key).or_insert_with(|| json!({}));
    if value.is_null() {
        *value = json!({});
    }
    value
        .as_object_mut()
        .ok_or_else(|| invalid(format!("{path}: must be an object")))
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidSpec(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::op;
    use api::OperationType;

    fn runbook_op() -> Operation {
        op("nextcloud-db-vacuum", OperationType::Runbook)
    }

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// The JobSpec of docs/examples/valid/operation-runbook.yaml.
    fn example_spec() -> Value {
        json!({
            "backoffLimit": 2,
            "activeDeadlineSeconds": 1800,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "vacuum",
                    "image": "docker.io/library/postgres:16",
                    "command": ["sh", "-c", "vacuumdb --host=\"$DB_HOST\" --all --analyze $VACUUM_FLAGS"],
                    "env": [
                        {"name": "PGUSER", "value": "postgres"},
                        {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": "nextcloud-postgresql", "key": "postgres-password"}}}
                    ]
                }]
            }}
        })
    }

    #[test]
    fn job_object_from_the_documented_example() {
        let parameters = params(&[("DB_HOST", "nextcloud-postgresql"), ("VACUUM_FLAGS", "--verbose")]);
        let job = job_object(&runbook_op(), &example_spec(), &parameters).expect("builds");
        assert_eq!(job["apiVersion"], "batch/v1");
        assert_eq!(job["kind"], "Job");
        assert_eq!(job["metadata"]["name"], "nextcloud-db-vacuum");
        assert_eq!(job["metadata"]["namespace"], "team-a");
        assert_eq!(job["metadata"]["ownerReferences"][0]["name"], "nextcloud-db-vacuum");
        assert_eq!(job["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            job["metadata"]["labels"]["vworkspace.io/operation"],
            "nextcloud-db-vacuum"
        );
        assert_eq!(job["spec"]["backoffLimit"], 2);
        assert_eq!(job["spec"]["activeDeadlineSeconds"], 1800);
        let template = &job["spec"]["template"];
        assert_eq!(
            template["metadata"]["labels"]["vworkspace.io/operation-uid"],
            "uid-nextcloud-db-vacuum"
        );
        assert_eq!(
            template["spec"]["containers"][0]["env"],
            json!([
                {"name": "PGUSER", "value": "postgres"},
                {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": "nextcloud-postgresql", "key": "postgres-password"}}},
                {"name": "DB_HOST", "value": "nextcloud-postgresql"},
                {"name": "VACUUM_FLAGS", "value": "--verbose"},
            ])
        );
        // Held to Pod Security "restricted", as the runbook ServiceAccount without a token.
        let pod = &template["spec"];
        assert_eq!(pod["serviceAccountName"], "vworkspace-runbook");
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(
            pod["securityContext"],
            json!({"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        assert_eq!(
            pod["containers"][0]["securityContext"],
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
        );
        // Deterministic.
        assert_eq!(
            job,
            job_object(&runbook_op(), &example_spec(), &parameters).expect("builds")
        );
    }

    #[test]
    fn pod_security_refusals_reach_the_job() {
        let cases = [
            (
                json!({"template": {"spec": {"containers": [{"name": "c", "securityContext": {"privileged": true}}]}}}),
                "runbook.job.template.spec.containers[0].securityContext.privileged: true is not allowed (Pod Security \"restricted\")",
            ),
            (
                json!({"template": {"spec": {"hostPID": true, "containers": [{"name": "c"}]}}}),
                "runbook.job.template.spec.hostPID: true is not allowed (Pod Security \"restricted\")",
            ),
            (
                json!({"template": {"spec": {"serviceAccountName": "default", "containers": [{"name": "c"}]}}}),
                "runbook.job.template.spec.serviceAccountName: \"default\" is not allowed; runbook pods run as the ServiceAccount vworkspace-runbook, which has no rights",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(
                job_object(&runbook_op(), &spec, &params(&[("A", "1")])),
                Err(Error::InvalidSpec(message.into())),
                "{spec}"
            );
        }
    }

    #[test]
    fn service_account_object_and_when_to_apply_it() {
        assert_eq!(
            service_account_object("team-a"),
            json!({
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {
                    "name": "vworkspace-runbook",
                    "namespace": "team-a",
                    "labels": {"app.kubernetes.io/managed-by": "vworkspace-operator"},
                },
                "automountServiceAccountToken": false,
            })
        );
        let cases = [
            (None, true),
            (Some(json!({"metadata": {"name": "vworkspace-runbook"}})), true),
            (Some(json!({"automountServiceAccountToken": true})), true),
            (Some(json!({"automountServiceAccountToken": null})), true),
            (Some(json!({"automountServiceAccountToken": "false"})), true),
            (Some(json!({"automountServiceAccountToken": false})), false),
            (Some(service_account_object("team-a")), false),
        ];
        for (existing, expected) in cases {
            assert_eq!(service_account_needs_apply(existing.as_ref()), expected, "{existing:?}");
        }
    }

    #[test]
    fn env_injection_table() {
        let spec = json!({"template": {
            "metadata": {"labels": {"team": "db", "vworkspace.io/operation": "spoofed"}},
            "spec": {
                "initContainers": [{"name": "init"}],
                "containers": [
                    {"name": "a", "env": [{"name": "MODE", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}, {"name": "KEEP", "value": "1"}]},
                    {"name": "b", "env": null},
                ]
            }
        }});
        let job = job_object(&runbook_op(), &spec, &params(&[("MODE", "fast")])).expect("builds");
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Never", "defaulted");
        assert_eq!(
            pod["initContainers"][0]["env"],
            json!([{"name": "MODE", "value": "fast"}])
        );
        assert_eq!(
            pod["containers"][0]["env"],
            json!([{"name": "MODE", "value": "fast"}, {"name": "KEEP", "value": "1"}]),
            "a parameter replaces the entry of the same name in place"
        );
        assert_eq!(pod["containers"][1]["env"], json!([{"name": "MODE", "value": "fast"}]));
        let labels = &job["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["team"], "db", "user labels kept");
        assert_eq!(labels["vworkspace.io/operation"], "nextcloud-db-vacuum", "ours win");

        // No parameters: containers untouched.
        let job = job_object(&runbook_op(), &spec, &BTreeMap::new()).expect("builds");
        assert!(
            job["spec"]["template"]["spec"]["initContainers"][0]
                .get("env")
                .is_none()
        );
        assert_eq!(job["spec"]["template"]["spec"]["containers"][1]["env"], Value::Null);
    }

    #[test]
    fn restart_policy_table() {
        let cases = [
            (None, Ok("Never")),
            (Some("Never"), Ok("Never")),
            (Some("OnFailure"), Ok("OnFailure")),
            (Some("Always"), Err(())),
        ];
        for (policy, expected) in cases {
            let mut spec = json!({"template": {"spec": {"containers": [{"name": "c"}]}}});
            if let Some(policy) = policy {
                spec["template"]["spec"]["restartPolicy"] = json!(policy);
            }
            let built = job_object(&runbook_op(), &spec, &BTreeMap::new());
            match expected {
                Ok(value) => assert_eq!(
                    built.expect("builds")["spec"]["template"]["spec"]["restartPolicy"],
                    value
                ),
                Err(()) => assert!(matches!(built, Err(Error::InvalidSpec(_))), "{policy:?}"),
            }
        }
    }

    #[test]
    fn invalid_specs_table() {
        let containers = json!({"template": {"spec": {"containers": [{"name": "c"}]}}});
        let cases: Vec<(&str, Value, BTreeMap<String, String>, &str)> = vec![
            (
                "not an object",
                json!([1]),
                params(&[]),
                "runbook.job: must be an object (a batch/v1 JobSpec)",
            ),
            (
                "no template",
                json!({}),
                params(&[]),
                "runbook.job: spec.template.spec.containers: Required value",
            ),
            (
                "empty containers",
                json!({"template": {"spec": {"containers": []}}}),
                params(&[]),
                "runbook.job: spec.template.spec.containers: Required value",
            ),
            (
                "template not an object",
                json!({"template": "x"}),
                params(&[]),
                "runbook.job.template: must be an object",
            ),
            (
                "containers not a list",
                json!({"template": {"spec": {"containers": [{"name": "c"}], "initContainers": {}}}}),
                params(&[("A", "1")]),
                "runbook.job.template.spec.initContainers: must be a list",
            ),
            (
                "container not an object",
                json!({"template": {"spec": {"containers": ["c"]}}}),
                params(&[("A", "1")]),
                "runbook.job.template.spec.containers[0]: must be an object",
            ),
            (
                "env not a list",
                json!({"template": {"spec": {"containers": [{"name": "c", "env": {}}]}}}),
                params(&[("A", "1")]),
                "runbook.job.template.spec.containers[0].env: must be a list",
            ),
            (
                "ttl",
                json!({"ttlSecondsAfterFinished": 60, "template": {"spec": {"containers": [{"name": "c"}]}}}),
                params(&[]),
                "runbook.job.ttlSecondsAfterFinished: not allowed; the Job records the run's outcome and is removed with its Operation",
            ),
            (
                "parameter name starts with a digit",
                containers.clone(),
                params(&[("1ABC", "x")]),
                "runbook.parameters: \"1ABC\" is not a valid environment variable name (expected [A-Za-z_][A-Za-z0-9_]*)",
            ),
            (
                "parameter name with a dash",
                containers.clone(),
                params(&[("DB-HOST", "x")]),
                "runbook.parameters: \"DB-HOST\" is not a valid environment variable name (expected [A-Za-z_][A-Za-z0-9_]*)",
            ),
            (
                "restart policy not a string",
                json!({"template": {"spec": {"restartPolicy": 1, "containers": [{"name": "c"}]}}}),
                params(&[]),
                "runbook.job.template.spec.restartPolicy: 1 is not supported for a Job (Never or OnFailure)",
            ),
        ];
        for (name, spec, parameters, message) in cases {
            assert_eq!(
                job_object(&runbook_op(), &spec, &parameters),
                Err(Error::InvalidSpec(message.into())),
                "{name}"
            );
        }
    }

    #[test]
    fn env_names() {
        for ok in ["A", "_", "a_b", "DB_HOST", "x1", "_1"] {
            assert!(is_env_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A.B", "A B", "É", "A="] {
            assert!(!is_env_name(bad), "{bad}");
        }
    }

    #[test]
    fn dotted_operation_names_make_valid_job_names() {
        let mut o = runbook_op();
        o.metadata.name = Some("db.vacuum".into());
        let job = job_object(
            &o,
            &json!({"template": {"spec": {"containers": [{"name": "c"}]}}}),
            &BTreeMap::new(),
        )
        .expect("builds");
        let name = job["metadata"]["name"].as_str().expect("name");
        assert!(names::is_dns_label(name) && name.starts_with("db-vacuum-"), "{name}");
    }

    fn job(status: Value) -> Value {
        json!({"metadata": {"name": "vacuum", "namespace": "team-a"}, "status": status})
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message})
    }

    #[test]
    fn map_job_table() {
        let cases = [
            (
                json!({}),
                Progress::Running {
                    message: "Job team-a/vacuum is running".into(),
                },
            ),
            (
                json!({"active": 1}),
                Progress::Running {
                    message: "Job team-a/vacuum is running".into(),
                },
            ),
            (
                json!({"active": 1, "failed": 1}),
                Progress::Running {
                    message: "Job team-a/vacuum is running, 1 failed pods so far".into(),
                },
            ),
            (
                json!({"succeeded": 1, "conditions": [cond("SuccessCriteriaMet", "True", "CompletionsReached", ""), cond("Complete", "True", "CompletionsReached", "")]}),
                Progress::Succeeded {
                    message: "Job team-a/vacuum completed (1 succeeded pods)".into(),
                    report: Report::default(),
                },
            ),
            (
                json!({"failed": 3, "conditions": [cond("FailureTarget", "True", "BackoffLimitExceeded", "x"), cond("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]}),
                Progress::Failed {
                    reason: "BackoffLimitExceeded".into(),
                    message: "Job team-a/vacuum failed: Job has reached the specified backoff limit".into(),
                    report: Report::default(),
                },
            ),
            (
                json!({"conditions": [cond("Failed", "True", "DeadlineExceeded", "Job was active longer than specified deadline")]}),
                Progress::Failed {
                    reason: "DeadlineExceeded".into(),
                    message: "Job team-a/vacuum failed: Job was active longer than specified deadline".into(),
                    report: Report::default(),
                },
            ),
            (
                json!({"conditions": [cond("Failed", "True", "", "")]}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Job team-a/vacuum failed: Failed".into(),
                    report: Report::default(),
                },
            ),
            (
                json!({"conditions": [cond("Failed", "True", "not valid!", "boom")]}),
                Progress::Failed {
                    reason: "Failed".into(),
                    message: "Job team-a/vacuum failed: boom".into(),
                    report: Report::default(),
                },
            ),
            (
                json!({"active": 1, "failed": 3, "conditions": [cond("FailureTarget", "True", "BackoffLimitExceeded", "")]}),
                Progress::Running {
                    message: "Job team-a/vacuum is failing (BackoffLimitExceeded), waiting for its pods to terminate: 3 failed pods".into(),
                },
            ),
            (
                json!({"active": 1, "succeeded": 1, "conditions": [cond("SuccessCriteriaMet", "True", "SuccessPolicy", "")]}),
                Progress::Running {
                    message: "Job team-a/vacuum is running".into(),
                },
            ),
            (
                json!({"conditions": [cond("Suspended", "True", "JobSuspended", "")]}),
                Progress::Running {
                    message: "Job team-a/vacuum is suspended".into(),
                },
            ),
            (
                json!({"conditions": [cond("Complete", "False", "", ""), cond("Failed", "False", "", "")]}),
                Progress::Running {
                    message: "Job team-a/vacuum is running".into(),
                },
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(map_job(&job(status.clone())), expected, "{status}");
        }
    }
}
