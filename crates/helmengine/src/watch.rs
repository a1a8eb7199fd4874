//! Which engine objects the ApplicationInstance controller watches, and how an event on one
//! finds the ApplicationInstance it belongs to.
//!
//! The engine owns this knowledge ([`Engine::watched_kinds`](crate::Engine::watched_kinds)),
//! so the controller's wiring names no engine type: it opens one metadata-only watch per
//! [`WatchedKind`] and maps each object back with [`owners`].
//!
//! Two links exist because engines place their objects differently: Flux's live beside the
//! ApplicationInstance and carry a controller owner reference to it; Argo CD's live in Argo
//! CD's own namespace, where an owner reference cannot point (owner references never cross
//! namespaces), so they carry labels naming the ApplicationInstance instead.

use api::{API_VERSION, ApplicationInstance, LABEL_INSTANCE};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource as _, api::ApiResource};

use crate::ObjectCache;

/// Label naming the namespace of the ApplicationInstance an object in another namespace
/// belongs to (with [`LABEL_INSTANCE`] naming the ApplicationInstance itself).
pub const LABEL_INSTANCE_NAMESPACE: &str = "vworkspace.io/instance-namespace";

/// One kind of engine object whose changes should wake the ApplicationInstance it belongs to.
#[derive(Debug, Clone)]
pub struct WatchedKind {
    /// The resource to watch (metadata only).
    pub resource: ApiResource,
    /// Where the objects live.
    pub place: WatchPlace,
    /// How an object names its ApplicationInstance.
    pub link: OwnerLink,
    /// For kinds with few objects, each read by many apps (shared chart sources): the
    /// controller watches whole objects, wakes the apps only when what they see changes,
    /// and keeps the engine's cache of them. `None`: metadata only, every change wakes.
    pub whole: Option<WholeObjects>,
}

/// How a kind watched whole ([`WatchedKind::whole`]) is handled.
#[derive(Debug, Clone)]
pub struct WholeObjects {
    /// What the apps see of an object: they wake only when this changes (not on a
    /// finalizer, an annotation or a status detail no app reports).
    pub readers_see: ReadersSee,
    /// The engine's cache of these objects, which the controller's watch fills; the engine
    /// reads them from it instead of from the API server.
    pub cache: ObjectCache,
}

/// A fingerprint of what the ApplicationInstances reading from an object see of it
/// (see [`WholeObjects::readers_see`]); equal fingerprints, equal status for them.
pub type ReadersSee = fn(&kube::api::DynamicObject) -> u64;

/// Where the objects of a [`WatchedKind`] live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchPlace {
    /// Beside the ApplicationInstances: watched in the controller's own watch scope.
    WithTheApplications,
    /// In this one namespace (the engine's own), whatever the controller's watch scope.
    Namespace(String),
}

/// How an engine object names the ApplicationInstance it belongs to.
#[derive(Debug, Clone, Copy)]
pub enum OwnerLink {
    /// A controller owner reference (same namespace).
    ControllerOwnerReference,
    /// The labels [`LABEL_INSTANCE_NAMESPACE`] and [`LABEL_INSTANCE`] (any namespace).
    InstanceLabels,
    /// None: the object serves many applications (a shared chart source). The ones it
    /// belongs to are those for which the function says their spec reads from it; the
    /// controller asks it of every ApplicationInstance it holds ([`owners`] finds none).
    ReadBy(ReadsFrom),
}

/// Whether an ApplicationInstance's spec reads from the object (see [`OwnerLink::ReadBy`]).
/// Pure and cheap: it runs for every ApplicationInstance on each event of the object.
pub type ReadsFrom = fn(&ApplicationInstance, &api::ObjectReference) -> bool;

/// Namespace and name of an ApplicationInstance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceKey {
    /// Namespace of the ApplicationInstance.
    pub namespace: String,
    /// Name of the ApplicationInstance.
    pub name: String,
}

/// The ApplicationInstances the object with `meta` belongs to through `link` (at most one
/// in practice; empty when it names none).
pub fn owners(link: OwnerLink, meta: &ObjectMeta) -> Vec<InstanceKey> {
    match link {
        OwnerLink::ControllerOwnerReference => {
            let Some(namespace) = meta.namespace.as_deref() else {
                return Vec::new();
            };
            let kind = ApplicationInstance::kind(&());
            meta.owner_references
                .iter()
                .flatten()
                .filter(|owner| owner.controller == Some(true))
                .filter(|owner| owner.kind == kind && owner.api_version == API_VERSION)
                .map(|owner| InstanceKey {
                    namespace: namespace.to_owned(),
                    name: owner.name.clone(),
                })
                .collect()
        }
        OwnerLink::ReadBy(_) => Vec::new(),
        OwnerLink::InstanceLabels => {
            let labels = meta.labels.as_ref();
            let label = |key: &str| labels.and_then(|l| l.get(key)).filter(|v| !v.is_empty());
            match (label(LABEL_INSTANCE_NAMESPACE), label(LABEL_INSTANCE)) {
                (Some(namespace), Some(name)) => vec![InstanceKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                }],
                _ => Vec::new(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn owner(kind: &str, api_version: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "wiki".into(),
            uid: "u".into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    fn key(namespace: &str, name: &str) -> InstanceKey {
        InstanceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn owner_reference_links() {
        let meta = |owners: Vec<OwnerReference>| ObjectMeta {
            namespace: Some("team-a".into()),
            owner_references: Some(owners),
            ..Default::default()
        };
        let cases = [
            (
                "our controller",
                meta(vec![owner("ApplicationInstance", API_VERSION, true)]),
                vec![key("team-a", "wiki")],
            ),
            (
                "not the controller",
                meta(vec![owner("ApplicationInstance", API_VERSION, false)]),
                vec![],
            ),
            ("another kind", meta(vec![owner("Deployment", "apps/v1", true)]), vec![]),
            (
                "another group's ApplicationInstance",
                meta(vec![owner("ApplicationInstance", "example.com/v1", true)]),
                vec![],
            ),
        ];
        for (name, meta, expected) in cases {
            assert_eq!(owners(OwnerLink::ControllerOwnerReference, &meta), expected, "{name}");
        }
    }

    #[test]
    fn label_links() {
        let meta = |pairs: &[(&str, &str)]| ObjectMeta {
            namespace: Some("argocd".into()),
            labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        };
        let cases = [
            (
                "both labels",
                meta(&[(LABEL_INSTANCE_NAMESPACE, "team-a"), (LABEL_INSTANCE, "wiki")]),
                vec![key("team-a", "wiki")],
            ),
            ("no namespace label", meta(&[(LABEL_INSTANCE, "wiki")]), vec![]),
            (
                "empty name",
                meta(&[(LABEL_INSTANCE_NAMESPACE, "team-a"), (LABEL_INSTANCE, "")]),
                vec![],
            ),
            ("no labels", ObjectMeta::default(), vec![]),
        ];
        for (name, meta, expected) in cases {
            assert_eq!(owners(OwnerLink::InstanceLabels, &meta), expected, "{name}");
        }
    }
}
