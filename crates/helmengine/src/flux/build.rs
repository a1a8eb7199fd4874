//! Pure builders: ApplicationInstance → Flux objects.
//!
//! Output is deterministic (JSON objects are key-sorted maps, nothing depends
//! on time or randomness), so applying the same spec twice is a no-op on the
//! server and the system stays quiet at rest.
//!
//! # Mapping
//!
//! | ApplicationInstance | Flux |
//! |---|---|
//! | (the object) | HelmRelease `helm.toolkit.fluxcd.io/v2`, same name and namespace |
//! | `chart.repository.url` `http(s)://` | a HelmRepository `source.toolkit.fluxcd.io/v1` shared by every app of the namespace with the same repository spec ([`shared_source_name`]); HR `spec.chart.spec` `{chart, version, sourceRef, interval}` |
//! | `chart.repository.url` `oci://host/path` | an OCIRepository `v1` shared the same way, `ref.semver`, Helm `layerSelector`; HR `spec.chartRef` |
//! | (the managed source's name) | HR label [`LABEL_CHART_SOURCE`] |
//! | `chart.sourceRef` HelmRepository/GitRepository/Bucket | HR `spec.chart.spec.sourceRef` |
//! | `chart.sourceRef` OCIRepository/HelmChart | HR `spec.chartRef` |
//! | `values`, `valuesFrom`, `releaseName`, `targetNamespace`, `timeout`, `suspend`, `serviceAccountName`, `driftDetection.mode` | same-named HR fields |
//! | `serviceAccountName` unset | HR `serviceAccountName` [`api::RELEASE_SERVICE_ACCOUNT`] (the release never runs with the controller's own rights) |
//! | `dependsOn[]` | HR `dependsOn[] {name, namespace}` (an app's HelmRelease has the app's name and namespace) |
//! | `install`/`upgrade.remediation` | HR `install`/`upgrade` `strategy` and `remediation` (see [`helm_release`]) |
//! | `test` `{enable, ignoreFailures, timeout}` | HR `test`, `enable` defaulting to true (the field's presence enables tests) |
//! | [`MaterializeInput::values_revision`] | HR annotation `reconcile.fluxcd.io/requestedAt` |
//!
//! Defaults are written explicitly (HR interval `10m`, HelmRepository `1h`,
//! OCIRepository `5m`, chart version `*`, reference namespaces) so the
//! applied object reads the same as what Flux acts on.
//!
//! # Decisions
//!
//! - **Managed chart sources are shared** (ADR 0013). One HelmRepository per namespace and
//!   repository spec (URL, credentials, interval, …) serves every app using it, so
//!   source-controller fetches an index once per repository, not once per app. The
//!   source carries no owner reference (it has many users); its name is derived from its
//!   spec, so equal specs meet on one object and a changed spec is a new object. Each
//!   HelmRelease names its source in [`LABEL_CHART_SOURCE`], which is how the last user
//!   is found when an app leaves (see `FluxEngine`).
//! - **OCI versions use `ref.semver` always.** Masterminds semver accepts an
//!   exact version as a constraint, so one field covers `6.2.1`, `~6.2` and
//!   `*`. Without a version we write `*`: OCIRepository's own default is the
//!   `latest` tag, which Helm chart registries rarely publish.
//! - **Version ranges are not parsed here.** Flux uses Masterminds semver,
//!   whose syntax (`>=1.0 <2.0`, `1.2.x`) differs from Rust's `semver`
//!   crate; a local check would reject valid input. A bad range surfaces on
//!   the source (HelmChart/OCIRepository Ready=False) with Flux's own reason.
//! - **`install.createNamespace` is never set.** The app controller only lets
//!   a release into namespaces on its allow-list, which the cluster owner
//!   provisions; creating namespaces from a chart install would need
//!   cluster-scoped rights for the (possibly impersonated) service account and
//!   leaves the namespace behind on uninstall. A missing target namespace
//!   surfaces as Flux's `InstallFailed`, verbatim.
//! - **`chart.version` with a GitRepository or Bucket source is refused.**
//!   Flux ignores it there (the chart at the path is used as is), so a pinned
//!   version would silently not be honoured.
//! - **URLs are validated before any write**: an `oci://` URL must name a
//!   repository path and carry no tag or digest (Flux rejects those; the
//!   version goes in `chart.version`), and no URL may embed credentials (use
//!   `secretRef`). Error messages never echo the URL, in case it holds them.
//! - **Remediation**: `rollback` → strategy `RemediateOnFailure` (Flux's
//!   install remediation is always an uninstall; upgrade gets
//!   `remediation.strategy: rollback`); `retry` → strategy `RetryOnFailure`
//!   with `retryInterval`; `retries` → `remediation.retries` in both cases
//!   (Flux documents that `RetryOnFailure` applies no remediation).

use api::{
    ApplicationInstance, ChartRepository, ChartSpec, DriftDetectionMode, ObjectReference, ReleaseActionSpec,
    ReleaseTest, RemediationStrategy, SourceKind, SourceReference, ValuesReference, ValuesSourceKind,
};
use kube::ResourceExt as _;
use kube::api::DynamicObject;
use serde_json::{Map, Value, json};

use super::{
    ANNOTATION_REQUESTED_AT, FluxKind, HELM_CHART_MEDIA_TYPE, HELM_RELEASE, HELM_REPOSITORY, MANAGED_SOURCE_KINDS,
    OCI_REPOSITORY,
};
use crate::meta::{self, AppId, COMPONENT_CHART_SOURCE, COMPONENT_HELM_RELEASE};
use crate::{EngineError, MaterializeInput};

/// HelmRelease `spec.interval` when the app sets none.
pub const DEFAULT_RELEASE_INTERVAL: &str = "10m";
/// HelmRepository `spec.interval` (and its chart's) when the repository sets none.
pub const DEFAULT_HELM_REPOSITORY_INTERVAL: &str = "1h";
/// OCIRepository `spec.interval` when the repository sets none.
pub const DEFAULT_OCI_REPOSITORY_INTERVAL: &str = "5m";
/// Chart version (semver constraint) when the app sets none: the latest release.
pub const DEFAULT_CHART_VERSION: &str = "*";
/// HelmRelease label naming the shared chart source it reads from (same namespace).
pub const LABEL_CHART_SOURCE: &str = "vworkspace.io/chart-source";
/// Prefix of the names of shared chart sources.
pub const SHARED_SOURCE_PREFIX: &str = "vws-";
/// At most this many characters of the repository host and path appear in a shared
/// source's name (which, prefix and digest included, stays a valid label value).
const SOURCE_NAME_HINT_LEN: usize = 40;

/// Where the chart comes from, validated.
#[derive(Debug, Clone, Copy)]
enum ChartSource<'a> {
    /// An `http(s)://` repository we manage as a HelmRepository.
    Http(&'a ChartRepository),
    /// An `oci://` repository we manage as an OCIRepository; `url` is normalised.
    Oci {
        repository: &'a ChartRepository,
        url: &'a str,
    },
    /// An existing Flux source object.
    Ref(&'a SourceReference),
}

/// The HelmRelease for `app`.
///
/// `input.values_revision`, when set, becomes the `reconcile.fluxcd.io/requestedAt`
/// annotation: Flux reconciles whenever its value changes, so a changed Secret
/// or ConfigMap behind `valuesFrom` is re-applied promptly without labelling
/// the user's objects.
pub fn helm_release(app: &ApplicationInstance, input: &MaterializeInput) -> Result<DynamicObject, EngineError> {
    let id = AppId::of(app)?;
    let source = chart_source(&app.spec.chart)?;
    let mut spec = release_spec(app, id, source)?;
    if input.suspended_by.is_some() {
        // An Operation (a Restore) holds the release still while it runs.
        if let Some(spec) = spec.as_object_mut() {
            spec.insert("suspend".to_owned(), json!(true));
        }
    }
    let mut hr = new_object(app, id, HELM_RELEASE, COMPONENT_HELM_RELEASE)?.data(json!({ "spec": spec }));
    if let Some(managed) = managed_source(&app.spec.chart, source) {
        hr.labels_mut().insert(LABEL_CHART_SOURCE.to_owned(), managed.name);
    }
    if let Some(token) = &input.values_revision {
        hr.metadata.annotations = Some([(ANNOTATION_REQUESTED_AT.to_owned(), token.clone())].into());
    }
    Ok(hr)
}

/// The chart source object we manage for `app`, shared with every app of its namespace
/// that has the same repository spec: a HelmRepository for an `http(s)://` repository, an
/// OCIRepository for `oci://` (whose spec includes the version), and `None` when the app
/// names an existing source with `chart.sourceRef`.
///
/// It carries our labels but no instance label and no owner reference: it belongs to no
/// single app.
pub fn source(app: &ApplicationInstance) -> Result<Option<DynamicObject>, EngineError> {
    let id = AppId::of(app)?;
    let Some(managed) = managed_source(&app.spec.chart, chart_source(&app.spec.chart)?) else {
        return Ok(None);
    };
    let mut object = DynamicObject::new(&managed.name, &managed.kind.api_resource()).within(id.namespace);
    object.metadata.labels = Some(meta::shared_labels(COMPONENT_CHART_SOURCE));
    Ok(Some(object.data(json!({ "spec": managed.spec }))))
}

/// A chart source we manage: kind, name and spec.
struct ManagedSource {
    kind: FluxKind,
    name: String,
    spec: Value,
}

/// The managed source behind `source`, if we manage one.
fn managed_source(chart: &ChartSpec, source: ChartSource<'_>) -> Option<ManagedSource> {
    let (kind, url, spec) = match source {
        ChartSource::Http(repository) => (
            HELM_REPOSITORY,
            repository.url.as_str(),
            helm_repository_spec(repository),
        ),
        ChartSource::Oci { repository, url } => (
            OCI_REPOSITORY,
            url,
            oci_repository_spec(repository, url, chart.version.as_deref()),
        ),
        ChartSource::Ref(_) => return None,
    };
    let name = shared_source_name(kind, url, &spec);
    Some(ManagedSource { kind, name, spec })
}

/// The name of the shared source of `kind` with `spec`: [`SHARED_SOURCE_PREFIX`], a
/// readable hint of the URL's host and path, and a digest of kind and spec. Equal specs get
/// equal names (so apps meet on one object); any difference (credentials, interval, CA, an
/// OCI version) gets its own object. At most 61 characters, a valid name and label value.
pub fn shared_source_name(kind: FluxKind, url: &str, spec: &Value) -> String {
    let digest = meta::fnv1a_hex(serde_json::to_vec(&json!({ "kind": kind.kind, "spec": spec })).unwrap_or_default());
    let location = url.split_once("://").map_or(url, |(_, rest)| rest);
    let mut hint = String::with_capacity(SOURCE_NAME_HINT_LEN);
    for c in location.chars() {
        if hint.len() >= SOURCE_NAME_HINT_LEN {
            break;
        }
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            hint.push(c);
        } else if !hint.is_empty() && !hint.ends_with('-') {
            hint.push('-');
        }
    }
    let hint = hint.trim_end_matches('-');
    if hint.is_empty() {
        format!("{SHARED_SOURCE_PREFIX}{digest}")
    } else {
        format!("{SHARED_SOURCE_PREFIX}{hint}-{digest}")
    }
}

/// The HelmRelease of `app` (same name and namespace).
pub fn engine_reference(app: &ApplicationInstance) -> Result<ObjectReference, EngineError> {
    let id = AppId::of(app)?;
    Ok(HELM_RELEASE.object_ref(id.name, id.namespace))
}

/// The source object the HelmRelease of `app` reads its chart from: the one we
/// manage, or the one `chart.sourceRef` names.
pub fn source_reference(app: &ApplicationInstance) -> Result<ObjectReference, EngineError> {
    let id = AppId::of(app)?;
    let source = chart_source(&app.spec.chart)?;
    Ok(match (managed_source(&app.spec.chart, source), source) {
        (Some(managed), _) => managed.kind.object_ref(&managed.name, id.namespace),
        (None, ChartSource::Ref(r)) => {
            flux_kind(r.kind).object_ref(&r.name, r.namespace.as_deref().unwrap_or(id.namespace))
        }
        // A managed source always exists for the other variants.
        (None, _) => HELM_REPOSITORY.object_ref(id.name, id.namespace),
    })
}

/// What to do with the source a live HelmRelease of `app` read from (`previous`, from
/// [`super::observe::source_refs`]) once the release points at `in_use`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreviousSource {
    /// Nothing: it is still the source in use, or not one we manage.
    Keep,
    /// A source named like the app, as releases before shared sources had: delete it if it
    /// is ours (controlled by this app).
    DeleteIfOurs(ObjectReference),
    /// A shared source: delete it if no other HelmRelease of the namespace names it.
    ReleaseShared(ObjectReference),
}

/// Decides [`PreviousSource`] from the live release's source and the one now in use. A
/// `sourceRef` that names exactly such an object keeps it: the user chose to point at it.
pub fn previous_source(
    app: &ApplicationInstance,
    previous: Option<&ObjectReference>,
    in_use: &ObjectReference,
) -> Result<PreviousSource, EngineError> {
    let id = AppId::of(app)?;
    let Some(previous) = previous.filter(|p| *p != in_use) else {
        return Ok(PreviousSource::Keep);
    };
    let managed_kind = MANAGED_SOURCE_KINDS.iter().any(|k| k.kind == previous.kind);
    let same_namespace = previous.namespace.as_deref() == Some(id.namespace);
    Ok(if !managed_kind || !same_namespace {
        PreviousSource::Keep
    } else if previous.name == id.name {
        PreviousSource::DeleteIfOurs(previous.clone())
    } else if previous.name.starts_with(SHARED_SOURCE_PREFIX) {
        PreviousSource::ReleaseShared(previous.clone())
    } else {
        PreviousSource::Keep
    })
}

/// A new object of `kind` named like the app, with our labels and owner reference.
fn new_object(
    app: &ApplicationInstance,
    id: AppId<'_>,
    kind: FluxKind,
    component: &str,
) -> Result<DynamicObject, EngineError> {
    let mut object = DynamicObject::new(id.name, &kind.api_resource()).within(id.namespace);
    object.metadata.labels = Some(meta::labels(id.name, component));
    object.metadata.owner_references = Some(vec![meta::owner_reference(app)?]);
    Ok(object)
}

/// Validates `chart` and says where it comes from.
fn chart_source(chart: &ChartSpec) -> Result<ChartSource<'_>, EngineError> {
    match (&chart.repository, &chart.source_ref) {
        (Some(repository), None) => repository_source(repository),
        (None, Some(source_ref)) => {
            check_version_for_ref(chart, source_ref)?;
            Ok(ChartSource::Ref(source_ref))
        }
        _ => Err(invalid(
            "exactly one of chart.repository or chart.sourceRef must be set",
        )),
    }
}

fn repository_source(repository: &ChartRepository) -> Result<ChartSource<'_>, EngineError> {
    let url = repository.url.as_str();
    if let Some(rest) = url.strip_prefix("oci://") {
        check_oci_repository(rest.trim_end_matches('/'))?;
        // Trailing slashes are dropped: Flux parses the URL as an image reference.
        let url = url.trim_end_matches('/');
        return Ok(ChartSource::Oci { repository, url });
    }
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    match rest {
        Some(rest) => {
            check_authority(rest)?;
            Ok(ChartSource::Http(repository))
        }
        None => Err(invalid(
            "chart.repository.url must start with https://, http:// or oci://",
        )),
    }
}

/// Checks the part of an `oci://` URL after the scheme (without trailing slashes).
fn check_oci_repository(rest: &str) -> Result<(), EngineError> {
    let (_, path) = check_authority(rest)?;
    if path.is_empty() {
        return Err(invalid(
            "chart.repository.url: an oci:// URL must name the chart repository, \
             e.g. oci://registry.example.com/charts/app, not just a registry host",
        ));
    }
    if path.contains(['@', ':']) {
        return Err(invalid(
            "chart.repository.url: an oci:// URL must not carry a tag or digest; \
             put the version in chart.version",
        ));
    }
    Ok(())
}

/// [`meta::check_repository_authority`], pointing embedded credentials to `secretRef`.
fn check_authority(rest: &str) -> Result<(&str, &str), EngineError> {
    meta::check_repository_authority(rest, Some("reference a Secret with chart.repository.secretRef"))
}

/// A version only makes sense where Flux resolves one (see module docs).
fn check_version_for_ref(chart: &ChartSpec, source_ref: &SourceReference) -> Result<(), EngineError> {
    let pinned = chart.version.as_deref().is_some_and(|v| v != DEFAULT_CHART_VERSION);
    if !pinned {
        return Ok(());
    }
    let why = match source_ref.kind {
        SourceKind::HelmRepository => return Ok(()),
        SourceKind::OciRepository | SourceKind::HelmChart => "the source pins the chart version",
        SourceKind::GitRepository | SourceKind::Bucket => "Flux takes the chart as it is in the source",
    };
    Err(invalid(format!(
        "chart.version cannot be set with a {} sourceRef: {why}",
        flux_kind(source_ref.kind).kind
    )))
}

/// `spec` of the HelmRelease.
fn release_spec(app: &ApplicationInstance, id: AppId<'_>, source: ChartSource<'_>) -> Result<Value, EngineError> {
    let spec = &app.spec;
    let mut out = Map::new();
    out.insert(
        "interval".into(),
        json!(spec.interval.as_deref().unwrap_or(DEFAULT_RELEASE_INTERVAL)),
    );
    let (key, chart) = chart_reference(&spec.chart, id, source);
    out.insert(key.into(), chart);
    if let Some(values) = spec.values.as_ref().filter(|v| !v.is_null()) {
        out.insert("values".into(), values.clone());
    }
    if !spec.values_from.is_empty() {
        out.insert(
            "valuesFrom".into(),
            spec.values_from.iter().map(values_reference).collect(),
        );
    }
    insert_str(&mut out, "releaseName", spec.release_name.as_deref());
    insert_str(&mut out, "targetNamespace", spec.target_namespace.as_deref());
    insert_str(&mut out, "timeout", spec.timeout.as_deref());
    // Always set: with the bundled helm-controller's `--default-service-account` pointing at a
    // ServiceAccount with no rights, an unset field would make every release fail; the app
    // controller creates and binds this one per namespace before materialising.
    insert_str(
        &mut out,
        "serviceAccountName",
        Some(
            spec.service_account_name
                .as_deref()
                .unwrap_or(api::RELEASE_SERVICE_ACCOUNT),
        ),
    );
    if spec.suspend {
        out.insert("suspend".into(), json!(true));
    }
    if !spec.depends_on.is_empty() {
        let deps = spec
            .depends_on
            .iter()
            .map(|d| json!({ "name": d.name, "namespace": d.namespace.as_deref().unwrap_or(id.namespace) }));
        out.insert("dependsOn".into(), deps.collect());
    }
    if let Some(install) = release_action(spec.install.as_ref(), Action::Install)? {
        out.insert("install".into(), install);
    }
    if let Some(upgrade) = release_action(spec.upgrade.as_ref(), Action::Upgrade)? {
        out.insert("upgrade".into(), upgrade);
    }
    if let Some(drift) = &spec.drift_detection {
        out.insert("driftDetection".into(), json!({ "mode": drift_mode(drift.mode) }));
    }
    if let Some(test) = &spec.test {
        out.insert("test".into(), release_test(test));
    }
    Ok(Value::Object(out))
}

/// `("chart", {spec: …})` for a chart template, `("chartRef", {…})` for a source that holds one chart.
fn chart_reference(chart: &ChartSpec, id: AppId<'_>, source: ChartSource<'_>) -> (&'static str, Value) {
    let version = chart.version.as_deref().unwrap_or(DEFAULT_CHART_VERSION);
    match source {
        ChartSource::Http(repository) => {
            let interval = repository
                .interval
                .as_deref()
                .unwrap_or(DEFAULT_HELM_REPOSITORY_INTERVAL);
            let name = managed_source(chart, source).map(|m| m.name).unwrap_or_default();
            let source_ref = json!({ "kind": HELM_REPOSITORY.kind, "name": name, "namespace": id.namespace });
            let spec =
                json!({ "chart": chart.name, "version": version, "sourceRef": source_ref, "interval": interval });
            ("chart", json!({ "spec": spec }))
        }
        ChartSource::Oci { .. } => {
            let name = managed_source(chart, source).map(|m| m.name).unwrap_or_default();
            (
                "chartRef",
                json!({ "kind": OCI_REPOSITORY.kind, "name": name, "namespace": id.namespace }),
            )
        }
        ChartSource::Ref(r) => {
            let reference = json!({
                "kind": flux_kind(r.kind).kind,
                "name": r.name,
                "namespace": r.namespace.as_deref().unwrap_or(id.namespace),
            });
            match r.kind {
                SourceKind::OciRepository | SourceKind::HelmChart => ("chartRef", reference),
                SourceKind::HelmRepository | SourceKind::GitRepository | SourceKind::Bucket => {
                    let spec = json!({ "chart": chart.name, "version": version, "sourceRef": reference });
                    ("chart", json!({ "spec": spec }))
                }
            }
        }
    }
}

fn values_reference(v: &ValuesReference) -> Value {
    let kind = match v.kind {
        ValuesSourceKind::Secret => "Secret",
        ValuesSourceKind::ConfigMap => "ConfigMap",
    };
    let mut out = Map::new();
    out.insert("kind".into(), json!(kind));
    out.insert("name".into(), json!(v.name));
    insert_str(&mut out, "valuesKey", v.values_key.as_deref());
    insert_str(&mut out, "targetPath", v.target_path.as_deref());
    if v.optional {
        out.insert("optional".into(), json!(true));
    }
    Value::Object(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Install,
    Upgrade,
}

/// HR `install` / `upgrade` from our remediation settings; `None` when there are none.
fn release_action(spec: Option<&ReleaseActionSpec>, action: Action) -> Result<Option<Value>, EngineError> {
    let Some(remediation) = spec.and_then(|s| s.remediation.as_ref()) else {
        return Ok(None);
    };
    let mut remediation_out = Map::new();
    if let Some(retries) = remediation.retries {
        remediation_out.insert("retries".into(), json!(retries));
    }
    let strategy = match remediation.strategy.unwrap_or_default() {
        RemediationStrategy::Rollback => {
            if remediation.retry_interval.is_some() {
                return Err(invalid("remediation.retryInterval is only allowed with strategy retry"));
            }
            if action == Action::Upgrade {
                remediation_out.insert("strategy".into(), json!("rollback"));
            }
            json!({ "name": "RemediateOnFailure" })
        }
        RemediationStrategy::Retry => {
            let mut strategy = Map::new();
            strategy.insert("name".into(), json!("RetryOnFailure"));
            insert_str(&mut strategy, "retryInterval", remediation.retry_interval.as_deref());
            Value::Object(strategy)
        }
    };
    let mut out = Map::new();
    out.insert("strategy".into(), strategy);
    if !remediation_out.is_empty() {
        out.insert("remediation".into(), Value::Object(remediation_out));
    }
    Ok(Some(Value::Object(out)))
}

/// HR `test`. `enable` and `ignoreFailures` are written even when false, so the applied
/// object says what Flux does.
fn release_test(test: &ReleaseTest) -> Value {
    let mut out = Map::new();
    out.insert("enable".into(), json!(test.enabled()));
    out.insert("ignoreFailures".into(), json!(test.ignore_failures));
    insert_str(&mut out, "timeout", test.timeout.as_deref());
    Value::Object(out)
}

fn helm_repository_spec(repository: &ChartRepository) -> Value {
    let mut spec = Map::new();
    spec.insert("url".into(), json!(repository.url));
    let interval = repository
        .interval
        .as_deref()
        .unwrap_or(DEFAULT_HELM_REPOSITORY_INTERVAL);
    spec.insert("interval".into(), json!(interval));
    insert_secret_refs(&mut spec, repository);
    Value::Object(spec)
}

fn oci_repository_spec(repository: &ChartRepository, url: &str, version: Option<&str>) -> Value {
    let mut spec = Map::new();
    spec.insert("url".into(), json!(url));
    let interval = repository
        .interval
        .as_deref()
        .unwrap_or(DEFAULT_OCI_REPOSITORY_INTERVAL);
    spec.insert("interval".into(), json!(interval));
    spec.insert(
        "ref".into(),
        json!({ "semver": version.unwrap_or(DEFAULT_CHART_VERSION) }),
    );
    spec.insert(
        "layerSelector".into(),
        json!({ "mediaType": HELM_CHART_MEDIA_TYPE, "operation": "copy" }),
    );
    insert_secret_refs(&mut spec, repository);
    Value::Object(spec)
}

fn insert_secret_refs(spec: &mut Map<String, Value>, repository: &ChartRepository) {
    if let Some(secret) = &repository.secret_ref {
        spec.insert("secretRef".into(), json!({ "name": secret.name }));
    }
    if let Some(secret) = &repository.cert_secret_ref {
        spec.insert("certSecretRef".into(), json!({ "name": secret.name }));
    }
}

fn insert_str(out: &mut Map<String, Value>, key: &str, value: Option<&str>) {
    if let Some(value) = value {
        out.insert(key.into(), json!(value));
    }
}

fn flux_kind(kind: SourceKind) -> FluxKind {
    match kind {
        SourceKind::HelmRepository => HELM_REPOSITORY,
        SourceKind::GitRepository => super::GIT_REPOSITORY,
        SourceKind::Bucket => super::BUCKET,
        SourceKind::OciRepository => OCI_REPOSITORY,
        SourceKind::HelmChart => super::HELM_CHART,
    }
}

fn drift_mode(mode: DriftDetectionMode) -> &'static str {
    match mode {
        DriftDetectionMode::Enabled => "enabled",
        DriftDetectionMode::Warn => "warn",
        DriftDetectionMode::Disabled => "disabled",
    }
}

fn invalid(message: impl Into<String>) -> EngineError {
    EngineError::InvalidSpec(message.into())
}

#[cfg(test)]
mod tests;
