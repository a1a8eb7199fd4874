//! [`FluxEngine`]: the thin client layer that applies, reads and deletes the
//! objects [`build`] describes.
//!
//! Requests per call, so the cost is predictable:
//! - `check_installed`: 2 discovery GETs, at most once a minute.
//! - `materialize`: a GET of the HelmRelease and a read of its source (the ownership
//!   checks, and what the observation is made of), an apply of each only when it changed,
//!   and a GET of the HelmChart once helm-controller names one. The source is read from the
//!   [`ObjectCache`] the controller's watch of sources fills, when it covers the source;
//!   otherwise it is a GET. It returns the observation, so the reconciler does not
//!   `observe` again: at rest that is 1 GET (2 once a HelmChart exists) and no write. Only
//!   when the release leaves a source: a GET (and a DELETE) of a source named like the
//!   app (releases from before shared sources), or a one-item LIST of the HelmReleases
//!   still naming a shared source (and a GET and DELETE when none does).
//! - `observe`: a GET of the HelmRelease and its HelmChart, and a read of its source as above.
//! - `delete`: a GET (and a DELETE) per object, and the shared source's LIST as above.
//!
//! Objects are never logged: a HelmRelease carries inline values, which may be
//! sensitive. Logs name objects by kind, namespace and name only.

use api::{ApplicationInstance, EngineKind};
use futures::future::BoxFuture;
use kube::api::{Api, DynamicObject, GetParams, ListParams};
use kube::{Client, ResourceExt};
use tracing::info;

use super::{FluxKind, HELM_RELEASE, HELM_REPOSITORY, OCI_REPOSITORY, build, observe};
use crate::apply::{RecentSuccess, apply_unless_up_to_date, delete_tolerant, is_not_found, names_namespace};
use crate::meta::{AppId, COMPONENT_CHART_SOURCE, Ownership, is_shared_by_us, is_terminating, ownership};
use crate::{Cached, DeleteProgress, Engine, EngineError, MaterializeInput, Materialized, ObjectCache, Observation};

/// The field manager of the ApplicationInstance controller's writes.
pub const FIELD_MANAGER: &str = "vworkspace-app-controller";

/// Resources that must be served for the adapter to work, per group version.
const REQUIRED: [(&str, &[FluxKind]); 2] = [
    ("helm.toolkit.fluxcd.io/v2", &[HELM_RELEASE]),
    (
        "source.toolkit.fluxcd.io/v1",
        &[HELM_REPOSITORY, OCI_REPOSITORY, super::HELM_CHART],
    ),
];

/// How long a successful "Flux CRDs are served" check is trusted. A failed check is never
/// cached, so installing Flux is noticed at the next reconcile; uninstalling it surfaces as
/// apply errors until the cache expires.
const INSTALLED_CHECK_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The Flux helm-controller engine.
#[derive(Clone)]
pub struct FluxEngine {
    client: Client,
    field_manager: String,
    /// When the CRD check last succeeded (2 discovery GETs saved per reconcile).
    installed: std::sync::Arc<RecentSuccess>,
    /// The HelmRepositories and OCIRepositories as the controller's watch of them delivers
    /// them ([`Engine::watched_kinds`]); empty (every lookup `Unknown`) where none runs.
    helm_repositories: ObjectCache,
    oci_repositories: ObjectCache,
}

impl FluxEngine {
    /// An engine writing with `field_manager` (normally [`FIELD_MANAGER`]).
    pub fn new(client: Client, field_manager: impl Into<String>) -> Self {
        Self {
            client,
            field_manager: field_manager.into(),
            installed: Default::default(),
            helm_repositories: ObjectCache::default(),
            oci_repositories: ObjectCache::default(),
        }
    }

    /// The cache of a source kind (`None` for the other kinds, which are not cached).
    fn cache(&self, kind: FluxKind) -> Option<&ObjectCache> {
        if kind == HELM_REPOSITORY {
            Some(&self.helm_repositories)
        } else if kind == OCI_REPOSITORY {
            Some(&self.oci_repositories)
        } else {
            None
        }
    }

    /// The object `namespace`/`name` of `kind`: from its cache when that covers it,
    /// otherwise from the API server.
    async fn read(&self, kind: FluxKind, namespace: &str, name: &str) -> Result<Option<DynamicObject>, kube::Error> {
        match self.cache(kind).map(|cache| cache.lookup(namespace, name)) {
            Some(Cached::Present(object)) => Ok(Some(object.as_ref().clone())),
            Some(Cached::Absent) => Ok(None),
            Some(Cached::Unknown) | None => self.api(kind, namespace).get_opt(name).await,
        }
    }

    /// The field manager of every apply.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    fn api(&self, kind: FluxKind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &kind.api_resource())
    }

    async fn check_installed_impl(&self) -> Result<(), EngineError> {
        if self.installed.is_fresh(INSTALLED_CHECK_TTL) {
            return Ok(());
        }
        self.check_served().await?;
        self.installed.record();
        Ok(())
    }

    async fn check_served(&self) -> Result<(), EngineError> {
        let mut missing = Vec::new();
        for (group_version, kinds) in REQUIRED {
            let served = match self.client.list_api_group_resources(group_version).await {
                Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
                Err(kube::Error::Api(status)) if is_not_found(&status) => Vec::new(),
                Err(err) => return Err(err.into()),
            };
            let absent = kinds.iter().filter(|k| !served.iter().any(|name| name == k.plural));
            missing.extend(absent.map(FluxKind::resource_name));
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(EngineError::NotInstalled(format!(
            "Flux is not installed or too old (v2.6 or newer is needed): the cluster does not serve {}",
            missing.join(", ")
        )))
    }

    async fn materialize_impl(
        &self,
        app: &ApplicationInstance,
        input: &MaterializeInput,
    ) -> Result<Materialized, EngineError> {
        // Build (and so validate) everything before the first request.
        let id = AppId::of(app)?;
        let release = build::helm_release(app, input)?;
        let source = build::source(app)?;
        let source_ref = build::source_reference(app)?;
        let engine_ref = build::engine_reference(app)?;

        let live_release = self.ensure_writable(HELM_RELEASE, app, id).await?;
        let live_source = match &source {
            Some(source) => {
                let kind = managed_kind(source);
                let live = self
                    .ensure_shared_writable(kind, id.namespace, &source.name_any())
                    .await?;
                let applied = self.apply(kind, id, source, live.as_ref()).await?;
                applied.or(live)
            }
            // Someone else's source (`chart.sourceRef`): only read, for the observation.
            None => self.get_readable(Some(&source_ref)).await?,
        };
        let applied = self.apply(HELM_RELEASE, id, &release, live_release.as_ref()).await?;
        // Only after the release points at the new source.
        let previous = live_release.as_ref().and_then(|r| observe::source_refs(r).source);
        match build::previous_source(app, previous.as_ref(), &source_ref)? {
            build::PreviousSource::Keep => {}
            build::PreviousSource::DeleteIfOurs(old) => {
                if let Some(kind) = FluxKind::source_by_kind(&old.kind) {
                    self.delete_if_ours(kind, app, id).await?;
                }
            }
            build::PreviousSource::ReleaseShared(old) => self.release_shared_source(&old).await?,
        }
        let current = applied.or(live_release);
        let observation = match &current {
            Some(current) => {
                let chart = self.get_readable(observe::source_refs(current).chart.as_ref()).await?;
                Some(observe::observe(current, live_source.as_ref(), chart.as_ref()))
            }
            None => None,
        };
        Ok(Materialized {
            engine_ref,
            source_ref: Some(source_ref),
            observation,
            engine_version: current.and_then(|c| c.metadata.resource_version),
        })
    }

    async fn observe_impl(&self, app: &ApplicationInstance) -> Result<Option<Observation>, EngineError> {
        let id = AppId::of(app)?;
        let Some(release) = self.api(HELM_RELEASE, id.namespace).get_opt(id.name).await? else {
            return Ok(None);
        };
        let refs = observe::source_refs(&release);
        let source = self.get_readable(refs.source.as_ref()).await?;
        let chart = self.get_readable(refs.chart.as_ref()).await?;
        Ok(Some(observe::observe(&release, source.as_ref(), chart.as_ref())))
    }

    async fn delete_impl(&self, app: &ApplicationInstance) -> Result<DeleteProgress, EngineError> {
        let id = AppId::of(app)?;
        if let Some(waiting) = self.delete_release(app, id).await? {
            return Ok(DeleteProgress::InProgress(waiting));
        }
        // Sources hold no release state: once the release is gone, issuing their
        // deletion is enough; source-controller finishes its own finalizer. Sources named
        // like the app are from releases before shared sources.
        for kind in [HELM_REPOSITORY, OCI_REPOSITORY] {
            self.delete_if_ours(kind, app, id).await?;
        }
        // An invalid spec never had a shared source to leave.
        if let Some(shared) = build::source(app).ok().flatten() {
            let kind = managed_kind(&shared);
            self.release_shared_source(&kind.object_ref(&shared.name_any(), id.namespace))
                .await?;
        }
        Ok(DeleteProgress::Gone)
    }

    /// Deletes the shared source `source` once no HelmRelease of its namespace names it in
    /// [`build::LABEL_CHART_SOURCE`] (the caller's own release no longer does). An app
    /// that starts using it meanwhile recreates it: its reconcile applies the source, and
    /// the source's deletion wakes every app whose spec reads from it.
    async fn release_shared_source(&self, source: &api::ObjectReference) -> Result<(), EngineError> {
        let Some(kind) = FluxKind::source_by_kind(&source.kind) else {
            return Ok(());
        };
        let namespace = source.namespace.as_deref().unwrap_or_default();
        let selector = format!("{}={}", build::LABEL_CHART_SOURCE, source.name);
        let users = self
            .api(HELM_RELEASE, namespace)
            .list_metadata(&ListParams::default().labels(&selector).limit(1))
            .await?;
        if !users.items.is_empty() {
            return Ok(());
        }
        let api = self.api(kind, namespace);
        let Some(existing) = api.get_opt(&source.name).await? else {
            return Ok(());
        };
        if is_shared_by_us(&existing.metadata, COMPONENT_CHART_SOURCE) && !is_terminating(&existing.metadata) {
            info!(kind = kind.kind, namespace, name = %source.name, "deleting shared chart source: no release uses it");
            delete_tolerant(&api, &source.name, existing.uid()).await?;
        }
        Ok(())
    }

    /// Like [`Self::ensure_writable`] for a shared source: ours when it carries our shared
    /// labels ([`is_shared_by_us`]); returns the live object.
    async fn ensure_shared_writable(
        &self,
        kind: FluxKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<DynamicObject>, EngineError> {
        let Some(existing) = self.read(kind, namespace, name).await? else {
            return Ok(None);
        };
        let described = format!("{} {namespace}/{name}", kind.kind);
        if is_terminating(&existing.metadata) {
            return Err(EngineError::Conflict(format!(
                "{described} is being deleted (its last release left it); it is recreated once it is gone"
            )));
        }
        if !is_shared_by_us(&existing.metadata, COMPONENT_CHART_SOURCE) {
            return Err(EngineError::Conflict(format!(
                "{described} already exists and is not a chart source shared by the app controller; \
                 delete or rename it"
            )));
        }
        Ok(Some(existing))
    }

    /// Deletes our HelmRelease; `Some(what we wait for)` while it still exists.
    async fn delete_release(&self, app: &ApplicationInstance, id: AppId<'_>) -> Result<Option<String>, EngineError> {
        let api = self.api(HELM_RELEASE, id.namespace);
        let Some(release) = api.get_opt(id.name).await? else {
            return Ok(None);
        };
        if ownership(&release.metadata, app) != Ownership::Ours {
            // Someone else's, or an orphan we never adopted: not ours to delete or wait for.
            return Ok(None);
        }
        if !is_terminating(&release.metadata) {
            info!(namespace = id.namespace, name = id.name, "deleting HelmRelease");
            delete_tolerant(&api, id.name, release.uid()).await?;
        }
        let name = format!("HelmRelease {}/{}", id.namespace, id.name);
        let suspended = release.data.pointer("/spec/suspend").and_then(|v| v.as_bool()) == Some(true);
        Ok(Some(if suspended {
            format!("{name} is suspended: Flux removes it without uninstalling the Helm release")
        } else {
            let detail = uninstall_failure(&release)
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            format!("waiting for helm-controller to uninstall the Helm release of {name}{detail}")
        }))
    }

    /// Refuses to write a name that belongs to someone else or is being deleted;
    /// returns the live object, if any, so an unchanged one is not written again.
    async fn ensure_writable(
        &self,
        kind: FluxKind,
        app: &ApplicationInstance,
        id: AppId<'_>,
    ) -> Result<Option<DynamicObject>, EngineError> {
        // From the API server's watch cache (`resourceVersion=0`), as an informer would hold it,
        // not a quorum read from etcd: this read is on every reconcile's path.
        let existing = match self.api(kind, id.namespace).get_with(id.name, &GetParams::any()).await {
            Ok(existing) => existing,
            Err(kube::Error::Api(status)) if is_not_found(&status) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let name = format!("{} {}/{}", kind.kind, id.namespace, id.name);
        if is_terminating(&existing.metadata) {
            return Err(EngineError::Conflict(format!(
                "{name} is being deleted; it is recreated once it is gone"
            )));
        }
        match ownership(&existing.metadata, app) {
            Ownership::Ours | Ownership::Orphaned => Ok(Some(existing)),
            Ownership::Foreign => Err(EngineError::Conflict(format!(
                "{name} already exists and is not managed by this ApplicationInstance; rename one of them"
            ))),
        }
    }

    /// Server-side applies `object`, unless the live object already carries exactly
    /// this desired state: no write at rest. Returns what the apply returned (`None`: `live`
    /// is current).
    async fn apply(
        &self,
        kind: FluxKind,
        id: AppId<'_>,
        object: &DynamicObject,
        live: Option<&DynamicObject>,
    ) -> Result<Option<DynamicObject>, EngineError> {
        match apply_unless_up_to_date(&self.api(kind, id.namespace), &self.field_manager, object, live).await {
            Ok(applied) => Ok(applied),
            Err(kube::Error::Api(status)) if is_not_found(&status) && !names_namespace(&status) => Err(
                EngineError::NotInstalled(format!("the cluster does not serve {}", kind.resource_name())),
            ),
            Err(err) => Err(err.into()),
        }
    }

    /// Deletes the object of `kind` named like the app if it is ours (and not already going).
    async fn delete_if_ours(
        &self,
        kind: FluxKind,
        app: &ApplicationInstance,
        id: AppId<'_>,
    ) -> Result<(), EngineError> {
        let api = self.api(kind, id.namespace);
        let Some(existing) = api.get_opt(id.name).await? else {
            return Ok(());
        };
        if ownership(&existing.metadata, app) == Ownership::Ours && !is_terminating(&existing.metadata) {
            info!(
                kind = kind.kind,
                namespace = id.namespace,
                name = id.name,
                "deleting chart source"
            );
            delete_tolerant(&api, id.name, existing.uid()).await?;
        }
        Ok(())
    }

    /// Reads the source `reference` ([`Self::read`]); `None` when it does not exist or we
    /// may not read it (e.g. a source in another namespace outside our RBAC).
    async fn get_readable(
        &self,
        reference: Option<&api::ObjectReference>,
    ) -> Result<Option<DynamicObject>, EngineError> {
        let Some(reference) = reference else {
            return Ok(None);
        };
        let Some(kind) = FluxKind::source_by_kind(&reference.kind) else {
            return Ok(None);
        };
        let namespace = reference.namespace.as_deref().unwrap_or_default();
        match self.read(kind, namespace, &reference.name).await {
            Ok(object) => Ok(object),
            Err(kube::Error::Api(status)) if is_not_found(&status) || status.is_forbidden() => Ok(None),
            Err(err) => Err(err.into()),
        }
    }
}

impl Engine for FluxEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Flux
    }

    fn watched_kinds(&self) -> Vec<crate::WatchedKind> {
        let watched = |kind: FluxKind, link, whole| crate::WatchedKind {
            resource: kind.api_resource(),
            place: crate::WatchPlace::WithTheApplications,
            link,
            whole,
        };
        // The sources too ("repository unreachable" is a source status change): shared
        // ones, and those `chart.sourceRef` names, wake every app that reads from them, but
        // only when what the apps report of them changes. They are few, so the watch keeps
        // them whole and every reconcile reads them from its cache.
        let source = |cache: &ObjectCache| {
            Some(crate::WholeObjects {
                readers_see: observe::source_fingerprint,
                cache: cache.clone(),
            })
        };
        vec![
            watched(HELM_RELEASE, crate::OwnerLink::ControllerOwnerReference, None),
            watched(
                HELM_REPOSITORY,
                crate::OwnerLink::ReadBy(reads_from),
                source(&self.helm_repositories),
            ),
            watched(
                OCI_REPOSITORY,
                crate::OwnerLink::ReadBy(reads_from),
                source(&self.oci_repositories),
            ),
        ]
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

/// Whether the release of `app` reads its chart from `object` (its managed source or the
/// one `chart.sourceRef` names), from the spec alone.
fn reads_from(app: &ApplicationInstance, object: &api::ObjectReference) -> bool {
    build::source_reference(app)
        .is_ok_and(|r| r.kind == object.kind && r.name == object.name && r.namespace == object.namespace)
}

/// The managed kind of a built source object.
fn managed_kind(source: &DynamicObject) -> FluxKind {
    source
        .types
        .as_ref()
        .and_then(|t| FluxKind::source_by_kind(&t.kind))
        .unwrap_or(HELM_REPOSITORY)
}

/// `reason: message` of a HelmRelease whose uninstall failed.
fn uninstall_failure(release: &DynamicObject) -> Option<String> {
    let conditions = release.data.pointer("/status/conditions")?.as_array()?;
    conditions
        .iter()
        .filter(|c| c.get("type").and_then(|t| t.as_str()) == Some("Ready"))
        .filter(|c| c.get("reason").and_then(|r| r.as_str()) == Some("UninstallFailed"))
        .find_map(|c| Some(format!("UninstallFailed: {}", c.get("message")?.as_str()?)))
}

#[cfg(test)]
mod tests;
