//! Runbook: a `batch/v1` Job from the Operation's JobSpec, in the Operation's namespace,
//! owned by it; phase from the Job's terminal conditions. Argo WorkflowTemplates are
//! accepted by the API and refused here with `NotSupported` until an engine exists.

use std::time::Duration;

use api::{OperationType, conditions::operation_reasons};
use operations::{Outcome, job, meta};

use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

/// Drives Runbook Operations.
#[derive(Debug, Default, Clone)]
pub struct RunbookDriver;

fn jobs() -> kube::api::ApiResource {
    children::resource(job::API_VERSION, job::KIND, "jobs")
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
        let job = match children::ensure(cx, &jobs(), &object).await? {
            Child::Ours(job) => job,
            Child::Foreign(message) => return Ok(children::foreign(message)),
        };
        let reference = meta::reference_of(&job).into_iter().collect();
        Ok(job::map_job(&job).into_outcome(reference))
    }
}
