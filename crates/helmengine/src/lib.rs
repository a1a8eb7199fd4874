//! The Helm-engine boundary of vworkspace-operator.
//!
//! The ApplicationInstance reconciler talks to a Helm engine only through the
//! object-safe [`Engine`] trait: `materialize` an app as the engine's objects,
//! `observe` them, `delete` them, `check_installed`, and `watched_kinds` (which
//! objects the controller watches, and how each names its ApplicationInstance,
//! [`watch`]). The values crossing the boundary ([`Observation`],
//! [`EngineCondition`], [`SourceObservation`], [`Materialized`],
//! [`DeleteProgress`], [`WatchedKind`]) name no engine type, so [`argocd`] sits
//! next to [`flux`] without touching the CRDs or the reconciler (ADR 0002, ADR 0012).
//!
//! [`flux`] is the default engine. Both adapters keep the mapping pure
//! ([`flux::build`], [`flux::observe`], [`argocd::build`], [`argocd::observe`])
//! and the API calls thin ([`flux::FluxEngine`], [`argocd::ArgoCdEngine`]), so
//! the mapping is unit-tested without a cluster.
//!
//! What this crate guarantees:
//! - **No Helm of its own.** It writes Flux or Argo CD objects; helm-controller
//!   or Argo CD installs, upgrades, tests, remediates and uninstalls.
//! - **Reasons relayed verbatim.** Engine conditions are copied as they are
//!   (Argo CD's sync, health and operation words become the reasons, see
//!   [`argocd::observe`]); only errors of our own map to `api::conditions::reasons`.
//! - **No secret material.** Secret data is never read; objects are never
//!   logged (inline values may be sensitive); errors never echo URLs.
//! - **Never someone else's object.** An existing object with the name we need
//!   is written or deleted only if it is ours ([`meta::ownership`]; by uid
//!   annotation for Argo CD's objects in its own namespace).
//! - **Quiet at rest.** Output is deterministic; re-applying an unchanged app
//!   changes nothing on the server.
//!
//! Namespace policy (which namespaces an app and its `targetNamespace` may
//! use) is the reconciler's job and is checked before `materialize`.

#![warn(missing_docs)]

mod apply;
pub mod argocd;
mod cache;
mod engine;
mod error;
#[cfg(test)]
mod fixtures;
pub mod flux;
pub mod meta;
pub mod watch;

pub use cache::{Cached, ObjectCache};
pub use engine::{
    DeleteProgress, Engine, EngineCondition, MAX_HISTORY, MaterializeInput, Materialized, Observation,
    SourceObservation,
};
pub use error::EngineError;
pub use watch::{InstanceKey, OwnerLink, ReadersSee, ReadsFrom, WatchPlace, WatchedKind, WholeObjects};
