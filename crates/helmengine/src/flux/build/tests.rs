use super::*;
use crate::fixtures::{NAMESPACE, app, labels_json, owner_json, ref_spec, repo_spec};
use api::{
    ApplicationDependency, ApplicationInstanceSpec, DriftDetection, LocalObjectReference, ReleaseTest, Remediation,
    SourceKind,
};
use pretty_assertions::assert_eq;

fn to_json(object: &DynamicObject) -> Value {
    serde_json::to_value(object).expect("DynamicObject serialises")
}

fn release_json(spec: ApplicationInstanceSpec) -> Value {
    to_json(&helm_release(&app(spec), &MaterializeInput::default()).expect("valid spec"))
}

fn source_json(spec: ApplicationInstanceSpec) -> Option<Value> {
    source(&app(spec)).expect("valid spec").as_ref().map(to_json)
}

fn metadata(component: &str) -> Value {
    json!({
        "name": "wiki",
        "namespace": NAMESPACE,
        "labels": labels_json(component),
        "ownerReferences": owner_json(),
    })
}

/// The metadata of a HelmRelease reading from the shared source `source`.
fn release_metadata(source: &str) -> Value {
    let mut metadata = metadata("helm-release");
    metadata["labels"]["vworkspace.io/chart-source"] = json!(source);
    metadata
}

/// The metadata of the shared source `name`: our labels, no instance, no owner. Names are
/// literal on purpose: a changed name makes every existing app move to a new source.
fn shared_source_metadata(name: &str) -> Value {
    json!({
        "name": name,
        "namespace": NAMESPACE,
        "labels": {
            "app.kubernetes.io/managed-by": "vworkspace-operator",
            "app.kubernetes.io/part-of": "vworkspace",
            "app.kubernetes.io/component": "chart-source",
        },
    })
}

const STABLE_SOURCE: &str = "vws-charts-example-com-stable-7ede9e3a1215bf24";
const OCI_SOURCE: &str = "vws-ghcr-io-example-charts-wiki-6942049b40624652";

#[test]
fn http_repository_golden() {
    let spec = repo_spec("https://charts.example.com/stable", None);
    assert_eq!(
        release_json(spec.clone()),
        json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2",
            "kind": "HelmRelease",
            "metadata": release_metadata(STABLE_SOURCE),
            "spec": {
                "interval": "10m",
                "chart": {"spec": {
                    "chart": "wiki",
                    "version": "*",
                    "sourceRef": {"kind": "HelmRepository", "name": STABLE_SOURCE, "namespace": NAMESPACE},
                    "interval": "1h",
                }},
                // Unset in the spec: the release ServiceAccount the app controller binds.
                "serviceAccountName": "vworkspace-release",
            },
        })
    );
    assert_eq!(
        source_json(spec),
        Some(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "HelmRepository",
            "metadata": shared_source_metadata(STABLE_SOURCE),
            "spec": {"url": "https://charts.example.com/stable", "interval": "1h"},
        }))
    );
}

#[test]
fn http_repository_with_credentials_and_interval() {
    let mut spec = repo_spec("http://charts.internal:8080", Some("~6.2"));
    let repository = spec.chart.repository.as_mut().expect("fixture has a repository");
    repository.secret_ref = Some(LocalObjectReference {
        name: "repo-auth".into(),
    });
    repository.cert_secret_ref = Some(LocalObjectReference {
        name: "repo-tls".into(),
    });
    repository.interval = Some("30m".into());
    assert_eq!(
        release_json(spec.clone())["spec"]["chart"],
        json!({"spec": {
            "chart": "wiki",
            "version": "~6.2",
            "sourceRef": {"kind": "HelmRepository", "name": "vws-charts-internal-8080-5903c2f4ee5b91a5", "namespace": NAMESPACE},
            "interval": "30m",
        }})
    );
    assert_eq!(
        source_json(spec).expect("managed source")["spec"],
        json!({
            "url": "http://charts.internal:8080",
            "interval": "30m",
            "secretRef": {"name": "repo-auth"},
            "certSecretRef": {"name": "repo-tls"},
        })
    );
}

#[test]
fn oci_repository_golden() {
    let spec = repo_spec("oci://ghcr.io/example/charts/wiki", None);
    let release = release_json(spec.clone());
    assert_eq!(
        release["spec"],
        json!({
            "interval": "10m",
            "chartRef": {"kind": "OCIRepository", "name": OCI_SOURCE, "namespace": NAMESPACE},
            "serviceAccountName": "vworkspace-release",
        })
    );
    assert_eq!(
        source_json(spec),
        Some(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "OCIRepository",
            "metadata": shared_source_metadata(OCI_SOURCE),
            "spec": {
                "url": "oci://ghcr.io/example/charts/wiki",
                "interval": "5m",
                "ref": {"semver": "*"},
                "layerSelector": {
                    "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                    "operation": "copy",
                },
            },
        }))
    );
}

#[test]
fn oci_repository_versions_credentials_and_trailing_slash() {
    let cases = [
        ("exact version", Some("6.2.1"), "6.2.1"),
        ("range", Some(">=6.0.0 <7.0.0"), ">=6.0.0 <7.0.0"),
        ("explicit latest", Some("*"), "*"),
    ];
    for (name, version, semver) in cases {
        let mut spec = repo_spec("oci://registry.example.com:5000/charts/wiki/", version);
        let repository = spec.chart.repository.as_mut().expect("fixture has a repository");
        repository.secret_ref = Some(LocalObjectReference { name: "pull".into() });
        repository.cert_secret_ref = Some(LocalObjectReference { name: "ca".into() });
        repository.interval = Some("1m".into());
        let source = source_json(spec).expect("managed source");
        assert_eq!(
            source["spec"],
            json!({
                "url": "oci://registry.example.com:5000/charts/wiki",
                "interval": "1m",
                "ref": {"semver": semver},
                "layerSelector": {"mediaType": HELM_CHART_MEDIA_TYPE, "operation": "copy"},
                "secretRef": {"name": "pull"},
                "certSecretRef": {"name": "ca"},
            }),
            "{name}"
        );
    }
}

#[test]
fn source_ref_variants() {
    let template = |kind: &str, name: &str, ns: &str| {
        json!({"chart": {"spec": {
            "chart": "wiki",
            "version": "*",
            "sourceRef": {"kind": kind, "name": name, "namespace": ns},
        }}})
    };
    let chart_ref =
        |kind: &str, name: &str, ns: &str| json!({"chartRef": {"kind": kind, "name": name, "namespace": ns}});
    let cases = [
        (
            SourceKind::HelmRepository,
            Some("flux-system"),
            template("HelmRepository", "bitnami", "flux-system"),
        ),
        (
            SourceKind::HelmRepository,
            None,
            template("HelmRepository", "bitnami", NAMESPACE),
        ),
        (
            SourceKind::GitRepository,
            None,
            template("GitRepository", "bitnami", NAMESPACE),
        ),
        (
            SourceKind::Bucket,
            Some("shared"),
            template("Bucket", "bitnami", "shared"),
        ),
        (
            SourceKind::OciRepository,
            None,
            chart_ref("OCIRepository", "bitnami", NAMESPACE),
        ),
        (
            SourceKind::HelmChart,
            Some("shared"),
            chart_ref("HelmChart", "bitnami", "shared"),
        ),
    ];
    for (kind, namespace, want) in cases {
        let spec = ref_spec(kind, "bitnami", namespace);
        let mut expected = json!({"interval": "10m", "serviceAccountName": "vworkspace-release"});
        for (k, v) in want.as_object().expect("object") {
            expected[k] = v.clone();
        }
        assert_eq!(release_json(spec.clone())["spec"], expected, "{kind:?}");
        assert_eq!(source_json(spec), None, "{kind:?} creates no source");
    }
}

#[test]
fn source_ref_with_helm_repository_keeps_the_version() {
    let mut spec = ref_spec(SourceKind::HelmRepository, "bitnami", None);
    spec.chart.version = Some("1.2.3".into());
    assert_eq!(release_json(spec)["spec"]["chart"]["spec"]["version"], json!("1.2.3"));
}

/// Every spec field at once: the full object as applied.
#[test]
fn full_example_golden() {
    let mut spec = repo_spec("https://charts.example.com", Some("6.2.1"));
    spec.values = Some(json!({"replicas": 2, "ingress": {"enabled": true, "host": "wiki.example.com"}}));
    spec.values_from = vec![
        ValuesReference {
            kind: ValuesSourceKind::Secret,
            name: "wiki-db".into(),
            values_key: Some("password".into()),
            target_path: Some("db.password".into()),
            optional: false,
        },
        ValuesReference {
            kind: ValuesSourceKind::ConfigMap,
            name: "wiki-defaults".into(),
            values_key: None,
            target_path: None,
            optional: true,
        },
    ];
    spec.release_name = Some("wiki-prod".into());
    spec.target_namespace = Some("team-a-apps".into());
    spec.interval = Some("15m".into());
    spec.timeout = Some("10m".into());
    spec.suspend = true;
    spec.depends_on = vec![
        ApplicationDependency {
            name: "postgres".into(),
            namespace: None,
        },
        ApplicationDependency {
            name: "redis".into(),
            namespace: Some("shared".into()),
        },
    ];
    spec.service_account_name = Some("wiki-deployer".into());
    spec.install = Some(ReleaseActionSpec {
        remediation: Some(Remediation {
            retries: Some(3),
            strategy: None,
            retry_interval: None,
        }),
    });
    spec.upgrade = Some(ReleaseActionSpec {
        remediation: Some(Remediation {
            retries: Some(-1),
            strategy: Some(RemediationStrategy::Retry),
            retry_interval: Some("2m".into()),
        }),
    });
    spec.drift_detection = Some(DriftDetection {
        mode: DriftDetectionMode::Warn,
    });
    spec.test = Some(ReleaseTest {
        enable: None,
        ignore_failures: true,
        timeout: Some("3m".into()),
    });
    spec.engine = Some(api::EngineKind::Flux);

    let input = MaterializeInput {
        values_revision: Some("wiki-db=4711,wiki-defaults=42".into()),
        ..Default::default()
    };
    let release = helm_release(&app(spec), &input).expect("valid spec");
    let mut metadata = release_metadata("vws-charts-example-com-737cbf3c6944be1e");
    metadata["annotations"] = json!({"reconcile.fluxcd.io/requestedAt": "wiki-db=4711,wiki-defaults=42"});
    assert_eq!(
        to_json(&release),
        json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2",
            "kind": "HelmRelease",
            "metadata": metadata,
            "spec": {
                "interval": "15m",
                "chart": {"spec": {
                    "chart": "wiki",
                    "version": "6.2.1",
                    "sourceRef": {"kind": "HelmRepository", "name": "vws-charts-example-com-737cbf3c6944be1e", "namespace": NAMESPACE},
                    "interval": "1h",
                }},
                "values": {"replicas": 2, "ingress": {"enabled": true, "host": "wiki.example.com"}},
                "valuesFrom": [
                    {"kind": "Secret", "name": "wiki-db", "valuesKey": "password", "targetPath": "db.password"},
                    {"kind": "ConfigMap", "name": "wiki-defaults", "optional": true},
                ],
                "releaseName": "wiki-prod",
                "targetNamespace": "team-a-apps",
                "timeout": "10m",
                "suspend": true,
                "dependsOn": [
                    {"name": "postgres", "namespace": NAMESPACE},
                    {"name": "redis", "namespace": "shared"},
                ],
                "serviceAccountName": "wiki-deployer",
                "install": {"strategy": {"name": "RemediateOnFailure"}, "remediation": {"retries": 3}},
                "upgrade": {
                    "strategy": {"name": "RetryOnFailure", "retryInterval": "2m"},
                    "remediation": {"retries": -1},
                },
                "driftDetection": {"mode": "warn"},
                "test": {"enable": true, "ignoreFailures": true, "timeout": "3m"},
            },
        })
    );
}

#[test]
fn remediation_table() {
    let rem = |retries: Option<i32>, strategy: Option<RemediationStrategy>, retry_interval: Option<&str>| {
        Some(ReleaseActionSpec {
            remediation: Some(Remediation {
                retries,
                strategy,
                retry_interval: retry_interval.map(Into::into),
            }),
        })
    };
    let cases = [
        ("no action spec", None, None, None),
        (
            "action without remediation",
            Some(ReleaseActionSpec { remediation: None }),
            None,
            None,
        ),
        (
            "default strategy",
            rem(None, None, None),
            Some(json!({"strategy": {"name": "RemediateOnFailure"}})),
            Some(json!({"strategy": {"name": "RemediateOnFailure"}, "remediation": {"strategy": "rollback"}})),
        ),
        (
            "rollback with retries",
            rem(Some(2), Some(RemediationStrategy::Rollback), None),
            Some(json!({"strategy": {"name": "RemediateOnFailure"}, "remediation": {"retries": 2}})),
            Some(json!({
                "strategy": {"name": "RemediateOnFailure"},
                "remediation": {"retries": 2, "strategy": "rollback"},
            })),
        ),
        (
            "retry without interval",
            rem(None, Some(RemediationStrategy::Retry), None),
            Some(json!({"strategy": {"name": "RetryOnFailure"}})),
            Some(json!({"strategy": {"name": "RetryOnFailure"}})),
        ),
        (
            "retry with interval and retries",
            rem(Some(5), Some(RemediationStrategy::Retry), Some("30s")),
            Some(
                json!({"strategy": {"name": "RetryOnFailure", "retryInterval": "30s"}, "remediation": {"retries": 5}}),
            ),
            Some(
                json!({"strategy": {"name": "RetryOnFailure", "retryInterval": "30s"}, "remediation": {"retries": 5}}),
            ),
        ),
    ];
    for (name, action, install, upgrade) in cases {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.install = action.clone();
        spec.upgrade = action;
        let release = release_json(spec);
        assert_eq!(release["spec"].get("install"), install.as_ref(), "install: {name}");
        assert_eq!(release["spec"].get("upgrade"), upgrade.as_ref(), "upgrade: {name}");
    }
}

#[test]
fn drift_detection_modes() {
    for (mode, want) in [
        (DriftDetectionMode::Enabled, "enabled"),
        (DriftDetectionMode::Warn, "warn"),
        (DriftDetectionMode::Disabled, "disabled"),
    ] {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.drift_detection = Some(DriftDetection { mode });
        assert_eq!(release_json(spec)["spec"]["driftDetection"], json!({"mode": want}));
    }
}

#[test]
fn release_test_table() {
    let test = |enable: Option<bool>, ignore_failures: bool, timeout: Option<&str>| {
        Some(ReleaseTest {
            enable,
            ignore_failures,
            timeout: timeout.map(Into::into),
        })
    };
    let cases = [
        ("absent: no tests", None, None),
        (
            "present: enabled, failures count",
            test(None, false, None),
            Some(json!({"enable": true, "ignoreFailures": false})),
        ),
        (
            "ignore failures with a timeout",
            test(None, true, Some("90s")),
            Some(json!({"enable": true, "ignoreFailures": true, "timeout": "90s"})),
        ),
        (
            "explicitly enabled",
            test(Some(true), false, Some("2m")),
            Some(json!({"enable": true, "ignoreFailures": false, "timeout": "2m"})),
        ),
        (
            "disabled keeps its settings",
            test(Some(false), true, None),
            Some(json!({"enable": false, "ignoreFailures": true})),
        ),
    ];
    for (name, test, want) in cases {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.test = test;
        assert_eq!(release_json(spec)["spec"].get("test"), want.as_ref(), "{name}");
    }
}

#[test]
fn values_revision_becomes_requested_at_only_when_set() {
    let spec = repo_spec("https://charts.example.com", None);
    assert_eq!(release_json(spec.clone())["metadata"].get("annotations"), None);
    let input = MaterializeInput {
        values_revision: Some("rv-17".into()),
        ..Default::default()
    };
    let release = to_json(&helm_release(&app(spec), &input).expect("valid spec"));
    assert_eq!(
        release["metadata"]["annotations"],
        json!({"reconcile.fluxcd.io/requestedAt": "rv-17"})
    );
}

#[test]
fn null_values_and_false_suspend_are_left_out() {
    let mut spec = repo_spec("https://charts.example.com", None);
    spec.values = Some(Value::Null);
    spec.suspend = false;
    let release = release_json(spec);
    assert_eq!(release["spec"].get("values"), None);
    assert_eq!(release["spec"].get("suspend"), None);
}

#[test]
fn empty_values_object_is_kept_as_is() {
    let mut spec = repo_spec("https://charts.example.com", None);
    spec.values = Some(json!({}));
    assert_eq!(release_json(spec)["spec"]["values"], json!({}));
}

#[test]
fn output_is_deterministic() {
    let mut spec = repo_spec("oci://ghcr.io/example/wiki", Some("1.0.0"));
    spec.values = Some(json!({"z": 1, "a": {"y": 2, "b": 3}}));
    let input = MaterializeInput {
        values_revision: Some("t".into()),
        ..Default::default()
    };
    let render = || {
        let release = helm_release(&app(spec.clone()), &input).expect("valid spec");
        let source = source(&app(spec.clone())).expect("valid spec");
        (
            serde_json::to_string(&release).expect("json"),
            serde_json::to_string(&source).expect("json"),
        )
    };
    let first = render();
    assert_eq!(first, render());
    // Keys come out sorted, whatever order they were written in.
    assert!(first.0.find("\"a\":").expect("a") < first.0.find("\"z\":").expect("z"));
}

#[test]
fn references() {
    let http = app(repo_spec("https://charts.example.com", None));
    assert_eq!(
        engine_reference(&http).expect("valid"),
        HELM_RELEASE.object_ref("wiki", NAMESPACE)
    );
    let shared_name = |app: &ApplicationInstance| source(app).expect("valid").expect("managed").name_any();
    assert_eq!(
        source_reference(&http).expect("valid"),
        HELM_REPOSITORY.object_ref(&shared_name(&http), NAMESPACE)
    );
    let oci = app(repo_spec("oci://ghcr.io/example/wiki", None));
    assert_eq!(
        source_reference(&oci).expect("valid"),
        OCI_REPOSITORY.object_ref(&shared_name(&oci), NAMESPACE)
    );
    let git = app(ref_spec(SourceKind::GitRepository, "charts", Some("flux-system")));
    assert_eq!(
        source_reference(&git).expect("valid"),
        super::super::GIT_REPOSITORY.object_ref("charts", "flux-system")
    );
}

#[test]
fn previous_source_table() {
    let app = app(repo_spec("https://charts.example.com", None));
    let in_use = source_reference(&app).expect("valid");
    let repo = |name: &str, namespace: &str| HELM_REPOSITORY.object_ref(name, namespace);
    let shared_elsewhere = repo("vws-other-0123456789abcdef", NAMESPACE);
    let cases = [
        ("no live release", None, PreviousSource::Keep),
        ("the source in use", Some(in_use.clone()), PreviousSource::Keep),
        (
            "named like the app (before shared sources)",
            Some(repo("wiki", NAMESPACE)),
            PreviousSource::DeleteIfOurs(repo("wiki", NAMESPACE)),
        ),
        (
            "an OCIRepository named like the app",
            Some(OCI_REPOSITORY.object_ref("wiki", NAMESPACE)),
            PreviousSource::DeleteIfOurs(OCI_REPOSITORY.object_ref("wiki", NAMESPACE)),
        ),
        (
            "another shared source",
            Some(shared_elsewhere.clone()),
            PreviousSource::ReleaseShared(shared_elsewhere),
        ),
        (
            "a user's source (sourceRef)",
            Some(repo("charts", NAMESPACE)),
            PreviousSource::Keep,
        ),
        ("another namespace", Some(repo("wiki", "other")), PreviousSource::Keep),
        (
            "a kind we never manage",
            Some(super::super::GIT_REPOSITORY.object_ref("wiki", NAMESPACE)),
            PreviousSource::Keep,
        ),
    ];
    for (what, previous, want) in cases {
        assert_eq!(
            previous_source(&app, previous.as_ref(), &in_use).expect("valid"),
            want,
            "{what}"
        );
    }
}

#[test]
fn apps_with_the_same_repository_spec_share_one_source() {
    let name = |spec: ApplicationInstanceSpec| {
        let source = source(&app(spec)).expect("valid").expect("managed");
        assert_eq!(source.metadata.owner_references, None, "a shared source has no owner");
        assert_eq!(
            source.labels().get(meta::LABEL_INSTANCE),
            None,
            "a shared source names no instance"
        );
        source.name_any()
    };
    let plain = name(repo_spec("https://charts.example.com/stable", Some("1.0.0")));
    // Chart name and version live in the HelmRelease, not in an HTTP repository's spec.
    let mut other_chart = repo_spec("https://charts.example.com/stable", Some("2.0.0"));
    other_chart.chart.name = "blog".into();
    assert_eq!(name(other_chart), plain);
    assert!(plain.starts_with("vws-charts-example-com-stable-"), "{plain}");
    assert!(plain.len() <= 63, "{plain}");

    let mut with_credentials = repo_spec("https://charts.example.com/stable", None);
    if let Some(repository) = with_credentials.chart.repository.as_mut() {
        repository.secret_ref = Some(LocalObjectReference { name: "creds".into() });
    }
    assert_ne!(name(with_credentials), plain, "other credentials, another source");
    assert_ne!(name(repo_spec("https://charts.example.com/other", None)), plain);

    // An OCIRepository's spec holds the version: one source per version.
    let oci = |version| name(repo_spec("oci://ghcr.io/example/wiki", Some(version)));
    assert_ne!(oci("1.0.0"), oci("2.0.0"));
    assert_eq!(oci("1.0.0"), oci("1.0.0"));

    // A very long URL still makes a valid name and label value.
    let long = name(repo_spec(&format!("https://{}.example.com", "a".repeat(300)), None));
    assert!(long.len() <= 63, "{long}");
}

#[test]
fn the_release_names_its_shared_source() {
    let app = app(repo_spec("https://charts.example.com", None));
    let release = helm_release(&app, &MaterializeInput::default()).expect("valid");
    let source = source(&app).expect("valid").expect("managed");
    assert_eq!(release.labels().get(LABEL_CHART_SOURCE), Some(&source.name_any()));
    assert_eq!(
        release.data.pointer("/spec/chart/spec/sourceRef/name"),
        Some(&json!(source.name_any()))
    );
    let by_ref = self::app(ref_spec(SourceKind::HelmRepository, "charts", None));
    let release = helm_release(&by_ref, &MaterializeInput::default()).expect("valid");
    assert_eq!(release.labels().get(LABEL_CHART_SOURCE), None, "not a source we manage");
}

#[test]
fn invalid_specs_are_refused_before_anything_is_built() {
    let with_version = |mut spec: ApplicationInstanceSpec, version: &str| {
        spec.chart.version = Some(version.into());
        spec
    };
    let both = {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.chart.source_ref = ref_spec(SourceKind::HelmRepository, "x", None).chart.source_ref;
        spec
    };
    let neither = {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.chart.repository = None;
        spec
    };
    let retry_interval_with_rollback = {
        let mut spec = repo_spec("https://charts.example.com", None);
        spec.upgrade = Some(ReleaseActionSpec {
            remediation: Some(Remediation {
                retry_interval: Some("1m".into()),
                ..Default::default()
            }),
        });
        spec
    };
    let cases = [
        (
            "oci host only",
            repo_spec("oci://ghcr.io", None),
            "must name the chart repository",
        ),
        (
            "oci host with slash",
            repo_spec("oci://ghcr.io/", None),
            "must name the chart repository",
        ),
        ("oci no host", repo_spec("oci:///charts/wiki", None), "has no host"),
        (
            "oci tag",
            repo_spec("oci://ghcr.io/example/wiki:1.0.0", None),
            "tag or digest",
        ),
        (
            "oci digest",
            repo_spec("oci://ghcr.io/example/wiki@sha256:abc", None),
            "tag or digest",
        ),
        (
            "credentials",
            repo_spec("https://user:secret@charts.example.com", None),
            "must not embed credentials",
        ),
        (
            "oci credentials",
            repo_spec("oci://user:secret@ghcr.io/x/wiki", None),
            "must not embed credentials",
        ),
        ("scheme", repo_spec("ftp://charts.example.com", None), "must start with"),
        ("http no host", repo_spec("https://", None), "has no host"),
        ("both sources", both, "exactly one of"),
        ("no source", neither, "exactly one of"),
        (
            "version with OCIRepository ref",
            with_version(ref_spec(SourceKind::OciRepository, "x", None), "1.0.0"),
            "OCIRepository sourceRef",
        ),
        (
            "version with HelmChart ref",
            with_version(ref_spec(SourceKind::HelmChart, "x", None), "1.0.0"),
            "HelmChart sourceRef",
        ),
        (
            "version with GitRepository ref",
            with_version(ref_spec(SourceKind::GitRepository, "x", None), "~1"),
            "GitRepository sourceRef",
        ),
        (
            "version with Bucket ref",
            with_version(ref_spec(SourceKind::Bucket, "x", None), "1.0.0"),
            "Bucket sourceRef",
        ),
        (
            "retryInterval with rollback",
            retry_interval_with_rollback,
            "retryInterval is only allowed",
        ),
    ];
    for (name, spec, fragment) in cases {
        let err = helm_release(&app(spec.clone()), &MaterializeInput::default()).expect_err(name);
        assert!(
            matches!(&err, EngineError::InvalidSpec(m) if m.contains(fragment)),
            "{name}: {err}"
        );
        assert!(!err.to_string().contains("secret@"), "{name}: the URL is never echoed");
        if !name.starts_with("retryInterval") {
            assert!(source(&app(spec)).is_err(), "{name}: source() refuses too");
        }
    }
}

#[test]
fn star_version_is_allowed_with_pinned_sources() {
    for kind in [
        SourceKind::OciRepository,
        SourceKind::HelmChart,
        SourceKind::GitRepository,
    ] {
        let mut spec = ref_spec(kind, "x", None);
        spec.chart.version = Some("*".into());
        assert!(
            helm_release(&app(spec), &MaterializeInput::default()).is_ok(),
            "{kind:?}"
        );
    }
}

#[test]
fn objects_need_identity() {
    let mut no_uid = app(repo_spec("https://charts.example.com", None));
    no_uid.metadata.uid = None;
    assert!(matches!(
        helm_release(&no_uid, &MaterializeInput::default()),
        Err(EngineError::InvalidSpec(_))
    ));
    let mut no_namespace = app(repo_spec("https://charts.example.com", None));
    no_namespace.metadata.namespace = None;
    assert!(matches!(source(&no_namespace), Err(EngineError::InvalidSpec(_))));
}
