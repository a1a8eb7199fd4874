//! The engines refuse what lies outside their namespaces, with nothing created.
//!
//! An Operation in a namespace outside an engine's allow-list ends `Failed
//! NamespaceNotAllowed` before the engine reads anything else; so does one whose
//! application installs into a namespace outside it, and a Restore cloning into one
//! (`docs/api/operation.md`, "Order of checks"). In every case nothing is created: no Job, no
//! Velero Backup or Restore, no child Operation, no change to the ApplicationInstance, and no
//! object in either namespace. The Restore into an allowed but unpaired namespace is
//! `data_protection.rs`'s.

use std::collections::BTreeMap;

use anyhow::Context as _;
use api::{Operation, OperationPhase};
use e2e::{
    TestContext,
    deploy::{ensure_bundle_rbac, kubectl},
    eventually,
    ops::{OPERATION_TIMEOUT, bare_app, create_operation, operation, start_engine_allowing, summary, wait_operation},
    process::ControllerProcess,
};
use kube::Api;
use serde_json::{Value, json};

/// The engines and the Operation types each runs.
const ENGINES: [(&str, &[&str]); 4] = [
    ("backup-engine", &["Backup", "Snapshot"]),
    ("restore-engine", &["Restore"]),
    ("upgrade-engine", &["Upgrade", "Rollback"]),
    ("runbook-engine", &["Runbook"]),
];

/// A payload of `type_` the API server admits (the engines must refuse it before looking).
fn payload(type_: &str) -> Value {
    match type_ {
        "Backup" => json!({"ttl": "24h"}),
        "Snapshot" => json!({"volumeSnapshotClassName": "csi-test"}),
        "Restore" => json!({"source": {"operationName": "nightly"}}),
        "Upgrade" => json!({"chartVersion": "0.2.0"}),
        "Rollback" => json!({}),
        "Runbook" => json!({"job": {
            "backoffLimit": 0,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}]}},
        }}),
        other => json!({"unknown": other}),
    }
}

/// Every object in `namespace` (of the kinds an engine could create or change), as
/// `kind/name` → resourceVersion. Operations are listed by name only: their status moves.
async fn objects_in(namespace: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let kinds = "all,configmaps,secrets,serviceaccounts,roles,rolebindings,persistentvolumeclaims,jobs,\
                 volumesnapshots.snapshot.storage.k8s.io,helmreleases.helm.toolkit.fluxcd.io,\
                 helmrepositories.source.toolkit.fluxcd.io,ocirepositories.source.toolkit.fluxcd.io,\
                 applicationinstances.vworkspace.io,operations.vworkspace.io";
    let out = kubectl(&["get", kinds, "-n", namespace, "-o", "json"], None).await?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            let kind = item["kind"].as_str().unwrap_or_default();
            let key = format!("{kind}/{}", item["metadata"]["name"].as_str().unwrap_or_default());
            let version = if kind == "Operation" {
                String::new()
            } else {
                item["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            };
            (key, version)
        })
        .collect())
}

/// Waits until the namespace controllers have added what they add to a new namespace
/// (its ServiceAccount `default` and ConfigMap `kube-root-ca.crt`), so a later comparison
/// sees only what an engine did.
async fn settled(ctx: &TestContext, namespace: &str) -> anyhow::Result<()> {
    eventually(
        ctx,
        &format!("namespace {namespace} set up"),
        std::time::Duration::from_secs(30),
        || async {
            let objects = objects_in(namespace).await?;
            let ready =
                objects.contains_key("ServiceAccount/default") && objects.contains_key("ConfigMap/kube-root-ca.crt");
            Ok(if ready { Ok(()) } else { Err(format!("{objects:?}")) })
        },
    )
    .await
}

/// Velero Backups and Restores made for Operations of `namespace`.
async fn velero_objects_of(namespace: &str) -> anyhow::Result<String> {
    let velero = std::env::var("VWS_VELERO_NAMESPACE").unwrap_or_else(|_| "velero".into());
    let label = format!("vworkspace.io/operation-namespace={namespace}");
    let out = kubectl(
        &[
            "get",
            "backups.velero.io,restores.velero.io",
            "-n",
            &velero,
            "-l",
            &label,
            "-o",
            "name",
        ],
        None,
    )
    .await?;
    Ok(out.trim().to_owned())
}

/// Creates `(name, type, application, payload)` Operations and waits until each is `Failed
/// NamespaceNotAllowed` with `message(name)` as its message.
async fn expect_refused(
    ctx: &TestContext,
    operations: &[(String, &str, &str, Value)],
    message: impl Fn(&str) -> String,
) -> anyhow::Result<()> {
    for (name, type_, app, payload) in operations {
        create_operation(ctx, &operation(name, app, type_, payload.clone())).await?;
    }
    for (name, type_, _, _) in operations {
        let want = message(name);
        let op = wait_operation(
            ctx,
            name,
            &format!("{type_} Failed NamespaceNotAllowed: {want}"),
            OPERATION_TIMEOUT,
            |op| {
                succeeded(op).is_some_and(|(status, reason, text)| {
                    status == "False" && reason == "NamespaceNotAllowed" && text == want
                })
            },
        )
        .await?;
        let status = op.status.clone().unwrap_or_default();
        anyhow::ensure!(
            status.phase == Some(OperationPhase::Failed),
            "{type_}: {}",
            summary(&op)
        );
        anyhow::ensure!(
            status.start_time.is_none() && status.children.is_empty(),
            "{type_} never started and has no children: {}",
            summary(&op)
        );
    }
    Ok(())
}

/// The `Succeeded` condition as (status, reason, message).
fn succeeded(op: &Operation) -> Option<(String, String, String)> {
    let c = op.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Succeeded")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Lets `system:serviceaccount:<ns>:refusing-<engine>` read the whole cluster (an engine
/// that watches every namespace needs to) but write only where the engine's own rights are
/// bound: in the test namespace, and in Velero's namespace for the Velero engines. So these
/// engines, which see every namespace's Operations, can change none outside this test (their
/// refusals of other tests' Operations end in 403), while in the test namespace nothing but
/// their own judgement stops them. Everything is owned by the test namespace and goes with it.
async fn grant_refusing_engines(ctx: &TestContext) -> anyhow::Result<()> {
    ensure_bundle_rbac().await?;
    let ns = ctx.namespace.as_str();
    let uid = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone())
        .get(ns)
        .await?
        .metadata
        .uid
        .context("namespace uid")?;
    let owner = json!([{"apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": uid}]);
    let velero = std::env::var("VWS_VELERO_NAMESPACE").unwrap_or_else(|_| "velero".into());
    let mut docs = vec![json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "vws-e2e-read-all"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
    })];
    for (engine, _) in ENGINES {
        let subject = json!([{"kind": "ServiceAccount", "name": format!("refusing-{engine}"), "namespace": ns}]);
        let name = format!("vws-e2e-{ns}-{engine}");
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "ownerReferences": owner},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vws-e2e-read-all"},
            "subjects": subject,
        }));
        docs.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("refusing-{engine}"), "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("vworkspace-{engine}")},
            "subjects": subject,
        }));
        if matches!(engine, "backup-engine" | "restore-engine") {
            docs.push(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": velero, "ownerReferences": owner},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("vworkspace-{engine}")},
                "subjects": subject,
            }));
        }
    }
    e2e::deploy::apply(&e2e::deploy::to_yaml(&docs.iter().collect::<Vec<_>>())?, false).await?;
    Ok(())
}

/// Starts `engine` watching every namespace with `--allowed-namespaces allowed`, as
/// `refusing-<engine>` ([`grant_refusing_engines`]).
async fn start_refusing_engine(ctx: &TestContext, engine: &str, allowed: &str) -> anyhow::Result<ControllerProcess> {
    let kubeconfig = e2e::deploy::impersonating_kubeconfig(
        &ctx.namespace,
        &format!("refusing-{engine}"),
        &format!("refusing-{engine}-{}", ctx.namespace),
    )?;
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    // No --watch-namespace: an engine watching one namespace must be allowed it (a startup
    // error otherwise), so only a cluster-wide engine ever meets a disallowed namespace.
    let args = ["--allowed-namespaces", allowed, "--admin-addr", "127.0.0.1:0"];
    ControllerProcess::start(
        ctx.process_scope(),
        engine,
        &format!("refusing-{engine}-{}", ctx.namespace),
        &args,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            (
                "RUST_LOG",
                "debug,hyper=info,tower=info,h2=info,rustls=info,kube_client=info",
            ),
        ],
    )
    .await
}

#[tokio::test]
async fn every_engine_refuses_an_operation_in_a_namespace_outside_its_allow_list() -> anyhow::Result<()> {
    let ctx = TestContext::new("refusals-ns").await?;
    let ns = ctx.namespace.clone();
    // Allowed: only a namespace that is not this one.
    let allowed = format!("{ns}-x");
    grant_refusing_engines(&ctx).await?;
    let mut engines = Vec::new();
    for (engine, _) in ENGINES {
        engines.push(start_refusing_engine(&ctx, engine, &allowed).await?);
    }
    bare_app(&ctx, "app").await?;
    settled(&ctx, &ns).await?;
    let before = objects_in(&ns).await?;

    let operations: Vec<(String, &str, &str, Value)> = ENGINES
        .iter()
        .flat_map(|(_, types)| types.iter())
        .map(|type_| (type_.to_ascii_lowercase(), *type_, "app", payload(type_)))
        .collect();
    expect_refused(&ctx, &operations, |_| {
        format!("namespace {ns} is not allowed (allowed namespaces: {allowed})")
    })
    .await?;

    // One more pass of every engine over them (a status change wakes them): still nothing.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let after = objects_in(&ns).await?;
    let made: Vec<_> = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).collect();
    let mut expected: Vec<String> = operations
        .iter()
        .map(|(name, ..)| format!("Operation/{name}"))
        .collect();
    expected.sort();
    let made_names: Vec<String> = made.iter().map(|(k, _)| (*k).clone()).collect();
    assert_eq!(
        made_names, expected,
        "only the Operations are new; nothing else created or changed (before: {before:?})"
    );
    assert_eq!(velero_objects_of(&ns).await?, "", "no Velero Backup or Restore");
    for engine in &engines {
        engine.check_running("the refusals")?;
    }
    Ok(())
}

#[tokio::test]
async fn an_application_or_restore_reaching_a_namespace_outside_the_allow_list_is_refused() -> anyhow::Result<()> {
    let ctx = TestContext::new("refusals-target").await?;
    let other = TestContext::new("refusals-target-to").await?;
    let (ns, to) = (ctx.namespace.as_str(), other.namespace.as_str());
    // The pair is allowed, so only the engine's namespaces refuse the clone.
    let pair = format!("{ns}={to}");
    let mut engines = Vec::new();
    for (engine, _) in ENGINES {
        let extra: &[&str] = if engine == "restore-engine" {
            &["--allowed-namespace-pairs", &pair]
        } else {
            &[]
        };
        engines.push(start_engine_allowing(&ctx, engine, ns, extra).await?);
    }
    // An application installed into the other namespace (the admin may create it; the
    // admission policies bind tenants only).
    let mut escaped = e2e::apps::app("escaped", "demo-app", "0.1.0", json!({}));
    escaped.spec.target_namespace = Some(to.to_owned());
    e2e::apps::apply_app(&ctx, &escaped).await?;
    bare_app(&ctx, "app").await?;
    settled(&ctx, ns).await?;
    settled(&other, to).await?;
    let before = (objects_in(ns).await?, objects_in(to).await?);

    let operations: Vec<(String, &str, &str, Value)> = ENGINES
        .iter()
        .flat_map(|(_, types)| types.iter())
        .map(|type_| {
            (
                format!("escaped-{}", type_.to_ascii_lowercase()),
                *type_,
                "escaped",
                payload(type_),
            )
        })
        .collect();
    expect_refused(&ctx, &operations, |_| {
        format!("the application's target namespace {to} is not allowed (allowed namespaces: {ns})")
    })
    .await?;

    let mut clone = payload("Restore");
    clone["targetNamespace"] = json!(to);
    let restore = [("clone".to_owned(), "Restore", "app", clone)];
    expect_refused(&ctx, &restore, |_| {
        format!("restore.targetNamespace {to} is not allowed (allowed namespaces: {ns})")
    })
    .await?;

    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let after = (objects_in(ns).await?, objects_in(to).await?);
    let made: Vec<String> = after
        .0
        .iter()
        .filter(|(k, v)| before.0.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    let mut expected: Vec<String> = operations
        .iter()
        .chain(&restore)
        .map(|(name, ..)| format!("Operation/{name}"))
        .collect();
    expected.sort();
    assert_eq!(
        made, expected,
        "only the Operations are new in {ns} (before: {:?})",
        before.0
    );
    assert_eq!(after.1, before.1, "nothing created or changed in {to}");
    assert_eq!(velero_objects_of(ns).await?, "", "no Velero Backup or Restore");
    for engine in &engines {
        engine.check_running("the refusals")?;
    }
    Ok(())
}
