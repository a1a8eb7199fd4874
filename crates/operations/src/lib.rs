//! Pure domain logic of the day-2 engines (backup-engine, restore-engine,
//! upgrade-engine, runbook-engine).
//!
//! Each engine is a thin controller: it lists what this crate needs, calls it,
//! applies the objects it returns and writes the status it computes. Nothing
//! here talks to a cluster, spawns tasks or reads the clock (time is passed
//! in), so every rule is unit-tested (layer 2 of
//! `docs/development/project-layout.md`).
//!
//! | Module | Answers |
//! |---|---|
//! | [`lifecycle`] | May this Operation act now? (terminal, duplicate `requestId`, deadline, `notBefore`, maintenance window, queue) |
//! | [`maintenance`] | Is the application's maintenance window open, and when does the next one open? |
//! | [`status`] | What is the next `OperationStatus`, and does it need a write? |
//! | [`velero`] | Which Velero `Backup` / `Restore` to create, and what their phase means |
//! | [`snapshot`] | Which CSI `VolumeSnapshot`s to create, and when they are done |
//! | [`job`] | Which `Job` a Runbook runs, and what its conditions mean |
//! | [`pod_security`] | Whether a Runbook's pod passes Pod Security `restricted`, with its compliant defaults and the runbook ServiceAccount |
//! | [`release`] | What an Upgrade or Rollback sets, and what the relayed Flux status says about it |
//! | [`release_flow`] | Where an Upgrade or Rollback stands and what the engine does next: explicit state machines (state in, action out) |
//! | [`revisions`] | The application revision history a Rollback picks its target from |
//! | [`names`] | Deterministic child names (≤ 63 chars, DNS-1123), the basis of crash safety |
//! | [`meta`] | Labels, owner references and ownership checks shared by every child |
//!
//! A reconcile of an engine, in outline (`docs/api/operation.md`, "Order of checks"):
//!
//! ```text
//! gate = lifecycle::gate(&op, now, &Siblings::of(&op, &operations_of_the_app))
//! Terminal                      -> nothing to do
//! Duplicate(outcome)            -> write next_status(.., outcome)
//! otherwise                     -> namespace / application / payload checks (Error::outcome on failure)
//! Expired | WaitUntil | Queued  -> write next_status(.., outcome); requeue at lifecycle::wake_at
//! Proceed                       -> create the children (velero / snapshot / job builders), read them back,
//!                                  write next_status(.., progress.into_outcome(children))
//! every write                   -> only if status::needs_write(old, new)
//! ```
//!
//! Crash safety rests on one property: every child object has a name derived
//! only from the Operation, so an engine restarted at any point re-creates
//! nothing and resumes by reading what exists. Objects whose name is taken by
//! something else are recognised by [`meta::is_child_of`] and never adopted.

#![warn(missing_docs)]

mod error;
pub mod job;
pub mod lifecycle;
pub mod maintenance;
pub mod meta;
pub mod names;
pub mod pod_security;
mod progress;
pub mod release;
pub mod release_flow;
pub mod revisions;
pub mod schedule;
pub mod snapshot;
pub mod status;
pub mod velero;
pub mod verify;
pub mod volume_replace;

pub use error::Error;
pub use lifecycle::{Gate, Sibling, Siblings};
pub use progress::Progress;
pub use status::{Outcome, Report, needs_write, next_status};

/// Reasons of the engines that are specific to this crate's mappings. They are
/// defined in `api::conditions::operation_reasons` (and `docs/api/conditions.md`);
/// re-exported here so `operations::reasons::…` keeps working.
pub mod reasons {
    pub use api::conditions::operation_reasons::{PARTIALLY_FAILED, REVISION_NOT_FOUND};
}
