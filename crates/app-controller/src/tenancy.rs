//! Flux multi-tenancy: the identity a release is applied with, and the namespace's Pod
//! Security labels, ensured before anything is materialised.
//!
//! The bundled helm-controller runs with `--default-service-account` naming a ServiceAccount
//! that nothing binds, and every HelmRelease we build names [`api::RELEASE_SERVICE_ACCOUNT`]
//! unless the spec names another. So, per namespace an ApplicationInstance lives in, this
//! module applies (server-side, field manager of the controller):
//!
//! - the ServiceAccount [`api::RELEASE_SERVICE_ACCOUNT`] (`automountServiceAccountToken: false`:
//!   it exists to be impersonated, not to run pods);
//! - the RoleBinding [`api::RELEASE_ROLE`] granting it the ClusterRole [`api::RELEASE_ROLE`]
//!   (namespace-scoped rights, shipped in the install bundle) in that namespace only;
//! - where an allowed pair lets the app install into another namespace (`targetNamespace`),
//!   a RoleBinding `vworkspace-release-<app namespace>` in the target namespace for the same
//!   ServiceAccount: the cluster administrator allowed the pair, and Helm applies the chart's
//!   objects there as that ServiceAccount;
//! - the Pod Security labels of both namespaces (`enforce` at the configured level, `warn`
//!   and `audit` at `restricted`), unless `--pod-security-enforce=none`.
//!
//! Writes happen once per namespace pair and process: a successful ensure is remembered in
//! memory, so a controller at rest writes nothing. Deleting an ApplicationInstance forgets its
//! namespace's pairs (the namespace may be deleted and recreated under the same name). A
//! binding deleted by hand is re-applied at the next start; meanwhile the engine reports the
//! missing rights itself.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    str::FromStr,
    sync::{Arc, Mutex},
};

use controller_kit::{ControllerMetrics, WriteVerb};
use k8s_openapi::api::{
    core::v1::{Namespace, ServiceAccount},
    rbac::v1::RoleBinding,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

/// Pod Security Admission label keys.
const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
const WARN: &str = "pod-security.kubernetes.io/warn";
const AUDIT: &str = "pod-security.kubernetes.io/audit";

/// The Pod Security level enforced in the namespaces the controller manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSecurityEnforce {
    /// Blocks the known escapes (privileged, host namespaces, hostPath, added capabilities)
    /// while letting charts that set no securityContext run.
    Baseline,
    /// Pod Security `restricted`: only charts written for it run.
    Restricted,
    /// The controller leaves the namespace's labels alone (the platform sets them).
    None,
}

impl PodSecurityEnforce {
    fn level(self) -> Option<&'static str> {
        match self {
            PodSecurityEnforce::Baseline => Some("baseline"),
            PodSecurityEnforce::Restricted => Some("restricted"),
            PodSecurityEnforce::None => None,
        }
    }
}

impl FromStr for PodSecurityEnforce {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "baseline" => Ok(PodSecurityEnforce::Baseline),
            "restricted" => Ok(PodSecurityEnforce::Restricted),
            "none" => Ok(PodSecurityEnforce::None),
            other => Err(format!(
                "unknown Pod Security level {other:?} (baseline, restricted, none)"
            )),
        }
    }
}

impl fmt::Display for PodSecurityEnforce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.level().unwrap_or("none"))
    }
}

/// Why a namespace could not be prepared for a release.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    #[error("namespace {0} does not exist")]
    NamespaceNotFound(String),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl TenancyError {
    fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TenancyError {
        let what = what.into();
        move |source| TenancyError::Api { what, source }
    }
}

/// `(app namespace, target namespace)`.
type NamespacePair = (String, String);

/// Ensures the release identity and Pod Security labels; remembers what it has ensured.
pub struct Tenancy {
    field_manager: &'static str,
    pod_security: PodSecurityEnforce,
    /// `(app namespace, target namespace)` pairs already ensured by this process.
    ensured: Mutex<HashSet<(String, String)>>,
    /// One lock per pair: the reconciles of many apps of one namespace (all of them after a
    /// start) wait for the first to ensure it instead of each applying the same objects.
    pending: Mutex<HashMap<NamespacePair, Arc<tokio::sync::Mutex<()>>>>,
}

impl Tenancy {
    pub fn new(field_manager: &'static str, pod_security: PodSecurityEnforce) -> Self {
        Self {
            field_manager,
            pod_security,
            ensured: Mutex::new(HashSet::new()),
            pending: Mutex::new(HashMap::new()),
        }
    }

    fn is_ensured(&self, key: &(String, String)) -> bool {
        // A poisoned lock only means another reconcile panicked mid-insert; the set is still valid.
        self.ensured.lock().unwrap_or_else(|p| p.into_inner()).contains(key)
    }

    /// Forgets what was ensured for apps in `app_ns`, so the next release there ensures it
    /// again (after an ApplicationInstance is deleted: its namespace may be deleted and
    /// recreated under the same name, without the release ServiceAccount and bindings).
    pub fn forget(&self, app_ns: &str) {
        self.ensured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(ns, _)| ns != app_ns);
    }

    /// Makes `app_ns` (and `target_ns`, when it differs) ready for a release applied as the
    /// release ServiceAccount of `app_ns`. Cheap after the first success per pair.
    pub async fn ensure(
        &self,
        client: &Client,
        metrics: &ControllerMetrics,
        app_ns: &str,
        target_ns: &str,
    ) -> Result<(), TenancyError> {
        let key = (app_ns.to_owned(), target_ns.to_owned());
        if self.is_ensured(&key) {
            return Ok(());
        }
        let pair_lock = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let _one_at_a_time = pair_lock.lock().await;
        // Whoever held the lock before may have ensured the pair meanwhile.
        if self.is_ensured(&key) {
            return Ok(());
        }
        let params = PatchParams::apply(self.field_manager);
        let mut namespaces = vec![app_ns];
        if target_ns != app_ns {
            namespaces.push(target_ns);
        }
        for ns in &namespaces {
            // Read first: server-side apply would create a missing namespace. Skipped when there is
            // nothing to label in the app's own namespace (it exists: the app lives there), so a
            // controller confined to Roles (the namespaced overlay) needs no namespace rights.
            let level = self.pod_security.level();
            if level.is_none() && *ns == app_ns {
                continue;
            }
            let api: Api<Namespace> = Api::all(client.clone());
            if api
                .get_metadata_opt(ns)
                .await
                .map_err(TenancyError::api(format!("reading namespace {ns}")))?
                .is_none()
            {
                return Err(TenancyError::NamespaceNotFound((*ns).to_owned()));
            }
            if let Some(level) = level {
                metrics.api_write(WriteVerb::Apply, "Namespace");
                // Forced: these three label keys are ours in the namespaces we manage (the level is
                // the cluster administrator's `--pod-security-enforce`); no other field is sent.
                api.patch(ns, &params.clone().force(), &Patch::Apply(namespace_labels(ns, level)))
                    .await
                    .map_err(TenancyError::api(format!("labelling namespace {ns} for Pod Security")))?;
            }
        }

        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), app_ns);
        metrics.api_write(WriteVerb::Apply, "ServiceAccount");
        accounts
            .patch(
                api::RELEASE_SERVICE_ACCOUNT,
                &params,
                &Patch::Apply(service_account(app_ns)),
            )
            .await
            .map_err(TenancyError::api(format!(
                "applying ServiceAccount {app_ns}/{}",
                api::RELEASE_SERVICE_ACCOUNT
            )))?;
        for ns in &namespaces {
            let binding = role_binding(ns, app_ns);
            let name = binding_name(ns, app_ns);
            let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
            metrics.api_write(WriteVerb::Apply, "RoleBinding");
            bindings
                .patch(&name, &params, &Patch::Apply(binding))
                .await
                .map_err(TenancyError::api(format!("applying RoleBinding {ns}/{name}")))?;
        }
        self.ensured.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
        Ok(())
    }
}

fn managed_labels() -> Value {
    json!({ api::LABEL_MANAGED_BY: api::MANAGED_BY, api::LABEL_PART_OF: api::PART_OF })
}

/// The Pod Security labels of a managed namespace: `enforce` at `level`; `warn` and `audit`
/// always at `restricted`, so chart authors see what would stop them under the strictest level.
pub fn namespace_labels(ns: &str, level: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": ns,
            "labels": { ENFORCE: level, WARN: "restricted", AUDIT: "restricted" },
        },
    })
}

/// The release ServiceAccount of `ns`.
pub fn service_account(ns: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": api::RELEASE_SERVICE_ACCOUNT,
            "namespace": ns,
            "labels": managed_labels(),
        },
        // Impersonated by helm-controller, never mounted: no pod needs its token.
        "automountServiceAccountToken": false,
    })
}

/// The RoleBinding's name in `binding_ns` for the release ServiceAccount of `account_ns`.
pub fn binding_name(binding_ns: &str, account_ns: &str) -> String {
    if binding_ns == account_ns {
        api::RELEASE_ROLE.to_owned()
    } else {
        format!("{}-{account_ns}", api::RELEASE_ROLE)
    }
}

/// Grants the release ServiceAccount of `account_ns` the release ClusterRole in `binding_ns`.
pub fn role_binding(binding_ns: &str, account_ns: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": binding_name(binding_ns, account_ns),
            "namespace": binding_ns,
            "labels": managed_labels(),
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": api::RELEASE_ROLE,
        },
        "subjects": [{
            "kind": "ServiceAccount",
            "name": api::RELEASE_SERVICE_ACCOUNT,
            "namespace": account_ns,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_a_namespace_drops_only_its_pairs() {
        let tenancy = Tenancy::new("test", PodSecurityEnforce::Baseline);
        let pair = |a: &str, t: &str| (a.to_owned(), t.to_owned());
        for key in [
            pair("team-a", "team-a"),
            pair("team-a", "shared"),
            pair("team-b", "team-b"),
        ] {
            tenancy.ensured.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
        }
        tenancy.forget("team-a");
        assert!(!tenancy.is_ensured(&pair("team-a", "team-a")));
        assert!(!tenancy.is_ensured(&pair("team-a", "shared")));
        assert!(tenancy.is_ensured(&pair("team-b", "team-b")));
    }

    #[test]
    fn own_namespace_binding_grants_the_release_role_to_its_own_account() {
        let rb = role_binding("team-a", "team-a");
        assert_eq!(rb["metadata"]["name"], "vworkspace-release");
        assert_eq!(rb["metadata"]["namespace"], "team-a");
        assert_eq!(rb["roleRef"]["kind"], "ClusterRole");
        assert_eq!(rb["roleRef"]["name"], "vworkspace-release");
        assert_eq!(
            rb["subjects"],
            json!([{"kind": "ServiceAccount", "name": "vworkspace-release", "namespace": "team-a"}])
        );
    }

    #[test]
    fn target_namespace_binding_names_the_app_namespace() {
        let rb = role_binding("shared", "team-a");
        assert_eq!(rb["metadata"]["name"], "vworkspace-release-team-a");
        assert_eq!(rb["metadata"]["namespace"], "shared");
        assert_eq!(rb["subjects"][0]["namespace"], "team-a");
    }

    #[test]
    fn account_is_never_mounted() {
        let sa = service_account("team-a");
        assert_eq!(sa["automountServiceAccountToken"], false);
        assert_eq!(sa["metadata"]["name"], "vworkspace-release");
    }

    #[test]
    fn labels_enforce_the_level_and_warn_restricted_and_nothing_else() {
        let ns = namespace_labels("team-a", "baseline");
        assert_eq!(
            ns["metadata"],
            json!({"name": "team-a", "labels": {
                "pod-security.kubernetes.io/enforce": "baseline",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            }})
        );
    }

    #[test]
    fn pod_security_flag_values() {
        assert_eq!("baseline".parse(), Ok(PodSecurityEnforce::Baseline));
        assert_eq!("restricted".parse(), Ok(PodSecurityEnforce::Restricted));
        assert_eq!("none".parse(), Ok(PodSecurityEnforce::None));
        assert!("privileged".parse::<PodSecurityEnforce>().is_err());
        assert_eq!(PodSecurityEnforce::Baseline.to_string(), "baseline");
    }
}

/// The IO of [`Tenancy::ensure`] against a scripted API server (`test-support`): the exact
/// requests, in order, and that a second call for the same namespaces makes none.
#[cfg(test)]
mod io_tests {
    use http::{Method, StatusCode};
    use test_support::Step;

    use super::*;

    /// Expects `method path` and answers with the request's own body.
    fn ok(method: Method, path: &'static str) -> Step {
        Step::echo(method, path)
    }

    fn namespace_meta(name: &str) -> Value {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": name}})
    }

    fn read_namespace(name: &'static str) -> Step {
        Step::ok(Method::GET, format!("/api/v1/namespaces/{name}"), namespace_meta(name))
    }

    /// Runs `ensure(app_ns, target_ns)` twice on one [`Tenancy`]: the first against `script`,
    /// the second (only after a success) against an empty script: it must make no request.
    async fn ensure_twice(
        level: PodSecurityEnforce,
        app_ns: &str,
        target_ns: &str,
        script: Vec<Step>,
    ) -> (
        Result<(), TenancyError>,
        Vec<Option<Value>>,
        Option<Result<(), TenancyError>>,
    ) {
        let (client, mut server) = test_support::pair();
        let metrics = controller_kit::Metrics::new("test").controller("test");
        let tenancy = Tenancy::new("test-manager", level);
        let (first, seen) = server
            .run(script, tenancy.ensure(&client, &metrics, app_ns, target_ns))
            .await
            .expect("the first ensure made exactly the scripted requests");
        let bodies = seen.into_iter().map(|s| s.body).collect();
        let second = if first.is_ok() {
            let (second, _) = server
                .run(Vec::new(), tenancy.ensure(&client, &metrics, app_ns, target_ns))
                .await
                .expect("the second ensure makes no request");
            Some(second)
        } else {
            None
        };
        (first, bodies, second)
    }

    #[tokio::test]
    async fn own_namespace_labels_account_and_binding_once() {
        let (first, bodies, second) = ensure_twice(
            PodSecurityEnforce::Baseline,
            "team-a",
            "team-a",
            vec![
                read_namespace("team-a"),
                ok(Method::PATCH, "/api/v1/namespaces/team-a"),
                ok(
                    Method::PATCH,
                    "/api/v1/namespaces/team-a/serviceaccounts/vworkspace-release",
                ),
                ok(
                    Method::PATCH,
                    "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/vworkspace-release",
                ),
            ],
        )
        .await;
        assert!(first.is_ok(), "{first:?}");
        assert!(matches!(second, Some(Ok(()))));
        assert_eq!(bodies[1], Some(namespace_labels("team-a", "baseline")));
        assert_eq!(bodies[2], Some(service_account("team-a")));
        assert_eq!(bodies[3], Some(role_binding("team-a", "team-a")));
    }

    #[tokio::test]
    async fn a_paired_target_gets_its_own_binding_and_labels() {
        let (first, bodies, _) = ensure_twice(
            PodSecurityEnforce::Restricted,
            "team-a",
            "shared",
            vec![
                read_namespace("team-a"),
                ok(Method::PATCH, "/api/v1/namespaces/team-a"),
                read_namespace("shared"),
                ok(Method::PATCH, "/api/v1/namespaces/shared"),
                ok(
                    Method::PATCH,
                    "/api/v1/namespaces/team-a/serviceaccounts/vworkspace-release",
                ),
                ok(
                    Method::PATCH,
                    "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/vworkspace-release",
                ),
                ok(
                    Method::PATCH,
                    "/apis/rbac.authorization.k8s.io/v1/namespaces/shared/rolebindings/vworkspace-release-team-a",
                ),
            ],
        )
        .await;
        assert!(first.is_ok(), "{first:?}");
        assert_eq!(bodies[3], Some(namespace_labels("shared", "restricted")));
        assert_eq!(bodies[6], Some(role_binding("shared", "team-a")));
    }

    /// Many reconciles of one namespace at once (every app after a start) ensure it once: the
    /// others wait for the first and send nothing.
    #[tokio::test]
    async fn concurrent_ensures_of_one_namespace_write_once() {
        let (client, mut server) = test_support::pair();
        let metrics = controller_kit::Metrics::new("test").controller("test");
        let tenancy = Tenancy::new("test-manager", PodSecurityEnforce::None);
        let script = vec![
            ok(
                Method::PATCH,
                "/api/v1/namespaces/team-a/serviceaccounts/vworkspace-release",
            ),
            ok(
                Method::PATCH,
                "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/vworkspace-release",
            ),
        ];
        let all = futures::future::join_all((0..8).map(|_| tenancy.ensure(&client, &metrics, "team-a", "team-a")));
        let (results, _) = server
            .run(script, all)
            .await
            .expect("eight ensures made the scripted requests once");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    /// A missing target namespace is reported before any write, so the apply cannot create it;
    /// with `none` the app's own namespace is not even read (no namespace rights needed).
    #[tokio::test]
    async fn a_missing_target_namespace_is_refused_before_any_write() {
        let (first, _, _) = ensure_twice(
            PodSecurityEnforce::None,
            "team-a",
            "gone",
            vec![Step::new(
                Method::GET,
                "/api/v1/namespaces/gone",
                StatusCode::NOT_FOUND,
                json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "namespaces \"gone\" not found", "reason": "NotFound", "code": 404
                }),
            )],
        )
        .await;
        assert!(
            matches!(&first, Err(TenancyError::NamespaceNotFound(ns)) if ns == "gone"),
            "{first:?}"
        );
    }

    /// A refused write (e.g. Forbidden) is an error naming the object.
    #[tokio::test]
    async fn a_forbidden_write_is_reported_and_not_remembered() {
        let forbidden = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "rolebindings.rbac.authorization.k8s.io is forbidden", "reason": "Forbidden", "code": 403
        });
        let (first, _, second) = ensure_twice(
            PodSecurityEnforce::None,
            "team-a",
            "team-a",
            vec![
                ok(
                    Method::PATCH,
                    "/api/v1/namespaces/team-a/serviceaccounts/vworkspace-release",
                ),
                Step::new(
                    Method::PATCH,
                    "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/vworkspace-release",
                    StatusCode::FORBIDDEN,
                    forbidden,
                ),
            ],
        )
        .await;
        let message = first.as_ref().map_err(ToString::to_string).err().unwrap_or_default();
        assert!(
            message.starts_with("applying RoleBinding team-a/vworkspace-release: "),
            "{message}"
        );
        assert!(second.is_none(), "a failed ensure is not repeated by the helper");
    }
}
