//! The Argo CD adapter: an ApplicationInstance becomes an `argoproj.io/v1alpha1`
//! `Application` with a Helm source, plus an `AppProject` of its own that fences it in
//! (ADR 0012).
//!
//! Split like [`crate::flux`]: [`build`] and [`observe`] are pure (our types → Argo CD
//! objects, an Application → [`Observation`](crate::Observation)), and [`ArgoCdEngine`] is
//! the thin client layer. No Argo CD Rust crate: the contract is the documented JSON of
//! Argo CD v3 (`third-party-contracts.md`).
//!
//! Argo CD semantics the reconciler inherits:
//! - The objects live in Argo CD's namespace (where its application-controller looks), not
//!   beside the ApplicationInstance: tenants who may create ApplicationInstances cannot
//!   write them. They name their ApplicationInstance by labels
//!   ([`crate::watch::OwnerLink::InstanceLabels`]) and its uid by annotation.
//! - Every sync runs as the release ServiceAccount of the app's namespace (Argo CD's sync
//!   impersonation, `destinationServiceAccounts` of the AppProject), never as Argo CD's own
//!   cluster-wide identity; [`ArgoCdEngine`] refuses to materialise while impersonation is
//!   off. The AppProject allows one destination namespace and no cluster-scoped kinds.
//! - Deleting the Application makes Argo CD delete what it deployed (the
//!   `resources-finalizer.argocd.argoproj.io` finalizer), also while suspended: unlike
//!   Flux, Argo CD has no "detach on delete" through suspension.

pub mod build;
mod client;
pub mod observe;

pub use client::{ArgoCdEngine, ArgoCdSettings};

use kube::api::{ApiResource, GroupVersionKind};

/// API group of Argo CD.
pub const GROUP: &str = "argoproj.io";
/// The version Argo CD serves and stores.
pub const VERSION: &str = "v1alpha1";
/// The namespace Argo CD is installed in, unless configured otherwise.
pub const DEFAULT_NAMESPACE: &str = "argocd";
/// Argo CD's name for the cluster it runs in.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// The finalizer that makes Argo CD delete an Application's resources before the Application.
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
/// Annotation naming the uid of the ApplicationInstance an Argo CD object was written for.
pub const ANNOTATION_INSTANCE_UID: &str = "vworkspace.io/instance-uid";
/// Argo CD's settings ConfigMap, in its namespace.
pub const SETTINGS_CONFIG_MAP: &str = "argocd-cm";
/// The `argocd-cm` key that turns sync impersonation on.
pub const IMPERSONATION_SETTING: &str = "application.sync.impersonation.enabled";

/// One Argo CD kind this adapter writes or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgoKind {
    /// Kind.
    pub kind: &'static str,
    /// Resource (plural) name.
    pub plural: &'static str,
}

/// `argoproj.io/v1alpha1` Application.
pub const APPLICATION: ArgoKind = ArgoKind {
    kind: "Application",
    plural: "applications",
};
/// `argoproj.io/v1alpha1` AppProject.
pub const APP_PROJECT: ArgoKind = ArgoKind {
    kind: "AppProject",
    plural: "appprojects",
};

impl ArgoKind {
    /// The kube `ApiResource` for dynamic requests.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, self.kind), self.plural)
    }

    /// `<plural>.<group>/<version>`, as an operator would look for it with kubectl.
    pub fn resource_name(&self) -> String {
        format!("{}.{GROUP}/{VERSION}", self.plural)
    }
}
