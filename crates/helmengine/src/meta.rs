//! Engine-neutral metadata every object we create carries: labels, the owner
//! reference to the ApplicationInstance, and the rule that decides whether an
//! existing object with the name we want is ours to write or delete.
//!
//! The rule matters because the engine objects are named after the
//! ApplicationInstance: a HelmRelease or HelmRepository of that name may
//! already exist and belong to someone else. Server-side apply with `force`
//! would silently take it over, so every write and every delete first checks
//! [`ownership`].

use api::{ApplicationInstance, LABEL_MANAGED_BY, MANAGED_BY};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

use crate::EngineError;

/// The standard label keys live in the api crate, shared by every controller.
pub use api::{LABEL_COMPONENT, LABEL_INSTANCE, LABEL_PART_OF, PART_OF};
/// [`LABEL_COMPONENT`] of the object the engine reconciles (a Flux HelmRelease).
pub const COMPONENT_HELM_RELEASE: &str = "helm-release";
/// [`LABEL_COMPONENT`] of the chart source we manage (a Flux HelmRepository or OCIRepository).
pub const COMPONENT_CHART_SOURCE: &str = "chart-source";

/// Name and namespace of an ApplicationInstance, checked once.
///
/// Objects read from the API server always have both; a hand-built object in a
/// test or a caller bug may not, and that must be an error rather than a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppId<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.namespace`.
    pub namespace: &'a str,
}

impl<'a> AppId<'a> {
    /// Name and namespace of `app`, or `InvalidSpec` if either is missing.
    pub fn of(app: &'a ApplicationInstance) -> Result<Self, EngineError> {
        let name = app.metadata.name.as_deref().filter(|n| !n.is_empty());
        let namespace = app.metadata.namespace.as_deref().filter(|n| !n.is_empty());
        match (name, namespace) {
            (Some(name), Some(namespace)) => Ok(Self { name, namespace }),
            _ => Err(EngineError::InvalidSpec(
                "the ApplicationInstance has no metadata.name or metadata.namespace".into(),
            )),
        }
    }
}

/// FNV-1a (64 bit) as 16 hex digits: a short, stable digest for change detection
/// (desired-state hashes, reference tokens). Not cryptographic; written out so values
/// never change between Rust versions.
pub fn fnv1a_hex(bytes: impl IntoIterator<Item = u8>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The labels of an object created for `app_name` with the given component.
pub fn labels(app_name: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_INSTANCE.to_owned(), app_name.to_owned()),
        (LABEL_PART_OF.to_owned(), PART_OF.to_owned()),
        (LABEL_COMPONENT.to_owned(), component.to_owned()),
    ])
}

/// The labels of an object shared by several apps (no instance label), with the given component.
pub fn shared_labels(component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_PART_OF.to_owned(), PART_OF.to_owned()),
        (LABEL_COMPONENT.to_owned(), component.to_owned()),
    ])
}

/// Whether `meta` is a shared object of ours with the given component (see
/// [`shared_labels`]): our labels, no instance label, no controller. Anything else with its
/// name is someone else's and is never written.
pub fn is_shared_by_us(meta: &ObjectMeta, component: &str) -> bool {
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let controlled = meta
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true));
    label(LABEL_MANAGED_BY) == Some(MANAGED_BY)
        && label(LABEL_COMPONENT) == Some(component)
        && label(LABEL_INSTANCE).is_none()
        && !controlled
}

/// Controller owner reference to `app`, with `blockOwnerDeletion` so a
/// foreground deletion of the app waits for its engine objects.
///
/// The owner reference is a backstop: the reconciler deletes engine objects
/// explicitly (see [`crate::Engine::delete`]), but if the ApplicationInstance
/// vanishes without its finalizer running, garbage collection still removes
/// them, which for a HelmRelease still uninstalls the release.
pub fn owner_reference(app: &ApplicationInstance) -> Result<OwnerReference, EngineError> {
    let mut owner = app.controller_owner_ref(&()).ok_or_else(|| {
        EngineError::InvalidSpec("the ApplicationInstance has no metadata.uid (it was not read from the API)".into())
    })?;
    owner.block_owner_deletion = Some(true);
    Ok(owner)
}

/// How an existing object relates to the ApplicationInstance that wants its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Controlled by this ApplicationInstance (same UID): ours to write and delete.
    Ours,
    /// Labelled as ours for this instance name but with no controller: left behind by an
    /// earlier ApplicationInstance deleted with `propagationPolicy: Orphan`. Adopted on
    /// write (the apply adds our owner reference); never deleted on its own.
    Orphaned,
    /// Someone else's object (another controller, a user, or an earlier
    /// ApplicationInstance of the same name that is still being deleted). Never touched.
    Foreign,
}

/// Classifies `meta` with respect to `app` (see [`Ownership`]). Whether the
/// object is being deleted is a separate question ([`is_terminating`]).
pub fn ownership(meta: &ObjectMeta, app: &ApplicationInstance) -> Ownership {
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true));
    match controller {
        Some(owner) if app.uid().as_deref() == Some(owner.uid.as_str()) => Ownership::Ours,
        Some(_) => Ownership::Foreign,
        None if labelled_for(meta, &app.name_any()) => Ownership::Orphaned,
        None => Ownership::Foreign,
    }
}

/// Whether the object has a deletion timestamp (its finalizers are running).
pub fn is_terminating(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// Splits the part of an `http(s)://` or `oci://` chart repository URL after the scheme
/// into `host[:port]` and path, refusing a URL without a host or with credentials in it
/// (everyone who can read the app would see them). `credentials_advice`, when given, is
/// appended to that refusal: where the engine takes repository credentials instead.
pub fn check_repository_authority<'a>(
    rest: &'a str,
    credentials_advice: Option<&str>,
) -> Result<(&'a str, &'a str), EngineError> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.contains('@') {
        let advice = credentials_advice.map(|a| format!("; {a}")).unwrap_or_default();
        return Err(EngineError::InvalidSpec(format!(
            "chart.repository.url must not embed credentials{advice}"
        )));
    }
    if authority.is_empty() {
        return Err(EngineError::InvalidSpec("chart.repository.url has no host".into()));
    }
    Ok((authority, path))
}

/// Whether `meta` carries our managed-by label and the instance label of `app_name`.
fn labelled_for(meta: &ObjectMeta, app_name: &str) -> bool {
    let labels = meta.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    label(LABEL_MANAGED_BY) == Some(MANAGED_BY) && label(LABEL_INSTANCE) == Some(app_name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(super::fnv1a_hex(*b""), "cbf29ce484222325");
        assert_eq!(super::fnv1a_hex(*b"a"), "af63dc4c8601ec8c");
    }

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn app() -> ApplicationInstance {
        let mut app = ApplicationInstance::new("wiki", Default::default());
        app.metadata.namespace = Some("team-a".into());
        app.metadata.uid = Some("uid-1".into());
        app
    }

    fn controller(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "vworkspace.io/v1alpha1".into(),
            kind: "ApplicationInstance".into(),
            name: "wiki".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn ownership_table() {
        let ours_labels = Some(labels("wiki", COMPONENT_HELM_RELEASE));
        let cases = [
            ("no owner, no labels", ObjectMeta::default(), Ownership::Foreign),
            (
                "our controller",
                ObjectMeta {
                    owner_references: Some(vec![controller("uid-1")]),
                    ..Default::default()
                },
                Ownership::Ours,
            ),
            (
                "another controller even with our labels",
                ObjectMeta {
                    owner_references: Some(vec![controller("uid-old")]),
                    labels: ours_labels.clone(),
                    ..Default::default()
                },
                Ownership::Foreign,
            ),
            (
                "non-controller owner with our uid",
                ObjectMeta {
                    owner_references: Some(vec![OwnerReference {
                        controller: None,
                        ..controller("uid-1")
                    }]),
                    ..Default::default()
                },
                Ownership::Foreign,
            ),
            (
                "our labels, no owner",
                ObjectMeta {
                    labels: ours_labels.clone(),
                    ..Default::default()
                },
                Ownership::Orphaned,
            ),
            (
                "labels of another instance",
                ObjectMeta {
                    labels: Some(labels("other", COMPONENT_HELM_RELEASE)),
                    ..Default::default()
                },
                Ownership::Foreign,
            ),
        ];
        for (name, meta, want) in cases {
            assert_eq!(ownership(&meta, &app()), want, "{name}");
        }
    }

    #[test]
    fn terminating_is_independent_of_ownership() {
        let meta = ObjectMeta {
            owner_references: Some(vec![controller("uid-1")]),
            deletion_timestamp: Some(Time(Default::default())),
            ..Default::default()
        };
        assert_eq!(ownership(&meta, &app()), Ownership::Ours);
        assert!(is_terminating(&meta));
        assert!(!is_terminating(&ObjectMeta::default()));
    }

    #[test]
    fn owner_reference_is_controller_and_blocks_deletion() {
        assert_eq!(owner_reference(&app()).unwrap(), controller("uid-1"));
        let mut no_uid = app();
        no_uid.metadata.uid = None;
        assert!(matches!(owner_reference(&no_uid), Err(EngineError::InvalidSpec(_))));
    }

    #[test]
    fn repository_authority_splits_and_refuses_credentials_and_empty_hosts() {
        assert_eq!(
            check_repository_authority("ghcr.io:443/charts/wiki", None).unwrap(),
            ("ghcr.io:443", "charts/wiki")
        );
        assert_eq!(
            check_repository_authority("charts.example.com", None).unwrap(),
            ("charts.example.com", "")
        );
        let message = |rest, advice| check_repository_authority(rest, advice).err().map(|e| e.to_string());
        assert_eq!(
            message("user:pw@charts.example.com", None).as_deref(),
            Some("chart.repository.url must not embed credentials")
        );
        assert_eq!(
            message("user:pw@charts.example.com", Some("use a Secret")).as_deref(),
            Some("chart.repository.url must not embed credentials; use a Secret")
        );
        assert_eq!(
            message("/charts", None).as_deref(),
            Some("chart.repository.url has no host")
        );
    }

    #[test]
    fn app_id_requires_name_and_namespace() {
        assert_eq!(
            AppId::of(&app()).unwrap(),
            AppId {
                name: "wiki",
                namespace: "team-a"
            }
        );
        let mut no_ns = app();
        no_ns.metadata.namespace = None;
        assert!(matches!(AppId::of(&no_ns), Err(EngineError::InvalidSpec(_))));
    }
}
