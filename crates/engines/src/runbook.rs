//! Runbook: a `batch/v1` Job from the Operation's JobSpec, in the Operation's namespace,
//! owned by it; phase from the Job's terminal conditions. Argo WorkflowTemplates are
//! accepted by the API and refused here with `NotSupported` until an engine exists.
//!
//! The Job's pod is held to Pod Security `restricted` and runs as the ServiceAccount
//! `vworkspace-runbook` without an API token (`operations::pod_security`). Before creating
//! the Job the driver ensures (only then, not on every pass) that ServiceAccount exists in the namespace with
//! `automountServiceAccountToken: false` (the API server refuses pods whose ServiceAccount
//! does not exist). It binds it to nothing: the ServiceAccount has no rights, so a runbook
//! that needs the Kubernetes API gets none, by design.

use std::time::Duration;

use api::{OperationType, conditions::operation_reasons};
use controller_kit::WriteVerb;
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams},
};
use operations::{Outcome, job, meta};

use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

/// Drives Runbook Operations.
#[derive(Debug, Default, Clone)]
pub struct RunbookDriver;

pub(crate) fn jobs() -> kube::api::ApiResource {
    children::resource(job::API_VERSION, job::KIND, "jobs")
}

fn service_accounts() -> kube::api::ApiResource {
    children::resource("v1", "ServiceAccount", "serviceaccounts")
}

/// Ensures the runbook ServiceAccount ([`job::SERVICE_ACCOUNT`]) of `namespace` (the
/// Operation's, or a verified restore's scratch namespace) exists with `automountServiceAccountToken: false`: read it, and apply it
/// (server-side, forced: the name is reserved for runbooks, and only the fields of
/// [`job::service_account_object`] are taken over) only when it is missing or says
/// otherwise, so an engine at rest writes nothing. Fields others set (e.g.
/// `imagePullSecrets`) are kept.
pub(crate) async fn ensure_service_account(cx: &Cx, namespace: &str) -> Result<(), DriverError> {
    let existing = children::get(&cx.client, &service_accounts(), namespace, job::SERVICE_ACCOUNT).await?;
    if !job::service_account_needs_apply(existing.as_ref()) {
        return Ok(());
    }
    cx.metrics.api_write(WriteVerb::Apply, "ServiceAccount");
    Api::<DynamicObject>::namespaced_with(cx.client.clone(), namespace, &service_accounts())
        .patch(
            job::SERVICE_ACCOUNT,
            &PatchParams::apply(cx.field_manager).force(),
            &Patch::Apply(&job::service_account_object(namespace)),
        )
        .await?;
    Ok(())
}

impl RunbookDriver {
    fn job_object(cx: &Cx) -> Result<Result<serde_json::Value, Outcome>, DriverError> {
        let Some(runbook) = cx.op.spec.runbook.as_ref() else {
            return Ok(Err(Outcome::failed(
                operation_reasons::INVALID_SPEC,
                "spec.runbook is missing",
            )));
        };
        if let Some(template) = &runbook.workflow_template_ref {
            return Ok(Err(Outcome::failed(
                operation_reasons::NOT_SUPPORTED,
                format!(
                    "runbook.workflowTemplateRef ({}) is not yet supported: no Argo Workflows engine is deployed; use runbook.job",
                    template.name
                ),
            )));
        }
        let Some(spec) = runbook.job.as_ref() else {
            return Ok(Err(Outcome::failed(
                operation_reasons::INVALID_SPEC,
                "runbook.job is missing",
            )));
        };
        Ok(Ok(job::job_object(&cx.op, spec, &runbook.parameters)?))
    }
}

impl Driver for RunbookDriver {
    fn op_type(&self) -> OperationType {
        OperationType::Runbook
    }

    fn watches(&self) -> Vec<Watch> {
        vec![Watch::Owned(jobs())]
    }

    fn reads_application_once_started(&self) -> bool {
        // The Job is built from the Operation alone.
        false
    }

    fn ends_from_child_events(&self) -> bool {
        // The Job is built from the Operation alone and found in the Job watch's cache.
        true
    }

    fn claim_outcome(&self, cx: &Cx) -> Option<Outcome> {
        // What `drive` reports for the Job it is about to create: a Job without status.
        let object = Self::job_object(cx).ok()?.ok()?;
        let reference = meta::reference_of(&object).into_iter().collect();
        Some(job::map_job(&object).into_outcome(reference))
    }

    fn poll_interval(&self) -> Duration {
        // The Job watch wakes us on every change; this is only a safety net.
        Duration::from_secs(60)
    }

    async fn validate(&self, cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        Ok(Self::job_object(cx)?.err())
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        let object = match Self::job_object(cx)? {
            Ok(object) => object,
            Err(refusal) => return Ok(refusal),
        };
        let job =
            match children::ensure_with(cx, &jobs(), &object, || ensure_service_account(cx, cx.namespace())).await? {
                Child::Ours(job) => job,
                Child::Foreign(message) => return Ok(children::foreign(message)),
            };
        let reference = meta::reference_of(&job).into_iter().collect();
        Ok(job::map_job(&job).into_outcome(reference))
    }
}
