//! `kubectl vws trace`: ApplicationInstance → engine object (HelmRelease or Argo CD
//! Application) → chart source → workloads, each with its Ready state, like `flux trace`
//! read downwards.

use serde_json::Value;

use crate::table::printable;

/// One object in the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `Kind/namespace/name` (or `Kind/name` for a cluster-scoped object).
    pub object: String,
    /// `True`, `False`, `Unknown`, `2/3`, or `-` when the object says nothing.
    pub ready: String,
    /// The reason and message of its Ready (or health) state.
    pub detail: String,
    pub children: Vec<Node>,
}

impl Node {
    /// A node for an object that does not exist (yet, or any more).
    pub fn missing(object: String) -> Self {
        Self {
            object,
            ready: "-".to_owned(),
            detail: "not found".to_owned(),
            children: Vec::new(),
        }
    }
}

/// `Kind/namespace/name` of a JSON object.
pub fn object_id(object: &Value) -> String {
    let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
    let (kind, namespace, name) = (text("/kind"), text("/metadata/namespace"), text("/metadata/name"));
    if namespace.is_empty() {
        format!("{kind}/{name}")
    } else {
        format!("{kind}/{namespace}/{name}")
    }
}

/// The `Ready` condition of a Kubernetes-style object, if it has one.
pub fn ready_condition(object: &Value) -> Option<&Value> {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == "Ready"))
}

/// The node of a Kubernetes-style object with a `Ready` condition (ApplicationInstance,
/// HelmRelease, HelmRepository, OCIRepository, HelmChart).
pub fn with_ready_condition(object: &Value) -> Node {
    let ready = ready_condition(object);
    let field = |c: &Value, f: &str| c.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
    let (state, detail) = match ready {
        Some(c) => (field(c, "status"), join(&field(c, "reason"), &field(c, "message"))),
        None => ("-".to_owned(), "no Ready condition yet".to_owned()),
    };
    Node {
        object: object_id(object),
        ready: state,
        detail,
        children: Vec::new(),
    }
}

/// The node of an Argo CD Application: its health and sync state.
pub fn argocd_application(object: &Value) -> Node {
    let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
    let health = text("/status/health/status");
    let sync = text("/status/sync/status");
    Node {
        object: object_id(object),
        ready: match health.as_str() {
            "Healthy" => "True".to_owned(),
            "" => "-".to_owned(),
            _ => "False".to_owned(),
        },
        detail: join(
            &format!("health {}, sync {}", dash(&health), dash(&sync)),
            &text("/status/health/message"),
        ),
        children: Vec::new(),
    }
}

/// The node of a Deployment, StatefulSet or DaemonSet: ready replicas out of desired.
pub fn workload(object: &Value) -> Node {
    let int = |p: &str| object.pointer(p).and_then(Value::as_i64);
    let (ready, desired) = match object.get("kind").and_then(Value::as_str) {
        Some("DaemonSet") => (int("/status/numberReady"), int("/status/desiredNumberScheduled")),
        _ => (int("/status/readyReplicas"), int("/spec/replicas")),
    };
    let (ready, desired) = (ready.unwrap_or(0), desired.unwrap_or(1));
    Node {
        object: object_id(object),
        ready: format!("{ready}/{desired}"),
        detail: if ready >= desired {
            "ready".to_owned()
        } else {
            "not all replicas ready".to_owned()
        },
        children: Vec::new(),
    }
}

/// Whether a workload was installed by the Helm release `release` of `namespace` (Helm 3
/// writes these annotations on everything it creates).
pub fn belongs_to_release(object: &Value, release: &str, namespace: &str) -> bool {
    let annotation = |k: &str| {
        object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    annotation("meta.helm.sh/release-name") == Some(release)
        && annotation("meta.helm.sh/release-namespace") == Some(namespace)
}

/// The Helm release name and namespace a HelmRelease installs: Flux's own record of the last
/// release when there is one, otherwise its spec's rule (`releaseName`, or
/// `<targetNamespace>-<name>` when the target namespace differs, or `<name>`).
pub fn helm_release_of(helm_release: &Value) -> (String, String) {
    let text = |p: &str| helm_release.pointer(p).and_then(Value::as_str).map(str::to_owned);
    let own_namespace = text("/metadata/namespace").unwrap_or_default();
    let name = text("/metadata/name").unwrap_or_default();
    let target = text("/spec/targetNamespace").unwrap_or_else(|| own_namespace.clone());
    let recorded = text("/status/history/0/name");
    let recorded_namespace = text("/status/history/0/namespace");
    let release = recorded.or_else(|| text("/spec/releaseName")).unwrap_or_else(|| {
        if target == own_namespace {
            name.clone()
        } else {
            format!("{target}-{name}")
        }
    });
    (release, recorded_namespace.unwrap_or(target))
}

/// The tree as text, like `flux trace`: one object per line under its parent.
pub fn render(root: &Node) -> String {
    let mut out = String::new();
    write_node(root, "", "", &mut out);
    out
}

fn write_node(node: &Node, lead: &str, child_lead: &str, out: &mut String) {
    out.push_str(&format!(
        "{lead}{}  Ready={}  {}\n",
        printable(&node.object),
        printable(&node.ready),
        printable(&node.detail)
    ));
    let count = node.children.len();
    for (i, child) in node.children.iter().enumerate() {
        let last = i + 1 == count;
        let (branch, next) = if last { ("└─ ", "   ") } else { ("├─ ", "│  ") };
        write_node(
            child,
            &format!("{child_lead}{branch}"),
            &format!("{child_lead}{next}"),
            out,
        );
    }
}

fn join(reason: &str, message: &str) -> String {
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => String::new(),
        (false, true) => reason.to_owned(),
        (true, false) => message.to_owned(),
        (false, false) => format!("{reason}: {message}"),
    }
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_trace_renders_as_a_tree_with_ready_states() {
        let app = json!({"kind": "ApplicationInstance", "metadata": {"name": "wiki", "namespace": "team-a"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "InstallSucceeded",
                                        "message": "Helm install succeeded\nfor release wiki"}]}});
        let hr = json!({"kind": "HelmRelease", "metadata": {"name": "wiki", "namespace": "team-a"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "InstallSucceeded"}]}});
        let repo = json!({"kind": "HelmRepository", "metadata": {"name": "vws-charts", "namespace": "team-a"}});
        let deploy = json!({"kind": "Deployment", "metadata": {"name": "wiki", "namespace": "team-a"},
            "spec": {"replicas": 2}, "status": {"readyReplicas": 1}});
        let ds = json!({"kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "team-a"},
            "status": {"numberReady": 3, "desiredNumberScheduled": 3}});
        let mut hr_node = with_ready_condition(&hr);
        hr_node.children = vec![with_ready_condition(&repo), workload(&deploy), workload(&ds)];
        let mut root = with_ready_condition(&app);
        root.children = vec![hr_node, Node::missing("HelmChart/team-a/team-a-wiki".into())];
        assert_eq!(
            render(&root),
            "ApplicationInstance/team-a/wiki  Ready=True  InstallSucceeded: Helm install succeeded for release wiki\n\
             ├─ HelmRelease/team-a/wiki  Ready=True  InstallSucceeded\n\
             │  ├─ HelmRepository/team-a/vws-charts  Ready=-  no Ready condition yet\n\
             │  ├─ Deployment/team-a/wiki  Ready=1/2  not all replicas ready\n\
             │  └─ DaemonSet/team-a/agent  Ready=3/3  ready\n\
             └─ HelmChart/team-a/team-a-wiki  Ready=-  not found\n"
        );
    }

    #[test]
    fn argocd_health_reads_as_ready() {
        let app = json!({"kind": "Application", "metadata": {"name": "team-a-wiki", "namespace": "argocd"},
            "status": {"health": {"status": "Progressing", "message": "waiting for rollout"},
                       "sync": {"status": "Synced"}}});
        let node = argocd_application(&app);
        assert_eq!(node.ready, "False");
        assert_eq!(node.detail, "health Progressing, sync Synced: waiting for rollout");
        assert_eq!(argocd_application(&json!({"kind": "Application"})).ready, "-");
    }

    #[test]
    fn the_release_name_follows_flux() {
        let hr = |spec: Value, status: Value| json!({"metadata": {"name": "wiki", "namespace": "team-a"}, "spec": spec, "status": status});
        assert_eq!(
            helm_release_of(&hr(json!({}), json!({}))),
            ("wiki".into(), "team-a".into())
        );
        assert_eq!(
            helm_release_of(&hr(json!({"targetNamespace": "apps"}), json!({}))),
            ("apps-wiki".into(), "apps".into())
        );
        assert_eq!(
            helm_release_of(&hr(json!({"releaseName": "w"}), json!({}))),
            ("w".into(), "team-a".into())
        );
        assert_eq!(
            helm_release_of(&hr(
                json!({"releaseName": "w"}),
                json!({"history": [{"name": "recorded", "namespace": "ns"}]})
            )),
            ("recorded".into(), "ns".into())
        );
    }

    #[test]
    fn workloads_belong_to_a_release_by_helm_annotations() {
        let w = json!({"metadata": {"annotations": {"meta.helm.sh/release-name": "wiki",
                                                     "meta.helm.sh/release-namespace": "team-a"}}});
        assert!(belongs_to_release(&w, "wiki", "team-a"));
        assert!(!belongs_to_release(&w, "wiki", "team-b"));
        assert!(!belongs_to_release(&json!({"metadata": {}}), "wiki", "team-a"));
    }
}
