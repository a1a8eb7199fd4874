//! The day-2 engines: one Operation controller runtime ([`runtime`]) shared by every
//! engine, and one [`Driver`] per Operation type. The pure rules (lifecycle gate, status,
//! child objects and their phase mappings, revision history, the Upgrade and Rollback
//! state machines) live in the `operations` crate; this crate is the thin layer that reads
//! the cluster, calls them, applies what they return and writes the status they compute.
//!
//! | Binary | Drivers |
//! |---|---|
//! | `backup-engine` | [`backup::BackupDriver`], [`snapshot::SnapshotDriver`], and the backup schedules of ApplicationInstances ([`schedule`]) |
//! | `restore-engine` | [`restore::RestoreDriver`] |
//! | `upgrade-engine` | [`upgrade::UpgradeDriver`], [`upgrade::RollbackDriver`] |
//! | `runbook-engine` | [`runbook::RunbookDriver`] |
//!
//! Every binary also exports the Operation metrics of its types, and `backup-engine` the
//! backup schedule gauges ([`metrics`]).

pub mod backup;
pub mod children;
pub mod cli;
pub mod metrics;
pub mod restore;
pub mod runbook;
pub mod runtime;
pub mod schedule;
pub mod snapshot;
pub mod upgrade;
pub mod verify;

pub use runtime::{Cx, Driver, DriverError, Watch};
