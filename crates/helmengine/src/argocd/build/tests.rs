use api::{
    ApplicationDependency, DriftDetection, DriftDetectionMode, LocalObjectReference, ReleaseActionSpec, ReleaseTest,
    Remediation, RemediationStrategy, SourceKind, ValuesReference, ValuesSourceKind,
};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

/// An edit of a fixture spec, for table tests.
type Edit = Box<dyn Fn(&mut api::ApplicationInstanceSpec)>;
use crate::fixtures::{self, NAME, NAMESPACE, UID, app, repo_spec};

fn placement() -> Placement {
    Placement {
        namespace: "argocd".into(),
        destination_server: "https://kubernetes.default.svc".into(),
    }
}

fn build(app: &ApplicationInstance) -> Result<serde_json::Value, EngineError> {
    let object = application(app, &MaterializeInput::default(), &placement(), Comparison::Done)?;
    Ok(serde_json::to_value(object).unwrap_or_default())
}

fn labels(component: &str) -> serde_json::Value {
    let mut labels = fixtures::labels_json(component);
    labels["vworkspace.io/instance-namespace"] = json!(NAMESPACE);
    labels
}

#[test]
fn an_http_chart_becomes_an_automated_application_in_argo_cds_namespace() {
    let mut spec = repo_spec("https://charts.example.com/stable/", Some("6.2.x"));
    spec.values = Some(json!({"replicas": 2, "ingress": {"host": "wiki.example.com"}}));
    let built = build(&app(spec)).unwrap();
    assert_eq!(
        built,
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {
                "name": "team-a.wiki",
                "namespace": "argocd",
                "labels": labels("helm-release"),
                "annotations": {"vworkspace.io/instance-uid": UID},
                "finalizers": ["resources-finalizer.argocd.argoproj.io"],
            },
            "spec": {
                "project": "team-a.wiki",
                "source": {
                    "repoURL": "https://charts.example.com/stable",
                    "chart": "wiki",
                    "targetRevision": "6.2.x",
                    "helm": {
                        "releaseName": NAME,
                        "valuesObject": {"replicas": 2, "ingress": {"host": "wiki.example.com"}},
                    },
                },
                "destination": {"server": "https://kubernetes.default.svc", "namespace": NAMESPACE},
                "syncPolicy": {"automated": {"prune": true, "selfHeal": false}, "retry": {"limit": 0}},
            },
        })
    );
}

#[test]
fn the_project_fences_the_application_in() {
    let mut spec = repo_spec("http://charts.example.com", None);
    spec.target_namespace = Some("wiki-prod".into());
    let project = serde_json::to_value(app_project(&app(spec), &placement()).unwrap()).unwrap();
    assert_eq!(
        project,
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AppProject",
            "metadata": {
                "name": "team-a.wiki",
                "namespace": "argocd",
                "labels": labels("app-project"),
                "annotations": {"vworkspace.io/instance-uid": UID},
            },
            "spec": {
                "description": "vworkspace: ApplicationInstance team-a/wiki",
                "sourceRepos": ["http://charts.example.com"],
                "destinations": [{"server": "https://kubernetes.default.svc", "namespace": "wiki-prod"}],
                "destinationServiceAccounts": [{
                    "server": "https://kubernetes.default.svc",
                    "namespace": "wiki-prod",
                    "defaultServiceAccount": "team-a:vworkspace-release",
                }],
                "clusterResourceWhitelist": [],
            },
        })
    );
}

#[test]
fn the_project_impersonates_the_named_service_account_in_the_apps_namespace() {
    let mut spec = repo_spec("http://charts.example.com", None);
    spec.service_account_name = Some("deployer".into());
    let project = serde_json::to_value(app_project(&app(spec), &placement()).unwrap()).unwrap();
    assert_eq!(
        project.pointer("/spec/destinationServiceAccounts/0/defaultServiceAccount"),
        Some(&json!("deployer"))
    );
}

#[test]
fn mapped_fields() {
    let cases: Vec<(&str, Edit, &str, serde_json::Value)> = vec![
        (
            "no version is the latest",
            Box::new(|_| {}),
            "/spec/source/targetRevision",
            json!("*"),
        ),
        (
            "release name defaults like Flux's",
            Box::new(|s| s.target_namespace = Some("prod".into())),
            "/spec/source/helm/releaseName",
            json!("prod-wiki"),
        ),
        (
            "explicit release name",
            Box::new(|s| s.release_name = Some("w".into())),
            "/spec/source/helm/releaseName",
            json!("w"),
        ),
        (
            "suspended: no automated sync",
            Box::new(|s| s.suspend = true),
            "/spec/project",
            json!("team-a.wiki"),
        ),
        (
            "drift correction is self-heal",
            Box::new(|s| {
                s.drift_detection = Some(DriftDetection {
                    mode: DriftDetectionMode::Enabled,
                })
            }),
            "/spec/syncPolicy/automated/selfHeal",
            json!(true),
        ),
        (
            "remediation retries become sync retries",
            Box::new(|s| {
                s.upgrade = Some(ReleaseActionSpec {
                    remediation: Some(Remediation {
                        retries: Some(3),
                        ..Default::default()
                    }),
                })
            }),
            "/spec/syncPolicy/retry",
            json!({"limit": 3}),
        ),
        (
            "null values are no values",
            Box::new(|s| s.values = Some(serde_json::Value::Null)),
            "/spec/source/helm",
            json!({"releaseName": NAME}),
        ),
    ];
    for (name, edit, pointer, expected) in cases {
        let mut spec = repo_spec("https://charts.example.com", None);
        edit(&mut spec);
        let built = build(&app(spec)).unwrap();
        assert_eq!(built.pointer(pointer), Some(&expected), "{name}");
    }
}

#[test]
fn an_operation_holding_the_release_suspends_it() {
    let input = MaterializeInput {
        suspended_by: Some("restore-1".into()),
        ..Default::default()
    };
    let built = application(
        &app(repo_spec("https://charts.example.com", None)),
        &input,
        &placement(),
        Comparison::Done,
    )
    .unwrap();
    assert_eq!(
        built.data.pointer("/spec/syncPolicy"),
        Some(&json!({"retry": {"limit": 0}})),
        "no automated sync"
    );
    let mut spec = repo_spec("https://charts.example.com", None);
    spec.suspend = true;
    let built = application(&app(spec), &MaterializeInput::default(), &placement(), Comparison::Done).unwrap();
    assert_eq!(built.data.pointer("/spec/syncPolicy/automated"), None, "spec.suspend");
}

/// Argo CD's project cache race (see [`Comparison`]): automated sync only once Argo CD has
/// compared the live Application against a project that existed before this write.
#[test]
fn automated_sync_waits_until_argo_cd_has_compared_the_application() {
    let live = |data: serde_json::Value| {
        let mut object = DynamicObject::new("team-a.wiki", &APPLICATION.api_resource()).within("argocd");
        object.data = data;
        object
    };
    let project = live(json!({"spec": {}}));
    let not_compared = live(json!({"status": {"sync": {"status": "Unknown"}}}));
    let compared = live(json!({"status": {"sync": {"status": "Synced", "comparedTo": {"source": {}}}}}));
    let cases = [
        ("no live Application", Some(&project), None, false, false),
        (
            "live without comparedTo",
            Some(&project),
            Some(&not_compared),
            false,
            false,
        ),
        ("live with comparedTo", Some(&project), Some(&compared), false, true),
        (
            "compared, but the project is created by this write",
            None,
            Some(&compared),
            false,
            false,
        ),
        ("suspended, no live Application", Some(&project), None, true, false),
        (
            "suspended, live with comparedTo",
            Some(&project),
            Some(&compared),
            true,
            false,
        ),
    ];
    for (name, live_project, live_application, suspend, automated) in cases {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.suspend = suspend;
        let comparison = Comparison::of(live_project, live_application);
        let built = application(&app(spec), &MaterializeInput::default(), &placement(), comparison).unwrap();
        assert_eq!(
            built.data.pointer("/spec/syncPolicy/automated").is_some(),
            automated,
            "{name}"
        );
        assert_eq!(
            built.data.pointer("/spec/syncPolicy/retry"),
            Some(&json!({"limit": 0})),
            "{name}"
        );
    }
}

#[test]
fn refused_fields_write_nothing_and_say_why() {
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "valuesFrom",
            Box::new(|s| {
                s.values_from = vec![ValuesReference {
                    kind: ValuesSourceKind::Secret,
                    name: "db".into(),
                    values_key: None,
                    target_path: None,
                    optional: false,
                }]
            }),
            "valuesFrom is not supported by the argocd engine",
        ),
        (
            "oci",
            Box::new(|s| {
                if let Some(r) = s.chart.repository.as_mut() {
                    r.url = "oci://registry.example.com/charts/wiki".into();
                }
            }),
            "oci:// repositories are not supported",
        ),
        (
            "repository credentials",
            Box::new(|s| {
                if let Some(r) = s.chart.repository.as_mut() {
                    r.secret_ref = Some(LocalObjectReference { name: "creds".into() });
                }
            }),
            "register the repository with Argo CD",
        ),
        (
            "sourceRef",
            Box::new(|s| {
                s.chart = fixtures::ref_spec(SourceKind::HelmRepository, "charts", None).chart;
            }),
            "chart.sourceRef names a Flux source",
        ),
        (
            "dependsOn",
            Box::new(|s| {
                s.depends_on = vec![ApplicationDependency {
                    name: "db".into(),
                    namespace: None,
                }]
            }),
            "dependsOn is not supported",
        ),
        (
            "helm tests",
            Box::new(|s| {
                s.test = Some(ReleaseTest {
                    enable: Some(true),
                    ..Default::default()
                })
            }),
            "Argo CD does not run Helm tests",
        ),
        (
            "rollback",
            Box::new(|s| {
                s.install = Some(ReleaseActionSpec {
                    remediation: Some(Remediation {
                        strategy: Some(RemediationStrategy::Rollback),
                        ..Default::default()
                    }),
                })
            }),
            "it does not roll back",
        ),
        (
            "credentials in the URL",
            Box::new(|s| {
                if let Some(r) = s.chart.repository.as_mut() {
                    r.url = "https://user:pw@charts.example.com".into();
                }
            }),
            "must not embed credentials",
        ),
        (
            "values that are not an object",
            Box::new(|s| s.values = Some(json!([1, 2]))),
            "values must be an object",
        ),
        (
            "a default release name too long for Helm",
            Box::new(|s| s.target_namespace = Some("a-namespace-with-a-rather-long-name-indeed-yes-it-is".into())),
            "set releaseName",
        ),
    ];
    for (name, edit, expected) in cases {
        let mut spec = repo_spec("https://charts.example.com", None);
        edit(&mut spec);
        let app = app(spec);
        let error = application(&app, &MaterializeInput::default(), &placement(), Comparison::Done)
            .err()
            .map(|e| (e.is_terminal(), e.to_string()));
        assert!(
            error
                .as_ref()
                .is_some_and(|(terminal, message)| *terminal && message.contains(expected)),
            "{name}: {error:?}"
        );
    }
}

#[test]
fn names_never_collide_across_namespaces() {
    // "a-b/c" and "a/b-c" would collide with a dash; namespaces hold no dots.
    let id = |namespace, name| AppId { name, namespace };
    assert_ne!(object_name(id("a-b", "c")), object_name(id("a", "b-c")));
    assert_eq!(object_name(id("team-a", "wiki")), "team-a.wiki");
}
