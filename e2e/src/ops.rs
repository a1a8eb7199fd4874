//! Helpers for Operation tests: an engine per test (watching only the test namespace),
//! Operations built as JSON, and waits on their phase.

use std::time::Duration;

use api::{Operation, OperationPhase};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::{FIELD_MANAGER, TestContext, process::ControllerProcess, wait_object};

/// How long an Operation may take on the local cluster.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(150);

/// Starts the engine `binary` confined to the test namespace, with debug logging.
pub async fn start_engine(ctx: &TestContext, binary: &str, extra: &[&str]) -> anyhow::Result<ControllerProcess> {
    start_engine_allowing(ctx, binary, &ctx.namespace, extra).await
}

/// Starts the engine `binary` watching the test namespace with exactly the rights of its
/// ServiceAccount `vworkspace-system/<binary>` in the bundle (RBAC and admission policies
/// applied by [`crate::deploy::ensure_bundle_rbac`]; the client impersonates it).
pub async fn start_engine_as_service_account(
    ctx: &TestContext,
    binary: &str,
    extra: &[&str],
) -> anyhow::Result<ControllerProcess> {
    crate::deploy::ensure_bundle_rbac().await?;
    let kubeconfig =
        crate::deploy::impersonating_kubeconfig("vworkspace-system", binary, &format!("{binary}-{}", ctx.namespace))?;
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    start_engine_with_env(
        ctx,
        binary,
        &ctx.namespace,
        extra,
        &[("KUBECONFIG", kubeconfig.as_str())],
    )
    .await
}

/// Starts the engine `binary` watching the test namespace, with `--allowed-namespaces
/// allowed` (comma-separated; for Operations that name other namespaces), with debug logging.
pub async fn start_engine_allowing(
    ctx: &TestContext,
    binary: &str,
    allowed: &str,
    extra: &[&str],
) -> anyhow::Result<ControllerProcess> {
    start_engine_with_env(ctx, binary, allowed, extra, &[]).await
}

/// [`start_engine_allowing`] with more environment variables (`env` wins over the defaults).
async fn start_engine_with_env(
    ctx: &TestContext,
    binary: &str,
    allowed: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<ControllerProcess> {
    let mut args = vec![
        "--watch-namespace",
        ctx.namespace.as_str(),
        "--allowed-namespaces",
        allowed,
        // Port 0: the kernel picks a free one; the tests never call this admin server.
        "--admin-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    ControllerProcess::start(
        ctx.process_scope(),
        binary,
        &format!("{binary}-{}", ctx.namespace),
        &args,
        &[
            &[(
                "RUST_LOG",
                "debug,hyper=info,tower=info,h2=info,rustls=info,kube_client=info",
            )],
            env,
        ]
        .concat(),
    )
    .await
}

/// An ApplicationInstance that only has to exist for an Operation to name it (no app
/// controller needed).
pub async fn bare_app(ctx: &TestContext, name: &str) -> anyhow::Result<()> {
    crate::apps::apply_app(ctx, &crate::apps::app(name, "demo-app", "0.1.0", json!({}))).await?;
    Ok(())
}

/// An Operation of `type_` on `app`, with the payload under the type's field.
pub fn operation(name: &str, app: &str, type_: &str, payload: Value) -> Value {
    let field = type_.to_ascii_lowercase();
    let mut spec = json!({"type": type_, "applicationRef": {"name": app}, "requestId": format!("req-{name}")});
    if !payload.is_null() {
        spec[field] = payload;
    }
    json!({"apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation", "metadata": {"name": name}, "spec": spec})
}

/// Creates (server-side applies) an Operation.
pub async fn create_operation(ctx: &TestContext, op: &Value) -> anyhow::Result<Operation> {
    let name = op.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    Ok(ctx
        .api::<Operation>()
        .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(op))
        .await?)
}

/// `phase reason: message` of an Operation, for messages.
pub fn summary(op: &Operation) -> String {
    let status = op.status.clone().unwrap_or_default();
    let succeeded = status.conditions.iter().find(|c| c.type_ == "Succeeded");
    format!(
        "phase {:?}, Succeeded={} ({}: {}), result {:?}, children {:?}",
        status.phase,
        succeeded.map(|c| c.status.as_str()).unwrap_or("-"),
        succeeded.map(|c| c.reason.as_str()).unwrap_or("-"),
        succeeded.map(|c| c.message.as_str()).unwrap_or("-"),
        status.result,
        status
            .children
            .iter()
            .map(|c| format!("{}/{}", c.kind, c.name))
            .collect::<Vec<_>>()
    )
}

/// The phase and the `Succeeded` reason.
pub fn phase_reason(op: &Operation) -> (Option<OperationPhase>, String) {
    let status = op.status.clone().unwrap_or_default();
    let reason = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Succeeded")
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    (status.phase, reason)
}

/// Waits until `check` accepts the Operation.
pub async fn wait_operation(
    ctx: &TestContext,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Operation) -> bool,
) -> anyhow::Result<Operation> {
    wait_object(ctx, name, what, timeout, check, summary).await
}

/// Waits for the phase `phase` with the `Succeeded` reason `reason`.
pub async fn wait_phase(
    ctx: &TestContext,
    name: &str,
    phase: OperationPhase,
    reason: &str,
) -> anyhow::Result<Operation> {
    wait_operation(
        ctx,
        name,
        &format!("phase {phase:?} reason {reason}"),
        OPERATION_TIMEOUT,
        |op| phase_reason(op) == (Some(phase), reason.to_owned()),
    )
    .await
}
