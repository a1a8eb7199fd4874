//! The apply path: "apply this desired-state document, return its acknowledgement".
//!
//! [`apply_received`] is the one entry point, shared by pull mode (the sync loop) and push
//! mode (the HTTPS endpoint receiving the same document): it runs [`apply_document`] and
//! records what happened (logs, Events, metrics), so a document is handled the same way
//! whichever way it came. [`apply_document`]:
//!
//! 1. validates the whole document ([`protocol::validate`]); an invalid one is refused
//!    whole and nothing is applied;
//! 2. plans it against the namespace allow-list ([`protocol::plan`]): entries outside it
//!    are refused with `NamespaceNotAllowed`, and deletions are exactly the explicit
//!    deletion entries (absence never deletes);
//! 3. acts on each entry through [`Cluster`]: server-side apply under the field manager
//!    `vworkspace-agent`, **without force** (ADR 0004). A conflict on `spec.chart.version`
//!    / `spec.values` (an Operation owns them) is resolved by applying the rest of the spec
//!    without those two fields and reporting the conflict with what is in force.
//!
//! A document that does not parse is refused whole ([`refuse_malformed`]) and
//! acknowledged by the cursor [`cursor_of`] reads from it.
//!
//! [`Cluster`] abstracts the API server so the rules are unit-tested without one.

use std::future::Future;

use api::{ApplicationInstance, LABEL_MANAGED_BY, Operation};
use controller_kit::WatchScope;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::events::{Event, EventType, Recorder},
};
use operations::revisions::{self, AppRevision};
use protocol::{
    FIELD_MANAGER, MANAGED_BY_AGENT,
    messages::{
        ApplicationIntent, ConflictReport, DeletionIntent, DesiredState, DocumentAck, DocumentOutcome, ObjectAck,
        ObjectKind, ObjectOutcome, OperationIntent, reasons,
    },
    plan::{Action, plan},
    validate::validate_document,
};
use serde_json::{Value, json};

use crate::health::AgentMetrics;

/// The two fields an Operation may own on an ApplicationInstance (ADR 0004).
pub const OPERATION_OWNED_FIELDS: [&str; 2] = [".spec.chart.version", ".spec.values"];

/// A failed API call, classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// 409 from a server-side apply: another field manager owns fields we set.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 422 / 400: the object is invalid.
    #[error("invalid: {0}")]
    Invalid(String),
    /// 403.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// 404.
    #[error("not found")]
    NotFound,
    /// Transport errors, 5xx, 429: worth retrying.
    #[error("API server unavailable: {0}")]
    Unavailable(String),
}

impl From<kube::Error> for ClusterError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => match s.code {
                409 => Self::Conflict(s.message),
                400 | 422 => Self::Invalid(s.message),
                403 => Self::Forbidden(s.message),
                404 => Self::NotFound,
                _ => Self::Unavailable(format!("{} ({})", s.message, s.code)),
            },
            other => Self::Unavailable(other.to_string()),
        }
    }
}

/// What the apply path needs from the API server.
pub trait Cluster: Send + Sync {
    /// Reads an ApplicationInstance.
    fn get_application(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ApplicationInstance>, ClusterError>> + Send;
    /// Server-side applies an ApplicationInstance (no force).
    fn apply_application(
        &self,
        namespace: &str,
        name: &str,
        body: &Value,
    ) -> impl Future<Output = Result<ApplicationInstance, ClusterError>> + Send;
    /// Reads an Operation.
    fn get_operation(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Operation>, ClusterError>> + Send;
    /// Server-side applies (creates) an Operation (no force).
    fn apply_operation(
        &self,
        namespace: &str,
        name: &str,
        body: &Value,
    ) -> impl Future<Output = Result<Operation, ClusterError>> + Send;
    /// Deletes an object, only if it still has `uid`.
    fn delete(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// The application's revision history (`<app>-revisions`), if readable.
    fn revision_history(
        &self,
        namespace: &str,
        app: &str,
    ) -> impl Future<Output = Result<Option<Vec<AppRevision>>, ClusterError>> + Send;
}

/// [`Cluster`] on a real API server.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
}

impl KubeCluster {
    /// Wraps a client.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

fn apply_params() -> PatchParams {
    // No `.force()`: a field owned by another manager is a conflict, never taken over.
    PatchParams::apply(FIELD_MANAGER)
}

impl Cluster for KubeCluster {
    async fn get_application(&self, namespace: &str, name: &str) -> Result<Option<ApplicationInstance>, ClusterError> {
        let api: Api<ApplicationInstance> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?)
    }

    async fn apply_application(
        &self,
        namespace: &str,
        name: &str,
        body: &Value,
    ) -> Result<ApplicationInstance, ClusterError> {
        let api: Api<ApplicationInstance> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.patch(name, &apply_params(), &Patch::Apply(body)).await?)
    }

    async fn get_operation(&self, namespace: &str, name: &str) -> Result<Option<Operation>, ClusterError> {
        let api: Api<Operation> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?)
    }

    async fn apply_operation(&self, namespace: &str, name: &str, body: &Value) -> Result<Operation, ClusterError> {
        let api: Api<Operation> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.patch(name, &apply_params(), &Patch::Apply(body)).await?)
    }

    async fn delete(&self, kind: ObjectKind, namespace: &str, name: &str, uid: &str) -> Result<(), ClusterError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match kind {
            ObjectKind::ApplicationInstance => {
                let api: Api<ApplicationInstance> = Api::namespaced(self.client.clone(), namespace);
                api.delete(name, &params).await?;
            }
            ObjectKind::Operation => {
                let api: Api<Operation> = Api::namespaced(self.client.clone(), namespace);
                api.delete(name, &params).await?;
            }
        }
        Ok(())
    }

    async fn revision_history(&self, namespace: &str, app: &str) -> Result<Option<Vec<AppRevision>>, ClusterError> {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let Some(cm) = api.get_opt(&revisions::config_map_name(app)).await? else {
            return Ok(None);
        };
        let value = serde_json::to_value(cm).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        Ok(revisions::parse_history(&value).ok())
    }
}

/// An error of a write: a 404 on a create means the namespace does not exist.
fn write_error(a: ObjectAck, err: ClusterError) -> ObjectAck {
    if err == ClusterError::NotFound {
        let mut a = a;
        a.outcome = ObjectOutcome::Refused;
        a.reason = Some(reasons::NAMESPACE_NOT_FOUND.to_owned());
        a.message = Some(format!(
            "namespace {:?} does not exist; the agent does not create namespaces",
            a.namespace
        ));
        return a;
    }
    with_error(a, err)
}

fn labels_say_managed(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY_AGENT)
}

/// The refusal of intent naming an existing object the agent did not create (a person's
/// `kubectl apply`, another tool): the agent never takes one over, since applying would add
/// its label and make the object deletable by intent.
fn not_managed(mut a: ObjectAck, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectAck {
    a.outcome = ObjectOutcome::Refused;
    a.reason = Some(reasons::NOT_MANAGED_BY_AGENT.to_owned());
    a.message = Some(format!(
        "an object of this name exists that the agent did not create (no label {LABEL_MANAGED_BY}={MANAGED_BY_AGENT}); \
         the agent does not take it over: delete or rename it, or label it to hand it to the agent"
    ));
    a.uid = meta.uid.clone();
    a
}

fn ack(kind: ObjectKind, namespace: &str, name: &str, outcome: ObjectOutcome) -> ObjectAck {
    ObjectAck {
        kind,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        outcome,
        reason: None,
        message: None,
        uid: None,
        generation: None,
        conflict: None,
    }
}

fn with_error(mut a: ObjectAck, err: ClusterError) -> ObjectAck {
    let (outcome, reason) = match &err {
        ClusterError::Invalid(_) => (ObjectOutcome::Refused, reasons::INVALID_SPEC),
        ClusterError::Forbidden(_) => (ObjectOutcome::Refused, reasons::FORBIDDEN),
        ClusterError::Conflict(_) => (ObjectOutcome::Refused, reasons::FIELD_CONFLICT),
        ClusterError::NotFound | ClusterError::Unavailable(_) => (ObjectOutcome::Failed, reasons::API_UNAVAILABLE),
    };
    a.outcome = outcome;
    a.reason = Some(reason.to_owned());
    a.message = Some(err.to_string());
    a
}

/// The fields and field managers named in a server-side apply conflict message, e.g.
/// `Apply failed with 2 conflicts: conflicts with "vworkspace-upgrade-engine" using
/// vworkspace.io/v1alpha1:\n- .spec.chart.version\n- .spec.values`.
pub fn parse_conflict(message: &str) -> (Vec<String>, Vec<String>) {
    let mut fields = Vec::new();
    let mut managers = Vec::new();
    for part in message.split("conflict") {
        if let Some(rest) = part.split_once("with \"").map(|(_, r)| r)
            && let Some((manager, _)) = rest.split_once('"')
            && !managers.iter().any(|m| m == manager)
        {
            managers.push(manager.to_owned());
        }
    }
    for token in message.split(|c: char| c.is_whitespace() || c == ',' || c == ':') {
        let token = token.trim_matches(|c: char| c == '"' || c == '\'');
        if token.starts_with(".spec") || token.starts_with(".metadata") {
            let token = token.to_owned();
            if !fields.contains(&token) {
                fields.push(token);
            }
        }
    }
    (fields, managers)
}

fn application_body(app: &ApplicationIntent, spec: Value) -> Value {
    json!({
        "apiVersion": api::API_VERSION,
        "kind": "ApplicationInstance",
        "metadata": {
            "name": app.name,
            "namespace": app.namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY_AGENT},
        },
        "spec": spec,
    })
}

async fn apply_application<C: Cluster>(cluster: &C, app: &ApplicationIntent) -> ObjectAck {
    let base = ack(
        ObjectKind::ApplicationInstance,
        &app.namespace,
        &app.name,
        ObjectOutcome::Applied,
    );
    let spec = match serde_json::to_value(&app.spec) {
        Ok(v) => v,
        Err(e) => return with_error(base, ClusterError::Invalid(e.to_string())),
    };
    let live = match cluster.get_application(&app.namespace, &app.name).await {
        Ok(live) => live,
        Err(e) => return with_error(base, e),
    };
    if let Some(live) = &live
        && !labels_say_managed(&live.metadata)
    {
        return not_managed(base, &live.metadata);
    }
    if let Some(live) = &live
        && serde_json::to_value(&live.spec).ok().as_ref() == Some(&spec)
    {
        let mut a = base;
        a.outcome = ObjectOutcome::Unchanged;
        a.uid = live.metadata.uid.clone();
        a.generation = live.metadata.generation;
        return a;
    }
    match cluster
        .apply_application(&app.namespace, &app.name, &application_body(app, spec.clone()))
        .await
    {
        Ok(applied) => {
            let mut a = base;
            a.uid = applied.metadata.uid;
            a.generation = applied.metadata.generation;
            a
        }
        Err(ClusterError::Conflict(message)) => resolve_conflict(cluster, app, spec, base, &message).await,
        Err(e) => write_error(base, e),
    }
}

/// ADR 0004: apply everything but the two Operation-owned fields, then report the conflict
/// with the chart version, values and revision in force.
async fn resolve_conflict<C: Cluster>(
    cluster: &C,
    app: &ApplicationIntent,
    mut spec: Value,
    base: ObjectAck,
    message: &str,
) -> ObjectAck {
    let (fields, managers) = parse_conflict(message);
    let only_owned = !fields.is_empty() && fields.iter().all(|f| OPERATION_OWNED_FIELDS.contains(&f.as_str()));
    if !only_owned {
        return with_error(base, ClusterError::Conflict(message.to_owned()));
    }
    if let Some(obj) = spec.as_object_mut() {
        obj.remove("values");
        if let Some(chart) = obj.get_mut("chart").and_then(Value::as_object_mut) {
            chart.remove("version");
        }
    }
    let applied = match cluster
        .apply_application(&app.namespace, &app.name, &application_body(app, spec))
        .await
    {
        Ok(applied) => applied,
        Err(e) => return with_error(base, e),
    };
    let history = cluster
        .revision_history(&app.namespace, &app.name)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let latest = history.iter().max_by_key(|r| r.number);
    let mut a = base;
    a.outcome = ObjectOutcome::Conflict;
    a.reason = Some(reasons::OWNED_BY_OPERATION.to_owned());
    a.message = Some(format!(
        "{} owned by {}; the rest of the spec was applied",
        fields.join(" and "),
        if managers.is_empty() {
            "another field manager".to_owned()
        } else {
            managers.join(", ")
        }
    ));
    a.uid = applied.metadata.uid.clone();
    a.generation = applied.metadata.generation;
    a.conflict = Some(ConflictReport {
        fields: fields.iter().map(|f| f.trim_start_matches('.').to_owned()).collect(),
        managers,
        chart_version_in_force: applied.spec.chart.version.clone(),
        values_in_force: applied.spec.values.clone(),
        revision_in_effect: latest.map(|r| r.number),
        operation: latest.and_then(|r| r.operation.clone()),
    });
    a
}

async fn create_operation<C: Cluster>(
    cluster: &C,
    op: &OperationIntent,
    generated_at: Option<Timestamp>,
    now: Timestamp,
) -> ObjectAck {
    let base = ack(ObjectKind::Operation, &op.namespace, &op.name, ObjectOutcome::Applied);
    let spec = match serde_json::to_value(&op.spec) {
        Ok(v) => v,
        Err(e) => return with_error(base, ClusterError::Invalid(e.to_string())),
    };
    match cluster.get_operation(&op.namespace, &op.name).await {
        Ok(Some(live)) if !labels_say_managed(&live.metadata) => return not_managed(base, &live.metadata),
        Ok(Some(live)) => {
            let mut a = base;
            a.uid = live.metadata.uid.clone();
            a.generation = live.metadata.generation;
            if serde_json::to_value(&live.spec).ok().as_ref() == Some(&spec) {
                a.outcome = ObjectOutcome::Unchanged;
            } else {
                a.outcome = ObjectOutcome::Refused;
                a.reason = Some(reasons::IMMUTABLE.to_owned());
                a.message = Some(
                    "an Operation with this name exists with another spec; Operations are immutable, use a new name"
                        .to_owned(),
                );
            }
            return a;
        }
        Ok(None) => {}
        Err(e) => return with_error(base, e),
    }
    // Checked at creation only: an existing Operation was created in time.
    if let Some(late) =
        protocol::lateness::undated_operation_too_late(op.spec.deadline.as_ref().map(|d| d.0), generated_at, now)
    {
        let mut a = base;
        a.outcome = ObjectOutcome::Refused;
        a.reason = Some(late.reason.to_owned());
        a.message = Some(late.message);
        return a;
    }
    let body = json!({
        "apiVersion": api::API_VERSION,
        "kind": "Operation",
        "metadata": {
            "name": op.name,
            "namespace": op.namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY_AGENT},
        },
        "spec": spec,
    });
    match cluster.apply_operation(&op.namespace, &op.name, &body).await {
        Ok(created) => {
            let mut a = base;
            a.uid = created.metadata.uid;
            a.generation = created.metadata.generation;
            a
        }
        Err(e) => write_error(base, e),
    }
}

async fn delete_object<C: Cluster>(cluster: &C, del: &DeletionIntent) -> ObjectAck {
    let mut a = ack(del.kind, &del.namespace, &del.name, ObjectOutcome::Deleted);
    let meta = match del.kind {
        ObjectKind::ApplicationInstance => cluster
            .get_application(&del.namespace, &del.name)
            .await
            .map(|o| o.map(|o| o.metadata)),
        ObjectKind::Operation => cluster
            .get_operation(&del.namespace, &del.name)
            .await
            .map(|o| o.map(|o| o.metadata)),
    };
    let meta = match meta {
        Ok(Some(meta)) => meta,
        Ok(None) => {
            a.outcome = ObjectOutcome::Absent;
            a.message = Some("already absent".into());
            return a;
        }
        Err(e) => return with_error(a, e),
    };
    let live_uid = meta.uid.clone().unwrap_or_default();
    if !labels_say_managed(&meta) {
        a.outcome = ObjectOutcome::Refused;
        a.reason = Some(reasons::NOT_MANAGED_BY_AGENT.to_owned());
        a.message = Some(format!(
            "the object was not created by the agent (no label {LABEL_MANAGED_BY}={MANAGED_BY_AGENT}); delete it by hand if intended"
        ));
        a.uid = meta.uid;
        return a;
    }
    if let Some(want) = &del.uid
        && *want != live_uid
    {
        a.outcome = ObjectOutcome::Refused;
        a.reason = Some(reasons::UID_MISMATCH.to_owned());
        a.message = Some(format!(
            "the deletion names uid {want}, the object has uid {live_uid} (recreated since?)"
        ));
        a.uid = meta.uid;
        return a;
    }
    a.uid = meta.uid;
    match cluster.delete(del.kind, &del.namespace, &del.name, &live_uid).await {
        Ok(()) => {
            a.message = Some(match &del.reason {
                Some(r) => format!("deleted: {r}"),
                None => "deleted".into(),
            });
            a
        }
        Err(ClusterError::NotFound) => {
            a.outcome = ObjectOutcome::Absent;
            a.message = Some("already absent".into());
            a
        }
        Err(e) => with_error(a, e),
    }
}

/// Applies a desired-state document and returns its acknowledgement. `allows(namespace)`
/// is the agent's namespace policy. Never applies anything from an invalid document.
pub async fn apply_document<C: Cluster>(
    cluster: &C,
    doc: &DesiredState,
    allows: impl Fn(&str) -> bool,
    now: impl Fn() -> Timestamp,
) -> DocumentAck {
    if let Err(e) = validate_document(doc) {
        return DocumentAck {
            epoch: doc.epoch.clone(),
            revision: doc.revision,
            outcome: DocumentOutcome::Refused,
            reason: Some(reasons::INVALID_DOCUMENT.to_owned()),
            message: Some(e.to_string()),
            processed_at: now(),
            objects: Vec::new(),
        };
    }
    let mut objects = Vec::new();
    for action in plan(doc, allows) {
        objects.push(match action {
            Action::ApplyApplication(app) => apply_application(cluster, app).await,
            Action::CreateOperation(op) => create_operation(cluster, op, doc.generated_at, now()).await,
            Action::Delete(del) => delete_object(cluster, del).await,
            Action::Refuse(ack) => *ack,
        });
    }
    let outcome = if objects.iter().any(|o| o.outcome == ObjectOutcome::Failed) {
        DocumentOutcome::Incomplete
    } else {
        DocumentOutcome::Applied
    };
    DocumentAck {
        epoch: doc.epoch.clone(),
        revision: doc.revision,
        outcome,
        reason: None,
        message: None,
        processed_at: now(),
        objects,
    }
}

/// A document that could not even be parsed: refused whole, acknowledged by cursor when
/// one could be read from it.
pub fn refuse_malformed(epoch: String, revision: u64, detail: String, now: Timestamp) -> DocumentAck {
    DocumentAck {
        epoch,
        revision,
        outcome: DocumentOutcome::Refused,
        reason: Some(reasons::MALFORMED_DOCUMENT.to_owned()),
        message: Some(detail),
        processed_at: now,
        objects: Vec::new(),
    }
}

/// The cursor (epoch, revision) of a document that does not parse, if one can be read:
/// such a document is still acknowledged, as refused, so the control plane learns why.
pub fn cursor_of(document: &Value) -> Option<(String, u64)> {
    Some((
        document.get("epoch")?.as_str()?.to_owned(),
        document.get("revision")?.as_u64()?,
    ))
}

/// The Event for an acknowledged object, when it exists to carry one.
fn event_for(ack: &ObjectAck, revision: &protocol::Cursor) -> Option<(ObjectReference, Event)> {
    let (type_, reason, action) = match ack.outcome {
        ObjectOutcome::Conflict => (EventType::Warning, "IntentConflict", "Apply"),
        ObjectOutcome::Deleted => (EventType::Normal, "DeletedByIntent", "Delete"),
        ObjectOutcome::Refused => (EventType::Warning, "IntentRefused", "Apply"),
        _ => return None,
    };
    // Refused objects that do not exist (e.g. outside the allow-list) have no uid.
    let uid = ack.uid.clone()?;
    let note = format!(
        "control-plane revision {revision}: {}{}",
        ack.reason.as_deref().map(|r| format!("{r}: ")).unwrap_or_default(),
        ack.message.as_deref().unwrap_or_default()
    );
    let note = api::text::prefix_within(&note, 1000).to_owned();
    Some((
        ObjectReference {
            api_version: Some(api::API_VERSION.into()),
            kind: Some(ack.kind.as_str().into()),
            namespace: Some(ack.namespace.clone()),
            name: Some(ack.name.clone()),
            uid: Some(uid),
            ..Default::default()
        },
        Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        },
    ))
}

fn outcome_label(o: ObjectOutcome) -> &'static str {
    match o {
        ObjectOutcome::Applied => "applied",
        ObjectOutcome::Unchanged => "unchanged",
        ObjectOutcome::Conflict => "conflict",
        ObjectOutcome::Deleted => "deleted",
        ObjectOutcome::Absent => "absent",
        ObjectOutcome::Refused => "refused",
        ObjectOutcome::Failed => "failed",
        ObjectOutcome::Unknown => "unknown",
    }
}

/// Applies a received document through [`apply_document`] and records what happened:
/// a log line per refused, failed or conflicting entry, Events on the objects touched,
/// metrics. Both modes call it (pull from its sync loop, push from its endpoint), so a
/// document is handled the same way whichever way it came; the caller decides first
/// whether to apply at all ([`decide`]) and records the acknowledgement in its ledger.
pub async fn apply_received<C: Cluster>(
    cluster: &C,
    scope: &WatchScope,
    metrics: &AgentMetrics,
    recorder: Option<&Recorder>,
    doc: &DesiredState,
) -> DocumentAck {
    let cursor = doc.cursor();
    let ack = apply_document(cluster, doc, |ns| scope.allows(ns), Timestamp::now).await;
    for o in &ack.objects {
        metrics.object(outcome_label(o.outcome));
        match o.outcome {
            ObjectOutcome::Refused | ObjectOutcome::Failed | ObjectOutcome::Conflict => {
                tracing::warn!(
                    revision = %cursor,
                    object = %format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name),
                    outcome = outcome_label(o.outcome),
                    reason = o.reason.as_deref().unwrap_or_default(),
                    message = o.message.as_deref().unwrap_or_default(),
                    "intent not applied as asked"
                );
            }
            _ => tracing::debug!(
                revision = %cursor,
                object = %format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name),
                outcome = outcome_label(o.outcome),
                "intent processed"
            ),
        }
    }
    if let Some(recorder) = recorder {
        for (reference, event) in ack.objects.iter().filter_map(|o| event_for(o, &cursor)) {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "cannot publish an Event");
            }
        }
    }
    let label = document_label(ack.outcome);
    metrics.document(label);
    if ack.outcome == DocumentOutcome::Refused {
        tracing::error!(
            revision = %cursor,
            reason = ack.reason.as_deref().unwrap_or_default(),
            message = ack.message.as_deref().unwrap_or_default(),
            "desired-state document refused whole; nothing applied"
        );
    } else {
        tracing::info!(revision = %cursor, outcome = label, objects = ack.objects.len(), "desired state processed");
    }
    metrics.revision(cursor.revision);
    ack
}

/// The metrics label of a document outcome.
pub fn document_label(o: DocumentOutcome) -> &'static str {
    match o {
        DocumentOutcome::Applied => "applied",
        DocumentOutcome::Incomplete => "incomplete",
        DocumentOutcome::Refused => "refused",
        DocumentOutcome::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests;
