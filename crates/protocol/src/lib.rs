//! The vWorkspace control-plane protocol: how a cluster's agent and the Odoo 19 control
//! plane talk. The full specification, written so the Odoo module can be implemented from
//! it alone, is `docs/connectivity/protocol.md`; this crate is its machine-readable half.
//!
//! Transport: Odoo 19's external JSON-2 API. Every call is `POST /json/2/<model>/<method>`
//! with a JSON object of named parameters, `Authorization: bearer <API key>` and an
//! optional `X-Odoo-Database` header; success is `200` with the method's return value as
//! JSON, errors are `4xx`/`5xx` with Odoo's error object ([`error::OdooError`]).
//!
//! The model is [`MODEL`] (`vworkspace.cluster`), with two methods:
//!
//! * [`METHOD_REGISTER`]: [`messages::RegisterParams`] → [`messages::RegisterResult`], once
//!   per agent start (and again after an authentication or "not registered" error);
//! * [`METHOD_SYNC`]: [`messages::SyncParams`] → [`messages::SyncResult`], every sync
//!   interval and at once when status changed: acknowledgements and status reports go
//!   up, the desired-state document comes down when it changed.
//!
//! What this crate holds, all pure (no runtime, no I/O):
//!
//! * the message types ([`messages`]), push mode's ([`push`]), and their validation with size limits ([`validate`]);
//! * the revision and acknowledgement rules ([`revision`]), the deletion-only-by-intent
//!   rule ([`plan`]) and the lateness rule for Operations without a deadline ([`lateness`]);
//! * what the agent processed, and its one-to-one comparison with the acknowledgements the
//!   control plane stored ([`processed`]);
//! * status reports built from the CRs ([`report`]);
//! * Odoo's error object and its classification ([`error`]);
//! * what the agent accepts from a module written the ordinary Odoo way (offset-less
//!   timestamps, `false` for an empty field), and located errors for what it cannot read
//!   ([`odoo_compat`]);
//! * the retry policy: exponential backoff with jitter ([`backoff`]).
//!
//! Naming rule: every field this protocol defines is `snake_case` (they are Python keyword
//! arguments on the Odoo side); the `spec` objects are Kubernetes resources and keep their
//! `camelCase` field names verbatim.

#![warn(missing_docs)]

/// The retry policy, kept at this path for the agent; defined in [`api::backoff`], the one
/// backoff of the workspace.
pub use api::backoff;
pub mod error;
pub mod lateness;
pub mod maintenance;
pub mod messages;
pub mod odoo_compat;
pub mod plan;
pub mod processed;
pub mod push;
pub mod release_test;
pub mod report;
pub mod revision;
pub mod schedule;
pub mod validate;
pub mod verification;
pub mod version;

pub use messages::*;
pub use version::{PROTOCOL_VERSION, ProtocolVersion};

/// The Odoo model implementing the control-plane side.
pub const MODEL: &str = "vworkspace.cluster";
/// Registration: binds the cluster UID to the API key's cluster record.
pub const METHOD_REGISTER: &str = "agent_register";
/// Periodic sync: acknowledgements and reports up, desired state down.
pub const METHOD_SYNC: &str = "agent_sync";

/// The URL path of a JSON-2 call.
pub fn json2_path(model: &str, method: &str) -> String {
    format!("/json/2/{model}/{method}")
}

/// Field manager of every write the agent makes (server-side apply, deletes).
pub const FIELD_MANAGER: &str = "vworkspace-agent";
/// Label the agent puts on every object it applies (`app.kubernetes.io/managed-by`). Only
/// objects carrying it can be deleted by a deletion intent.
pub const MANAGED_BY_AGENT: &str = "vworkspace-agent";
