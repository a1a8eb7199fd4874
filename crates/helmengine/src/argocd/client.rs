//! [`ArgoCdEngine`]: the thin client layer that applies, reads and deletes the objects
//! [`build`] describes, in Argo CD's namespace.
//!
//! Requests per call:
//! - `check_installed`: 1 discovery GET and a GET of `argocd-cm` (a success is trusted for
//!   a minute).
//! - `materialize`: a GET of the AppProject and of the Application (ownership, and whether
//!   Argo CD has compared the Application yet), an apply of each unless unchanged. It returns
//!   the observation made from the Application it holds, so the reconciler does not `observe`.
//! - `observe`: a GET of the Application.
//! - `delete`: a GET (and a DELETE) of the Application, then of the AppProject.
//!
//! Objects are never logged: an Application carries inline values.

use std::sync::Arc;
use std::time::Duration;

use api::{ApplicationInstance, EngineKind, ObjectReference};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use kube::{Client, ResourceExt};
use tracing::info;

use super::build::{self, Placement};
use super::{
    ANNOTATION_INSTANCE_UID, APP_PROJECT, APPLICATION, ArgoKind, DEFAULT_NAMESPACE, GROUP, IMPERSONATION_SETTING,
    IN_CLUSTER_SERVER, SETTINGS_CONFIG_MAP, VERSION, observe,
};
use crate::apply::{RecentSuccess, apply_unless_up_to_date, delete_tolerant, is_not_found};
use crate::meta::{AppId, Ownership, is_terminating};
use crate::watch::{LABEL_INSTANCE_NAMESPACE, OwnerLink, WatchPlace, WatchedKind};
use crate::{DeleteProgress, Engine, EngineError, MaterializeInput, Materialized, Observation};

/// How long a successful "Argo CD is installed and impersonates" check is trusted.
const INSTALLED_CHECK_TTL: Duration = Duration::from_secs(60);

/// Where Argo CD runs and which cluster its Applications deploy to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgoCdSettings {
    /// Argo CD's namespace (default `argocd`).
    pub namespace: String,
    /// `spec.destination.server` (default Argo CD's in-cluster name).
    pub destination_server: String,
}

impl Default for ArgoCdSettings {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            destination_server: IN_CLUSTER_SERVER.to_owned(),
        }
    }
}

/// The Argo CD engine.
#[derive(Clone)]
pub struct ArgoCdEngine {
    client: Client,
    field_manager: String,
    placement: Placement,
    installed: Arc<RecentSuccess>,
}

impl ArgoCdEngine {
    /// An engine writing with `field_manager` into `settings.namespace`.
    pub fn new(client: Client, field_manager: impl Into<String>, settings: ArgoCdSettings) -> Self {
        Self {
            client,
            field_manager: field_manager.into(),
            placement: Placement {
                namespace: settings.namespace,
                destination_server: settings.destination_server,
            },
            installed: Default::default(),
        }
    }

    fn api(&self, kind: ArgoKind) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.placement.namespace, &kind.api_resource())
    }

    async fn check_installed_impl(&self) -> Result<(), EngineError> {
        if self.installed.is_fresh(INSTALLED_CHECK_TTL) {
            return Ok(());
        }
        self.check_served().await?;
        self.check_impersonation().await?;
        self.installed.record();
        Ok(())
    }

    async fn check_served(&self) -> Result<(), EngineError> {
        let served: Vec<String> = match self
            .client
            .list_api_group_resources(&format!("{GROUP}/{VERSION}"))
            .await
        {
            Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
            Err(kube::Error::Api(status)) if is_not_found(&status) => Vec::new(),
            Err(err) => return Err(err.into()),
        };
        let missing: Vec<String> = [APPLICATION, APP_PROJECT]
            .iter()
            .filter(|k| !served.iter().any(|name| name == k.plural))
            .map(ArgoKind::resource_name)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(EngineError::NotInstalled(format!(
            "Argo CD is not installed: the cluster does not serve {}",
            missing.join(", ")
        )))
    }

    /// Without sync impersonation every Application would sync with Argo CD's own
    /// cluster-wide rights, so a tenant could deploy anything anywhere: refuse instead.
    async fn check_impersonation(&self) -> Result<(), EngineError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.placement.namespace);
        let settings = match api.get_opt(SETTINGS_CONFIG_MAP).await {
            Ok(settings) => settings,
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                return Err(EngineError::NotInstalled(format!(
                    "cannot read ConfigMap {}/{SETTINGS_CONFIG_MAP} to check that Argo CD impersonates \
                     (the app controller needs get on it)",
                    self.placement.namespace
                )));
            }
            Err(err) => return Err(err.into()),
        };
        let enabled = settings
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|data| data.get(IMPERSONATION_SETTING))
            .is_some_and(|v| v == "true");
        if enabled {
            return Ok(());
        }
        Err(EngineError::NotInstalled(format!(
            "Argo CD sync impersonation is off ({IMPERSONATION_SETTING} in ConfigMap {}/{SETTINGS_CONFIG_MAP} \
             is not \"true\"): refusing, because every sync would run with Argo CD's own cluster-wide rights",
            self.placement.namespace
        )))
    }

    async fn materialize_impl(
        &self,
        app: &ApplicationInstance,
        input: &MaterializeInput,
    ) -> Result<Materialized, EngineError> {
        let name = build::object_name(AppId::of(app)?);
        // Both read before anything is built: the Application depends on what Argo CD has
        // done with them so far.
        let live_project = self.api(APP_PROJECT).get_opt(&name).await?;
        let live_application = self.api(APPLICATION).get_opt(&name).await?;
        let comparison = build::Comparison::of(live_project.as_ref(), live_application.as_ref());
        let application = build::application(app, input, &self.placement, comparison)?;
        let project = build::app_project(app, &self.placement)?;

        self.ensure_writable(APP_PROJECT, app, &name, live_project.as_ref())?;
        self.apply(APP_PROJECT, &project, live_project.as_ref()).await?;
        self.ensure_writable(APPLICATION, app, &name, live_application.as_ref())?;
        let applied = self.apply(APPLICATION, &application, live_application.as_ref()).await?;
        // What the apply returned (or the live object it found current) is what `observe`
        // would read again.
        let current = applied.or(live_application);
        let observation = current.as_ref().map(observe::observe);
        Ok(Materialized {
            engine_ref: self.reference(APPLICATION, &name),
            source_ref: None,
            observation,
            engine_version: current.and_then(|a| a.metadata.resource_version),
        })
    }

    async fn observe_impl(&self, app: &ApplicationInstance) -> Result<Option<Observation>, EngineError> {
        let name = build::object_name(AppId::of(app)?);
        let Some(application) = self.api(APPLICATION).get_opt(&name).await? else {
            return Ok(None);
        };
        if ownership(&application.metadata, app) == Ownership::Foreign {
            return Ok(None);
        }
        Ok(Some(observe::observe(&application)))
    }

    async fn delete_impl(&self, app: &ApplicationInstance) -> Result<DeleteProgress, EngineError> {
        let name = build::object_name(AppId::of(app)?);
        let api = self.api(APPLICATION);
        if let Some(application) = api.get_opt(&name).await?
            && ownership(&application.metadata, app) == Ownership::Ours
        {
            if !is_terminating(&application.metadata) {
                info!(namespace = %self.placement.namespace, name = %name, "deleting Argo CD Application");
                delete_tolerant(&api, &name, application.uid()).await?;
            }
            let detail = deletion_problem(&application)
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            return Ok(DeleteProgress::InProgress(format!(
                "waiting for Argo CD to delete the resources of Application {}/{name}{detail}",
                self.placement.namespace
            )));
        }
        let projects = self.api(APP_PROJECT);
        if let Some(project) = projects.get_opt(&name).await?
            && ownership(&project.metadata, app) == Ownership::Ours
            && !is_terminating(&project.metadata)
        {
            delete_tolerant(&projects, &name, project.uid()).await?;
        }
        Ok(DeleteProgress::Gone)
    }

    fn reference(&self, kind: ArgoKind, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: kind.kind.to_owned(),
            name: name.to_owned(),
            namespace: Some(self.placement.namespace.clone()),
        }
    }

    /// Refuses to write over `existing` unless it is ours (or orphaned) and not being deleted.
    fn ensure_writable(
        &self,
        kind: ArgoKind,
        app: &ApplicationInstance,
        name: &str,
        existing: Option<&DynamicObject>,
    ) -> Result<(), EngineError> {
        let Some(existing) = existing else {
            return Ok(());
        };
        let what = format!("{} {}/{name}", kind.kind, self.placement.namespace);
        if is_terminating(&existing.metadata) {
            return Err(EngineError::Conflict(format!(
                "{what} is being deleted; it is recreated once it is gone"
            )));
        }
        match ownership(&existing.metadata, app) {
            Ownership::Ours | Ownership::Orphaned => Ok(()),
            Ownership::Foreign => Err(EngineError::Conflict(format!(
                "{what} already exists and is not managed by this ApplicationInstance"
            ))),
        }
    }

    async fn apply(
        &self,
        kind: ArgoKind,
        object: &DynamicObject,
        live: Option<&DynamicObject>,
    ) -> Result<Option<DynamicObject>, EngineError> {
        match apply_unless_up_to_date(&self.api(kind), &self.field_manager, object, live).await {
            Ok(applied) => Ok(applied),
            Err(kube::Error::Api(status)) if is_not_found(&status) => Err(EngineError::NotInstalled(format!(
                "the cluster does not serve {}, or namespace {} does not exist",
                kind.resource_name(),
                self.placement.namespace
            ))),
            Err(err) => Err(err.into()),
        }
    }
}

/// Whether an Argo CD object was written for `app`: its uid annotation names this very
/// ApplicationInstance (ours), or only its labels do (left by an earlier one of the same
/// name: taken over), or neither (someone else's).
fn ownership(meta: &ObjectMeta, app: &ApplicationInstance) -> Ownership {
    let annotation = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION_INSTANCE_UID));
    if annotation.is_some() && annotation.map(String::as_str) == app.metadata.uid.as_deref() {
        return Ownership::Ours;
    }
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let labelled = label(api::LABEL_MANAGED_BY) == Some(api::MANAGED_BY)
        && label(api::LABEL_INSTANCE) == app.metadata.name.as_deref()
        && label(LABEL_INSTANCE_NAMESPACE) == app.metadata.namespace.as_deref();
    if labelled {
        Ownership::Orphaned
    } else {
        Ownership::Foreign
    }
}

/// Argo CD's words on why deleting an Application's resources does not finish.
fn deletion_problem(application: &DynamicObject) -> Option<String> {
    let conditions = application.data.pointer("/status/conditions")?.as_array()?;
    conditions
        .iter()
        .filter(|c| c.get("type").and_then(|t| t.as_str()) == Some("DeletionError"))
        .find_map(|c| Some(format!("DeletionError: {}", c.get("message")?.as_str()?)))
}

impl Engine for ArgoCdEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Argocd
    }

    fn watched_kinds(&self) -> Vec<WatchedKind> {
        vec![WatchedKind {
            resource: APPLICATION.api_resource(),
            place: WatchPlace::Namespace(self.placement.namespace.clone()),
            link: OwnerLink::InstanceLabels,
            whole: None,
        }]
    }

    fn check_installed(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(self.check_installed_impl())
    }

    fn materialize<'a>(
        &'a self,
        app: &'a ApplicationInstance,
        input: &'a MaterializeInput,
    ) -> BoxFuture<'a, Result<Materialized, EngineError>> {
        Box::pin(self.materialize_impl(app, input))
    }

    fn observe<'a>(&'a self, app: &'a ApplicationInstance) -> BoxFuture<'a, Result<Option<Observation>, EngineError>> {
        Box::pin(self.observe_impl(app))
    }

    fn delete<'a>(&'a self, app: &'a ApplicationInstance) -> BoxFuture<'a, Result<DeleteProgress, EngineError>> {
        Box::pin(self.delete_impl(app))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn meta(uid: Option<&str>, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            annotations: uid.map(|u| [(ANNOTATION_INSTANCE_UID.to_owned(), u.to_owned())].into()),
            labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn ownership_table() {
        let app = fixtures::app(fixtures::repo_spec("https://charts.example.com", None));
        let ours = [
            (api::LABEL_MANAGED_BY, api::MANAGED_BY),
            (api::LABEL_INSTANCE, fixtures::NAME),
            (LABEL_INSTANCE_NAMESPACE, fixtures::NAMESPACE),
        ];
        let cases = [
            ("our uid", meta(Some(fixtures::UID), &ours), Ownership::Ours),
            (
                "our labels, an earlier uid",
                meta(Some("old"), &ours),
                Ownership::Orphaned,
            ),
            ("our labels, no uid", meta(None, &ours), Ownership::Orphaned),
            (
                "same name in another namespace",
                meta(
                    Some("old"),
                    &[
                        (api::LABEL_MANAGED_BY, api::MANAGED_BY),
                        (api::LABEL_INSTANCE, fixtures::NAME),
                        (LABEL_INSTANCE_NAMESPACE, "team-b"),
                    ],
                ),
                Ownership::Foreign,
            ),
            ("nothing of ours", meta(None, &[]), Ownership::Foreign),
        ];
        for (name, meta, expected) in cases {
            assert_eq!(ownership(&meta, &app), expected, "{name}");
        }
    }
}
