//! Metadata every child of an Operation carries: labels linking it back, the
//! owner reference (only where one is valid), and the check that an existing
//! object with a child's name really is that child.
//!
//! The check matters because names are derived from the Operation's name: an
//! Operation deleted and re-created under the same name would otherwise adopt
//! the children of its predecessor (a Velero Backup outlives its Operation),
//! and report their outcome as its own.

use std::collections::BTreeMap;

use api::{LABEL_MANAGED_BY, MANAGED_BY, ObjectReference, Operation, OperationType};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Map, Value, json};

use crate::{Error, names};

/// Name of the Operation an object was created for.
pub const LABEL_OPERATION: &str = "vworkspace.io/operation";
/// Namespace of that Operation (Velero objects live elsewhere).
pub const LABEL_OPERATION_NAMESPACE: &str = "vworkspace.io/operation-namespace";
/// UID of that Operation: tells a child from the leftover of an earlier Operation of the same name.
pub const LABEL_OPERATION_UID: &str = "vworkspace.io/operation-uid";
/// The Operation's `requestId`, as a label value ([`names::label_value`]); the exact value is
/// in the annotation of the same key.
pub const LABEL_REQUEST_ID: &str = "vworkspace.io/request-id";
/// Annotation carrying the exact `requestId` (a label value cannot hold every requestId).
pub const ANNOTATION_REQUEST_ID: &str = "vworkspace.io/request-id";
/// Name of the ApplicationInstance the Operation acts on.
pub const LABEL_APPLICATION: &str = "vworkspace.io/application";
/// Kind of the Operation (`Backup`, `Restore`, …).
pub const LABEL_OPERATION_TYPE: &str = "vworkspace.io/operation-type";

/// The identity of an Operation, checked once: objects read from the API server always
/// have a name, namespace and UID; a hand-built one may not, which is an error, not a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpId<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `spec.requestId`.
    pub request_id: &'a str,
    /// `spec.applicationRef.name`.
    pub application: &'a str,
    /// `spec.type`.
    pub type_: OperationType,
}

impl<'a> OpId<'a> {
    /// The identity of `op`, or [`Error::MissingMetadata`].
    pub fn of(op: &'a Operation) -> Result<Self, Error> {
        let field = |value: &'a Option<String>, field| {
            value
                .as_deref()
                .filter(|v| !v.is_empty())
                .ok_or(Error::missing("Operation", field))
        };
        Ok(Self {
            name: field(&op.metadata.name, "name")?,
            namespace: field(&op.metadata.namespace, "namespace")?,
            uid: field(&op.metadata.uid, "uid")?,
            request_id: &op.spec.request_id,
            application: &op.spec.application_ref.name,
            type_: op.spec.type_,
        })
    }

    /// `<namespace>/<name>`, for messages.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Labels of every child of `op`.
pub fn labels(op: &OpId<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_OPERATION.to_owned(), names::label_value(op.name)),
        (LABEL_OPERATION_NAMESPACE.to_owned(), op.namespace.to_owned()),
        (LABEL_OPERATION_UID.to_owned(), names::label_value(op.uid)),
        (LABEL_REQUEST_ID.to_owned(), names::label_value(op.request_id)),
        (LABEL_APPLICATION.to_owned(), op.application.to_owned()),
        (LABEL_OPERATION_TYPE.to_owned(), op.type_.as_str().to_owned()),
    ])
}

/// Annotations of every child of `op`.
pub fn annotations(op: &OpId<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([(ANNOTATION_REQUEST_ID.to_owned(), op.request_id.to_owned())])
}

/// Controller owner reference to `op`. Valid only on objects in the Operation's own
/// namespace: the garbage collector treats a cross-namespace owner as absent and deletes
/// the dependent, so callers add it only when the namespaces match.
pub fn owner_reference(op: &OpId<'_>) -> OwnerReference {
    OwnerReference {
        api_version: api::API_VERSION.to_owned(),
        kind: "Operation".to_owned(),
        name: op.name.to_owned(),
        uid: op.uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// `metadata` of a child named `name` in `namespace`: labels, annotations, and the owner
/// reference when `namespace` is the Operation's own.
pub fn child_metadata(op: &OpId<'_>, name: &str, namespace: &str) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(namespace));
    meta.insert("labels".into(), json!(labels(op)));
    meta.insert("annotations".into(), json!(annotations(op)));
    if namespace == op.namespace {
        let owner = owner_reference(op);
        meta.insert(
            "ownerReferences".into(),
            json!([{
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }]),
        );
    }
    Value::Object(meta)
}

/// Whether an existing object (as JSON) is a child of `op`: it carries `op`'s UID label.
///
/// An object with the child's name but another (or no) UID is someone else's: a leftover
/// of an earlier Operation with the same name, or an object nobody told us about. It must
/// be neither adopted nor overwritten; the engine fails the Operation instead.
pub fn is_child_of(object: &Value, op: &OpId<'_>) -> bool {
    object
        .pointer("/metadata/labels")
        .and_then(|labels| labels.get(LABEL_OPERATION_UID))
        .and_then(Value::as_str)
        .is_some_and(|uid| uid == names::label_value(op.uid))
}

/// The parent Operation named by an Operation's owner references (the controller one if
/// several point at Operations), for child Operations such as an Upgrade's backup.
pub fn parent_operation(meta: &ObjectMeta) -> Option<&str> {
    let is_operation =
        |owner: &&OwnerReference| owner.kind == "Operation" && owner.api_version.split('/').next() == Some(api::GROUP);
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    owners
        .iter()
        .filter(is_operation)
        .find(|owner| owner.controller == Some(true))
        .or_else(|| owners.iter().find(is_operation))
        .map(|owner| owner.name.as_str())
}

/// A reference for `status.children`.
pub fn object_ref(api_version: &str, kind: &str, name: &str, namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
    }
}

/// The `status.children` reference of an object built by this crate (or read back).
pub fn reference_of(object: &Value) -> Option<ObjectReference> {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    Some(ObjectReference {
        api_version: text("/apiVersion")?.to_owned(),
        kind: text("/kind")?.to_owned(),
        name: text("/metadata/name")?.to_owned(),
        namespace: text("/metadata/namespace").map(str::to_owned),
    })
}

/// `<namespace>/<name>` of an object, for messages (`?` for what is missing).
pub(crate) fn display_name(object: &Value) -> String {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).unwrap_or("?");
    match object.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(namespace) => format!("{namespace}/{}", text("/metadata/name")),
        None => text("/metadata/name").to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use api::{ApplicationReference, OperationSpec};

    /// An Operation as read from the API server.
    pub(crate) fn op(name: &str, type_: OperationType) -> Operation {
        let mut op = Operation::new(
            name,
            OperationSpec {
                type_,
                application_ref: ApplicationReference {
                    name: "nextcloud".into(),
                },
                request_id: "odoo:op:4711".into(),
                ..Default::default()
            },
        );
        op.metadata.namespace = Some("team-a".into());
        op.metadata.uid = Some(format!("uid-{name}"));
        op.metadata.generation = Some(1);
        op
    }

    #[test]
    fn op_id_requires_metadata() {
        let full = op("b", OperationType::Backup);
        let id = OpId::of(&full).expect("complete");
        assert_eq!(id.display(), "team-a/b");
        assert_eq!(id.request_id, "odoo:op:4711");

        type Breaker = fn(&mut Operation);
        let cases: [(&str, Breaker); 4] = [
            ("name", |o| o.metadata.name = None),
            ("namespace", |o| o.metadata.namespace = None),
            ("uid", |o| o.metadata.uid = None),
            ("uid", |o| o.metadata.uid = Some(String::new())),
        ];
        for (field, breaker) in cases {
            let mut broken = full.clone();
            breaker(&mut broken);
            assert_eq!(OpId::of(&broken), Err(Error::missing("Operation", field)));
        }
    }

    #[test]
    fn labels_and_owner() {
        let op = op("nextcloud-backup", OperationType::Backup);
        let id = OpId::of(&op).expect("complete");
        let labels = labels(&id);
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(labels[LABEL_OPERATION], "nextcloud-backup");
        assert_eq!(labels[LABEL_OPERATION_NAMESPACE], "team-a");
        assert_eq!(labels[LABEL_OPERATION_UID], "uid-nextcloud-backup");
        assert_eq!(labels[LABEL_APPLICATION], "nextcloud");
        assert_eq!(labels[LABEL_OPERATION_TYPE], "Backup");
        assert!(labels[LABEL_REQUEST_ID].starts_with("odoo-op-4711-"));
        assert!(labels.values().all(|v| names::is_label_value(v)));
        assert_eq!(annotations(&id)[ANNOTATION_REQUEST_ID], "odoo:op:4711");

        let same_ns = child_metadata(&id, "child", "team-a");
        assert_eq!(same_ns["ownerReferences"][0]["uid"], "uid-nextcloud-backup");
        assert_eq!(same_ns["ownerReferences"][0]["apiVersion"], "vworkspace.io/v1alpha1");
        assert_eq!(same_ns["ownerReferences"][0]["controller"], true);
        let other_ns = child_metadata(&id, "child", "velero");
        assert!(other_ns.get("ownerReferences").is_none());
        assert_eq!(other_ns["labels"][LABEL_OPERATION], "nextcloud-backup");
    }

    #[test]
    fn is_child_of_table() {
        let op = op("b", OperationType::Backup);
        let id = OpId::of(&op).expect("complete");
        let cases = [
            (json!({"metadata": {"labels": {LABEL_OPERATION_UID: "uid-b"}}}), true),
            (
                json!({"metadata": {"labels": {LABEL_OPERATION_UID: "uid-other"}}}),
                false,
            ),
            (json!({"metadata": {"labels": {LABEL_OPERATION: "b"}}}), false),
            (json!({"metadata": {}}), false),
            (json!({}), false),
        ];
        for (object, expected) in cases {
            assert_eq!(is_child_of(&object, &id), expected, "{object}");
        }
    }

    #[test]
    fn parent_operation_table() {
        let owner = |kind: &str, api_version: &str, name: &str, controller: Option<bool>| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        };
        let cases = [
            (vec![], None),
            (
                vec![owner("Operation", "vworkspace.io/v1alpha1", "up", Some(true))],
                Some("up"),
            ),
            (
                vec![owner("Operation", "vworkspace.io/v1alpha1", "up", None)],
                Some("up"),
            ),
            (vec![owner("Operation", "other.io/v1", "up", Some(true))], None),
            (vec![owner("Deployment", "apps/v1", "d", Some(true))], None),
            (
                vec![
                    owner("Operation", "vworkspace.io/v1alpha1", "plain", None),
                    owner("Operation", "vworkspace.io/v1alpha1", "ctrl", Some(true)),
                ],
                Some("ctrl"),
            ),
        ];
        for (owners, expected) in cases {
            let meta = ObjectMeta {
                owner_references: Some(owners),
                ..Default::default()
            };
            assert_eq!(parent_operation(&meta), expected);
        }
        assert_eq!(parent_operation(&ObjectMeta::default()), None);
    }

    #[test]
    fn references() {
        let object = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"}});
        assert_eq!(reference_of(&object), Some(object_ref("batch/v1", "Job", "j", "ns")));
        assert_eq!(reference_of(&json!({"kind": "Job"})), None);
        assert_eq!(display_name(&object), "ns/j");
        assert_eq!(display_name(&json!({"metadata": {"name": "c"}})), "c");
        assert_eq!(display_name(&json!({})), "?");
    }
}
