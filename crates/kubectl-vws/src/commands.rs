//! The commands' reads and writes. Everything shown is computed by the pure modules.

use std::{io::Write, path::Path, time::Duration};

use api::{ApplicationInstance, BackupParams, Operation, RestoreParams, RollbackParams, UpgradeParams};
use futures::{StreamExt, TryStreamExt};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::GroupVersionKind,
    discovery::{self, ApiResource},
    runtime::{WatchStreamExt, watcher},
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    Error, apps,
    cli::{Command, Output, RequestArgs},
    history,
    progress::{self, Printer, Verdict},
    request::{self, Intent},
    table,
    trace::{self, Node},
};

/// The field manager of the plugin's own writes (suspend, resume, reconcile).
pub const FIELD_MANAGER: &str = "kubectl-vws";
/// Flux's annotation asking for an immediate reconcile.
const FLUX_REQUESTED_AT: &str = "reconcile.fluxcd.io/requestedAt";
/// Argo CD's annotation asking for a refresh.
const ARGOCD_REFRESH: &str = "argocd.argoproj.io/refresh";
/// How often a terminal's progress line is redrawn (the clock moves).
const REDRAW: Duration = Duration::from_secs(1);

/// A client and the namespace commands act in.
pub struct Session {
    pub client: Client,
    pub namespace: String,
}

impl Session {
    /// Connects as the kubeconfig says (`--kubeconfig`, else `KUBECONFIG`, else
    /// `~/.kube/config`; in a pod, its ServiceAccount).
    pub async fn connect(
        kubeconfig: Option<&Path>,
        context: Option<String>,
        namespace: Option<String>,
    ) -> Result<Self, Error> {
        let options = KubeConfigOptions {
            context,
            ..KubeConfigOptions::default()
        };
        let config = match kubeconfig {
            Some(path) => {
                let file =
                    Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| Error::Kubeconfig(e.to_string()))?
            }
            None if options.context.is_some() => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| Error::Kubeconfig(e.to_string()))?,
            None => Config::infer().await.map_err(|e| Error::Kubeconfig(e.to_string()))?,
        };
        let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config)?;
        Ok(Self { client, namespace })
    }

    fn apps(&self) -> Api<ApplicationInstance> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn operations(&self) -> Api<Operation> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn app(&self, name: &str) -> Result<ApplicationInstance, Error> {
        self.apps()
            .get_opt(name)
            .await?
            .ok_or_else(|| Error::NotFound(format!("applicationinstance {}/{name} not found", self.namespace)))
    }
}

/// Runs `command`, writing what it shows to `out`.
pub async fn run(session: &Session, command: Command, out: &mut dyn Write, terminal: bool) -> Result<(), Error> {
    match command {
        Command::Get {
            app,
            all_namespaces,
            output,
        } => get(session, app.as_deref(), all_namespaces, output, out).await,
        Command::Trace { app } => trace(session, &app, out).await,
        Command::History { app } => history(session, &app, out).await,
        Command::Backup {
            app,
            ttl,
            include_volumes,
            storage_location,
            request,
        } => {
            let params = BackupParams {
                ttl,
                include_volumes: include_volumes.then_some(true),
                storage_location,
                ..BackupParams::default()
            };
            operate(session, &app, Intent::Backup(params), &request, out, terminal).await
        }
        Command::Restore {
            app,
            from_operation,
            from_backup,
            restore_volumes,
            target_namespace,
            verify,
            request,
        } => {
            let params = RestoreParams {
                source: request::restore_source(from_operation, from_backup)?,
                restore_volumes: restore_volumes.then_some(true),
                target_namespace,
                verify: verify.then_some(true),
            };
            operate(session, &app, Intent::Restore(params), &request, out, terminal).await
        }
        Command::Upgrade {
            app,
            version,
            values_file,
            backup_first,
            on_failure,
            request,
        } => {
            let values_patch = match values_file {
                Some(path) => Some(request::mapping(&path.display().to_string(), &read(&path)?)?),
                None => None,
            };
            let params = UpgradeParams {
                chart_version: version,
                values_patch,
                backup_first: backup_first.then_some(true),
                on_failure: on_failure.as_deref().map(request::failure_policy).transpose()?,
                ..UpgradeParams::default()
            };
            operate(session, &app, Intent::Upgrade(params), &request, out, terminal).await
        }
        Command::Rollback { app, revision, request } => {
            let params = RollbackParams {
                revision,
                ..RollbackParams::default()
            };
            operate(session, &app, Intent::Rollback(params), &request, out, terminal).await
        }
        Command::Runbook {
            app,
            job_file,
            workflow_template,
            cluster_template,
            params,
            request,
        } => {
            let job = match job_file {
                Some(path) => Some(request::mapping(&path.display().to_string(), &read(&path)?)?),
                None => None,
            };
            let runbook = request::runbook(job, workflow_template, cluster_template, request::parameters(&params)?)?;
            operate(session, &app, Intent::Runbook(runbook), &request, out, terminal).await
        }
        Command::Suspend { app } => set_suspend(session, &app, true, out).await,
        Command::Resume { app } => set_suspend(session, &app, false, out).await,
        Command::Reconcile {
            app,
            with_source,
            no_wait,
            timeout,
        } => reconcile(session, &app, with_source, !no_wait, parse_timeout(&timeout)?, out).await,
    }
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}

/// `30m`, `1h 30m`, `90s` or ISO 8601 (`PT30M`).
pub fn parse_timeout(text: &str) -> Result<Duration, Error> {
    let parsed: SignedDuration = text
        .parse()
        .map_err(|e| Error::Usage(format!("--timeout {text:?}: {e}")))?;
    Duration::try_from(parsed).map_err(|_| Error::Usage(format!("--timeout {text:?} must not be negative")))
}

fn write(out: &mut dyn Write, text: &str) -> Result<(), Error> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Error::Output(e.to_string()))
}

fn encode<T: Serialize>(value: &T, output: Output) -> Result<String, Error> {
    match output {
        Output::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| Error::Output(e.to_string())),
        Output::Yaml | Output::Table => serde_saphyr::to_string(value).map_err(|e| Error::Output(e.to_string())),
    }
}

async fn get(
    session: &Session,
    name: Option<&str>,
    all_namespaces: bool,
    output: Output,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let mut apps: Vec<ApplicationInstance> = match name {
        Some(name) => vec![session.app(name).await?],
        None if all_namespaces => {
            Api::all(session.client.clone())
                .list(&ListParams::default())
                .await?
                .items
        }
        None => session.apps().list(&ListParams::default()).await?.items,
    };
    for app in &mut apps {
        app.metadata.managed_fields = None;
    }
    match output {
        Output::Table => {
            let ops_api: Api<Operation> = if all_namespaces && name.is_none() {
                Api::all(session.client.clone())
            } else {
                session.operations()
            };
            let list = match name {
                Some(name) => ListParams::default().fields(&format!("spec.applicationRef.name={name}")),
                None => ListParams::default(),
            };
            let operations = ops_api.list(&list).await?.items;
            let now = Timestamp::now();
            let rows: Vec<apps::AppRow> = apps.iter().map(|a| apps::row(a, &operations, now)).collect();
            if rows.is_empty() {
                let scope = if all_namespaces {
                    "any namespace".to_owned()
                } else {
                    format!("namespace {}", session.namespace)
                };
                return write(out, &format!("No applications found in {scope}.\n"));
            }
            write(out, &apps::render(&rows, all_namespaces && name.is_none()))
        }
        Output::Json | Output::Yaml => {
            let text = match (name, apps.first()) {
                (Some(_), Some(app)) => encode(app, output)?,
                _ => encode(&json!({"apiVersion": "v1", "kind": "List", "items": apps}), output)?,
            };
            write(out, &text)
        }
    }
}

async fn history(session: &Session, name: &str, out: &mut dyn Write) -> Result<(), Error> {
    let app = session.app(name).await?;
    let operations = session
        .operations()
        .list(&ListParams::default().fields(&format!("spec.applicationRef.name={name}")))
        .await?
        .items;
    let revisions = history::revisions(&app, &operations);
    if revisions.is_empty() {
        return write(
            out,
            &format!(
                "applicationinstance {}/{name} has no revisions yet.\n",
                session.namespace
            ),
        );
    }
    write(out, &history::render(&revisions))
}

/// Creates the Operation for `intent` (or finds the one this request already created) and,
/// with `--wait`, follows it to its end.
async fn operate(
    session: &Session,
    app: &str,
    intent: Intent,
    args: &RequestArgs,
    out: &mut dyn Write,
    terminal: bool,
) -> Result<(), Error> {
    let timeout = parse_timeout(&args.timeout)?;
    let request_id = match &args.request_id {
        Some(id) => {
            request::check_request_id(id)?;
            id.clone()
        }
        None => request::generated_request_id(Timestamp::now(), fastrand::u32(..)),
    };
    // A clear error now rather than an Operation that fails with ApplicationNotFound.
    session.app(app).await?;
    let op = request::operation(&session.namespace, app, &request_id, intent);
    let name = op.name_any();
    let ops = session.operations();
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match ops.create(&params, &op).await {
        Ok(_) => write(
            out,
            &format!("operation.vworkspace.io/{name} created (requestId {request_id})\n"),
        )?,
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = ops.get(&name).await?;
            if existing.spec.request_id != request_id || existing.spec.application_ref.name != app {
                return Err(Error::Usage(format!(
                    "operation {name} already exists for another request ({} on {})",
                    existing.spec.request_id, existing.spec.application_ref.name
                )));
            }
            write(
                out,
                &format!(
                    "operation.vworkspace.io/{name} already exists for requestId {request_id}; not created again\n"
                ),
            )?;
        }
        Err(e) => return Err(e.into()),
    }
    if args.wait {
        follow(&ops, &name, timeout, terminal, out).await?;
    }
    Ok(())
}

/// Follows Operation `name` until it ends, printing progress.
async fn follow(
    ops: &Api<Operation>,
    name: &str,
    timeout: Duration,
    terminal: bool,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(ops.clone(), config).default_backoff().boxed();
    let mut printer = Printer::new(terminal);
    let mut latest: Option<Operation> = None;
    let mut redraw = tokio::time::interval(REDRAW);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => {
                write(out, printer.finish())?;
                return Err(Error::Timeout(format!("{timeout:?}"), format!("operation {name}")));
            }
            _ = redraw.tick(), if terminal => {}
            event = events.try_next() => match event {
                Ok(Some(watcher::Event::Apply(op) | watcher::Event::InitApply(op))) => latest = Some(op),
                Ok(Some(watcher::Event::Delete(_))) => {
                    write(out, printer.finish())?;
                    return Err(Error::NotFound(format!("operation {name} was deleted while followed")));
                }
                Ok(Some(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Ok(None) => return Err(Error::NotFound(format!("the watch of operation {name} ended"))),
                // The watcher retries with backoff; a transient error only delays the line.
                Err(_) => {}
            },
        }
        let Some(op) = &latest else { continue };
        if let Some(text) = printer.update(&progress::line(op, Timestamp::now())) {
            write(out, &text)?;
        }
        match progress::verdict(op) {
            Verdict::Going => {}
            Verdict::Succeeded { result } => {
                write(out, printer.finish())?;
                return write(
                    out,
                    &format!("operation {name} Succeeded: {}\n", table::printable(&result)),
                );
            }
            Verdict::Failed { phase, reason, message } => {
                write(out, printer.finish())?;
                return Err(Error::OperationFailed {
                    name: name.to_owned(),
                    phase,
                    reason,
                    message,
                });
            }
        }
    }
}

async fn set_suspend(session: &Session, name: &str, suspend: bool, out: &mut dyn Write) -> Result<(), Error> {
    let patch = json!({"spec": {"suspend": suspend}});
    session
        .apps()
        .patch(name, &patch_params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            not_found_as(e, || {
                format!("applicationinstance {}/{name} not found", session.namespace)
            })
        })?;
    let verb = if suspend { "suspended" } else { "resumed" };
    write(
        out,
        &format!("applicationinstance {}/{name} {verb}\n", session.namespace),
    )
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

fn not_found_as(error: kube::Error, message: impl FnOnce() -> String) -> Error {
    match error {
        kube::Error::Api(status) if status.code == 404 => Error::NotFound(message()),
        other => other.into(),
    }
}

/// The API resource of `apiVersion` + `kind`, found by discovery.
async fn resource_of(client: &Client, api_version: &str, kind: &str) -> Result<ApiResource, Error> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, _) = discovery::pinned_kind(client, &gvk).await?;
    Ok(resource)
}

/// The API resource of `kind` in `group`, at the version the server prefers.
async fn preferred(client: &Client, group: &str, kind: &str) -> Result<Option<ApiResource>, Error> {
    let group = match discovery::group(client, group).await {
        Ok(group) => group,
        Err(kube::Error::Discovery(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(group.recommended_kind(kind).map(|(resource, _)| resource))
}

async fn get_dynamic(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Value>, Error> {
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let Some(mut object) = api.get_opt(name).await? else {
        return Ok(None);
    };
    object.metadata.managed_fields = None;
    let mut value = serde_json::to_value(&object).map_err(|e| Error::Output(e.to_string()))?;
    // A dynamic object carries its type only when the server sent it; make it explicit.
    if let Some(fields) = value.as_object_mut() {
        fields.insert("kind".to_owned(), Value::String(resource.kind.clone()));
    }
    Ok(Some(value))
}

/// The engine object the app's status names: (resource, namespace, name, object).
async fn engine_object(
    session: &Session,
    app: &ApplicationInstance,
) -> Result<Option<(ApiResource, String, String, Option<Value>)>, Error> {
    let Some(reference) = app.status.as_ref().and_then(|s| s.engine_ref.as_ref()) else {
        return Ok(None);
    };
    let resource = resource_of(&session.client, &reference.api_version, &reference.kind).await?;
    let namespace = reference.namespace.clone().unwrap_or_else(|| session.namespace.clone());
    let object = get_dynamic(&session.client, &resource, Some(&namespace), &reference.name).await?;
    Ok(Some((resource, namespace, reference.name.clone(), object)))
}

async fn trace(session: &Session, name: &str, out: &mut dyn Write) -> Result<(), Error> {
    let mut app = session.app(name).await?;
    app.metadata.managed_fields = None;
    let app_json = serde_json::to_value(&app).map_err(|e| Error::Output(e.to_string()))?;
    let mut root = trace::with_ready_condition(&app_json);
    match engine_object(session, &app).await? {
        None => root.children.push(Node::missing(
            "engine object (the app has not been materialised)".into(),
        )),
        Some((resource, namespace, engine_name, None)) => {
            root.children
                .push(Node::missing(format!("{}/{namespace}/{engine_name}", resource.kind)));
        }
        Some((resource, _, _, Some(object))) if resource.kind == "Application" => {
            let mut node = trace::argocd_application(&object);
            node.children = argocd_resources(&object);
            root.children.push(node);
        }
        Some((_, _, _, Some(object))) => {
            let mut node = trace::with_ready_condition(&object);
            node.children = flux_children(session, &object).await?;
            root.children.push(node);
        }
    }
    write(out, &trace::render(&root))
}

/// A HelmRelease's chart source, its HelmChart, and the workloads of its Helm release.
async fn flux_children(session: &Session, helm_release: &Value) -> Result<Vec<Node>, Error> {
    let client = &session.client;
    let own_namespace = helm_release
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or(&session.namespace)
        .to_owned();
    let mut children = Vec::new();
    let source = helm_release
        .pointer("/spec/chartRef")
        .or_else(|| helm_release.pointer("/spec/chart/spec/sourceRef"));
    if let Some(source) = source {
        let text = |f: &str| source.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
        let (kind, name) = (text("kind"), text("name"));
        let namespace = Some(text("namespace"))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| own_namespace.clone());
        children.push(flux_object(client, &kind, &namespace, &name).await?);
    }
    if let Some((namespace, name)) = helm_release
        .pointer("/status/helmChart")
        .and_then(Value::as_str)
        .and_then(|s| s.split_once('/'))
    {
        children.push(flux_object(client, "HelmChart", namespace, name).await?);
    }
    let (release, namespace) = trace::helm_release_of(helm_release);
    let params = ListParams::default().labels("app.kubernetes.io/managed-by=Helm");
    let mut workloads = Vec::new();
    for item in Api::<Deployment>::namespaced(client.clone(), &namespace)
        .list(&params)
        .await?
        .items
    {
        workloads.push(serde_json::to_value(item).map_err(|e| Error::Output(e.to_string()))?);
    }
    for item in Api::<StatefulSet>::namespaced(client.clone(), &namespace)
        .list(&params)
        .await?
        .items
    {
        workloads.push(serde_json::to_value(item).map_err(|e| Error::Output(e.to_string()))?);
    }
    for item in Api::<DaemonSet>::namespaced(client.clone(), &namespace)
        .list(&params)
        .await?
        .items
    {
        workloads.push(serde_json::to_value(item).map_err(|e| Error::Output(e.to_string()))?);
    }
    children.extend(
        workloads
            .iter()
            .filter(|w| trace::belongs_to_release(w, &release, &namespace))
            .map(trace::workload),
    );
    Ok(children)
}

async fn flux_object(client: &Client, kind: &str, namespace: &str, name: &str) -> Result<Node, Error> {
    let id = format!("{kind}/{namespace}/{name}");
    let Some(resource) = preferred(client, "source.toolkit.fluxcd.io", kind).await? else {
        return Ok(Node::missing(id));
    };
    Ok(match get_dynamic(client, &resource, Some(namespace), name).await? {
        Some(object) => trace::with_ready_condition(&object),
        None => Node::missing(id),
    })
}

/// The resources an Argo CD Application reports, with their health.
fn argocd_resources(application: &Value) -> Vec<Node> {
    application
        .pointer("/status/resources")
        .and_then(Value::as_array)
        .map(|resources| {
            resources
                .iter()
                .map(|r| {
                    let text = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
                    let health = text("/health/status");
                    Node {
                        object: format!("{}/{}/{}", text("/kind"), text("/namespace"), text("/name")),
                        ready: match health.as_str() {
                            "" => "-".to_owned(),
                            "Healthy" => "True".to_owned(),
                            _ => "False".to_owned(),
                        },
                        detail: format!("sync {}", text("/status")),
                        children: Vec::new(),
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Asks the engine to reconcile now and (with `wait`) waits until it has.
async fn reconcile(
    session: &Session,
    name: &str,
    with_source: bool,
    wait: bool,
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let app = session.app(name).await?;
    let Some((resource, namespace, engine_name, Some(object))) = engine_object(session, &app).await? else {
        return Err(Error::NotFound(format!(
            "applicationinstance {}/{name} has no engine object yet (see `kubectl vws trace {name}`)",
            session.namespace
        )));
    };
    let client = &session.client;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let params = patch_params();
    let argocd = resource.kind == "Application";
    let token = Timestamp::now().to_string();
    let annotation = if argocd {
        json!({"metadata": {"annotations": {ARGOCD_REFRESH: "normal"}}})
    } else {
        json!({"metadata": {"annotations": {FLUX_REQUESTED_AT: token}}})
    };
    if with_source && !argocd {
        let source = object
            .pointer("/spec/chartRef")
            .or_else(|| object.pointer("/spec/chart/spec/sourceRef"));
        if let Some(source) = source {
            let text = |f: &str| source.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
            let source_namespace = Some(text("namespace"))
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| namespace.clone());
            if let Some(source_resource) = preferred(client, "source.toolkit.fluxcd.io", &text("kind")).await? {
                let sources: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &source_namespace, &source_resource);
                sources
                    .patch(&text("name"), &params, &Patch::Merge(&annotation))
                    .await?;
            }
        }
    }
    api.patch(&engine_name, &params, &Patch::Merge(&annotation)).await?;
    let id = format!("{}/{namespace}/{engine_name}", resource.kind);
    write(out, &format!("► asked {id} to reconcile\n"))?;
    if !wait {
        return Ok(());
    }
    let handled = |o: &Value| {
        if argocd {
            o.pointer(&format!("/metadata/annotations/{}", ARGOCD_REFRESH.replace('/', "~1")))
                .is_none()
        } else {
            o.pointer("/status/lastHandledReconcileAt").and_then(Value::as_str) == Some(token.as_str())
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let config = watcher::Config::default().fields(&format!("metadata.name={engine_name}"));
    let stream = watcher(api, config).default_backoff().applied_objects();
    let seen = tokio::time::timeout_at(
        deadline,
        stream
            .map_ok(|o| serde_json::to_value(&o).unwrap_or(Value::Null))
            .try_filter(|o| std::future::ready(handled(o)))
            .boxed()
            .try_next(),
    )
    .await
    .map_err(|_| Error::Timeout(format!("{timeout:?}"), format!("{id} to reconcile")))?
    .map_err(|e| Error::Output(e.to_string()))?;
    let Some(seen) = seen else {
        return Err(Error::NotFound(format!("the watch of {id} ended")));
    };
    let mut node = if argocd {
        trace::argocd_application(&seen)
    } else {
        trace::with_ready_condition(&seen)
    };
    node.object = id;
    // Then the app itself: `get` right after this shows what the engine just did.
    let engine_reason = (!argocd)
        .then(|| {
            trace::ready_condition(&seen)
                .and_then(|ready| ready.get("reason"))
                .and_then(Value::as_str)
        })
        .flatten();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let relayed = tokio::time::timeout_at(
        deadline,
        watcher(session.apps(), config)
            .default_backoff()
            .applied_objects()
            .try_filter(|app| std::future::ready(apps::relays_engine(app, engine_reason)))
            .boxed()
            .try_next(),
    )
    .await
    .map_err(|_| {
        Error::Timeout(
            format!("{timeout:?}"),
            format!("applicationinstance {name} to show what {} reported", node.object),
        )
    })?
    .map_err(|e| Error::Output(e.to_string()))?;
    if relayed.is_none() {
        return Err(Error::NotFound(format!(
            "the watch of applicationinstance {name} ended"
        )));
    }
    write(out, &format!("✔ reconciled: {}", trace::render(&node)))?;
    if node.ready == "False" {
        return Err(Error::Usage(format!("{} is not ready: {}", node.object, node.detail)));
    }
    Ok(())
}
