//! The restore engine's verified restore (`restore.verify`): it carries out the steps
//! [`operations::verify::step`] decides, one per pass. The scratch namespace is created,
//! and later deleted, by the engine alone; the admission policy of
//! `deploy/components/restore-engine` lets its ServiceAccount create and delete only
//! namespaces labelled as scratch, and create Jobs and ServiceAccounts only in them.

use std::collections::BTreeMap;

use api::{RestoreVerificationStatus, conditions::operation_reasons};
use controller_kit::{WriteVerb, writes};
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, ListParams, Patch, Preconditions},
    discovery::ApiResource,
};
use operations::{
    Outcome, Report,
    meta::{self, OpId},
    velero,
    verify::{self, Observed, Plan, Step},
};
use serde_json::Value;

use crate::backup::{velero_restores, velero_target};
use crate::children::{self, Child};
use crate::restore::RestoreDriver;
use crate::runbook::{ensure_service_account, jobs};
use crate::runtime::{Cx, DriverError};

fn namespaces() -> ApiResource {
    children::resource("v1", "Namespace", "namespaces")
}

fn pod_volume_restores() -> ApiResource {
    children::resource(velero::API_VERSION, "PodVolumeRestore", "podvolumerestores")
}

/// Deployments and StatefulSets, whose readiness is the first check.
fn workloads() -> [ApiResource; 2] {
    [
        children::resource("apps/v1", "Deployment", "deployments"),
        children::resource("apps/v1", "StatefulSet", "statefulsets"),
    ]
}

fn as_json(object: DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

/// Deletes the namespace `namespace` (as JSON; UID precondition): `true` when the deletion was
/// accepted, `false` when it is gone or was replaced by another of the same name (left alone).
async fn delete_namespace(api: &Api<DynamicObject>, namespace: Option<&Value>) -> Result<bool, kube::Error> {
    let text = |pointer: &str| namespace.and_then(|ns| ns.pointer(pointer)).and_then(Value::as_str);
    let Some(name) = text("/metadata/name") else {
        return Ok(false);
    };
    let params = DeleteParams {
        preconditions: text("/metadata/uid").map(|uid| Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The terminal outcome for a verified restore's evidence.
fn verdict_outcome(evidence: RestoreVerificationStatus, children: Vec<api::ObjectReference>) -> Outcome {
    let message = format!(
        "verification of Velero Backup {} {}: {}; scratch namespace {} removed",
        evidence.backup,
        if evidence.passed { "passed" } else { "failed" },
        evidence.message,
        evidence.scratch_namespace
    );
    let report = Report {
        verification: Some(Box::new(evidence.clone())),
        ..Report::default()
    };
    if evidence.passed {
        Outcome::Succeeded {
            result: message,
            children,
            report,
        }
    } else {
        Outcome::Failed {
            reason: operation_reasons::VERIFICATION_FAILED.to_owned(),
            message,
            children,
            report,
        }
    }
}

impl RestoreDriver {
    /// Refuses, before anything is created, a verification Job the application declares that
    /// cannot run (not a JobSpec, or not Pod Security `restricted`).
    pub(crate) fn refuse_verification_job(cx: &Cx) -> Option<Outcome> {
        let id = OpId::of(&cx.op).ok()?;
        let job = cx.app.as_ref()?.spec.restore_verification.as_ref()?.job.as_ref()?;
        verify::job_object(&id, job, &verify::scratch_namespace(&id), cx.namespace(), "check")
            .err()
            .map(|e| Outcome::failed(operation_reasons::INVALID_SPEC, e.to_string()))
    }

    /// One pass of a verified restore.
    pub(crate) async fn drive_verification(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        let id = OpId::of(&cx.op)?;
        let scratch = verify::scratch_namespace(&id);
        let name = velero::object_name(&id);
        let restore = match self.own_restore(cx, &id, &name).await? {
            Ok(restore) => restore,
            Err(foreign) => return Ok(foreign),
        };
        let namespace_api = Api::<DynamicObject>::all_with(cx.client.clone(), &namespaces());
        let scratch_ns = namespace_api.get_opt(&scratch).await?.map(as_json);
        if let Some(ns) = &scratch_ns
            && !verify::is_scratch_of(ns, &id)
        {
            return Ok(children::foreign(format!(
                "Namespace {scratch} already exists and is not this Operation's scratch namespace; it is left alone"
            )));
        }
        let backup = match restore
            .as_ref()
            .and_then(|r| r.pointer("/spec/backupName"))
            .and_then(Value::as_str)
        {
            Some(backup) => backup.to_owned(),
            None => self.source_backup(cx).await?,
        };

        let mut workloads_found = Vec::new();
        let mut job = None;
        if scratch_ns.is_some() {
            for resource in workloads() {
                let list = Api::<DynamicObject>::namespaced_with(cx.client.clone(), &scratch, &resource)
                    .list(&ListParams::default())
                    .await?;
                workloads_found.extend(list.items.into_iter().map(|o| {
                    let mut value = as_json(o);
                    if let Some(object) = value.as_object_mut() {
                        object.insert("kind".to_owned(), Value::String(resource.kind.clone()));
                    }
                    value
                }));
            }
            job = children::get(&cx.client, &jobs(), &scratch, verify::JOB_NAME).await?;
        }
        let volumes_restored = match &restore {
            Some(_) => {
                let selector = format!("velero.io/restore-name={name}");
                let list = Api::<DynamicObject>::namespaced_with(
                    cx.client.clone(),
                    &self.velero_namespace,
                    &pod_volume_restores(),
                )
                .list(&ListParams::default().labels(&selector))
                .await?;
                let completed = list
                    .items
                    .iter()
                    .filter(|p| p.data.pointer("/status/phase").and_then(Value::as_str) == Some("Completed"))
                    .count();
                Some(i64::try_from(completed).unwrap_or(i64::MAX))
            }
            None => None,
        };

        let verification = cx.app.as_ref().and_then(|app| app.spec.restore_verification.as_ref());
        let plan = Plan {
            backup: &backup,
            scratch: &scratch,
            verification,
        };
        let seen = Observed {
            scratch: scratch_ns.as_ref(),
            restore: restore.as_ref(),
            workloads: &workloads_found,
            job: job.as_ref(),
            volumes_restored,
            now: jiff::Timestamp::now(),
        };
        let references: Vec<_> = restore.as_ref().and_then(meta::reference_of).into_iter().collect();
        let running = |message: String| Outcome::Running {
            message,
            children: references.clone(),
        };

        Ok(match verify::step(&plan, &seen) {
            Step::CreateNamespace => {
                let Some(target) = velero_target(cx).await? else {
                    return Ok(Outcome::failed(
                        operation_reasons::APPLICATION_NOT_FOUND,
                        "the ApplicationInstance was deleted before the verified restore started",
                    ));
                };
                let source_labels: BTreeMap<String, String> = namespace_api
                    .get_opt(&target.namespace)
                    .await?
                    .and_then(|ns| ns.metadata.labels)
                    .unwrap_or_default();
                let object = verify::namespace_object(&id, &target.namespace, &source_labels);
                let object: DynamicObject = serde_json::from_value(object)
                    .map_err(|e| DriverError::Retry(format!("scratch namespace object: {e}")))?;
                cx.metrics.api_write(WriteVerb::Create, "Namespace");
                match namespace_api
                    .create(&writes::create_as(cx.field_manager), &object)
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(kube::Error::Api(e)) if e.code == 403 => {
                        return Ok(Outcome::failed(
                            operation_reasons::SCRATCH_NAMESPACE_FORBIDDEN,
                            format!(
                                "the restore engine may not create the scratch namespace {scratch}: {}; a verified restore \
                                 needs the cluster-wide rights and admission policy of deploy/components/restore-engine \
                                 (a namespaced installation has neither)",
                                e.message
                            ),
                        ));
                    }
                    Err(e) => return Err(e.into()),
                }
                running(format!(
                    "created the scratch namespace {scratch} for a copy of {}",
                    target.namespace
                ))
            }
            Step::CreateRestore => {
                let Some(target) = velero_target(cx).await? else {
                    return Ok(Outcome::failed(
                        operation_reasons::APPLICATION_NOT_FOUND,
                        "the ApplicationInstance was deleted before the verified restore started",
                    ));
                };
                let object = velero::restore_object(&cx.op, &backup, &target, &self.velero_namespace)?;
                match children::ensure(cx, &velero_restores(), &object).await? {
                    Child::Ours(restore) => Outcome::Running {
                        message: format!("Velero Restore {name} created from Backup {backup} into {scratch}"),
                        children: meta::reference_of(&restore).into_iter().collect(),
                    },
                    Child::Foreign(message) => children::foreign(message),
                }
            }
            Step::CreateJob => {
                let source = cx.target_namespace().unwrap_or(cx.namespace()).to_owned();
                let Some(spec) = verification.and_then(|v| v.job.as_ref()) else {
                    return Ok(running("no verification Job declared".into()));
                };
                let object = verify::job_object(&id, spec, &scratch, &source, &backup)?;
                match children::ensure_with(cx, &jobs(), &object, || ensure_service_account(cx, &scratch)).await? {
                    Child::Ours(_) => running(format!("verification Job {scratch}/{} created", verify::JOB_NAME)),
                    Child::Foreign(message) => children::foreign(message),
                }
            }
            Step::Wait(message) => running(message),
            Step::Record(evidence) => {
                let patch = verify::verdict_patch(&evidence)?;
                cx.metrics.api_write(WriteVerb::Patch, "Restore");
                Api::<DynamicObject>::namespaced_with(cx.client.clone(), &self.velero_namespace, &velero_restores())
                    .patch(&name, &writes::patch_as(cx.field_manager), &Patch::Merge(&patch))
                    .await?;
                running(format!(
                    "verification {}: {}; removing the scratch namespace {scratch}",
                    if evidence.passed { "passed" } else { "failed" },
                    evidence.message
                ))
            }
            Step::RemoveNamespace(evidence) => {
                cx.metrics.api_write(WriteVerb::Delete, "Namespace");
                delete_namespace(&namespace_api, scratch_ns.as_ref()).await?;
                running(format!(
                    "verification {}; removing the scratch namespace {scratch}",
                    if evidence.passed { "passed" } else { "failed" }
                ))
            }
            Step::Done(evidence) => verdict_outcome(evidence, references),
        })
    }
}

/// How often the restore engine looks for scratch namespaces whose Operation is gone.
pub const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes orphaned scratch namespaces ([`verify::is_orphaned`]) every [`SWEEP_INTERVAL`]
/// while this replica leads: a verified restore whose Operation was deleted mid-way leaves
/// its copy running, and nothing else would ever remove it. Only namespaces whose Operation
/// lies in the engine's scope are judged.
pub async fn sweep_orphans(
    client: kube::Client,
    settings: crate::runtime::EngineSettings,
    synced: crate::runtime::SyncTracker,
    shutdown: controller_kit::CancellationToken,
) {
    const CONTROLLER: &str = "scratch-sweeper";
    let metrics = settings.metrics.controller(CONTROLLER);
    metrics.declare_write(WriteVerb::Delete, "Namespace");
    synced.synced();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
        if !settings.gate.is_leader() {
            continue;
        }
        match sweep_once(&client, &settings, &metrics).await {
            Ok(()) => {}
            // No right to list namespaces: an installation without verified restores.
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tracing::debug!(error = %e.message, "scratch namespaces not listable; no sweep");
            }
            Err(e) => tracing::warn!(error = %e, "sweeping orphaned scratch namespaces failed"),
        }
    }
}

async fn sweep_once(
    client: &kube::Client,
    settings: &crate::runtime::EngineSettings,
    metrics: &controller_kit::ControllerMetrics,
) -> Result<(), kube::Error> {
    let namespace_api = Api::<DynamicObject>::all_with(client.clone(), &namespaces());
    let selector = format!("{}={}", verify::LABEL_SCRATCH, verify::SCRATCH_VALUE);
    for scratch in namespace_api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
    {
        let scratch = as_json(scratch);
        let Some((namespace, name, _)) = verify::owner_of(&scratch) else {
            continue;
        };
        if !settings.scope.allows(&namespace) {
            continue;
        }
        let operation = Api::<api::Operation>::namespaced(client.clone(), &namespace)
            .get_opt(&name)
            .await?;
        if !verify::is_orphaned(&scratch, operation.as_ref()) {
            continue;
        }
        metrics.api_write(WriteVerb::Delete, "Namespace");
        if delete_namespace(&namespace_api, Some(&scratch)).await? {
            let scratch_name = scratch
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            tracing::info!(
                scratch = scratch_name,
                operation = %format!("{namespace}/{name}"),
                "removed a scratch namespace whose verified restore is gone or ended"
            );
        }
    }
    Ok(())
}
