//! A Runbook Operation as the attack of review item C2: whoever can create an Operation
//! (Odoo through the agent, the push-token holder, a kubectl user with create rights on
//! Operations in one namespace) tries to get a privileged or host-reaching pod, or
//! another ServiceAccount's rights, out of the runbook engine. Every attempt must end
//! `Failed` with reason `InvalidSpec` naming the field, and create nothing; an ordinary
//! runbook must still run, with the restricted defaults filled in, as the ServiceAccount
//! `vworkspace-runbook` without an API token (docs/api/operation.md, Runbook).
//!
//! The attacks run in a namespace that enforces no Pod Security level (the e2e namespaces
//! carry no `pod-security.kubernetes.io` labels), so the engine is the only barrier; the
//! ordinary runbook runs in a namespace that enforces `restricted`, so the API server's
//! own Pod Security admission proves the filled-in pod compliant.

use api::{OperationPhase, RUNBOOK_SERVICE_ACCOUNT};
use e2e::{
    TestContext,
    ops::{bare_app, create_operation, operation, start_engine, summary, wait_phase},
};
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Namespace, Pod, ServiceAccount},
    rbac::v1::RoleBinding,
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

const RESTRICTED: &str = "(Pod Security \"restricted\")";

/// A JobSpec with one busybox container running `command`, plus `pod` merged into the
/// pod spec and `container` merged into the container.
fn job_spec(command: &str, pod: Value, container: Value) -> Value {
    let mut main = json!({"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", command]});
    if let (Some(main), Value::Object(extra)) = (main.as_object_mut(), container) {
        main.extend(extra);
    }
    let mut spec = json!({"containers": [main]});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), pod) {
        spec.extend(extra);
    }
    json!({"backoffLimit": 0, "template": {"spec": spec}})
}

#[tokio::test]
async fn runbook_attacks_on_the_node_and_the_api_are_refused() -> anyhow::Result<()> {
    let ctx = TestContext::new("tenant-runbook-attack").await?;
    let _engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    bare_app(&ctx, "wiki").await?;
    // A ServiceAccount the attacker would like to borrow.
    let deployer: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "deployer"}}))?;
    ctx.apply(&deployer).await?;

    let spec = "runbook.job.template.spec";
    let attacks: Vec<(&str, Value, String)> = vec![
        (
            // The C2 exploit: the host's PID namespace, a privileged container, nsenter into PID 1.
            "nsenter",
            job_spec(
                "nsenter -t 1 -m -u -i -n -p -- sh -c id",
                json!({"hostPID": true}),
                json!({"securityContext": {"privileged": true}}),
            ),
            format!("{spec}.hostPID: true is not allowed {RESTRICTED}"),
        ),
        (
            "privileged",
            job_spec("id", json!({}), json!({"securityContext": {"privileged": true}})),
            format!("{spec}.containers[0].securityContext.privileged: true is not allowed {RESTRICTED}"),
        ),
        (
            "host-network",
            job_spec(
                "wget -qO- http://169.254.169.254/",
                json!({"hostNetwork": true}),
                json!({}),
            ),
            format!("{spec}.hostNetwork: true is not allowed {RESTRICTED}"),
        ),
        (
            "host-path",
            job_spec(
                "cat /host/etc/shadow",
                json!({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
                json!({"volumeMounts": [{"name": "host", "mountPath": "/host"}]}),
            ),
            format!(
                "{spec}.volumes[0].hostPath: {{\"path\":\"/\"}} is not allowed {RESTRICTED}; allowed volume types: \
                 configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret"
            ),
        ),
        (
            "sys-admin",
            job_spec(
                "mount -t proc proc /mnt",
                json!({}),
                json!({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
            ),
            format!(
                "{spec}.containers[0].securityContext.capabilities.add[0]: \"SYS_ADMIN\" is not allowed {RESTRICTED}; \
                 only NET_BIND_SERVICE may be added"
            ),
        ),
        (
            "root",
            job_spec("id", json!({}), json!({"securityContext": {"runAsUser": 0}})),
            format!(
                "{spec}.containers[0].securityContext.runAsUser: 0 is not allowed {RESTRICTED}; runbooks run as a non-root user"
            ),
        ),
        (
            "other-service-account",
            job_spec("id", json!({"serviceAccountName": "deployer"}), json!({})),
            format!(
                "{spec}.serviceAccountName: \"deployer\" is not allowed; runbook pods run as the ServiceAccount \
                 vworkspace-runbook, which has no rights"
            ),
        ),
        (
            "api-token",
            job_spec("id", json!({"automountServiceAccountToken": true}), json!({})),
            format!(
                "{spec}.automountServiceAccountToken: true is not allowed; runbook pods get no Kubernetes API token"
            ),
        ),
        (
            "projected-token",
            job_spec(
                "cat /t/token",
                json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}),
                json!({"volumeMounts": [{"name": "t", "mountPath": "/t"}]}),
            ),
            format!(
                "{spec}.volumes[0].projected.sources[0].serviceAccountToken: {{\"path\":\"token\"}} is not allowed; \
                 runbook pods get no Kubernetes API credentials (allowed projected sources: configMap, downwardAPI, \
                 secret, clusterTrustBundle)"
            ),
        ),
    ];

    for (name, spec_json, _) in &attacks {
        create_operation(&ctx, &operation(name, "wiki", "Runbook", json!({"job": spec_json}))).await?;
    }
    for (name, _, message) in &attacks {
        let refused = wait_phase(&ctx, name, OperationPhase::Failed, "InvalidSpec").await?;
        let status = refused.status.clone().unwrap_or_default();
        assert_eq!(
            status.result.as_deref(),
            Some(message.as_str()),
            "{name}: {}",
            summary(&refused)
        );
        let condition = status.conditions.iter().find(|c| c.type_ == "Succeeded");
        assert_eq!(condition.map(|c| c.message.as_str()), Some(message.as_str()), "{name}");
        assert!(status.start_time.is_none(), "{name}: refused before the start");
        assert!(status.children.is_empty(), "{name}: {:?}", status.children);
    }

    // Nothing was created: no Job (hence no pod), and not even the runbook ServiceAccount.
    let jobs = ctx.api::<Job>().list(&ListParams::default()).await?.items;
    assert!(
        jobs.is_empty(),
        "no Job may exist: {:?}",
        jobs.iter().map(|j| &j.metadata.name).collect::<Vec<_>>()
    );
    let pods = ctx.api::<Pod>().list(&ListParams::default()).await?.items;
    assert!(pods.is_empty(), "no pod may exist");
    assert!(
        ctx.api::<ServiceAccount>()
            .get_opt(RUNBOOK_SERVICE_ACCOUNT)
            .await?
            .is_none(),
        "a refused runbook creates no ServiceAccount"
    );
    Ok(())
}

#[tokio::test]
async fn an_ordinary_runbook_runs_restricted_as_the_runbook_service_account() -> anyhow::Result<()> {
    let ctx = TestContext::new("tenant-runbook-ok").await?;
    // The API server itself enforces Pod Security "restricted" here: a pod the engine let
    // through non-compliant would be refused at creation and the Job would never complete.
    let labels = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    Api::<Namespace>::all(ctx.client.clone())
        .patch(&ctx.namespace, &PatchParams::default(), &Patch::Merge(&labels))
        .await?;
    let _engine = start_engine(&ctx, "runbook-engine", &[]).await?;
    bare_app(&ctx, "wiki").await?;

    // No securityContext, no ServiceAccount: what an ordinary runbook looks like.
    create_operation(
        &ctx,
        &operation(
            "tidy",
            "wiki",
            "Runbook",
            json!({"job": job_spec("echo tidy", json!({}), json!({})), "parameters": {"MODE": "full"}}),
        ),
    )
    .await?;
    wait_phase(&ctx, "tidy", OperationPhase::Succeeded, "Completed").await?;

    let job = ctx.api::<Job>().get("tidy").await?;
    let pod = job
        .spec
        .and_then(|s| s.template.spec)
        .ok_or_else(|| anyhow::anyhow!("the Job has no pod template spec"))?;
    assert_eq!(pod.service_account_name.as_deref(), Some(RUNBOOK_SERVICE_ACCOUNT));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let pod_context = pod.security_context.clone().unwrap_or_default();
    assert_eq!(pod_context.run_as_non_root, Some(true));
    assert_eq!(pod_context.run_as_user, Some(65532));
    assert_eq!(
        pod_context.seccomp_profile.map(|p| p.type_).as_deref(),
        Some("RuntimeDefault")
    );
    let main = pod.containers.first().ok_or_else(|| anyhow::anyhow!("no container"))?;
    let context = main.security_context.clone().unwrap_or_default();
    assert_eq!(context.allow_privilege_escalation, Some(false));
    assert_eq!(context.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_owned()]));
    assert_eq!(context.privileged, None, "nothing else is added");
    assert!(
        main.env
            .iter()
            .flatten()
            .any(|e| e.name == "MODE" && e.value.as_deref() == Some("full")),
        "parameters still reach the container"
    );

    // The pods ran as the runbook ServiceAccount, without an API token volume.
    let pods = ctx
        .api::<Pod>()
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=tidy"))
        .await?
        .items;
    assert!(!pods.is_empty(), "the Job's pod exists");
    for pod in pods {
        let spec = pod.spec.unwrap_or_default();
        assert_eq!(spec.service_account_name.as_deref(), Some(RUNBOOK_SERVICE_ACCOUNT));
        let volumes: Vec<String> = spec.volumes.iter().flatten().map(|v| v.name.clone()).collect();
        assert!(
            !volumes.iter().any(|v| v.starts_with("kube-api-access")),
            "no API token is mounted: {volumes:?}"
        );
    }

    // The ServiceAccount exists, mounts no token, and nothing binds it to any rights.
    let account = ctx.api::<ServiceAccount>().get(RUNBOOK_SERVICE_ACCOUNT).await?;
    assert_eq!(account.automount_service_account_token, Some(false));
    assert_eq!(
        account
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("vworkspace-operator")
    );
    let bindings = ctx.api::<RoleBinding>().list(&ListParams::default()).await?.items;
    let bound: Vec<_> = bindings
        .iter()
        .filter(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| s.kind == "ServiceAccount" && s.name == RUNBOOK_SERVICE_ACCOUNT)
        })
        .filter_map(|b| b.metadata.name.clone())
        .collect();
    assert!(
        bound.is_empty(),
        "no RoleBinding names {RUNBOOK_SERVICE_ACCOUNT}: {bound:?}"
    );

    // A second runbook reuses the ServiceAccount as it is.
    let version = account.metadata.resource_version.clone();
    create_operation(
        &ctx,
        &operation(
            "tidy-again",
            "wiki",
            "Runbook",
            json!({"job": job_spec("true", json!({}), json!({}))}),
        ),
    )
    .await?;
    wait_phase(&ctx, "tidy-again", OperationPhase::Succeeded, "Completed").await?;
    let again = ctx.api::<ServiceAccount>().get(RUNBOOK_SERVICE_ACCOUNT).await?;
    assert_eq!(
        again.metadata.resource_version, version,
        "an existing ServiceAccount is not written again"
    );
    Ok(())
}
