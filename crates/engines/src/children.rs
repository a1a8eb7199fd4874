//! Creating and reading an Operation's children through the dynamic API.
//!
//! A child has a name derived only from its Operation, so "create" is: read the name (from
//! the child watch's cache when it holds our child there, else from the API server);
//! if an object is there and carries the Operation's UID label it is ours (created by an
//! earlier pass, perhaps before a crash) and is returned as it is; if something else holds
//! the name the Operation fails rather than adopting or overwriting it; otherwise apply it
//! (server-side, with the engine's field manager).

use api::conditions::operation_reasons;
use controller_kit::WriteVerb;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery,
};
use operations::{Outcome, meta::OpId};
use serde_json::Value;

use crate::runtime::{Cx, DriverError};

/// A child as found or created.
#[derive(Debug)]
pub enum Child {
    /// Ours: the object as the API server has it.
    Ours(Value),
    /// The name is held by an object that is not this Operation's child.
    Foreign(String),
}

/// The API resource of `api_version`/`kind` with the given plural.
pub fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn dynamic_api(client: &Client, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, resource)
}

/// Reads `namespace/name` of `resource` as JSON (`None` when absent).
pub async fn get(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, DriverError> {
    let object = dynamic_api(client, resource, namespace).get_opt(name).await?;
    Ok(object.map(|o| serde_json::to_value(o).unwrap_or(Value::Null)))
}

/// Finds or creates the child `object` (built by the `operations` crate) of `cx.op`.
pub async fn ensure(cx: &Cx, resource: &ApiResource, object: &Value) -> Result<Child, DriverError> {
    ensure_with(cx, resource, object, || async { Ok(()) }).await
}

/// [`ensure`], running `before_create` first when (and only when) the child is about to be
/// created: for what the child needs to exist first (a runbook Job's ServiceAccount), without
/// reading it again on every pass while the child runs.
pub async fn ensure_with<F, Fut>(
    cx: &Cx,
    resource: &ApiResource,
    object: &Value,
    before_create: F,
) -> Result<Child, DriverError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), DriverError>>,
{
    let id = OpId::of(&cx.op)?;
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
    let (name, namespace) = (
        text("/metadata/name").to_owned(),
        text("/metadata/namespace").to_owned(),
    );
    // Only ours is taken from the cache; an absent or foreign object is read again, so a
    // lagging cache never creates twice nor refuses a name.
    if let Some(cached) = cx.cached_children.get(resource, &namespace, &name)
        && operations::meta::is_child_of(&cached, &id)
    {
        return Ok(Child::Ours(cached));
    }
    if let Some(existing) = get(&cx.client, resource, &namespace, &name).await? {
        return Ok(if operations::meta::is_child_of(&existing, &id) {
            Child::Ours(existing)
        } else {
            Child::Foreign(format!(
                "{} {namespace}/{name} already exists and was not created by this Operation; it is left alone",
                resource.kind
            ))
        });
    }
    before_create().await?;
    cx.metrics.api_write(WriteVerb::Apply, kind_label(&resource.kind));
    let applied = dynamic_api(&cx.client, resource, &namespace)
        .patch(&name, &PatchParams::apply(cx.field_manager), &Patch::Apply(object))
        .await?;
    Ok(Child::Ours(serde_json::to_value(applied).unwrap_or(Value::Null)))
}

/// The outcome for a child name held by someone else.
pub fn foreign(message: String) -> Outcome {
    Outcome::failed(operation_reasons::FAILED, message)
}

/// Whether the API group/version serves `kind` (e.g. Velero's CRDs are installed).
pub async fn is_served(client: &Client, api_version: &str, kind: &str) -> Result<bool, DriverError> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    match discovery::pinned_kind(client, &gvk).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(kube::Error::Discovery(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Server-side applies `fields` (e.g. `{"spec": {...}}` or `{"metadata": {"annotations":
/// {...}}}`) to the ApplicationInstance `name` of the Operation's namespace, forced: the
/// engine takes over exactly these fields (ADR 0004).
pub async fn apply_application(cx: &Cx, name: &str, fields: Value) -> Result<(), DriverError> {
    let mut patch = serde_json::json!({
        "apiVersion": api::API_VERSION,
        "kind": "ApplicationInstance",
        "metadata": {"name": name, "namespace": cx.namespace()},
    });
    if let (Value::Object(patch), Value::Object(fields)) = (&mut patch, fields) {
        for (key, value) in fields {
            match (patch.get_mut(&key), value) {
                (Some(Value::Object(existing)), Value::Object(more)) => existing.extend(more),
                (_, value) => {
                    patch.insert(key, value);
                }
            }
        }
    }
    cx.metrics.api_write(WriteVerb::Apply, "ApplicationInstance");
    Api::<api::ApplicationInstance>::namespaced(cx.client.clone(), cx.namespace())
        .patch(
            name,
            &PatchParams::apply(cx.field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// Static metric label for the kinds engines write.
fn kind_label(kind: &str) -> &'static str {
    match kind {
        "Job" => "Job",
        "Backup" => "Backup",
        "Restore" => "Restore",
        "VolumeSnapshot" => "VolumeSnapshot",
        "Operation" => "Operation",
        "ConfigMap" => "ConfigMap",
        "ApplicationInstance" => "ApplicationInstance",
        _ => "Other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_of_core_and_grouped_kinds() {
        let job = resource("batch/v1", "Job", "jobs");
        assert_eq!(
            (job.group.as_str(), job.version.as_str(), job.plural.as_str()),
            ("batch", "v1", "jobs")
        );
        let cm = resource("v1", "ConfigMap", "configmaps");
        assert_eq!((cm.group.as_str(), cm.api_version.as_str()), ("", "v1"));
    }
}
