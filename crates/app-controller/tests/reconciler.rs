//! `app_controller::reconciler::reconcile` against a scripted API server (`test-support`):
//! each test lists every request one reconcile must make, in order, with the answers, and
//! checks what was sent. A request that is not scripted fails the test, so "no write" is a
//! script of GETs only and "nothing at all" an empty script.

use std::{collections::HashMap, sync::Arc, time::Duration};

use anyhow::{Context as _, ensure};
use api::{ApplicationInstance, ApplicationInstanceSpec, ChartRepository, ChartSpec, EngineKind};
use app_controller::{
    controller,
    reconciler::{self, CONTROLLER, Context, Engines, FIELD_MANAGER, FINALIZER},
    repositories::RepositoryPolicy,
    tenancy::{PodSecurityEnforce, Tenancy},
};
use controller_kit::{
    LeaderGate, WatchScope,
    namespaces::{NamespacePairs, NamespacePolicy},
};
use helmengine::{Engine, flux::FluxEngine};
use http::Method;
use kube::{
    core::DeserializeGuard,
    runtime::{
        controller::Action,
        events::{Recorder, Reporter},
        reflector,
    },
};
use serde_json::{Value, json};
use test_support::{ApiServer, Seen, Step};

const NS: &str = "team-a";
const APP_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/applicationinstances/wiki";
const APP_STATUS_PATH: &str = "/apis/vworkspace.io/v1alpha1/namespaces/team-a/applicationinstances/wiki/status";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";
const SA_PATH: &str = "/api/v1/namespaces/team-a/serviceaccounts/vworkspace-release";
const RB_PATH: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings/vworkspace-release";
const HR_PATH: &str = "/apis/helm.toolkit.fluxcd.io/v2/namespaces/team-a/helmreleases/wiki";
const HELMREPO_PATH: &str = "/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmrepositories/wiki";
const OCIREPO_PATH: &str = "/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/ocirepositories/wiki";
const HELMCHART_PATH: &str = "/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmcharts/team-a-wiki";
const HR_LIST_PATH: &str = "/apis/helm.toolkit.fluxcd.io/v2/namespaces/team-a/helmreleases";

/// Name and path of the HelmRepository the apps of `team-a` reading from `url` share.
fn shared_repository(url: &str) -> anyhow::Result<(String, String)> {
    let source = helmengine::flux::build::source(&app(url))?.context("a managed source")?;
    let name = source.metadata.name.context("named")?;
    let path = format!("/apis/source.toolkit.fluxcd.io/v1/namespaces/team-a/helmrepositories/{name}");
    Ok((name, path))
}
const OTHER_FINALIZER: &str = "example.com/keep";

/// An ApplicationInstance `team-a/wiki` at generation 1 whose chart comes from `url`, with our finalizer.
fn app(url: &str) -> ApplicationInstance {
    let spec = ApplicationInstanceSpec {
        chart: ChartSpec {
            name: "wiki".into(),
            version: Some("6.2.1".into()),
            repository: Some(ChartRepository {
                url: url.into(),
                ..Default::default()
            }),
            source_ref: None,
        },
        ..Default::default()
    };
    let mut app = ApplicationInstance::new("wiki", spec);
    app.metadata.namespace = Some(NS.into());
    app.metadata.uid = Some("0b9f5c1e-6d7e-4c55-9a55-0d6f7d7f2a11".into());
    app.metadata.generation = Some(1);
    app.metadata.resource_version = Some("100".into());
    app.metadata.finalizers = Some(vec![FINALIZER.into()]);
    app
}

/// `app` as being deleted, with `finalizers`.
fn deleting(mut app: ApplicationInstance, finalizers: &[&str]) -> anyhow::Result<ApplicationInstance> {
    app.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-11-25T01:00:00Z".parse()?,
    ));
    app.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    Ok(app)
}

/// A reconciler context on the scripted client: the Flux engine, every namespace but the
/// system ones (or only `allowed`), the flags' default repository rules, Pod Security left
/// to the platform (so the tenancy setup is the ServiceAccount and one RoleBinding).
fn context(allowed: Option<&str>) -> anyhow::Result<(Arc<Context>, ApiServer)> {
    let (client, server) = test_support::pair();
    let flux: Arc<dyn Engine> = Arc::new(FluxEngine::new(client.clone(), FIELD_MANAGER));
    let policy = match allowed {
        Some(ns) => ns.parse()?,
        None => NamespacePolicy::All,
    };
    let (store, _writer) = reflector::store::<DeserializeGuard<ApplicationInstance>>();
    let reporter = Reporter {
        controller: "app-controller".into(),
        instance: Some("app-controller-0".into()),
    };
    let ctx = Context {
        client: client.clone(),
        engines: Engines {
            default: EngineKind::Flux,
            available: HashMap::from([(EngineKind::Flux, flux)]),
        },
        scope: WatchScope::new(policy, None)?,
        namespace_pairs: NamespacePairs::default(),
        repositories: RepositoryPolicy::default(),
        gate: LeaderGate::always_leader(),
        metrics: controller_kit::Metrics::new("test").controller(CONTROLLER),
        recorder: Recorder::new(client, reporter),
        store,
        publisher: status_channel::Publisher::disabled(),
        failures: controller::failures(),
        tenancy: Tenancy::new(FIELD_MANAGER, PodSecurityEnforce::None),
        seen: Default::default(),
        selector: None,
    };
    Ok((Arc::new(ctx), server))
}

/// One reconcile of `app` against `script`.
async fn reconcile(
    server: &mut ApiServer,
    ctx: &Arc<Context>,
    app: &ApplicationInstance,
    script: Vec<Step>,
) -> anyhow::Result<(Result<Action, reconciler::Error>, Vec<Seen>)> {
    let guard = Arc::new(DeserializeGuard(Ok(app.clone())));
    server.run(script, reconciler::reconcile(guard, ctx.clone())).await
}

fn api_resource_list(group_version: &str, names: &[&str]) -> Value {
    let resources: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "singularName": "", "namespaced": true, "kind": "X", "verbs": ["get"]}))
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// Flux is installed: the two discovery GETs of `check_installed`.
fn flux_installed() -> Vec<Step> {
    vec![
        Step::get(
            "/apis/helm.toolkit.fluxcd.io/v2",
            api_resource_list("helm.toolkit.fluxcd.io/v2", &["helmreleases", "helmreleases/status"]),
        ),
        Step::get(
            "/apis/source.toolkit.fluxcd.io/v1",
            api_resource_list(
                "source.toolkit.fluxcd.io/v1",
                &["helmrepositories", "ocirepositories", "helmcharts"],
            ),
        ),
    ]
}

/// A Ready=True status as Flux writes it for generation 1.
fn ready_status(reason: &str, message: &str) -> Value {
    json!({
        "observedGeneration": 1,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": reason, "message": message,
            "observedGeneration": 1, "lastTransitionTime": "2026-11-25T01:00:00Z",
        }],
    })
}

/// What the server holds after an apply of `applied`: the object as sent, with a UID,
/// generation 1 and `status`.
fn live(applied: &Value, uid: &str, status: Value) -> Value {
    let mut object = applied.clone();
    object["metadata"]["uid"] = json!(uid);
    object["metadata"]["generation"] = json!(1);
    object["status"] = status;
    object
}

fn find<'a>(seen: &'a [Seen], method: Method, path: &str) -> anyhow::Result<&'a Seen> {
    seen.iter()
        .find(|s| s.method == method && s.path == path)
        .with_context(|| format!("no {method} {path}"))
}

/// The status a status apply sent, as the reconciler's next read of the object would see it.
fn with_status_from(mut app: ApplicationInstance, status_apply: &Seen) -> anyhow::Result<ApplicationInstance> {
    app.status = Some(serde_json::from_value(status_apply.body()?["status"].clone())?);
    Ok(app)
}

fn condition<'a>(status_apply: &'a Seen, type_: &str) -> anyhow::Result<&'a Value> {
    status_apply.body()?["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .with_context(|| format!("no {type_} condition"))
}

/// First reconcile of a new application: Flux check, tenancy, the source and release applied
/// with our field manager, the engine read back, the status written once and one Normal
/// Event for Ready becoming True. The second reconcile, with the applied objects and the
/// written status served back, only reads: no apply, no status write, no Event.
#[tokio::test]
async fn first_reconcile_writes_everything_once_and_the_next_one_only_reads() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let app = app("https://charts.example.com");
    let release_status = {
        let mut status = ready_status("InstallSucceeded", "Helm install succeeded for release team-a/wiki.v1");
        status["helmChart"] = json!("team-a/team-a-wiki");
        status
    };
    let repository_status = ready_status("Succeeded", "stored artifact: revision 'sha256:abc'");
    let chart = json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmChart",
        "metadata": {"name": "team-a-wiki", "namespace": NS, "generation": 1},
        "status": ready_status("ChartPullSucceeded", "pulled 'wiki' chart with version '6.2.1'"),
    });
    let (repository_name, repository_path) = shared_repository("https://charts.example.com")?;
    // What the applies return once helm-controller and source-controller have reported (the
    // observation reads the source reference and the status only, from these answers).
    let release = json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
        "metadata": {"name": "wiki", "namespace": NS, "generation": 1},
        "spec": {"chart": {"spec": {"chart": "wiki", "sourceRef": {"kind": "HelmRepository", "name": repository_name}}}},
        "status": release_status.clone(),
    });
    let repository = json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
        "metadata": {"name": repository_name, "namespace": NS, "generation": 1},
        "status": repository_status.clone(),
    });

    let mut script = flux_installed();
    script.extend([
        Step::echo(Method::PATCH, SA_PATH),
        Step::echo(Method::PATCH, RB_PATH),
        Step::not_found(HR_PATH),
        Step::not_found(&repository_path),
        Step::ok(Method::PATCH, &repository_path, repository),
        Step::ok(Method::PATCH, HR_PATH, release),
        // Nothing re-read: only the HelmChart the release names is new.
        Step::get(HELMCHART_PATH, chart.clone()),
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&app)?),
        Step::echo(Method::POST, EVENTS_PATH),
    ]);
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(
        matches!(&result, Ok(a) if *a == Action::requeue(Duration::from_secs(600))),
        "{result:?}"
    );

    // Tenancy and engine objects: server-side apply with our field manager; the engine's forced,
    // carrying the desired-state hash that lets the next reconcile skip them.
    for path in [SA_PATH, RB_PATH] {
        let apply = find(&seen, Method::PATCH, path)?;
        ensure!(apply.query("fieldManager") == Some(FIELD_MANAGER), "{path}");
    }
    // The release is read from the API server's watch cache, as an informer holds it.
    let release_read = find(&seen, Method::GET, HR_PATH)?;
    ensure!(release_read.query("resourceVersion") == Some("0"), "{release_read:?}");
    for path in [repository_path.as_str(), HR_PATH] {
        let apply = find(&seen, Method::PATCH, path)?;
        ensure!(apply.query("fieldManager") == Some(FIELD_MANAGER), "{path}");
        ensure!(apply.query("force") == Some("true"), "{path}");
        let hash = &apply.body()?["metadata"]["annotations"]["vworkspace.io/desired-hash"];
        ensure!(hash.is_string(), "{path}: {:?}", apply.body);
    }

    // The status: one forced apply of apiVersion, kind and status only.
    let status_apply = find(&seen, Method::PATCH, APP_STATUS_PATH)?;
    ensure!(status_apply.query("fieldManager") == Some(FIELD_MANAGER));
    ensure!(status_apply.query("force") == Some("true"));
    let body = status_apply.body()?;
    ensure!(body["apiVersion"] == "vworkspace.io/v1alpha1" && body["kind"] == "ApplicationInstance");
    ensure!(body.get("metadata").is_none() && body.get("spec").is_none(), "{body}");
    ensure!(body["status"]["observedGeneration"] == 1, "{body}");
    ensure!(body["status"]["engine"] == "flux", "{body}");
    let ready = condition(status_apply, "Ready")?;
    ensure!(
        ready["status"] == "True" && ready["reason"] == "InstallSucceeded",
        "{ready}"
    );

    // The Event: Normal, Flux's reason, the message, about this object.
    let event = find(&seen, Method::POST, EVENTS_PATH)?.body()?;
    ensure!(
        event["type"] == "Normal" && event["reason"] == "InstallSucceeded",
        "{event}"
    );
    ensure!(
        event["note"] == "Ready=True: Helm install succeeded for release team-a/wiki.v1",
        "{event}"
    );
    ensure!(event["action"] == "Reconcile" && event["reportingController"] == "app-controller");
    ensure!(
        event["regarding"]["kind"] == "ApplicationInstance" && event["regarding"]["name"] == "wiki",
        "{event}"
    );

    // At rest: the same world, the status as written. The Flux check (cached) and the tenancy
    // (remembered) make no request; the engine objects are read once each, found up to date,
    // not applied, and the observation is made of those reads: three GETs in all.
    let hr_live = live(find(&seen, Method::PATCH, HR_PATH)?.body()?, "hr-uid", release_status);
    let repo_live = live(
        find(&seen, Method::PATCH, &repository_path)?.body()?,
        "repo-uid",
        repository_status,
    );
    let app = with_status_from(app, status_apply)?;
    let script = vec![
        Step::get(HR_PATH, hr_live),
        Step::get(&repository_path, repo_live),
        Step::get(HELMCHART_PATH, chart),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(
        matches!(&result, Ok(a) if *a == Action::requeue(Duration::from_secs(600))),
        "{result:?}"
    );
    ensure!(seen.iter().all(|s| !s.is_write()), "no write at rest: {seen:?}");
    Ok(())
}

/// Ready goes from True to False (the repository host is no longer allowed): one status
/// write and one Warning Event, before anything is read for the app; the next reconcile of
/// the written status makes no request at all.
#[tokio::test]
async fn a_ready_transition_publishes_one_event_and_the_same_failure_writes_nothing() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let mut app = app("https://127.0.0.1/charts");
    app.status = Some(serde_json::from_value(json!({
        "observedGeneration": 1,
        "engine": "flux",
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "InstallSucceeded", "message": "installed",
            "observedGeneration": 1, "lastTransitionTime": "2026-11-25T01:00:00Z",
        }],
    }))?);
    let app_json = serde_json::to_value(&app)?;
    let script = vec![
        Step::ok(Method::PATCH, APP_STATUS_PATH, app_json),
        Step::echo(Method::POST, EVENTS_PATH),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    let status_apply = &seen[0];
    let ready = condition(status_apply, "Ready")?;
    ensure!(
        ready["status"] == "False" && ready["reason"] == "RepositoryNotAllowed",
        "{ready}"
    );
    ensure!(
        ready["lastTransitionTime"] != "2026-11-25T01:00:00Z",
        "the status changed, so the transition time moved"
    );
    let stalled = condition(status_apply, "Stalled")?;
    ensure!(stalled["status"] == "True", "{stalled}");
    let event = seen[1].body()?;
    ensure!(
        event["type"] == "Warning" && event["reason"] == "RepositoryNotAllowed",
        "{event}"
    );
    let note = event["note"].as_str().unwrap_or_default();
    ensure!(note.starts_with("Ready=False: repository host 127.0.0.1 is "), "{note}");

    let app = with_status_from(app, status_apply)?;
    let (result, seen) = reconcile(&mut server, &ctx, &app, Vec::new()).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(seen.is_empty(), "{seen:?}");
    Ok(())
}

/// A status change that keeps Ready's status and reason (only the message moves) is
/// written, without an Event.
#[tokio::test]
async fn a_message_change_is_written_without_an_event() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let mut app = app("https://127.0.0.1/charts");
    app.status = Some(serde_json::from_value(json!({
        "observedGeneration": 1,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "RepositoryNotAllowed", "message": "an older wording",
             "observedGeneration": 1, "lastTransitionTime": "2026-11-25T01:00:00Z"},
            {"type": "Stalled", "status": "True", "reason": "RepositoryNotAllowed", "message": "an older wording",
             "observedGeneration": 1, "lastTransitionTime": "2026-11-25T01:00:00Z"},
        ],
    }))?);
    let app_json = serde_json::to_value(&app)?;
    let script = vec![Step::ok(Method::PATCH, APP_STATUS_PATH, app_json)];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(result.is_ok(), "{result:?}");
    let ready = condition(&seen[0], "Ready")?;
    ensure!(
        ready["lastTransitionTime"] == "2026-11-25T01:00:00Z",
        "same status, same transition time: {ready}"
    );
    ensure!(ready["message"] != "an older wording", "{ready}");
    Ok(())
}

/// `status.backupSchedule` belongs to the backup engine (ADR 0008): the app controller's status
/// apply leaves it out (so it never co-owns the field and writes back a stale copy), and the
/// field being there does not make the app controller write at rest.
#[tokio::test]
async fn the_backup_schedule_status_is_left_to_the_backup_engine() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let mut app = app("https://127.0.0.1/charts");
    let schedule_status = json!({
        "schedule": "0 2 * * * in Europe/Brussels",
        "since": "2026-11-24T10:00:00Z",
        "nextScheduleTime": "2026-11-26T01:00:00Z",
        "keptBackups": ["team-a-wiki-backup-202611250100"],
    });
    app.status = Some(serde_json::from_value(json!({
        "observedGeneration": 1,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "RepositoryNotAllowed", "message": "an older wording",
             "observedGeneration": 1, "lastTransitionTime": "2026-11-25T01:00:00Z"},
        ],
        "backupSchedule": schedule_status,
    }))?);
    let app_json = serde_json::to_value(&app)?;
    let script = vec![Step::ok(Method::PATCH, APP_STATUS_PATH, app_json)];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(result.is_ok(), "{result:?}");
    let sent = seen[0].body()?;
    ensure!(sent["status"].get("backupSchedule").is_none(), "{sent}");
    ensure!(condition(&seen[0], "Ready")?["message"] != "an older wording");

    // The server now holds our conditions and the engine's field: nothing to write.
    let mut app = with_status_from(app, &seen[0])?;
    if let Some(status) = app.status.as_mut() {
        status.backup_schedule = Some(serde_json::from_value(schedule_status)?);
    }
    let (result, seen) = reconcile(&mut server, &ctx, &app, Vec::new()).await?;
    ensure!(result.is_ok(), "{result:?}");
    ensure!(seen.is_empty(), "{seen:?}");
    Ok(())
}

/// Without our finalizer, the first reconcile adds it (a merge patch conditional on the
/// resourceVersion read, so a finalizer added meanwhile is never dropped), records the
/// version the patch returned as seen (its watch event must not wake the app again) and
/// goes on in the same reconcile: here to the refused repository's status and Event.
#[tokio::test]
async fn the_finalizer_is_added_first_and_the_same_reconcile_goes_on() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let mut app = app("https://127.0.0.1/charts");
    app.metadata.finalizers = None;
    let mut patched = app.clone();
    patched.metadata.finalizers = Some(vec![FINALIZER.into()]);
    patched.metadata.resource_version = Some("101".into());
    let script = vec![
        Step::ok(Method::PATCH, APP_PATH, serde_json::to_value(&patched)?),
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&patched)?),
        Step::echo(Method::POST, EVENTS_PATH),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(
        seen[0].body()? == &json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "100"}}),
        "{:?}",
        seen[0].body
    );
    let ready = condition(&seen[1], "Ready")?;
    ensure!(ready["reason"] == "RepositoryNotAllowed", "{ready}");
    ensure!(
        ctx.seen.consume("ApplicationInstance", NS, "wiki", "101"),
        "the patched version is recorded as acted on"
    );
    Ok(())
}

/// The cached copy lags a finalizer another reconcile added: the patch's precondition fails,
/// the live object is read, and with the finalizer there the reconcile goes on without a
/// second patch (no failure, no backoff).
#[tokio::test]
async fn a_stale_copy_without_the_finalizer_reads_the_live_object() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let mut stale = app("https://127.0.0.1/charts");
    stale.metadata.finalizers = None;
    let mut live = app("https://127.0.0.1/charts");
    live.metadata.resource_version = Some("101".into());
    let script = vec![
        Step::fail(Method::PATCH, APP_PATH, 409, "Conflict"),
        Step::get(APP_PATH, serde_json::to_value(&live)?),
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&live)?),
        Step::echo(Method::POST, EVENTS_PATH),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &stale, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(seen.len() == 4, "{seen:?}");
    Ok(())
}

/// Deleted in a namespace this controller may not manage: only our finalizer is removed
/// (another one stays), by a merge patch, with no status write, no Event and no engine call.
#[tokio::test]
async fn a_refused_namespace_never_holds_up_deletion() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Some("team-b"))?;
    let app = deleting(app("https://charts.example.com"), &[OTHER_FINALIZER, FINALIZER])?;
    let script = vec![Step::ok(Method::PATCH, APP_PATH, serde_json::to_value(&app)?)];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(
        seen[0].body()? == &json!({"metadata": {"finalizers": [OTHER_FINALIZER]}}),
        "{:?}",
        seen[0].body
    );

    // Without our finalizer there is nothing to do at all.
    let app = deleting(app, &[OTHER_FINALIZER])?;
    let (result, seen) = reconcile(&mut server, &ctx, &app, Vec::new()).await?;
    ensure!(result.is_ok() && seen.is_empty(), "{result:?} {seen:?}");
    Ok(())
}

/// Not deleted in a refused namespace: Failed NamespaceNotAllowed (Stalled) and a Warning
/// Event; nothing is read or materialised.
#[tokio::test]
async fn a_refused_namespace_is_reported_and_never_materialised() -> anyhow::Result<()> {
    let (ctx, mut server) = context(Some("team-b"))?;
    let app = app("https://charts.example.com");
    let script = vec![
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&app)?),
        Step::echo(Method::POST, EVENTS_PATH),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(result.is_ok(), "{result:?}");
    let ready = condition(&seen[0], "Ready")?;
    ensure!(ready["reason"] == "NamespaceNotAllowed", "{ready}");
    ensure!(
        ready["message"] == "namespace team-a is not allowed (allowed namespaces: team-b)",
        "{ready}"
    );
    ensure!(seen[1].body()?["reason"] == "NamespaceNotAllowed");
    Ok(())
}

/// Deleted while its repository is refused: nothing of ours can exist, the cleanup finds
/// that (three GETs, no DELETE) and our finalizer is removed by index, guarded by a test
/// operation so someone else's finalizer is never removed.
#[tokio::test]
async fn a_refused_repository_does_not_hold_up_deletion() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let app = deleting(app("https://127.0.0.1/charts"), &[OTHER_FINALIZER, FINALIZER])?;
    let (_, repository_path) = shared_repository("https://127.0.0.1/charts")?;
    let no_releases =
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {}, "items": []});
    let script = vec![
        Step::not_found(HR_PATH),
        Step::not_found(HELMREPO_PATH),
        Step::not_found(OCIREPO_PATH),
        // The shared source, if no other release names it.
        Step::get(HR_LIST_PATH, no_releases),
        Step::not_found(&repository_path),
        Step::ok(Method::PATCH, APP_PATH, serde_json::to_value(&app)?),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(matches!(&result, Ok(a) if *a == Action::await_change()), "{result:?}");
    ensure!(
        seen[5].body()?
            == &json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]),
        "{:?}",
        seen[5].body
    );
    Ok(())
}

/// Deleted while the release still exists: the HelmRelease is deleted, the status says the
/// uninstall is in progress, and the finalizer stays (the reconcile fails with `Uninstalling`,
/// which the error policy polls quickly).
#[tokio::test]
async fn deletion_keeps_the_finalizer_until_the_release_is_gone() -> anyhow::Result<()> {
    let (ctx, mut server) = context(None)?;
    let app = deleting(app("https://charts.example.com"), &[FINALIZER])?;
    let owner = json!([{
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance", "name": "wiki",
        "uid": "0b9f5c1e-6d7e-4c55-9a55-0d6f7d7f2a11", "controller": true, "blockOwnerDeletion": true,
    }]);
    let release = json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
        "metadata": {"name": "wiki", "namespace": NS, "uid": "hr-uid", "ownerReferences": owner},
        "spec": {},
    });
    let script = vec![
        Step::get(HR_PATH, release.clone()),
        Step::new(Method::DELETE, HR_PATH, http::StatusCode::OK, release),
        Step::ok(Method::PATCH, APP_STATUS_PATH, serde_json::to_value(&app)?),
    ];
    let (result, seen) = reconcile(&mut server, &ctx, &app, script).await?;
    ensure!(
        matches!(&result, Err(reconciler::Error::Uninstalling(m)) if m.contains("waiting for helm-controller")),
        "{result:?}"
    );
    ensure!(seen[1].body()?["preconditions"] == json!({"uid": "hr-uid"}));
    let ready = condition(&seen[2], "Ready")?;
    ensure!(
        ready["status"] == "Unknown" && ready["reason"] == "Uninstalling",
        "{ready}"
    );
    // A first status of Unknown is no verdict: no Event.
    ensure!(seen.len() == 3, "{seen:?}");
    Ok(())
}
