//! The Flux adapter: an ApplicationInstance becomes a `helm.toolkit.fluxcd.io/v2`
//! HelmRelease plus, for `chart.repository`, the `source.toolkit.fluxcd.io/v1`
//! HelmRepository or OCIRepository behind it.
//!
//! Split in two so almost everything is testable without a cluster:
//! - [`build`] and [`observe`] are pure functions from our types to Flux
//!   objects and from Flux objects to an [`Observation`](crate::Observation);
//! - [`FluxEngine`] is the thin client layer that applies, reads and deletes
//!   them through `kube::Api<DynamicObject>` (no Flux Rust crate: the contract
//!   is the documented JSON, see `third-party-contracts.md` §1 and §2).
//!
//! Flux semantics the reconciler inherits:
//! - Deleting a HelmRelease makes helm-controller uninstall the Helm release
//!   (its `finalizers.fluxcd.io` finalizer), **except when the HelmRelease is
//!   suspended**: then only the finalizer is removed and the release stays
//!   installed. An ApplicationInstance deleted while `spec.suspend: true` thus
//!   leaves its workloads running; that is Flux's documented escape hatch for
//!   detaching a release, and this adapter does not override it.
//! - Changing `releaseName` or `targetNamespace` makes Flux uninstall the old
//!   release and install a new one.

pub mod build;
mod client;
pub mod observe;

pub use client::{FIELD_MANAGER, FluxEngine};

use api::ObjectReference;
use kube::api::{ApiResource, GroupVersionKind};

/// API group of helm-controller.
pub const HELM_GROUP: &str = "helm.toolkit.fluxcd.io";
/// The HelmRelease version we write (served and stored since helm-controller 1.0).
pub const HELM_VERSION: &str = "v2";
/// API group of source-controller.
pub const SOURCE_GROUP: &str = "source.toolkit.fluxcd.io";
/// The source version we write and read (OCIRepository is `v1` since source-controller 1.6, Flux 2.6).
pub const SOURCE_VERSION: &str = "v1";

/// HelmRelease annotation whose every new value queues a reconcile; Flux echoes
/// the handled value in `status.lastHandledReconcileAt`.
pub const ANNOTATION_REQUESTED_AT: &str = "reconcile.fluxcd.io/requestedAt";

/// Layer media type of a Helm chart in an OCI artifact.
pub const HELM_CHART_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

/// One Flux kind this adapter writes or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FluxKind {
    /// API group.
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Resource (plural) name.
    pub plural: &'static str,
}

/// `helm.toolkit.fluxcd.io/v2` HelmRelease.
pub const HELM_RELEASE: FluxKind = FluxKind::new(HELM_GROUP, HELM_VERSION, "HelmRelease", "helmreleases");
/// `source.toolkit.fluxcd.io/v1` HelmRepository.
pub const HELM_REPOSITORY: FluxKind = FluxKind::source("HelmRepository", "helmrepositories");
/// `source.toolkit.fluxcd.io/v1` OCIRepository.
pub const OCI_REPOSITORY: FluxKind = FluxKind::source("OCIRepository", "ocirepositories");
/// `source.toolkit.fluxcd.io/v1` HelmChart.
pub const HELM_CHART: FluxKind = FluxKind::source("HelmChart", "helmcharts");
/// `source.toolkit.fluxcd.io/v1` GitRepository.
pub const GIT_REPOSITORY: FluxKind = FluxKind::source("GitRepository", "gitrepositories");
/// `source.toolkit.fluxcd.io/v1` Bucket.
pub const BUCKET: FluxKind = FluxKind::source("Bucket", "buckets");

/// The source kinds this adapter creates, and so the only ones it ever prunes.
pub const MANAGED_SOURCE_KINDS: [FluxKind; 2] = [HELM_REPOSITORY, OCI_REPOSITORY];

/// Source kinds a HelmRelease can name, by `kind`.
const SOURCE_KINDS: [FluxKind; 5] = [HELM_REPOSITORY, OCI_REPOSITORY, HELM_CHART, GIT_REPOSITORY, BUCKET];

impl FluxKind {
    const fn new(group: &'static str, version: &'static str, kind: &'static str, plural: &'static str) -> Self {
        Self {
            group,
            version,
            kind,
            plural,
        }
    }

    const fn source(kind: &'static str, plural: &'static str) -> Self {
        Self::new(SOURCE_GROUP, SOURCE_VERSION, kind, plural)
    }

    /// The source kind named `kind` (as written in a `sourceRef` / `chartRef`).
    pub fn source_by_kind(kind: &str) -> Option<Self> {
        SOURCE_KINDS.into_iter().find(|k| k.kind == kind)
    }

    /// `group/version`.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// The kube `ApiResource` for dynamic requests.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(self.group, self.version, self.kind), self.plural)
    }

    /// A reference to the object of this kind with the given name and namespace.
    pub fn object_ref(&self, name: &str, namespace: &str) -> ObjectReference {
        ObjectReference {
            api_version: self.api_version(),
            kind: self.kind.to_owned(),
            name: name.to_owned(),
            namespace: Some(namespace.to_owned()),
        }
    }

    /// `<plural>.<group>/<version>`, as an operator would look for it with kubectl.
    pub fn resource_name(&self) -> String {
        format!("{}.{}/{}", self.plural, self.group, self.version)
    }
}
