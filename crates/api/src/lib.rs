//! vWorkspace custom resource types: the whole contract between the control
//! plane (Odoo, through the agent) and a cluster.
//!
//! This crate holds types and constants, plus the few pure helpers every crate shares
//! (message cuts in [`text`], the retry policy in [`backoff`], the conditions setter in
//! [`conditions`]): no client, no runtime. They live here because it is the lowest crate,
//! the one the pure crates (`operations`, `protocol`) can depend on as well as
//! controller-kit and the controllers. The CRD YAML in `deploy/crds/` is generated from it
//! (`just generate`), and the conditions contract (`docs/api/conditions.md`) names the
//! constants in [`conditions`].

#![warn(missing_docs)]

pub mod admission;
pub mod application_instance;
pub mod backoff;
pub mod conditions;
pub mod maintenance;
pub mod operation;
pub mod schedule;
pub mod schema;
pub mod text;

pub use application_instance::*;
pub use operation::*;

/// API group of every vWorkspace CRD.
pub const GROUP: &str = "vworkspace.io";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every vWorkspace object: [`GROUP`]`/`[`VERSION`] (a test checks that
/// the three agree with the CRDs; `concat!` cannot join constants).
pub const API_VERSION: &str = "vworkspace.io/v1alpha1";

/// Label every object we create carries, so it can be listed and pruned.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "vworkspace-operator";
/// `app.kubernetes.io/instance`: the owning ApplicationInstance on our objects, and the Helm
/// release name on a chart's objects (the Helm chart convention).
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/part-of`.
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// Value of [`LABEL_PART_OF`].
pub const PART_OF: &str = "vworkspace";
/// `app.kubernetes.io/component`: what the object is to the application.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Annotation on an ApplicationInstance: the name of an Operation (same namespace) that
/// holds its release suspended while it runs (a Restore, so Flux does not fight it). Set
/// and removed by that Operation's engine; ignored once the Operation has ended or is gone.
pub const ANNOTATION_SUSPENDED_BY: &str = "vworkspace.io/suspended-by-operation";

/// The ServiceAccount every Runbook Job's pod runs as, in the Operation's namespace. The
/// runbook engine creates it (server-side apply) with `automountServiceAccountToken: false`
/// and binds it to nothing: it has no rights, so a runbook gets no Kubernetes API access.
/// A Runbook that names any other ServiceAccount is refused (`InvalidSpec`).
pub const RUNBOOK_SERVICE_ACCOUNT: &str = "vworkspace-runbook";

/// The ServiceAccount Flux's helm-controller impersonates for an ApplicationInstance's release
/// when `spec.serviceAccountName` is unset, in the ApplicationInstance's namespace. The app
/// controller creates it (server-side apply) before materialising, together with a RoleBinding
/// named [`RELEASE_ROLE`] that grants it the ClusterRole [`RELEASE_ROLE`] in that namespace only,
/// so a chart is applied with namespace-scoped rights (no ClusterRoleBinding, no other
/// namespace's Secrets). See docs/install/README.md#flux-multi-tenancy.
pub const RELEASE_SERVICE_ACCOUNT: &str = "vworkspace-release";

/// The ClusterRole (shipped in the install bundle: an explicit rule list of the built-in API
/// groups, plus what a platform team labels `vworkspace.io/aggregate-to-release`, never the
/// built-in `admin`'s aggregation) that the release ServiceAccount is bound to, per namespace,
/// by a RoleBinding of the same name.
pub const RELEASE_ROLE: &str = "vworkspace-release";

/// The ClusterRole (shipped beside [`RELEASE_ROLE`], labelled `vworkspace.io/aggregate-to-release`)
/// holding the release's explicit rules of the built-in API groups; never bound itself.
pub const RELEASE_BUILTIN_ROLE: &str = "vworkspace-release-builtin";

/// The release ClusterRoles a bundle ships: [`RELEASE_ROLE`] and the rules it aggregates.
pub const RELEASE_ROLES: [&str; 2] = [RELEASE_ROLE, RELEASE_BUILTIN_ROLE];

use kube::CustomResourceExt;

/// Every CRD of the group, in a stable order (used by `crdgen` and the tests).
pub fn all_crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    vec![ApplicationInstance::crd(), Operation::crd()]
}
