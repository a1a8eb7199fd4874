//! Controller plumbing shared by every vWorkspace binary.
//!
//! The workspace is layered, each layer depending only on those below it:
//!
//! 1. **API types** (`api` crate): the CRDs, types only.
//! 2. **Domain logic**: pure functions (validate, build, map status) with no I/O.
//! 3. **Controllers**: reconcile loops wiring the domain logic to the API server.
//! 4. **Binaries** (app-controller, backup/restore/upgrade/runbook engines, agent):
//!    tiny `main`s that parse flags and start controllers.
//!
//! This crate sits beside layer 3 and is used by every binary, so the operational
//! behaviour is written once and is the same everywhere: the same flags
//! ([`args`]), logs and traces ([`telemetry`]), metric names ([`metrics`]), probes
//! ([`admin`]), namespace boundaries ([`namespaces`]), shutdown ([`shutdown`]),
//! background tasks that never fail in silence ([`tasks`]) and high-availability policy
//! ([`leader`]: every replica reads and serves health, only the Lease holder writes, and a
//! replica that loses the Lease stops writing at once and follows again).
//!
//! It holds no domain knowledge and no CRD types. Errors are typed per module
//! (`thiserror`); `anyhow` belongs in the binaries.
//!
//! A `main` flattens [`args::CommonArgs`] into its flags and hands the rest to
//! [`runtime::Runtime::builder`], which wires the parts in one order for every binary
//! ([`telemetry::init`] → [`shutdown`] on signals → [`admin::spawn`] → client →
//! [`leader::LeaderElection::start`] → the controllers, with the [`leader::LeaderGate`],
//! until they end, shutdown or a failure of the election task; see `examples/minimal_controller.rs`).
//! Inside, each kube-runtime `Controller` waits for its cache and opens each reconcile
//! the same way ([`controller`]).

#![warn(missing_docs)]

pub mod admin;
pub mod args;
pub mod controller;
pub mod labels;
pub mod leader;
pub mod metrics;
pub mod namespaces;
pub mod requests;
pub mod retry;
pub mod runtime;
pub mod seen;
pub mod shutdown;
pub mod tasks;
pub mod telemetry;
pub mod writes;

pub use admin::Readiness;
pub use args::CommonArgs;
pub use leader::{LeaderElection, LeaderGate};
pub use metrics::{ControllerMetrics, GaugeSnapshot, Metrics, WriteVerb};
pub use namespaces::{NamespacePolicy, WatchScope};
pub use retry::RetryBackoff;
pub use runtime::Runtime;
pub use seen::SeenVersions;
pub use shutdown::CancellationToken;
pub use telemetry::{Redacted, TelemetryGuard};
