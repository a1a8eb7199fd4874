//! ValidatingAdmissionPolicies (CEL, `admissionregistration.k8s.io/v1`) that hold a
//! kubectl user, or any ServiceAccount (the agent's included), to the same tenant rules
//! the controllers enforce: an ApplicationInstance stays in its own namespace and an
//! Operation's Runbook pod gets nothing from the node. Generated into `deploy/crds/` by
//! `crdgen` together with the CRDs, so they are drift-checked and installed in the same
//! step. What they enforce and why: `docs/security.md`.
//!
//! The API server, not the controllers, is the barrier here: a refused object is never
//! stored, so nothing a controller might do with it (or a bug in its own check) matters.

use serde_json::{Value, json};

use crate::{GROUP, RELEASE_SERVICE_ACCOUNT, RUNBOOK_SERVICE_ACCOUNT};

/// Name of the ApplicationInstance policy and of its binding.
pub const APPLICATION_INSTANCE_POLICY: &str = "vworkspace-application-instance";
/// Name of the Operation policy and of its binding.
pub const OPERATION_POLICY: &str = "vworkspace-operation";
/// Annotation on a Namespace: the namespace pairs an administrator allows, in the syntax of
/// the app controller's `--allowed-namespace-pairs` (`from=to,from=to`). Only pairs whose
/// `from` is the annotated namespace count, so the same value can go on every namespace.
/// A Namespace is cluster-scoped: a tenant with rights in its namespace cannot set it.
///
/// Not a `paramKind` ConfigMap: on Kubernetes 1.36 the API server's informer for a
/// built-in param kind stops for good once no binding uses it for a moment (deleting and
/// reapplying the bundle is enough), after which every checked request is refused (`no
/// params found`) or checked against a stale copy, until the API server restarts
/// (kubernetes/kubernetes#130887, seen on the local cluster). A namespace annotation needs
/// no param informer.
pub const ANNOTATION_ALLOWED_NAMESPACE_PAIRS: &str = "vworkspace.io/allowed-namespace-pairs";
/// The one capability a Runbook container may add (Pod Security `restricted` allows it,
/// and so does the runbook engine).
const ALLOWED_ADDED_CAPABILITY: &str = "NET_BIND_SERVICE";

/// Conditions every policy shares.
///
/// Cluster administrators (`system:masters`) are exempt: they can do anything anyway
/// (including deleting these policies), and the controllers' own refusals are proven by
/// tests that create hostile objects as the administrator. Everyone else, the operator's
/// ServiceAccounts included, is checked.
///
/// An update is checked only when it changes the spec: controllers (and the garbage
/// collector) add and remove finalizers, labels and annotations on objects an
/// administrator created, and must not be refused for a spec they did not write; an
/// object stuck because its finalizer could not be removed would never be deleted.
fn match_conditions() -> Value {
    json!([
        {
            "name": "not-a-cluster-administrator",
            "expression": "!('system:masters' in request.userInfo.groups)",
        },
        {
            "name": "creates-or-changes-the-spec",
            "expression": "request.operation != 'UPDATE' || object.spec != oldObject.spec",
        },
    ])
}

fn resource_rules(resource: &str) -> Value {
    json!([{
        "apiGroups": [GROUP],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE"],
        "resources": [resource],
    }])
}

/// A binding of `policy` to every namespace, refusing (not only warning or auditing).
fn binding(policy: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
        },
    })
}

/// The ApplicationInstance policy: target, source and dependencies in the object's own
/// namespace (or an allowed pair), only the release ServiceAccount, and no repository URL
/// whose host is a link-local IP literal (the cloud metadata service).
/// The variable `pairs`: the pairs the namespace's annotation allows, as normalised `from=to`
/// strings (the same parse as controller-kit's NamespacePairs: comma-separated, blanks
/// around names ignored), for `in variables.pairs`.
fn pairs_variable() -> Value {
    let annotations = "namespaceObject.metadata.annotations";
    let pairs = format!(
        "namespaceObject == null || !has({annotations}) \
         || !('{ANNOTATION_ALLOWED_NAMESPACE_PAIRS}' in {annotations}) ? [] : \
         {annotations}['{ANNOTATION_ALLOWED_NAMESPACE_PAIRS}'].split(',').map(p, p.trim()).filter(p, p != '')\
         .map(p, p.split('=').map(n, n.trim()).join('='))"
    );
    json!({"name": "pairs", "expression": pairs})
}

/// CEL: namespace `ns` is the request's own, or an allowed pair (needs [`pairs_variable`]).
fn allowed_namespace(ns: &str) -> String {
    format!("({ns} == request.namespace || (request.namespace + '=' + {ns}) in variables.pairs)")
}

fn application_instance_policy() -> Value {
    let allowed = allowed_namespace;
    let outside = |field: &str, value: &str| {
        format!(
            "'{field} ' + {value} + ' is not this object\\'s namespace ' + request.namespace + \
             ': an ApplicationInstance reaches only its own namespace, unless the cluster administrator \
             allows the pair ' + request.namespace + '=' + {value} + ' (annotation {ANNOTATION_ALLOWED_NAMESPACE_PAIRS} on the namespace)'"
        )
    };
    let target = "object.spec.targetNamespace";
    let source = "object.spec.chart.sourceRef.namespace";
    let dependency = format!("has(d.namespace) && !{}", allowed("d.namespace"));
    let url = "object.spec.chart.repository.url";
    let host = format!("url({url}).getHostname()");
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": APPLICATION_INSTANCE_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": resource_rules("applicationinstances")},
            "matchConditions": match_conditions(),
            "variables": [pairs_variable()],
            "validations": [
                {
                    "expression": format!("!has({target}) || {}", allowed(target)),
                    "messageExpression": outside("spec.targetNamespace", target),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!("!has(object.spec.chart.sourceRef) || !has({source}) || {}", allowed(source)),
                    "messageExpression": outside("spec.chart.sourceRef.namespace", source),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!("!has(object.spec.dependsOn) || !object.spec.dependsOn.exists(d, {dependency})"),
                    "messageExpression": outside(
                        "spec.dependsOn[].namespace",
                        &format!("object.spec.dependsOn.filter(d, {dependency})[0].namespace"),
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!(
                        "!has(object.spec.serviceAccountName) || object.spec.serviceAccountName == '{RELEASE_SERVICE_ACCOUNT}'"
                    ),
                    "messageExpression": format!(
                        "'spec.serviceAccountName ' + object.spec.serviceAccountName + ' is not allowed: a release \
                         runs as the namespace\\'s release ServiceAccount {RELEASE_SERVICE_ACCOUNT} (leave the field \
                         out, or name that one)'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    // An IPv6 literal that isIP() does not take (an IPv4-mapped address such
                    // as [::ffff:169.254.169.254]) is refused too: it would reach the same host.
                    "expression": format!(
                        "!has(object.spec.chart.repository) || !isURL({url}) || \
                         (isIP({host}) ? !ip({host}).isLinkLocalUnicast() : !{host}.contains(':'))"
                    ),
                    "messageExpression": format!(
                        "'spec.chart.repository.url ' + {url} + ' points at a link-local address \
                         (169.254.0.0/16, fe80::/10: the cloud metadata service) or at an IPv6 literal that cannot \
                         be checked (IPv4-mapped); chart repositories are fetched from inside the cluster and may \
                         not reach it'"
                    ),
                    "reason": "Forbidden",
                },
            ],
        },
    })
}

/// The Operation policy: a Restore that clones into another namespace without an allowed
/// pair, a Runbook pod that could reach the node or borrow API rights, and a Runbook that
/// runs a cluster-scoped WorkflowTemplate, are refused.
fn operation_policy() -> Value {
    let pod_field = "'spec.runbook.job.template.spec.'";
    // Every container of the pod, with the list it came from, for messages.
    let containers = "['containers', 'initContainers', 'ephemeralContainers']\
        .filter(l, l in variables.pod && variables.pod[l] != null)\
        .map(l, variables.pod[l].map(c, {'list': dyn(l), 'c': c}))\
        .flatten()"
        .to_owned();
    let security = |field: &str| {
        format!("has(e.c.securityContext) && e.c.securityContext != null && '{field}' in e.c.securityContext")
    };
    let privileged = format!("{} && e.c.securityContext.privileged == true", security("privileged"));
    let escalation = format!(
        "{} && e.c.securityContext.allowPrivilegeEscalation == true",
        security("allowPrivilegeEscalation")
    );
    let capabilities = format!(
        "{} && e.c.securityContext.capabilities != null && 'add' in e.c.securityContext.capabilities \
         && e.c.securityContext.capabilities.add != null \
         && e.c.securityContext.capabilities.add.exists(a, a != '{ALLOWED_ADDED_CAPABILITY}')",
        security("capabilities")
    );
    let host_port = "has(e.c.ports) && e.c.ports != null && e.c.ports.exists(p, 'hostPort' in p && p.hostPort != null && p.hostPort != 0)";
    let container_rule = |bad: &str, what: &str| {
        json!({
            "expression": format!("!variables.containers.exists(e, {bad})"),
            "messageExpression": format!(
                "{pod_field} + variables.containers.filter(e, {bad}).map(e, e.list + '[' + e.c.name + ']')[0] + '{what}'"
            ),
            "reason": "Forbidden",
        })
    };
    let host_namespaces =
        "['hostNetwork', 'hostPID', 'hostIPC'].filter(f, f in variables.pod && variables.pod[f] == true)";
    let clone = "object.spec.restore.targetNamespace";
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": OPERATION_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": resource_rules("operations")},
            "matchConditions": match_conditions(),
            "variables": [
                pairs_variable(),
                {
                    "name": "pod",
                    // The JobSpec is free-form in the CRD: dyn() lets missing levels be an
                    // empty object, so every rule below reads one pod spec.
                    "expression": "has(object.spec.runbook) && has(object.spec.runbook.job) \
                        && 'template' in object.spec.runbook.job && object.spec.runbook.job.template != null \
                        && 'spec' in object.spec.runbook.job.template && object.spec.runbook.job.template.spec != null \
                        ? dyn(object.spec.runbook.job.template.spec) : dyn({})",
                },
                {"name": "containers", "expression": containers},
            ],
            "validations": [
                {
                    "expression": format!(
                        "!has(object.spec.restore) || !has(object.spec.restore.targetNamespace) || {}",
                        allowed_namespace(clone)
                    ),
                    "messageExpression": format!(
                        "'spec.restore.targetNamespace ' + {clone} + ' is not this object\\'s namespace ' + \
                         request.namespace + ': a Restore clones only into its own namespace, unless the cluster \
                         administrator allows the pair ' + request.namespace + '=' + {clone} + ' (annotation \
                         {ANNOTATION_ALLOWED_NAMESPACE_PAIRS} on the namespace)'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!("size({host_namespaces}) == 0"),
                    "messageExpression": format!(
                        "{pod_field} + {host_namespaces}[0] + ' is true: a Runbook pod may not share the node\\'s \
                         network, process or IPC namespace'"
                    ),
                    "reason": "Forbidden",
                },
                container_rule(&privileged, ".securityContext.privileged is true: a Runbook container may not be privileged"),
                container_rule(
                    &escalation,
                    ".securityContext.allowPrivilegeEscalation is true: a Runbook container may not gain privileges",
                ),
                container_rule(
                    &capabilities,
                    &format!(
                        ".securityContext.capabilities.add adds a capability other than {ALLOWED_ADDED_CAPABILITY}: \
                         a Runbook container may add no other"
                    ),
                ),
                container_rule(host_port, ".ports[].hostPort is set: a Runbook container may not bind a node port"),
                {
                    "expression": "!('volumes' in variables.pod) || variables.pod.volumes == null \
                        || !variables.pod.volumes.exists(v, 'hostPath' in v)",
                    "messageExpression": format!(
                        "{pod_field} + 'volumes[' + variables.pod.volumes.filter(v, 'hostPath' in v)[0].name + \
                         '].hostPath is set: a Runbook pod may not mount the node\\'s filesystem'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!(
                        "['serviceAccountName', 'serviceAccount'].all(f, !(f in variables.pod) || variables.pod[f] == null \
                         || variables.pod[f] == '' || variables.pod[f] == '{RUNBOOK_SERVICE_ACCOUNT}')"
                    ),
                    "messageExpression": format!(
                        "{pod_field} + ['serviceAccountName', 'serviceAccount'].filter(f, f in variables.pod \
                         && variables.pod[f] != null && variables.pod[f] != '' \
                         && variables.pod[f] != '{RUNBOOK_SERVICE_ACCOUNT}')[0] + ' names another ServiceAccount \
                         than {RUNBOOK_SERVICE_ACCOUNT}: a Runbook runs without API rights'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": "!('automountServiceAccountToken' in variables.pod) \
                        || variables.pod.automountServiceAccountToken != true",
                    "messageExpression": format!(
                        "{pod_field} + 'automountServiceAccountToken is true: a Runbook pod gets no API token'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": "!has(object.spec.runbook) || !has(object.spec.runbook.workflowTemplateRef) \
                        || !has(object.spec.runbook.workflowTemplateRef.clusterScope) \
                        || !object.spec.runbook.workflowTemplateRef.clusterScope",
                    "message": "spec.runbook.workflowTemplateRef.clusterScope is true: a cluster-scoped \
                        ClusterWorkflowTemplate is not the namespace's to run",
                    "reason": "Forbidden",
                },
            ],
        },
    })
}

/// Both policies and their bindings, in apply order (a binding after its policy).
pub fn admission_policies() -> Vec<Value> {
    vec![
        application_instance_policy(),
        binding(APPLICATION_INSTANCE_POLICY),
        operation_policy(),
        binding(OPERATION_POLICY),
    ]
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};

    use super::*;

    /// Every document is a well-formed object of its kind (the typed structs would drop a
    /// misspelt field, so the round trip must give back exactly what was written).
    #[test]
    fn documents_round_trip_through_the_typed_api() -> Result<(), serde_json::Error> {
        for doc in admission_policies() {
            let back = match doc["kind"].as_str() {
                Some("ValidatingAdmissionPolicy") => {
                    serde_json::to_value(serde_json::from_value::<ValidatingAdmissionPolicy>(doc.clone())?)?
                }
                _ => serde_json::to_value(serde_json::from_value::<ValidatingAdmissionPolicyBinding>(doc.clone())?)?,
            };
            assert_eq!(back, doc);
        }
        Ok(())
    }

    #[test]
    fn every_validation_names_its_field_and_refuses() {
        for doc in admission_policies()
            .into_iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        {
            assert_eq!(doc["spec"]["failurePolicy"], "Fail");
            for v in doc["spec"]["validations"].as_array().into_iter().flatten() {
                let message = v["messageExpression"]
                    .as_str()
                    .or(v["message"].as_str())
                    .unwrap_or_default();
                assert!(message.contains("spec."), "{message}");
            }
        }
    }
}
