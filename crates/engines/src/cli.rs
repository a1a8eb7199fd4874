//! The `main` of every engine binary: common flags, telemetry, admin server, leader
//! election, then one controller per driver until shutdown or loss of the Lease.

use anyhow::Context as _;
use clap::Args;
use controller_kit::{CancellationToken, CommonArgs, LeaderElection, Metrics, Readiness, admin, shutdown, telemetry};
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
}

impl EngineMain {
    /// An engine named `name` (binary name; field manager `vworkspace-<name>`).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            controllers: Vec::new(),
        }
    }

    /// Adds a controller for `driver`.
    pub fn driver<D: Driver>(mut self, driver: D) -> Self {
        self.controllers
            .push(Box::new(move |client, settings, synced, shutdown| {
                Box::pin(runtime::run(client, driver, settings, synced, shutdown))
            }));
        self
    }

    /// Runs until a signal or the loss of the Lease.
    pub async fn run(self, common: &CommonArgs, field_manager: &'static str) -> anyhow::Result<()> {
        common.validate()?;
        let _telemetry = telemetry::init(self.name, common)?;
        let shutdown = shutdown::cancel_on_signal(CancellationToken::new());
        let metrics = Metrics::new("vworkspace");
        let readiness = Readiness::new();
        let (admin_addr, admin) =
            admin::spawn(common.admin_addr, metrics.clone(), readiness.clone(), shutdown.clone()).await?;
        tracing::info!(%admin_addr, engine = self.name, "admin server listening");

        let client = Client::try_default()
            .await
            .context("connecting to the Kubernetes API")?;
        let scope = common.watch_scope()?;
        let lease_name = format!("vworkspace-{}", self.name);
        let mut election = LeaderElection::start(client.clone(), common, &lease_name, &metrics, &shutdown)?;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: format!("vworkspace-{}", self.name),
                instance: Some(common.identity.clone()),
            },
        );
        let settings = EngineSettings {
            name: self.name,
            field_manager,
            scope,
            concurrency: common.concurrency,
            gate: election.gate(),
            metrics,
            recorder,
            publisher: status_channel::Publisher::from_flag(
                common.status_channel_endpoint.as_deref(),
                self.name,
                &common.identity,
            ),
        };
        let synced = SyncTracker::new(self.controllers.len(), readiness);
        let runs = self
            .controllers
            .into_iter()
            .map(|start| start(client.clone(), settings.clone(), synced.clone(), shutdown.clone()));
        tokio::select! {
            _ = futures::future::join_all(runs) => {}
            res = election.wait() => res?,
        }
        shutdown.cancel();
        election.wait().await?;
        admin.await??;
        Ok(())
    }
}
