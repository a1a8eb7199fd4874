//! The `main` of every engine binary: common flags, telemetry, admin server, leader
//! election, then one controller per driver until shutdown or loss of the Lease.

use clap::Args;
use controller_kit::{CancellationToken, CommonArgs, Runtime, runtime::Never};
use futures::future::BoxFuture;
use kube::{
    Client,
    runtime::events::{Recorder, Reporter},
};

use crate::runtime::{self, Driver, EngineSettings, SyncTracker};

/// Flags of every engine.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Starts one controller: everything it needs from `main`, returning its run.
type StartController =
    Box<dyn FnOnce(Client, EngineSettings, SyncTracker, CancellationToken) -> BoxFuture<'static, ()>>;

/// One engine binary: its name and the controllers it runs.
pub struct EngineMain {
    name: &'static str,
    controllers: Vec<StartController>,
    /// The Operation types of the drivers, for the Operation metrics ([`crate::metrics`]).
    types: Vec<api::OperationType>,
}

impl EngineMain {
    /// An engine named `name` (binary name; field manager `vworkspace-<name>`).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            controllers: Vec::new(),
            types: Vec::new(),
        }
    }

    /// Adds a controller for `driver`.
    pub fn driver<D: Driver>(mut self, driver: D) -> Self {
        self.types.push(driver.op_type());
        self.controllers
            .push(Box::new(move |client, settings, synced, shutdown| {
                Box::pin(runtime::run(client, driver, settings, synced, shutdown))
            }));
        self
    }

    /// Adds the sweeper of orphaned scratch namespaces of verified restores
    /// ([`crate::verify::sweep_orphans`]).
    pub fn scratch_sweeper(mut self) -> Self {
        self.controllers
            .push(Box::new(move |client, settings, synced, shutdown| {
                Box::pin(crate::verify::sweep_orphans(client, settings, synced, shutdown))
            }));
        self
    }

    /// Adds the controller of ApplicationInstances' backup schedules ([`crate::schedule`]),
    /// which creates Backup Operations in Velero's namespace `velero_namespace`.
    pub fn backup_schedules(mut self, velero_namespace: String) -> Self {
        self.controllers
            .push(Box::new(move |client, settings, synced, shutdown| {
                Box::pin(crate::schedule::run(
                    client,
                    velero_namespace,
                    settings,
                    synced,
                    shutdown,
                ))
            }));
        self
    }

    /// Runs until a signal or the loss of the Lease.
    pub async fn run(self, common: &CommonArgs, field_manager: &'static str) -> anyhow::Result<()> {
        let name = self.name;
        let reporter = format!("vworkspace-{name}");
        Runtime::builder(name, common)?
            .lease_name(reporter.clone())
            .run(|rt| async move {
                let recorder = Recorder::new(
                    rt.client.clone(),
                    Reporter {
                        controller: reporter,
                        instance: Some(common.identity.clone()),
                    },
                );
                let publisher = status_channel::Publisher::from_flag(
                    common.status_channel_endpoint.as_deref(),
                    name,
                    &common.identity,
                );
                publisher.register_metrics(&rt.metrics);
                let end_from_child = crate::metrics::EndFromChild::register(&rt.metrics);
                let settings = EngineSettings {
                    name,
                    field_manager,
                    scope: rt.scope,
                    concurrency: common.concurrency,
                    gate: rt.gate,
                    metrics: rt.metrics,
                    recorder,
                    publisher,
                    end_from_child,
                };
                let synced = SyncTracker::new(self.controllers.len(), rt.readiness);
                let client = rt.client;
                let shutdown = rt.shutdown;
                let observer = crate::metrics::observe_all(
                    client.clone(),
                    settings.scope.clone(),
                    self.types,
                    settings.metrics.clone(),
                    settings.gate.clone(),
                    shutdown.clone(),
                );
                let runs = self
                    .controllers
                    .into_iter()
                    .map(|start| start(client.clone(), settings.clone(), synced.clone(), shutdown.clone()));
                futures::future::join(futures::future::join_all(runs), observer).await;
                Ok::<_, Never>(())
            })
            .await?;
        Ok(())
    }
}
