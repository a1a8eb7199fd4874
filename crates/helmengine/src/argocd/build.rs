//! Pure mapping: ApplicationInstance → Argo CD `Application` and `AppProject`.
//!
//! | ApplicationInstance | Application / AppProject |
//! |---|---|
//! | `chart.repository.url` (`http(s)://`) | `spec.source.repoURL`; the AppProject's only `sourceRepos` entry |
//! | `chart.name` | `spec.source.chart` |
//! | `chart.version` (exact or semver range; default `*`) | `spec.source.targetRevision` |
//! | `values` | `spec.source.helm.valuesObject` |
//! | `releaseName` (default `[<targetNamespace>-]<name>`, as Flux) | `spec.source.helm.releaseName` |
//! | `targetNamespace` (default: the app's namespace) | `spec.destination.namespace`; the AppProject's only destination |
//! | `serviceAccountName` (default `vworkspace-release`) | the AppProject's `destinationServiceAccounts` (sync impersonation) |
//! | `suspend`, an Operation holding the release | no `spec.syncPolicy.automated` |
//! | ([`Comparison::Pending`]: Argo CD has not yet compared the live Application) | no `spec.syncPolicy.automated` |
//! | `driftDetection.mode` `enabled` / `warn`, `disabled` (default) | `automated.selfHeal` true / false (Argo CD reports drift as `OutOfSync` either way) |
//! | `install`/`upgrade.remediation.retries` (default none) | `spec.syncPolicy.retry.limit` (the larger; `0` by default, where Argo CD would retry 5 times) |
//! | `interval`, `timeout` | not mapped: Argo CD's own resync and sync timeouts apply |
//!
//! Refused with `InvalidSpec` (nothing written), because Argo CD has nothing that keeps
//! their meaning: `chart.sourceRef` (Flux objects), `oci://` repositories (not yet),
//! `chart.repository.secretRef`/`certSecretRef` (Argo CD reads repository credentials only
//! from its own namespace: the cluster administrator registers the repository there),
//! `valuesFrom` (ADR 0012: Argo CD has no values from Secrets or ConfigMaps, and copying
//! them into the Application would show Secret data to everyone who can read
//! Applications), `dependsOn`, `test.enable`, and `remediation.strategy: rollback`.

use api::{ApplicationInstance, ChartRepository, DriftDetectionMode, RemediationStrategy};
use kube::api::DynamicObject;
use serde_json::{Map, Value, json};

use super::{ANNOTATION_INSTANCE_UID, APP_PROJECT, APPLICATION, ArgoKind, RESOURCES_FINALIZER};
use crate::meta::{self, AppId, COMPONENT_HELM_RELEASE};
use crate::watch::LABEL_INSTANCE_NAMESPACE;
use crate::{EngineError, MaterializeInput};

/// `spec.source.targetRevision` when the app sets no version: the latest release.
pub const DEFAULT_CHART_VERSION: &str = "*";
/// Helm's limit on release names.
const MAX_RELEASE_NAME: usize = 53;
/// The AppProject label component.
const COMPONENT_APP_PROJECT: &str = "app-project";

/// Where the Argo CD objects go and which cluster they deploy to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Argo CD's namespace.
    pub namespace: String,
    /// `spec.destination.server` of every Application.
    pub destination_server: String,
}

/// Whether Argo CD has compared the live Application with its source yet, read from the
/// live objects before a write.
///
/// Argo CD reads AppProjects from its own cache: an automated sync started before that cache
/// holds a project created a moment earlier fails for good ("referencing project … which
/// does not exist"; Argo CD never retries a failed revision). Argo CD compares an
/// Application (`status.sync.comparedTo`) only once it has found its project, so automated
/// sync waits for that; the reconcile that Argo CD's status write wakes turns it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// No Application yet, no `status.sync.comparedTo` on it, or its AppProject did not
    /// exist before this write: no automated sync yet.
    Pending,
    /// Argo CD has compared the live Application, and its AppProject existed before this
    /// write: automated sync as the spec asks.
    Done,
}

impl Comparison {
    /// The comparison state shown by the AppProject and Application as read before writing
    /// them (`None`: absent).
    pub fn of(live_project: Option<&DynamicObject>, live_application: Option<&DynamicObject>) -> Self {
        let compared = live_application.is_some_and(|live| live.data.pointer("/status/sync/comparedTo").is_some());
        if live_project.is_some() && compared {
            Self::Done
        } else {
            Self::Pending
        }
    }
}

/// Name of the Application and of its AppProject for `app`: `<namespace>.<name>`.
/// Unique, because namespace names hold no dots.
pub fn object_name(id: AppId<'_>) -> String {
    format!("{}.{}", id.namespace, id.name)
}

/// The namespace the release installs into.
pub fn target_namespace<'a>(app: &'a ApplicationInstance, id: AppId<'a>) -> &'a str {
    app.spec
        .target_namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or(id.namespace)
}

/// The Application for `app`, with automated sync only once Argo CD has compared it
/// ([`Comparison`]). Validates the whole spec first: an error writes nothing.
pub fn application(
    app: &ApplicationInstance,
    input: &MaterializeInput,
    placement: &Placement,
    comparison: Comparison,
) -> Result<DynamicObject, EngineError> {
    let id = AppId::of(app)?;
    let repository = repository(app)?;
    refuse_unsupported(app)?;
    let target = target_namespace(app, id);
    let mut helm = Map::new();
    helm.insert("releaseName".into(), json!(release_name(app, id)?));
    match app.spec.values.as_ref() {
        None | Some(Value::Null) => {}
        Some(values @ Value::Object(_)) => {
            helm.insert("valuesObject".into(), values.clone());
        }
        Some(_) => return Err(invalid("values must be an object")),
    }
    let source = json!({
        "repoURL": repository.url.trim_end_matches('/'),
        "chart": app.spec.chart.name,
        "targetRevision": app.spec.chart.version.as_deref().unwrap_or(DEFAULT_CHART_VERSION),
        "helm": helm,
    });
    let mut sync_policy = Map::new();
    let suspended = app.spec.suspend || input.suspended_by.is_some();
    if !suspended && comparison == Comparison::Done {
        let self_heal = app
            .spec
            .drift_detection
            .as_ref()
            .is_some_and(|d| d.mode == DriftDetectionMode::Enabled);
        sync_policy.insert("automated".into(), json!({ "prune": true, "selfHeal": self_heal }));
    }
    // Always set: without it Argo CD retries an automated sync 5 times, where the spec (like
    // Flux's default) asks for no retry unless remediation.retries says so.
    sync_policy.insert("retry".into(), json!({ "limit": retry_limit(app).unwrap_or(0) }));
    let mut object = new_object(app, id, APPLICATION, COMPONENT_HELM_RELEASE, placement)?;
    object.metadata.finalizers = Some(vec![RESOURCES_FINALIZER.to_owned()]);
    object.data = json!({
        "spec": {
            "project": object_name(id),
            "source": source,
            "destination": { "server": placement.destination_server, "namespace": target },
        }
    });
    // Left out rather than empty: server-side apply would leave an emptied map as `null`,
    // which Argo CD's schema refuses.
    if !sync_policy.is_empty()
        && let Some(spec) = object.data.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert("syncPolicy".into(), Value::Object(sync_policy));
    }
    Ok(object)
}

/// The AppProject that fences `app`'s Application in: its one repository, its one
/// destination namespace, no cluster-scoped kinds, and the ServiceAccount every sync
/// impersonates.
pub fn app_project(app: &ApplicationInstance, placement: &Placement) -> Result<DynamicObject, EngineError> {
    let id = AppId::of(app)?;
    let repository = repository(app)?;
    let target = target_namespace(app, id);
    let account = app
        .spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(api::RELEASE_SERVICE_ACCOUNT);
    // The account lives in the app's namespace; Argo CD looks it up in the destination
    // namespace unless it is qualified as `<namespace>:<name>`.
    let account = if target == id.namespace {
        account.to_owned()
    } else {
        format!("{}:{account}", id.namespace)
    };
    let server = &placement.destination_server;
    let mut object = new_object(app, id, APP_PROJECT, COMPONENT_APP_PROJECT, placement)?;
    object.data = json!({
        "spec": {
            "description": format!("vworkspace: ApplicationInstance {}/{}", id.namespace, id.name),
            "sourceRepos": [repository.url.trim_end_matches('/')],
            "destinations": [{ "server": server, "namespace": target }],
            "destinationServiceAccounts": [
                { "server": server, "namespace": target, "defaultServiceAccount": account }
            ],
            "clusterResourceWhitelist": [],
        }
    });
    Ok(object)
}

fn new_object(
    app: &ApplicationInstance,
    id: AppId<'_>,
    kind: ArgoKind,
    component: &str,
    placement: &Placement,
) -> Result<DynamicObject, EngineError> {
    let uid = app
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| invalid("the ApplicationInstance has no metadata.uid (it was not read from the API)"))?;
    let mut object = DynamicObject::new(&object_name(id), &kind.api_resource()).within(&placement.namespace);
    let mut labels = meta::labels(id.name, component);
    labels.insert(LABEL_INSTANCE_NAMESPACE.to_owned(), id.namespace.to_owned());
    object.metadata.labels = Some(labels);
    object.metadata.annotations = Some([(ANNOTATION_INSTANCE_UID.to_owned(), uid.to_owned())].into());
    Ok(object)
}

fn repository(app: &ApplicationInstance) -> Result<&ChartRepository, EngineError> {
    let chart = &app.spec.chart;
    if chart.source_ref.is_some() {
        return Err(invalid(
            "chart.sourceRef names a Flux source, which the argocd engine cannot read; use chart.repository",
        ));
    }
    let Some(repository) = chart.repository.as_ref() else {
        return Err(invalid("chart.repository must be set"));
    };
    let url = repository.url.as_str();
    if url.starts_with("oci://") {
        return Err(invalid(
            "chart.repository.url: oci:// repositories are not supported by the argocd engine yet; \
             use an http(s):// Helm repository or engine flux",
        ));
    }
    let Some(rest) = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) else {
        return Err(invalid("chart.repository.url must start with https:// or http://"));
    };
    // No advice on where credentials go: this engine takes none (refused below).
    meta::check_repository_authority(rest, None)?;
    if repository.secret_ref.is_some() || repository.cert_secret_ref.is_some() {
        return Err(invalid(
            "chart.repository.secretRef and certSecretRef are not supported by the argocd engine: \
             Argo CD reads repository credentials only from Secrets in its own namespace; \
             ask the cluster administrator to register the repository with Argo CD",
        ));
    }
    if chart.name.is_empty() {
        return Err(invalid("chart.name must be set"));
    }
    Ok(repository)
}

fn refuse_unsupported(app: &ApplicationInstance) -> Result<(), EngineError> {
    let spec = &app.spec;
    if !spec.values_from.is_empty() {
        return Err(invalid(
            "valuesFrom is not supported by the argocd engine: Argo CD takes values only from the \
             Application, which more people can read than your Secret (ADR 0012); \
             put non-secret values in values, or use engine flux",
        ));
    }
    if !spec.depends_on.is_empty() {
        return Err(invalid("dependsOn is not supported by the argocd engine"));
    }
    if spec.test.as_ref().is_some_and(|t| t.enable == Some(true)) {
        return Err(invalid(
            "test.enable is not supported by the argocd engine: Argo CD does not run Helm tests",
        ));
    }
    let rollback = [spec.install.as_ref(), spec.upgrade.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|action| action.remediation.as_ref())
        .any(|r| r.strategy == Some(RemediationStrategy::Rollback));
    if rollback {
        return Err(invalid(
            "remediation.strategy rollback is not supported by the argocd engine: Argo CD retries a sync, \
             it does not roll back",
        ));
    }
    Ok(())
}

/// The release name Flux would pick, so switching engines keeps the Helm release.
fn release_name(app: &ApplicationInstance, id: AppId<'_>) -> Result<String, EngineError> {
    if let Some(name) = app.spec.release_name.as_deref().filter(|n| !n.is_empty()) {
        return Ok(name.to_owned());
    }
    let name = match app.spec.target_namespace.as_deref().filter(|ns| !ns.is_empty()) {
        Some(target) => format!("{target}-{}", id.name),
        None => id.name.to_owned(),
    };
    if name.len() > MAX_RELEASE_NAME {
        return Err(invalid(format!(
            "the default release name {name:?} is longer than Helm's {MAX_RELEASE_NAME} characters; set releaseName"
        )));
    }
    Ok(name)
}

fn retry_limit(app: &ApplicationInstance) -> Option<i32> {
    [app.spec.install.as_ref(), app.spec.upgrade.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|action| action.remediation.as_ref()?.retries)
        .filter(|retries| *retries > 0)
        .max()
}

fn invalid(message: impl Into<String>) -> EngineError {
    EngineError::InvalidSpec(message.into())
}

#[cfg(test)]
mod tests;
