//! Secrets and ConfigMaps an ApplicationInstance references (valuesFrom,
//! repository credentials).
//!
//! Only ConfigMap metadata is ever read. Secrets are not read at all (the controller has
//! no right to): a missing values or credentials Secret is reported by Flux itself and
//! relayed verbatim, and Flux re-applies on a Secret change when the Secret carries the
//! label `reconcile.fluxcd.io/watch: Enabled` (otherwise at the HelmRelease interval).
//! The resourceVersions of the referenced ConfigMaps make a deterministic token; when it
//! changes the engine is asked to re-apply promptly.

use api::{ApplicationInstance, ValuesSourceKind};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

/// One referenced object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub kind: ValuesSourceKind,
    pub name: String,
    /// A missing optional object is not an error.
    pub optional: bool,
}

impl Reference {
    fn describe(&self, namespace: &str) -> String {
        format!("{:?} {namespace}/{}", self.kind, self.name)
    }
}

/// Every Secret/ConfigMap `app` references, in spec order, without duplicates.
pub fn references(app: &ApplicationInstance) -> Vec<Reference> {
    let mut out: Vec<Reference> = Vec::new();
    let mut push = |r: Reference| {
        if !out.iter().any(|o| o.kind == r.kind && o.name == r.name) {
            out.push(r);
        }
    };
    for v in &app.spec.values_from {
        push(Reference {
            kind: v.kind,
            name: v.name.clone(),
            optional: v.optional,
        });
    }
    if let Some(repo) = &app.spec.chart.repository {
        for secret in [&repo.secret_ref, &repo.cert_secret_ref].into_iter().flatten() {
            push(Reference {
                kind: ValuesSourceKind::Secret,
                name: secret.name.clone(),
                optional: false,
            });
        }
    }
    out
}

/// Whether `app` references the object of `kind` named `name` (same namespace).
pub fn references_object(app: &ApplicationInstance, kind: ValuesSourceKind, name: &str) -> bool {
    references(app).iter().any(|r| r.kind == kind && r.name == name)
}

/// What resolving the references found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved {
    /// Deterministic token over the referenced objects' resourceVersions; `None` when
    /// nothing is referenced.
    pub token: Option<String>,
    /// Non-optional ConfigMap references that do not exist, described for a condition message.
    pub missing: Vec<String>,
}

/// Reads the metadata of every referenced ConfigMap; Secret references are left to Flux.
pub async fn resolve(client: &Client, namespace: &str, refs: &[Reference]) -> Result<Resolved, kube::Error> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut versions = Vec::with_capacity(refs.len());
    let mut missing = Vec::new();
    for r in refs.iter().filter(|r| r.kind == ValuesSourceKind::ConfigMap) {
        let meta = config_maps.get_metadata_opt(&r.name).await?.map(|m| m.metadata);
        match meta {
            Some(meta) => versions.push(format!(
                "{:?}/{}={}",
                r.kind,
                r.name,
                meta.resource_version.unwrap_or_default()
            )),
            None if r.optional => versions.push(format!("{:?}/{}=absent", r.kind, r.name)),
            None => missing.push(r.describe(namespace)),
        }
    }
    Ok(Resolved {
        token: token(&versions),
        missing,
    })
}

/// A digest of the entries: short, stable, and a pure function of its input.
fn token(entries: &[String]) -> Option<String> {
    if entries.is_empty() {
        return None;
    }
    Some(format!(
        "vws-{}",
        helmengine::meta::fnv1a_hex(entries.join(";").bytes())
    ))
}

#[cfg(test)]
mod tests {
    use api::{ApplicationInstanceSpec, ChartRepository, ChartSpec, LocalObjectReference, ValuesReference};

    use super::*;

    fn app() -> ApplicationInstance {
        ApplicationInstance::new(
            "wiki",
            ApplicationInstanceSpec {
                chart: ChartSpec {
                    name: "wiki".into(),
                    repository: Some(ChartRepository {
                        url: "https://charts.example.com".into(),
                        secret_ref: Some(LocalObjectReference {
                            name: "repo-creds".into(),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                values_from: vec![
                    ValuesReference {
                        kind: ValuesSourceKind::Secret,
                        name: "db".into(),
                        ..Default::default()
                    },
                    ValuesReference {
                        kind: ValuesSourceKind::ConfigMap,
                        name: "tuning".into(),
                        optional: true,
                        ..Default::default()
                    },
                    ValuesReference {
                        kind: ValuesSourceKind::Secret,
                        name: "db".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        )
    }

    #[test]
    fn references_cover_values_from_and_repository_credentials_once() {
        let refs = references(&app());
        let names: Vec<(ValuesSourceKind, &str, bool)> =
            refs.iter().map(|r| (r.kind, r.name.as_str(), r.optional)).collect();
        assert_eq!(
            names,
            [
                (ValuesSourceKind::Secret, "db", false),
                (ValuesSourceKind::ConfigMap, "tuning", true),
                (ValuesSourceKind::Secret, "repo-creds", false)
            ]
        );
        assert!(references_object(&app(), ValuesSourceKind::Secret, "repo-creds"));
        assert!(!references_object(&app(), ValuesSourceKind::ConfigMap, "db"));
    }

    #[test]
    fn token_is_deterministic_and_changes_with_any_version() {
        let a = token(&["Secret/db=1".into(), "ConfigMap/x=2".into()]);
        assert_eq!(a, token(&["Secret/db=1".into(), "ConfigMap/x=2".into()]));
        assert_ne!(a, token(&["Secret/db=2".into(), "ConfigMap/x=2".into()]));
        assert_eq!(token(&[]), None);
    }
}
