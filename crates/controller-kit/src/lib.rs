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
//! ([`admin`]), namespace boundaries ([`namespaces`]), shutdown ([`shutdown`]) and
//! high-availability policy ([`leader`]: every replica reads and serves health,
//! only the Lease holder writes, and a replica that loses the Lease exits).
//!
//! It holds no domain knowledge and no CRD types. Errors are typed per module
//! (`thiserror`); `anyhow` belongs in the binaries.
//!
//! A `main` wires it in this order (see `examples/minimal_controller.rs`):
//! flatten [`args::CommonArgs`] → [`telemetry::init`] → [`admin::spawn`] →
//! [`leader::LeaderElection::start`] → run the controllers with the
//! [`leader::LeaderGate`] until [`shutdown`] or loss of the Lease.

#![warn(missing_docs)]

pub mod admin;
pub mod args;
pub mod leader;
pub mod metrics;
pub mod namespaces;
pub mod retry;
pub mod shutdown;
pub mod telemetry;

pub use admin::Readiness;
pub use args::CommonArgs;
pub use leader::{LeaderElection, LeaderGate};
pub use metrics::{ControllerMetrics, Metrics, WriteVerb};
pub use namespaces::{NamespacePolicy, WatchScope};
pub use retry::RetryBackoff;
pub use shutdown::CancellationToken;
pub use telemetry::{Redacted, TelemetryGuard};
