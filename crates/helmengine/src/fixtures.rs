//! Test fixtures shared by the unit tests.

use api::{ApplicationInstance, ApplicationInstanceSpec, ChartRepository, ChartSpec, SourceKind, SourceReference};

/// Name, namespace and UID of the fixture app.
pub const NAME: &str = "wiki";
pub const NAMESPACE: &str = "team-a";
pub const UID: &str = "0b9f5c1e-6d7e-4c55-9a55-0d6f7d7f2a11";

/// An ApplicationInstance as read from the API server, with `spec`.
pub fn app(spec: ApplicationInstanceSpec) -> ApplicationInstance {
    let mut app = ApplicationInstance::new(NAME, spec);
    app.metadata.namespace = Some(NAMESPACE.into());
    app.metadata.uid = Some(UID.into());
    app.metadata.generation = Some(1);
    app
}

/// A spec whose chart comes from `url`.
pub fn repo_spec(url: &str, version: Option<&str>) -> ApplicationInstanceSpec {
    ApplicationInstanceSpec {
        chart: ChartSpec {
            name: "wiki".into(),
            version: version.map(Into::into),
            repository: Some(ChartRepository {
                url: url.into(),
                ..Default::default()
            }),
            source_ref: None,
        },
        ..Default::default()
    }
}

/// A spec whose chart comes from an existing source.
pub fn ref_spec(kind: SourceKind, name: &str, namespace: Option<&str>) -> ApplicationInstanceSpec {
    ApplicationInstanceSpec {
        chart: ChartSpec {
            name: "wiki".into(),
            version: None,
            repository: None,
            source_ref: Some(SourceReference {
                kind,
                name: name.into(),
                namespace: namespace.map(Into::into),
            }),
        },
        ..Default::default()
    }
}

/// The owner reference every object built for [`app`] carries.
pub fn owner_json() -> serde_json::Value {
    serde_json::json!([{
        "apiVersion": "vworkspace.io/v1alpha1",
        "kind": "ApplicationInstance",
        "name": NAME,
        "uid": UID,
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

/// The labels of an object built for [`app`] with `component`.
pub fn labels_json(component: &str) -> serde_json::Value {
    serde_json::json!({
        "app.kubernetes.io/managed-by": "vworkspace-operator",
        "app.kubernetes.io/instance": NAME,
        "app.kubernetes.io/part-of": "vworkspace",
        "app.kubernetes.io/component": component,
    })
}
