//! The client layer against a scripted API server ([`test_support::ApiServer`]): each
//! test lists the exact requests the engine must make, in order, and the answers it
//! gets; a missing, extra or different request fails the test.

use super::*;
use crate::fixtures::{NAMESPACE, UID, app, owner_json, ref_spec, repo_spec};
use api::SourceKind;
use http::{Method, StatusCode};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use std::sync::Arc;
use test_support::{Seen, Step};

const HR_PATH: &str = "/apis/helm.toolkit.fluxcd.io/v2/namespaces/team-a/helmreleases/wiki";
const HELMREPO_PATH: &str = "/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmrepositories/wiki";
const OCIREPO_PATH: &str = "/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/ocirepositories/wiki";
const HR_LIST_PATH: &str = "/apis/helm.toolkit.fluxcd.io/v2/namespaces/team-a/helmreleases";

/// Path and name of the shared source `app` uses (built, so tests follow the naming rule).
fn shared_source(app: &ApplicationInstance) -> (String, String) {
    let source = build::source(app).expect("valid").expect("a managed source");
    let plural = managed_kind(&source).plural;
    let name = source.name_any();
    (
        format!("/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/{plural}/{name}"),
        name,
    )
}

/// A shared source of ours at `name`, as the API server returns it.
fn our_shared_source(kind: &str, name: &str, extra: Value) -> Value {
    let mut object = existing(
        kind,
        "source.toolkit.fluxcd.io/v1",
        None,
        json!({"metadata": {"labels": crate::meta::shared_labels(crate::meta::COMPONENT_CHART_SOURCE)}}),
    );
    object["metadata"]["name"] = json!(name);
    for (k, v) in extra.as_object().into_iter().flatten() {
        object[k] = v.clone();
    }
    object
}

/// The answer to the one-item LIST of the HelmReleases naming a shared source.
fn releases_naming_it(names: &[&str]) -> Step {
    let items: Vec<Value> = names
        .iter()
        .map(|n| json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": n, "namespace": NAMESPACE}}))
        .collect();
    step(
        Method::GET,
        HR_LIST_PATH,
        StatusCode::OK,
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {}, "items": items}),
    )
}

fn deleted(path: &str) -> Step {
    step(
        Method::DELETE,
        path,
        StatusCode::OK,
        json!({"kind": "Status", "status": "Success"}),
    )
}

fn step(method: Method, path: &str, status: StatusCode, body: Value) -> Step {
    Step::new(method, path, status, body)
}

fn not_found(path: &str) -> Step {
    Step::not_found(path)
}

/// A failure `Status`; `details_kind` names what is missing (e.g. `namespaces`).
fn status_body(code: u16, reason: &str, details_kind: Option<&str>) -> Value {
    let mut body = test_support::status_body(code, reason);
    if let Some(kind) = details_kind {
        body["details"] = json!({"name": NAMESPACE, "kind": kind});
    }
    body
}

fn engine(client: Client) -> Arc<dyn Engine> {
    Arc::new(FluxEngine::new(client, FIELD_MANAGER))
}

/// Runs `call` against `script`: exactly the scripted requests, in order, and nothing else.
async fn run<T>(script: Vec<Step>, call: impl AsyncFnOnce(Arc<dyn Engine>) -> T) -> (T, Vec<Seen>) {
    test_support::run(script, async |client| call(engine(client)).await)
        .await
        .expect("the engine made exactly the scripted requests")
}

/// An existing object at `path`'s kind, controlled by `uid`.
fn existing(kind: &str, api_version: &str, uid_of_owner: Option<&str>, extra: Value) -> Value {
    let mut object = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "wiki", "namespace": NAMESPACE, "uid": format!("{kind}-uid"), "generation": 1},
        "spec": {},
    });
    if let Some(owner) = uid_of_owner {
        let mut owners = owner_json();
        owners[0]["uid"] = json!(owner);
        object["metadata"]["ownerReferences"] = owners;
    }
    for (k, v) in extra.as_object().into_iter().flatten() {
        match (k.as_str(), v.as_object()) {
            // Metadata is merged so fixtures keep their owner reference and UID.
            ("metadata", Some(fields)) => fields.iter().for_each(|(f, v)| object["metadata"][f] = v.clone()),
            _ => object[k] = v.clone(),
        }
    }
    object
}

fn our_release(extra: Value) -> Value {
    existing("HelmRelease", "helm.toolkit.fluxcd.io/v2", Some(UID), extra)
}

#[tokio::test]
async fn engine_is_flux() {
    let (client, _server) = test_support::pair();
    assert_eq!(engine(client).kind(), api::EngineKind::Flux);
}

#[tokio::test]
async fn materialize_http_applies_source_then_release_with_our_field_manager() {
    let app = app(repo_spec("https://charts.example.com", Some("6.2.1")));
    let input = MaterializeInput {
        values_revision: Some("rv-1".into()),
        ..Default::default()
    };
    let built_source = serde_json::to_value(build::source(&app).expect("valid")).expect("json");
    let built_release = serde_json::to_value(build::helm_release(&app, &input).expect("valid")).expect("json");
    let (source_path, source_name) = shared_source(&app);
    let script = vec![
        not_found(HR_PATH),
        not_found(&source_path),
        step(Method::PATCH, &source_path, StatusCode::CREATED, built_source.clone()),
        step(Method::PATCH, HR_PATH, StatusCode::CREATED, built_release.clone()),
    ];
    let (result, seen) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    let materialized = result.expect("materialized");
    assert_eq!(
        (materialized.engine_ref, materialized.source_ref),
        (
            super::super::HELM_RELEASE.object_ref("wiki", NAMESPACE),
            Some(HELM_REPOSITORY.object_ref(&source_name, NAMESPACE)),
        )
    );
    // Made from what the applies returned: the reconciler need not read them again.
    let observation = materialized.observation.expect("observed from the applies");
    assert_eq!(
        observation.source.map(|s| s.object),
        Some(HELM_REPOSITORY.object_ref(&source_name, NAMESPACE))
    );
    for (patch, body) in [(&seen[2], &built_source), (&seen[3], &built_release)] {
        assert_eq!(
            patch.query("fieldManager"),
            Some("vworkspace-app-controller"),
            "{}",
            patch.path
        );
        assert_eq!(patch.query("force"), Some("true"), "{}", patch.path);
        // What build produced, plus the desired-state hash that lets later reconciles skip it.
        let mut sent = patch.body.clone().expect("apply body");
        let annotations = sent["metadata"]["annotations"].as_object_mut().expect("annotations");
        assert!(
            annotations.remove(crate::apply::ANNOTATION_DESIRED_HASH).is_some(),
            "{}",
            patch.path
        );
        if annotations.is_empty() {
            sent["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("annotations");
        }
        assert_eq!(&sent, body, "{} applies exactly what build produced", patch.path);
    }
}

/// A live release of ours reading from the HelmRepository `source`.
fn our_release_reading(source: &str) -> Value {
    our_release(
        json!({"spec": {"chart": {"spec": {"chart": "wiki", "sourceRef": {"kind": "HelmRepository", "name": source}}}}}),
    )
}

#[tokio::test]
async fn materialize_moving_off_a_source_named_like_the_app_prunes_it_if_ours() {
    // Releases from before shared sources read from a HelmRepository named like the app.
    let app = app(repo_spec("oci://ghcr.io/example/wiki", None));
    let (source_path, source_name) = shared_source(&app);
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, our_release_reading("wiki")),
        not_found(&source_path),
        step(Method::PATCH, &source_path, StatusCode::CREATED, json!({})),
        step(Method::PATCH, HR_PATH, StatusCode::OK, json!({})),
        step(
            Method::GET,
            HELMREPO_PATH,
            StatusCode::OK,
            existing("HelmRepository", "source.toolkit.fluxcd.io/v1", Some(UID), json!({})),
        ),
        deleted(HELMREPO_PATH),
    ];
    let input = MaterializeInput::default();
    let (result, seen) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    assert_eq!(
        result.expect("materialized").source_ref,
        Some(OCI_REPOSITORY.object_ref(&source_name, NAMESPACE))
    );
    let delete = seen.last().expect("delete request");
    assert_eq!(
        delete.body.as_ref().and_then(|b| b.get("preconditions")),
        Some(&json!({"uid": "HelmRepository-uid"})),
        "the delete is pinned to the object we checked"
    );
}

#[tokio::test]
async fn materialize_moving_off_a_shared_source_deletes_it_only_when_no_release_names_it() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (source_path, _) = shared_source(&app);
    let old = "vws-old-charts-0123456789abcdef";
    let old_path = format!("/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmrepositories/{old}");
    let moved = |rest: Vec<Step>| {
        let mut script = vec![
            step(Method::GET, HR_PATH, StatusCode::OK, our_release_reading(old)),
            step(
                Method::GET,
                &source_path,
                StatusCode::OK,
                our_shared_source("HelmRepository", "x", json!({})),
            ),
            step(Method::PATCH, &source_path, StatusCode::OK, json!({})),
            step(Method::PATCH, HR_PATH, StatusCode::OK, json!({})),
        ];
        script.extend(rest);
        script
    };
    let input = MaterializeInput::default();

    // Another release still names it: kept.
    let script = moved(vec![releases_naming_it(&["blog"])]);
    let (result, seen) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    result.expect("materialized");
    let list = seen.last().expect("the list");
    assert_eq!(
        list.query("labelSelector"),
        Some(format!("vworkspace.io%2Fchart-source%3D{old}").as_str()),
        "percent-encoded in the query"
    );
    assert_eq!(list.query("limit"), Some("1"), "one item answers the question");

    // None does: deleted, pinned to the object checked.
    let script = moved(vec![
        releases_naming_it(&[]),
        step(
            Method::GET,
            &old_path,
            StatusCode::OK,
            our_shared_source("HelmRepository", old, json!({})),
        ),
        deleted(&old_path),
    ]);
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    result.expect("materialized");
}

#[tokio::test]
async fn materialize_with_a_source_ref_reads_it_and_leaves_a_foreign_old_source_alone() {
    let app = app(ref_spec(SourceKind::GitRepository, "charts", Some("flux-system")));
    let foreign = existing("HelmRepository", "source.toolkit.fluxcd.io/v1", None, json!({}));
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, our_release_reading("wiki")),
        not_found("/apis/source.toolkit.fluxcd.io/v1/namespaces/flux-system/gitrepositories/charts"),
        step(Method::PATCH, HR_PATH, StatusCode::OK, json!({})),
        step(Method::GET, HELMREPO_PATH, StatusCode::OK, foreign),
    ];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    let materialized = result.expect("materialized");
    assert_eq!(
        materialized.source_ref,
        Some(crate::flux::GIT_REPOSITORY.object_ref("charts", "flux-system"))
    );
}

#[tokio::test]
async fn materialize_refuses_a_foreign_object_with_the_shared_name() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (source_path, _) = shared_source(&app);
    let foreign = existing("HelmRepository", "source.toolkit.fluxcd.io/v1", None, json!({}));
    let script = vec![
        not_found(HR_PATH),
        step(Method::GET, &source_path, StatusCode::OK, foreign),
    ];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    assert!(matches!(result, Err(EngineError::Conflict(m)) if m.contains("not a chart source shared")));
}

#[tokio::test]
async fn materialize_refuses_someone_elses_release() {
    let app = app(repo_spec("https://charts.example.com", None));
    let foreign = existing(
        "HelmRelease",
        "helm.toolkit.fluxcd.io/v2",
        Some("another-uid"),
        json!({}),
    );
    let script = vec![step(Method::GET, HR_PATH, StatusCode::OK, foreign)];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    let err = result.expect_err("foreign HelmRelease");
    assert!(err.is_conflict(), "{err}");
    assert!(!err.is_terminal());
    assert_eq!(err.reason(), api::conditions::reasons::APPLY_FAILED);
}

#[tokio::test]
async fn materialize_waits_for_a_terminating_source() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (source_path, name) = shared_source(&app);
    let mut terminating = our_shared_source("HelmRepository", &name, json!({}));
    terminating["metadata"]["deletionTimestamp"] = json!("2026-08-01T10:00:00Z");
    let script = vec![
        not_found(HR_PATH),
        step(Method::GET, &source_path, StatusCode::OK, terminating),
    ];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    assert!(matches!(result, Err(EngineError::Conflict(m)) if m.contains("being deleted")));
}

#[tokio::test]
async fn materialize_maps_an_unserved_resource_to_not_installed() {
    let app = app(repo_spec("oci://ghcr.io/example/wiki", None));
    let (source_path, _) = shared_source(&app);
    let script = vec![
        not_found(HR_PATH),
        not_found(&source_path),
        step(
            Method::PATCH,
            &source_path,
            StatusCode::NOT_FOUND,
            status_body(404, "NotFound", None),
        ),
    ];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    let err = result.expect_err("not served");
    assert!(matches!(&err, EngineError::NotInstalled(m) if m.contains("ocirepositories.source.toolkit.fluxcd.io/v1")));
    assert_eq!(err.reason(), api::conditions::reasons::ENGINE_NOT_INSTALLED);
}

#[tokio::test]
async fn materialize_into_a_missing_namespace_is_an_api_error() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (source_path, _) = shared_source(&app);
    let script = vec![
        not_found(HR_PATH),
        not_found(&source_path),
        step(
            Method::PATCH,
            &source_path,
            StatusCode::NOT_FOUND,
            status_body(404, "NotFound", Some("namespaces")),
        ),
    ];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    let err = result.expect_err("namespace gone");
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn materialize_validates_before_any_request() {
    let app = app(repo_spec("oci://ghcr.io", None));
    let input = MaterializeInput::default();
    let (result, seen) = run(Vec::new(), async |engine| engine.materialize(&app, &input).await).await;
    assert!(matches!(result, Err(EngineError::InvalidSpec(_))));
    assert!(seen.is_empty());
}

#[tokio::test]
async fn observe_without_release_is_none() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (result, _) = run(vec![not_found(HR_PATH)], async |engine| engine.observe(&app).await).await;
    assert_eq!(result.expect("observed"), None);
}

#[tokio::test]
async fn observe_reads_release_source_and_tolerates_an_unreadable_chart() {
    let app = app(repo_spec("https://charts.example.com", None));
    let release = our_release(json!({
        "spec": {"chart": {"spec": {"chart": "wiki", "sourceRef": {"kind": "HelmRepository", "name": "wiki"}}}},
        "status": {
            "observedGeneration": 1,
            "helmChart": "team-a/team-a-wiki",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ArtifactFailed", "message": "source not ready", "observedGeneration": 1}],
        },
    }));
    let repository = existing(
        "HelmRepository",
        "source.toolkit.fluxcd.io/v1",
        Some(UID),
        json!({"status": {"observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "False", "reason": "IndexationFailed", "message": "failed to fetch index", "observedGeneration": 1},
        ]}}),
    );
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, release),
        step(Method::GET, HELMREPO_PATH, StatusCode::OK, repository),
        step(
            Method::GET,
            "/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmcharts/team-a-wiki",
            StatusCode::FORBIDDEN,
            status_body(403, "Forbidden", None),
        ),
    ];
    let (result, _) = run(script, async |engine| engine.observe(&app).await).await;
    let observation = result.expect("observed").expect("release exists");
    assert!(observation.observed_generation_current);
    assert_eq!(
        observation.condition("Ready").map(|c| c.reason.as_str()),
        Some("ArtifactFailed")
    );
    let source = observation.source.expect("source observed");
    assert_eq!((source.ready, source.reason.as_str()), (false, "IndexationFailed"));
}

/// A source the controller's watch holds is read from the engine's cache, not GET.
#[tokio::test]
async fn a_source_the_watch_holds_is_read_from_its_cache() {
    let app = app(repo_spec("https://charts.example.com", None));
    let release = our_release(json!({
        "spec": {"chart": {"spec": {"chart": "wiki", "sourceRef": {"kind": "HelmRepository", "name": "wiki"}}}},
        "status": {"observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "False", "reason": "ArtifactFailed", "message": "source not ready", "observedGeneration": 1},
        ]},
    }));
    let repository: DynamicObject = serde_json::from_value(existing(
        "HelmRepository",
        "source.toolkit.fluxcd.io/v1",
        Some(UID),
        json!({"status": {"observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "False", "reason": "IndexationFailed", "message": "failed to fetch index", "observedGeneration": 1},
        ]}}),
    ))
    .expect("a HelmRepository");
    let script = vec![step(Method::GET, HR_PATH, StatusCode::OK, release)];
    let (observation, _) = test_support::run(script, async |client| {
        let engine = FluxEngine::new(client, FIELD_MANAGER);
        let watched = engine.watched_kinds();
        let cache = watched
            .iter()
            .find(|w| w.resource.kind == "HelmRepository")
            .and_then(|w| w.whole.as_ref())
            .map(|whole| whole.cache.clone())
            .expect("HelmRepositories are watched whole");
        cache.list_started();
        cache.listed(repository);
        cache.list_done(Some(NAMESPACE));
        engine.observe(&app).await
    })
    .await
    .expect("no GET of the source");
    let source = observation.expect("observed").expect("release exists").source;
    let source = source.expect("source observed");
    assert_eq!((source.ready, source.reason.as_str()), (false, "IndexationFailed"));
}

#[tokio::test]
async fn observe_propagates_server_errors() {
    let app = app(repo_spec("https://charts.example.com", None));
    let script = vec![step(
        Method::GET,
        HR_PATH,
        StatusCode::INTERNAL_SERVER_ERROR,
        status_body(500, "InternalError", None),
    )];
    let (result, _) = run(script, async |engine| engine.observe(&app).await).await;
    let err = result.expect_err("server error");
    assert_eq!(err.reason(), api::conditions::reasons::APPLY_FAILED);
    assert!(!err.is_terminal());
}

#[tokio::test]
async fn delete_removes_the_release_and_waits_for_uninstall() {
    let app = app(repo_spec("https://charts.example.com", None));
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, our_release(json!({}))),
        step(Method::DELETE, HR_PATH, StatusCode::OK, our_release(json!({}))),
    ];
    let (result, seen) = run(script, async |engine| engine.delete(&app).await).await;
    assert!(
        matches!(result, Ok(DeleteProgress::InProgress(m)) if m.contains("waiting for helm-controller to uninstall"))
    );
    let body = seen[1].body.as_ref().expect("delete options");
    assert_eq!(body["propagationPolicy"], json!("Background"));
    assert_eq!(body["preconditions"], json!({"uid": "HelmRelease-uid"}));
}

#[tokio::test]
async fn delete_of_a_terminating_release_only_waits_and_says_why() {
    let app = app(repo_spec("https://charts.example.com", None));
    let terminating = our_release(json!({
        "metadata": {"deletionTimestamp": "2026-08-01T10:00:00Z"},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "UninstallFailed", "message": "hook failed"}]},
    }));
    let (result, _) = run(
        vec![step(Method::GET, HR_PATH, StatusCode::OK, terminating)],
        async |engine| engine.delete(&app).await,
    )
    .await;
    assert!(matches!(result, Ok(DeleteProgress::InProgress(m)) if m.ends_with("(UninstallFailed: hook failed)")));
}

#[tokio::test]
async fn delete_of_a_suspended_release_warns_that_it_stays_installed() {
    let app = app(repo_spec("https://charts.example.com", None));
    let suspended = our_release(json!({"spec": {"suspend": true}}));
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, suspended.clone()),
        step(Method::DELETE, HR_PATH, StatusCode::OK, suspended),
    ];
    let (result, _) = run(script, async |engine| engine.delete(&app).await).await;
    assert!(matches!(result, Ok(DeleteProgress::InProgress(m)) if m.contains("without uninstalling")));
}

#[tokio::test]
async fn delete_after_the_release_is_gone_removes_our_sources() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (source_path, name) = shared_source(&app);
    let script = vec![
        not_found(HR_PATH),
        step(
            Method::GET,
            HELMREPO_PATH,
            StatusCode::OK,
            existing("HelmRepository", "source.toolkit.fluxcd.io/v1", Some(UID), json!({})),
        ),
        // Gone between our GET and DELETE: still fine.
        step(
            Method::DELETE,
            HELMREPO_PATH,
            StatusCode::NOT_FOUND,
            status_body(404, "NotFound", None),
        ),
        not_found(OCIREPO_PATH),
        // The shared source: no release names it any more.
        releases_naming_it(&[]),
        step(
            Method::GET,
            &source_path,
            StatusCode::OK,
            our_shared_source("HelmRepository", &name, json!({})),
        ),
        deleted(&source_path),
    ];
    let (result, _) = run(script, async |engine| engine.delete(&app).await).await;
    assert_eq!(result.expect("deleted"), DeleteProgress::Gone);
}

#[tokio::test]
async fn delete_keeps_a_shared_source_another_release_names() {
    let app = app(repo_spec("https://charts.example.com", None));
    let script = vec![
        not_found(HR_PATH),
        not_found(HELMREPO_PATH),
        not_found(OCIREPO_PATH),
        releases_naming_it(&["blog"]),
    ];
    let (result, _) = run(script, async |engine| engine.delete(&app).await).await;
    assert_eq!(result.expect("deleted"), DeleteProgress::Gone);
}

#[tokio::test]
async fn delete_never_touches_someone_elses_objects() {
    let app = app(repo_spec("https://charts.example.com", None));
    let foreign_release = existing(
        "HelmRelease",
        "helm.toolkit.fluxcd.io/v2",
        Some("another-uid"),
        json!({}),
    );
    let foreign_repository = existing("HelmRepository", "source.toolkit.fluxcd.io/v1", None, json!({}));
    let (source_path, _) = shared_source(&app);
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, foreign_release),
        step(Method::GET, HELMREPO_PATH, StatusCode::OK, foreign_repository.clone()),
        not_found(OCIREPO_PATH),
        releases_naming_it(&[]),
        step(Method::GET, &source_path, StatusCode::OK, foreign_repository),
    ];
    let (result, _) = run(script, async |engine| engine.delete(&app).await).await;
    assert_eq!(result.expect("deleted"), DeleteProgress::Gone);
}

#[tokio::test]
async fn check_installed_lists_what_is_missing() {
    let sources = json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "source.toolkit.fluxcd.io/v1",
        "resources": [
            {"name": "helmrepositories", "singularName": "helmrepository", "namespaced": true, "kind": "HelmRepository", "verbs": ["get"]},
            {"name": "helmrepositories/status", "singularName": "", "namespaced": true, "kind": "HelmRepository", "verbs": ["get"]},
            {"name": "helmcharts", "singularName": "helmchart", "namespaced": true, "kind": "HelmChart", "verbs": ["get"]},
        ],
    });
    let script = vec![
        step(
            Method::GET,
            "/apis/helm.toolkit.fluxcd.io/v2",
            StatusCode::NOT_FOUND,
            status_body(404, "NotFound", None),
        ),
        step(
            Method::GET,
            "/apis/source.toolkit.fluxcd.io/v1",
            StatusCode::OK,
            sources,
        ),
    ];
    let (result, _) = run(script, async |engine| engine.check_installed().await).await;
    let err = result.expect_err("not installed");
    assert_eq!(err.reason(), api::conditions::reasons::ENGINE_NOT_INSTALLED);
    assert_eq!(
        err.to_string(),
        "Flux is not installed or too old (v2.6 or newer is needed): the cluster does not serve \
         helmreleases.helm.toolkit.fluxcd.io/v2, ocirepositories.source.toolkit.fluxcd.io/v1"
    );
}

/// What a real API server answers for a group version nobody serves: the plain text
/// `404 page not found`, no `Status` (a JSON string here, which kube cannot parse as one
/// either). Seen on a cluster without Flux, where it was taken for an API failure and
/// retried forever instead of reported.
fn page_not_found(path: &str) -> Step {
    step(Method::GET, path, StatusCode::NOT_FOUND, json!("404 page not found"))
}

#[tokio::test]
async fn check_installed_takes_a_plain_404_for_not_served() {
    let script = vec![
        page_not_found("/apis/helm.toolkit.fluxcd.io/v2"),
        page_not_found("/apis/source.toolkit.fluxcd.io/v1"),
    ];
    let (result, _) = run(script, async |engine| engine.check_installed().await).await;
    let err = result.expect_err("not installed");
    assert_eq!(err.reason(), api::conditions::reasons::ENGINE_NOT_INSTALLED);
    assert_eq!(
        err.to_string(),
        "Flux is not installed or too old (v2.6 or newer is needed): the cluster does not serve \
         helmreleases.helm.toolkit.fluxcd.io/v2, helmrepositories.source.toolkit.fluxcd.io/v1, \
         ocirepositories.source.toolkit.fluxcd.io/v1, helmcharts.source.toolkit.fluxcd.io/v1"
    );
}

#[tokio::test]
async fn materialize_maps_a_plain_404_on_apply_to_not_installed() {
    let app = app(repo_spec("https://charts.example.com", None));
    let (source_path, _) = shared_source(&app);
    let script = vec![
        not_found(HR_PATH),
        not_found(&source_path),
        step(
            Method::PATCH,
            &source_path,
            StatusCode::NOT_FOUND,
            json!("404 page not found"),
        ),
    ];
    let input = MaterializeInput::default();
    let (result, _) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    let err = result.expect_err("not served");
    assert_eq!(err.reason(), api::conditions::reasons::ENGINE_NOT_INSTALLED, "{err}");
}

#[tokio::test]
async fn check_installed_ok() {
    let list = |group_version: &str, names: &[&str]| {
        let resources: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "singularName": "", "namespaced": true, "kind": "X", "verbs": ["get"]}))
            .collect();
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
    };
    let script = vec![
        step(
            Method::GET,
            "/apis/helm.toolkit.fluxcd.io/v2",
            StatusCode::OK,
            list("helm.toolkit.fluxcd.io/v2", &["helmreleases", "helmreleases/status"]),
        ),
        step(
            Method::GET,
            "/apis/source.toolkit.fluxcd.io/v1",
            StatusCode::OK,
            list(
                "source.toolkit.fluxcd.io/v1",
                &["helmrepositories", "ocirepositories", "helmcharts", "buckets"],
            ),
        ),
    ];
    let (result, _) = run(script, async |engine| engine.check_installed().await).await;
    result.expect("installed");
}

#[tokio::test]
async fn materialize_adopts_an_orphan_of_ours() {
    let app = app(ref_spec(SourceKind::HelmChart, "wiki-chart", None));
    let labels = crate::fixtures::labels_json("helm-release");
    let orphan = existing(
        "HelmRelease",
        "helm.toolkit.fluxcd.io/v2",
        None,
        json!({"metadata": {"labels": labels}}),
    );
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, orphan),
        not_found("/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmcharts/wiki-chart"),
        step(Method::PATCH, HR_PATH, StatusCode::OK, json!({})),
    ];
    let input = MaterializeInput::default();
    let (result, seen) = run(script, async |engine| engine.materialize(&app, &input).await).await;
    result.expect("materialized");
    let applied = seen[2].body.as_ref().expect("apply body");
    assert_eq!(
        applied["metadata"]["ownerReferences"],
        owner_json(),
        "the apply adds our owner reference"
    );
}

#[tokio::test]
async fn delete_does_not_wait_for_someone_elses_terminating_release() {
    let app = app(repo_spec("https://charts.example.com", None));
    let foreign = existing(
        "HelmRelease",
        "helm.toolkit.fluxcd.io/v2",
        Some("old-uid"),
        json!({"metadata": {"deletionTimestamp": "2026-08-01T10:00:00Z"}}),
    );
    let script = vec![
        step(Method::GET, HR_PATH, StatusCode::OK, foreign),
        not_found(HELMREPO_PATH),
        not_found(OCIREPO_PATH),
        releases_naming_it(&["wiki"]),
    ];
    let (result, _) = run(script, async |engine| engine.delete(&app).await).await;
    assert_eq!(result.expect("deleted"), DeleteProgress::Gone);
}

#[tokio::test]
async fn sources_wake_the_apps_that_read_from_them() {
    let engine = FluxEngine::new(test_support::pair().0, FIELD_MANAGER);
    let links: Vec<_> = engine
        .watched_kinds()
        .into_iter()
        .filter_map(|w| match w.link {
            crate::OwnerLink::ReadBy(reads) => Some((w.resource.kind, reads)),
            _ => None,
        })
        .collect();
    let kinds: Vec<&str> = links.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["HelmRepository", "OCIRepository"]);
    let (_, reads) = links[0];
    let http = app(repo_spec("https://charts.example.com", None));
    let (_, name) = shared_source(&http);
    assert!(reads(&http, &HELM_REPOSITORY.object_ref(&name, NAMESPACE)));
    assert!(!reads(&http, &HELM_REPOSITORY.object_ref(&name, "other")));
    assert!(!reads(&http, &HELM_REPOSITORY.object_ref("wiki", NAMESPACE)));
    // A source the app names with chart.sourceRef wakes it too.
    let by_ref = app(ref_spec(SourceKind::HelmRepository, "charts", Some("flux-system")));
    assert!(reads(&by_ref, &HELM_REPOSITORY.object_ref("charts", "flux-system")));
}
