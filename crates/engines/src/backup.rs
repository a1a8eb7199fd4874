//! Backup: a Velero `Backup` of the application's target namespace (the whole namespace
//! when the application is alone there, else its release's labelled objects), in
//! Velero's namespace. Velero Backups outlive their Operation on purpose: they are the
//! data, with their own `ttl`.

use std::time::Duration;

use api::{ApplicationInstance, OperationType, conditions::operation_reasons};
use kube::{
    Api,
    api::{ApiResource, ListParams},
};
use operations::{
    Outcome,
    meta::{self, OpId},
    velero::{self, BackupScope, VeleroKind, VeleroTarget},
};

use crate::children::{self, Child};
use crate::runtime::{Cx, Driver, DriverError, Watch};

/// Velero's Backup resource.
pub fn velero_backups() -> ApiResource {
    children::resource(velero::API_VERSION, VeleroKind::Backup.as_str(), "backups")
}

/// Velero's Restore resource.
pub fn velero_restores() -> ApiResource {
    children::resource(velero::API_VERSION, VeleroKind::Restore.as_str(), "restores")
}

/// Drives Backup Operations through Velero.
#[derive(Debug, Clone)]
pub struct BackupDriver {
    /// Namespace Velero runs in (its Backups and Restores live there).
    pub velero_namespace: String,
}

/// `EngineNotInstalled` unless Velero's `kind` is served.
pub async fn require_velero(cx: &Cx, kind: VeleroKind) -> Result<Option<Outcome>, DriverError> {
    if children::is_served(&cx.client, velero::API_VERSION, kind.as_str()).await? {
        return Ok(None);
    }
    Ok(Some(Outcome::failed(
        operation_reasons::ENGINE_NOT_INSTALLED,
        format!(
            "Velero is not installed: {}/{} is not served by this cluster",
            velero::API_VERSION,
            kind.as_str()
        ),
    )))
}

/// The Helm release name Flux gives `app`: `spec.releaseName`, else
/// `<targetNamespace>-<name>` when a target namespace is set, else `<name>`.
pub fn release_name(app: &ApplicationInstance) -> String {
    let name = app.metadata.name.clone().unwrap_or_default();
    match (&app.spec.release_name, &app.spec.target_namespace) {
        (Some(release), _) => release.clone(),
        (None, Some(target)) => format!("{target}-{name}"),
        (None, None) => name,
    }
}

/// What Velero must cover for the application of `cx`: its target namespace, whole when
/// no other ApplicationInstance targets it.
pub async fn velero_target(cx: &Cx) -> Result<Option<VeleroTarget>, DriverError> {
    let (Some(app), Some(namespace)) = (cx.app.as_ref(), cx.target_namespace()) else {
        return Ok(None);
    };
    // Within the watch scope: a namespaced engine may not (and need not) list elsewhere.
    let all: Api<ApplicationInstance> = cx.scope.api(cx.client.clone());
    let neighbours = all
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|other| {
            other
                .spec
                .target_namespace_or(other.metadata.namespace.as_deref().unwrap_or_default())
                == namespace
        })
        .count();
    Ok(Some(VeleroTarget {
        namespace: namespace.to_owned(),
        release_name: release_name(app),
        scope: BackupScope::for_neighbours(neighbours.max(1)),
    }))
}

impl Driver for BackupDriver {
    fn op_type(&self) -> OperationType {
        OperationType::Backup
    }

    fn watches(&self) -> Vec<Watch> {
        vec![Watch::Labelled {
            resource: velero_backups(),
            namespace: Some(self.velero_namespace.clone()),
        }]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(30)
    }

    async fn validate(&self, cx: &Cx) -> Result<Option<Outcome>, DriverError> {
        require_velero(cx, VeleroKind::Backup).await
    }

    async fn drive(&self, cx: &Cx) -> Result<Outcome, DriverError> {
        let id = OpId::of(&cx.op)?;
        let name = velero::object_name(&id);
        let backup = match children::get(&cx.client, &velero_backups(), &self.velero_namespace, &name).await? {
            Some(existing) if meta::is_child_of(&existing, &id) => existing,
            Some(_) => {
                return Ok(children::foreign(format!(
                    "Velero Backup {}/{name} already exists and was not created by this Operation",
                    self.velero_namespace
                )));
            }
            None => {
                let Some(target) = velero_target(cx).await? else {
                    return Ok(Outcome::failed(
                        operation_reasons::APPLICATION_NOT_FOUND,
                        "the ApplicationInstance was deleted before the backup started",
                    ));
                };
                let object = velero::backup_object(&cx.op, &target, &self.velero_namespace)?;
                match children::ensure(cx, &velero_backups(), &object).await? {
                    Child::Ours(backup) => backup,
                    Child::Foreign(message) => return Ok(children::foreign(message)),
                }
            }
        };
        let reference = meta::reference_of(&backup).into_iter().collect();
        Ok(velero::map_backup(&backup).into_outcome(reference))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::ApplicationInstanceSpec;

    #[test]
    fn release_names_follow_flux() {
        let mut app = ApplicationInstance::new("wiki", ApplicationInstanceSpec::default());
        assert_eq!(release_name(&app), "wiki");
        app.spec.target_namespace = Some("team-b".into());
        assert_eq!(release_name(&app), "team-b-wiki");
        app.spec.release_name = Some("docs".into());
        assert_eq!(release_name(&app), "docs");
    }
}
