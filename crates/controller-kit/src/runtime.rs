//! The start-up and shutdown of every binary, written once (the kubert `Runtime` model).
//!
//! A `main` parses its flags, then hands the rest to [`Runtime::builder`]:
//!
//! ```no_run
//! # async fn example(common: controller_kit::CommonArgs) -> Result<(), controller_kit::runtime::RuntimeError> {
//! use controller_kit::runtime::Runtime;
//!
//! Runtime::builder("vworkspace-demo", &common)? // validates the common flags
//!     .run(|rt| async move {
//!         // Build the controllers from `rt` and run them until `rt.shutdown` is cancelled.
//!         rt.readiness.set_ready();
//!         rt.shutdown.cancelled().await;
//!         Ok::<_, std::convert::Infallible>(())
//!     })
//!     .await
//! # }
//! ```
//!
//! [`Builder::run`] does, in this order: [`telemetry::init`] (the guard is held until
//! it returns) → SIGINT/SIGTERM cancel the process [`CancellationToken`]
//! ([`shutdown::cancel_on_signal`]) → the [`admin`] server (`/livez`, `/readyz`,
//! `/metrics`) → the Kubernetes client → [`LeaderElection`] when `--leader-elect` is set
//! (otherwise an open gate) → the controllers, given a [`Runtime`]. It then waits for
//! whichever ends first:
//!
//! * the controllers (after shutdown, or on their own): shutdown is cancelled, the
//!   election is waited for (the Lease is released) and so is the admin server, and
//!   `run` returns `Ok` (or the controllers' error at once);
//! * the election, after shutdown: as above;
//! * the election, with an error (its task panicked or was aborted, so no task renews the
//!   Lease): `run` returns that error at once and the binary exits. A lost Lease is not
//!   such an error: the replica steps down and follows ([`crate::leader`]).

use std::{convert::Infallible, future::Future};

use kube::Client;
use tokio::task::JoinHandle;

use crate::{
    admin::{self, AdminError, Readiness},
    args::{ArgsError, CommonArgs},
    leader::{LeaderElection, LeaderError, LeaderGate},
    metrics::Metrics,
    namespaces::WatchScope,
    shutdown::{self, CancellationToken},
    telemetry::{self, TelemetryError},
};

/// Prefix of every metric name (`vworkspace_reconcile_runs_total`, …).
pub const METRICS_PREFIX: &str = "vworkspace";

/// An error of the controllers, whatever its type (`anyhow::Error` converts into it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error type of controllers that cannot fail: `Ok::<_, Never>(())`.
pub type Never = Infallible;

/// Why a binary stopped with an error. Each variant shows its cause's own message.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Inconsistent common flags.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// Logging or tracing could not be set up.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The admin server could not start, or failed.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The admin server's task panicked.
    #[error("admin server task failed: {0}")]
    AdminTask(#[source] tokio::task::JoinError),
    /// No Kubernetes client could be built (no kubeconfig, no in-cluster configuration).
    #[error("connecting to the Kubernetes API")]
    Client(#[source] kube::Error),
    /// Leader election could not start, or this replica lost the Lease.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// The controllers returned an error.
    #[error(transparent)]
    Controllers(BoxError),
}

/// What the controllers get from the runtime. Cheap handles, all cloneable.
#[derive(Clone)]
pub struct Runtime {
    /// Kubernetes client (in-cluster configuration or kubeconfig).
    pub client: Client,
    /// Where to watch, within the namespace allow-list (`--allowed-namespaces`, `--watch-namespace`).
    pub scope: WatchScope,
    /// Check it before every write: open while this replica leads (always, without `--leader-elect`).
    pub gate: LeaderGate,
    /// The process's metrics registry, served on `/metrics`.
    pub metrics: Metrics,
    /// `/readyz`: set it ready once the watch caches have synced.
    pub readiness: Readiness,
    /// Cancelled on SIGINT/SIGTERM; the controllers stop when it is.
    pub shutdown: CancellationToken,
}

impl Runtime {
    /// Starts building the runtime of the binary `name` (the OTLP `service.name` and the
    /// default Lease name). Validates `common` first ([`CommonArgs::validate`]), before
    /// anything starts, so a wrong flag is a clear error at once.
    pub fn builder(name: impl Into<String>, common: &CommonArgs) -> Result<Builder, RuntimeError> {
        common.validate()?;
        let scope = common.watch_scope().map_err(ArgsError::from)?;
        let name = name.into();
        Ok(Builder {
            lease_name: name.clone(),
            name,
            common: common.clone(),
            scope,
        })
    }
}

/// Configures and starts a [`Runtime`]; see the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Builder {
    name: String,
    lease_name: String,
    common: CommonArgs,
    scope: WatchScope,
}

impl Builder {
    /// The Lease used when `--lease-name` is not given (default: the binary's name).
    #[must_use]
    pub fn lease_name(mut self, name: impl Into<String>) -> Self {
        self.lease_name = name.into();
        self
    }

    /// Starts telemetry, signal handling, the admin server, the client and leader election,
    /// then runs `controllers` until they end, shutdown or the loss of the Lease (see the
    /// [module documentation](self)).
    pub async fn run<F, Fut, E>(self, controllers: F) -> Result<(), RuntimeError>
    where
        F: FnOnce(Runtime) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<BoxError>,
    {
        let _telemetry = telemetry::init(&self.name, &self.common)?;
        let shutdown = shutdown::cancel_on_signal(CancellationToken::new());
        let metrics = Metrics::new(METRICS_PREFIX);
        let readiness = Readiness::new();
        let (admin_addr, admin) = admin::spawn(
            self.common.admin_addr,
            metrics.clone(),
            readiness.clone(),
            shutdown.clone(),
        )
        .await?;
        tracing::info!(%admin_addr, name = %self.name, "admin server listening");

        let client = counting_client(&metrics).await.map_err(RuntimeError::Client)?;
        let mut election = LeaderElection::start(client.clone(), &self.common, &self.lease_name, &metrics, &shutdown)?;
        let runtime = Runtime {
            client,
            scope: self.scope,
            gate: election.gate(),
            metrics,
            readiness,
            shutdown: shutdown.clone(),
        };
        supervise(controllers(runtime), &mut election, &shutdown, admin).await
    }
}

/// The default client (in-cluster configuration or kubeconfig) with every request counted in
/// `api_requests_total`.
pub async fn counting_client(metrics: &Metrics) -> Result<Client, kube::Error> {
    let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    let metrics = metrics.clone();
    let count = tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
        metrics.api_request(&request);
        request
    });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&count)
        .build())
}

/// Runs `controllers` against the election, then shuts down in order (see the module
/// documentation). The telemetry guard is the caller's, dropped after this returns.
async fn supervise<E: Into<BoxError>>(
    controllers: impl Future<Output = Result<(), E>>,
    election: &mut LeaderElection,
    shutdown: &CancellationToken,
    admin: JoinHandle<Result<(), AdminError>>,
) -> Result<(), RuntimeError> {
    tokio::select! {
        res = controllers => res.map_err(|e| RuntimeError::Controllers(e.into()))?,
        res = election.wait() => res?,
    }
    shutdown.cancel();
    election.wait().await?;
    admin.await.map_err(RuntimeError::AdminTask)??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn common(extra: &[&str]) -> CommonArgs {
        let mut args = vec!["bin", "--allowed-namespaces", "team-a"];
        args.extend_from_slice(extra);
        Cli::parse_from(args).common
    }

    fn admin_ok() -> JoinHandle<Result<(), AdminError>> {
        tokio::spawn(async { Ok(()) })
    }

    /// An election whose task ends with `result` when `shutdown` is cancelled, or at once
    /// when `at_once`.
    fn election(
        shutdown: &CancellationToken,
        at_once: bool,
        result: fn() -> Result<(), LeaderError>,
    ) -> LeaderElection {
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if !at_once {
                token.cancelled().await;
            }
            result()
        });
        LeaderElection::from_parts(LeaderGate::always_leader(), Some(task), shutdown.clone())
    }

    fn broken() -> Result<(), LeaderError> {
        Err(LeaderError::Config(crate::args::ArgsError::EmptyIdentity))
    }

    async fn within<T>(fut: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .expect("supervise did not return")
    }

    #[test]
    fn builder_validates_the_common_flags_first() {
        let builder = Runtime::builder("vworkspace-demo", &common(&["--watch-namespace", "team-a"])).unwrap();
        assert_eq!(builder.lease_name, "vworkspace-demo", "the Lease defaults to the name");
        assert_eq!(builder.scope.watch_namespace(), Some("team-a"));
        assert_eq!(builder.lease_name("vworkspace-x").lease_name, "vworkspace-x");

        let missing = Cli::parse_from(["bin"]).common;
        assert!(matches!(
            Runtime::builder("demo", &missing),
            Err(RuntimeError::Args(ArgsError::Namespace(_)))
        ));
        let timings = common(&["--lease-duration", "5s", "--renew-deadline", "10s"]);
        let err = Runtime::builder("demo", &timings).unwrap_err();
        assert!(matches!(err, RuntimeError::Args(ArgsError::LeaderTimings(_))), "{err}");
        assert!(err.to_string().starts_with("invalid leader election timings"), "{err}");
    }

    #[tokio::test]
    async fn controllers_ending_cancel_shutdown_and_wait_for_the_election() {
        let shutdown = CancellationToken::new();
        let mut election = election(&shutdown, false, || Ok(()));
        let res = within(supervise(
            async { Ok::<_, Never>(()) },
            &mut election,
            &shutdown,
            admin_ok(),
        ))
        .await;
        assert!(res.is_ok(), "{res:?}");
        assert!(shutdown.is_cancelled(), "the rest of the process is told to stop");
    }

    #[tokio::test]
    async fn a_signal_ends_the_run_cleanly() {
        let shutdown = CancellationToken::new();
        let mut election = election(&shutdown, false, || Ok(()));
        let token = shutdown.clone();
        let controllers = async move {
            token.cancelled().await;
            // Draining takes a while; the released Lease ends the run first (as before).
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Never>(())
        };
        shutdown.cancel();
        let res = within(supervise(controllers, &mut election, &shutdown, admin_ok())).await;
        assert!(res.is_ok(), "{res:?}");
    }

    #[tokio::test]
    async fn without_leader_election_a_signal_ends_the_run() {
        let shutdown = CancellationToken::new();
        let mut election = LeaderElection::from_parts(LeaderGate::always_leader(), None, shutdown.clone());
        let controllers = std::future::pending::<Result<(), Never>>();
        let token = shutdown.clone();
        tokio::spawn(async move { token.cancel() });
        let res = within(supervise(controllers, &mut election, &shutdown, admin_ok())).await;
        assert!(res.is_ok(), "{res:?}");
    }

    #[tokio::test]
    async fn an_election_that_ends_with_an_error_ends_the_run_at_once() {
        let shutdown = CancellationToken::new();
        let mut election = election(&shutdown, true, broken);
        let controllers = std::future::pending::<Result<(), Never>>();
        let err = within(supervise(controllers, &mut election, &shutdown, admin_ok()))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Leader(LeaderError::Config(_))), "{err}");
        assert!(!shutdown.is_cancelled(), "the binary exits; nothing waits for a drain");
    }

    #[tokio::test]
    async fn the_controllers_error_is_returned_with_its_own_message() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read the token")]
        struct Failed;

        let shutdown = CancellationToken::new();
        let mut election = election(&shutdown, false, || Ok(()));
        let err = within(supervise(async { Err(Failed) }, &mut election, &shutdown, admin_ok()))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Controllers(_)), "{err}");
        assert_eq!(err.to_string(), "cannot read the token");
    }

    #[tokio::test]
    async fn a_failed_admin_server_is_reported_after_shutdown() {
        let shutdown = CancellationToken::new();
        let mut election = election(&shutdown, false, || Ok(()));
        let admin = tokio::spawn(async { Err(AdminError::Serve(std::io::Error::other("broken"))) });
        let err = within(supervise(async { Ok::<_, Never>(()) }, &mut election, &shutdown, admin))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Admin(AdminError::Serve(_))), "{err}");
        assert!(shutdown.is_cancelled());
    }

    #[tokio::test]
    async fn an_election_error_at_shutdown_is_still_an_error() {
        // The election ends with an error only after the controllers have returned.
        let shutdown = CancellationToken::new();
        let mut election = election(&shutdown, false, broken);
        let err = within(supervise(
            async { Ok::<_, Never>(()) },
            &mut election,
            &shutdown,
            admin_ok(),
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, RuntimeError::Leader(_)), "{err}");
    }
}
