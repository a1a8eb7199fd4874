//! `app-controller`: reconciles ApplicationInstances into Helm releases.

use std::{collections::HashMap, sync::Arc};

use api::{ApplicationInstance, EngineKind};
use app_controller::{
    controller::{self, Settings},
    reconciler::{CONTROLLER, Context, Engines, FIELD_MANAGER},
    tenancy::{PodSecurityEnforce, Tenancy},
};
use clap::Parser;
use controller_kit::{CommonArgs, Runtime, WriteVerb, runtime::Never};
use controller_kit::{labels::LabelSelector, namespaces::NamespacePairs};
use helmengine::{
    Engine,
    argocd::{ArgoCdEngine, ArgoCdSettings},
    flux::FluxEngine,
};
use kube::{
    core::DeserializeGuard,
    runtime::{
        events::{Recorder, Reporter},
        reflector::Store,
    },
};

const NAME: &str = "vworkspace-app-controller";

#[derive(Parser)]
#[command(
    name = "app-controller",
    version,
    about = "Reconciles ApplicationInstances into Helm releases (Flux or Argo CD)."
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Engine for ApplicationInstances that do not name one.
    #[arg(long, env = "VWS_DEFAULT_ENGINE", default_value = "flux", value_parser = parse_engine)]
    default_engine: EngineKind,
    /// Engines this controller drives (comma-separated: `flux`, `argocd`). An
    /// ApplicationInstance naming another one is refused with `EngineUnavailable`.
    #[arg(long, env = "VWS_ENGINES", default_value = "flux", value_delimiter = ',', value_parser = parse_engine)]
    engines: Vec<EngineKind>,
    /// The namespace Argo CD runs in; the argocd engine writes its Applications and
    /// AppProjects there.
    #[arg(long, env = "VWS_ARGOCD_NAMESPACE", default_value = helmengine::argocd::DEFAULT_NAMESPACE)]
    argocd_namespace: String,
    /// `spec.destination.server` of the Applications the argocd engine writes.
    #[arg(long, env = "VWS_ARGOCD_DESTINATION_SERVER", default_value = helmengine::argocd::IN_CLUSTER_SERVER)]
    argocd_destination_server: String,
    /// Cross-namespace references an ApplicationInstance may make, as `FROM=TO` pairs
    /// (e.g. `team-a=shared-charts`): `targetNamespace`, `chart.sourceRef.namespace` and
    /// `dependsOn[].namespace` outside the app's own namespace are refused unless listed here.
    #[arg(long, env = "VWS_ALLOWED_NAMESPACE_PAIRS", default_value = "", value_parser = parse_pairs)]
    allowed_namespace_pairs: NamespacePairs,
    #[command(flatten)]
    repositories: app_controller::repositories::RepositoryArgs,
    /// Pod Security level enforced in the namespaces this controller manages (`warn` and
    /// `audit` are always `restricted`): `baseline`, `restricted`, or `none` to leave the
    /// namespaces' labels to the platform.
    #[arg(long, env = "VWS_POD_SECURITY_ENFORCE", default_value = "baseline")]
    pod_security_enforce: PodSecurityEnforce,
    /// Act only on the ApplicationInstances whose labels match this selector (Kubernetes
    /// syntax, e.g. `vworkspace.io/shard=b` or `!vworkspace.io/shard`), and say nothing of
    /// the others: how several app controllers share one cluster (ADR 0015). Unset: every
    /// ApplicationInstance in the watched namespaces.
    #[arg(long, env = "VWS_WATCH_LABEL_SELECTOR", value_parser = parse_selector)]
    watch_label_selector: Option<LabelSelector>,
}

fn parse_selector(s: &str) -> Result<LabelSelector, String> {
    s.parse()
        .map_err(|e: controller_kit::labels::LabelSelectorError| e.to_string())
}

fn parse_pairs(s: &str) -> Result<NamespacePairs, String> {
    s.parse()
        .map_err(|e: controller_kit::namespaces::NamespaceError| e.to_string())
}

fn parse_engine(s: &str) -> Result<EngineKind, String> {
    match s {
        "flux" => Ok(EngineKind::Flux),
        "argocd" => Ok(EngineKind::Argocd),
        other => Err(format!("unknown engine {other:?} (flux, argocd)")),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if !cli.engines.contains(&cli.default_engine) {
        anyhow::bail!(
            "--default-engine {} is not among --engines ({})",
            cli.default_engine.as_str(),
            cli.engines.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(",")
        );
    }
    Runtime::builder(NAME, &cli.common)?
        .run(|rt| async move {
            let client = rt.client;
            let controller_metrics = rt.metrics.controller(CONTROLLER);
            controller_metrics.declare_write(WriteVerb::Apply, "ApplicationInstance");
            for kind in ["Namespace", "ServiceAccount", "RoleBinding"] {
                controller_metrics.declare_write(WriteVerb::Apply, kind);
            }

            let available: HashMap<EngineKind, Arc<dyn Engine>> = cli
                .engines
                .iter()
                .map(|kind| {
                    let engine: Arc<dyn Engine> = match kind {
                        EngineKind::Flux => Arc::new(FluxEngine::new(client.clone(), FIELD_MANAGER)),
                        EngineKind::Argocd => Arc::new(ArgoCdEngine::new(
                            client.clone(),
                            FIELD_MANAGER,
                            ArgoCdSettings {
                                namespace: cli.argocd_namespace.clone(),
                                destination_server: cli.argocd_destination_server.clone(),
                            },
                        )),
                    };
                    (*kind, engine)
                })
                .collect();
            let engines = Engines {
                default: cli.default_engine,
                available,
            };
            let reporter = Reporter {
                controller: NAME.into(),
                instance: Some(cli.common.identity.clone()),
            };
            let recorder = Recorder::new(client.clone(), reporter);
            let settings = Settings {
                scope: rt.scope.clone(),
                concurrency: cli.common.concurrency,
                watched: engines.watched_kinds(),
                selector: cli.watch_label_selector.clone(),
            };
            let publisher = controller_kit_publisher(&cli.common, NAME);
            publisher.register_metrics(&rt.metrics);
            let ctx_client = client.clone();
            // Readiness gauges, from the controller's own cache (app_metrics.rs).
            let app_metrics = app_controller::app_metrics::AppMetrics::register(&rt.metrics);
            let (metrics_gate, metrics_shutdown) = (rt.gate.clone(), rt.shutdown.clone());
            let make_context = move |store: Store<DeserializeGuard<ApplicationInstance>>| {
                tokio::spawn(app_controller::app_metrics::run(
                    store.clone(),
                    app_metrics,
                    metrics_gate,
                    metrics_shutdown,
                ));
                Context {
                    client: ctx_client,
                    engines,
                    scope: rt.scope,
                    namespace_pairs: cli.allowed_namespace_pairs,
                    repositories: cli.repositories.policy(),
                    gate: rt.gate,
                    metrics: controller_metrics,
                    recorder,
                    store,
                    failures: controller::failures(),
                    publisher,
                    tenancy: Tenancy::new(FIELD_MANAGER, cli.pod_security_enforce),
                    seen: Default::default(),
                    selector: cli.watch_label_selector,
                }
            };
            controller::run(client, settings, make_context, rt.readiness, rt.shutdown).await;
            Ok::<_, Never>(())
        })
        .await?;
    Ok(())
}

/// The status channel publisher for `--status-channel-endpoint` (disabled when unset).
fn controller_kit_publisher(common: &controller_kit::CommonArgs, name: &str) -> status_channel::Publisher {
    status_channel::Publisher::from_flag(common.status_channel_endpoint.as_deref(), name, &common.identity)
}
