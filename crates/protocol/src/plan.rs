//! From a validated document to the actions the agent takes, with the two cluster-side
//! rules that do not depend on the API server:
//!
//! * **Deletion only by explicit intent.** The only deletions are the document's
//!   `deletions` entries. An object that exists in the cluster but is missing from the
//!   document, or a document that is empty, deletes nothing ([`plan`] never looks at the
//!   cluster at all).
//! * **The namespace allow-list is the cluster owner's.** Every entry whose namespace (or,
//!   for an application, `spec.targetNamespace`) the agent may not touch is refused with
//!   `NamespaceNotAllowed`, whatever Odoo asked.

use crate::messages::{
    ApplicationIntent, DeletionIntent, DesiredState, ObjectAck, ObjectKind, ObjectOutcome, OperationIntent, reasons,
};

/// One action on the cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Action<'a> {
    /// Server-side apply an ApplicationInstance.
    ApplyApplication(&'a ApplicationIntent),
    /// Create an Operation (or confirm an identical one exists).
    CreateOperation(&'a OperationIntent),
    /// Delete an object named by an explicit deletion intent.
    Delete(&'a DeletionIntent),
    /// Do nothing and acknowledge this refusal.
    Refuse(Box<ObjectAck>),
}

/// The actions for a validated document, in document order: applications, operations,
/// deletions. `allows(namespace)` is the agent's namespace policy.
pub fn plan<'a>(doc: &'a DesiredState, allows: impl Fn(&str) -> bool) -> Vec<Action<'a>> {
    let refuse = |kind: ObjectKind, namespace: &str, name: &str, message: String| {
        Action::Refuse(Box::new(ObjectAck {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            outcome: ObjectOutcome::Refused,
            reason: Some(reasons::NAMESPACE_NOT_ALLOWED.to_owned()),
            message: Some(message),
            uid: None,
            generation: None,
            conflict: None,
        }))
    };
    let mut actions = Vec::with_capacity(doc.applications.len() + doc.operations.len() + doc.deletions.len());
    for app in &doc.applications {
        let target = app.spec.target_namespace_or(&app.namespace);
        actions.push(if !allows(&app.namespace) {
            refuse(
                ObjectKind::ApplicationInstance,
                &app.namespace,
                &app.name,
                format!("namespace {:?} is not in the agent's allow-list", app.namespace),
            )
        } else if !allows(target) {
            refuse(
                ObjectKind::ApplicationInstance,
                &app.namespace,
                &app.name,
                format!("target namespace {target:?} is not in the agent's allow-list"),
            )
        } else {
            Action::ApplyApplication(app)
        });
    }
    for op in &doc.operations {
        actions.push(if allows(&op.namespace) {
            Action::CreateOperation(op)
        } else {
            refuse(
                ObjectKind::Operation,
                &op.namespace,
                &op.name,
                format!("namespace {:?} is not in the agent's allow-list", op.namespace),
            )
        });
    }
    for del in &doc.deletions {
        actions.push(if allows(&del.namespace) {
            Action::Delete(del)
        } else {
            refuse(
                del.kind,
                &del.namespace,
                &del.name,
                format!("namespace {:?} is not in the agent's allow-list", del.namespace),
            )
        });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::ObjectKey;

    fn doc(json: serde_json::Value) -> DesiredState {
        serde_json::from_value(json).unwrap()
    }

    fn app(ns: &str, name: &str) -> serde_json::Value {
        serde_json::json!({"namespace": ns, "name": name,
            "spec": {"chart": {"name": "wiki", "repository": {"url": "https://charts.example.com"}}}})
    }

    fn deleted_keys(actions: &[Action<'_>]) -> Vec<ObjectKey> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete(d) => Some(ObjectKey {
                    kind: d.kind,
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_empty_document_deletes_nothing() {
        let d = doc(serde_json::json!({"epoch": "e", "revision": 9}));
        assert!(plan(&d, |_| true).is_empty());
    }

    #[test]
    fn a_partial_document_deletes_nothing_and_deletions_are_exactly_the_explicit_ones() {
        let d = doc(serde_json::json!({"epoch": "e", "revision": 2,
            "applications": [app("team-a", "kept")],
            "deletions": [{"kind": "ApplicationInstance", "namespace": "team-a", "name": "gone"},
                          {"kind": "Operation", "namespace": "team-a", "name": "old-op", "uid": "u-1"}]}));
        let actions = plan(&d, |_| true);
        assert_eq!(actions.len(), 3);
        assert!(matches!(actions[0], Action::ApplyApplication(a) if a.name == "kept"));
        let keys: Vec<String> = deleted_keys(&actions).iter().map(ToString::to_string).collect();
        assert_eq!(keys, ["ApplicationInstance/team-a/gone", "Operation/team-a/old-op"]);
    }

    #[test]
    fn namespaces_outside_the_allow_list_are_refused() {
        let mut other_target = app("team-a", "escape");
        other_target["spec"]["targetNamespace"] = "kube-system".into();
        let d = doc(serde_json::json!({"epoch": "e", "revision": 2,
            "applications": [app("team-a", "ok"), app("team-b", "nope"), other_target],
            "operations": [{"namespace": "team-b", "name": "op", "spec":
                {"type": "Backup", "applicationRef": {"name": "nope"}, "requestId": "r1"}}],
            "deletions": [{"kind": "ApplicationInstance", "namespace": "team-b", "name": "x"}]}));
        let actions = plan(&d, |ns| ns == "team-a");
        assert!(matches!(actions[0], Action::ApplyApplication(_)));
        let refusals: Vec<(String, String)> = actions[1..]
            .iter()
            .map(|a| match a {
                Action::Refuse(ack) => (
                    format!("{}/{}", ack.namespace, ack.name),
                    ack.message.clone().unwrap_or_default(),
                ),
                other => panic!("expected a refusal, got {other:?}"),
            })
            .collect();
        assert_eq!(refusals.len(), 4);
        assert!(
            refusals[1].1.contains("target namespace \"kube-system\""),
            "{refusals:?}"
        );
        assert!(actions[1..].iter().all(|a| matches!(a, Action::Refuse(ack)
            if ack.outcome == ObjectOutcome::Refused && ack.reason.as_deref() == Some("NamespaceNotAllowed"))));
        assert!(deleted_keys(&actions).is_empty());
    }
}
