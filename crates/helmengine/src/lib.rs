//! The Helm-engine boundary of vworkspace-operator.
//!
//! The ApplicationInstance reconciler talks to a Helm engine only through the
//! object-safe [`Engine`] trait: `materialize` an app as the engine's objects,
//! `observe` them, `delete` them, and `check_installed`. The values crossing
//! the boundary ([`Observation`], [`EngineCondition`], [`SourceObservation`],
//! [`Materialized`], [`DeleteProgress`]) name no engine type, so an Argo CD
//! adapter can sit next to [`flux`] without touching the CRDs or the
//! reconciler (design intent, ADR "Helm-first via Flux HelmRelease").
//!
//! [`flux`] is the default engine. It keeps the mapping pure
//! ([`flux::build`], [`flux::observe`]) and the API calls thin
//! ([`flux::FluxEngine`]), so the mapping is unit-tested without a cluster.
//!
//! What this crate guarantees:
//! - **No Helm of its own.** It writes Flux objects; helm-controller installs,
//!   upgrades, tests, remediates and uninstalls.
//! - **Reasons relayed verbatim.** Engine conditions are copied as they are;
//!   only errors of our own map to `api::conditions::reasons`.
//! - **No secret material.** Secret data is never read; objects are never
//!   logged (inline values may be sensitive); errors never echo URLs.
//! - **Never someone else's object.** An existing object with the name we need
//!   is written or deleted only if it is ours ([`meta::ownership`]).
//! - **Quiet at rest.** Output is deterministic; re-applying an unchanged app
//!   changes nothing on the server.
//!
//! Namespace policy (which namespaces an app and its `targetNamespace` may
//! use) is the reconciler's job and is checked before `materialize`.

#![warn(missing_docs)]

mod apply;
pub mod argocd;
mod engine;
mod error;
#[cfg(test)]
mod fixtures;
pub mod flux;
pub mod meta;
pub mod watch;

pub use engine::{
    DeleteProgress, Engine, EngineCondition, MAX_HISTORY, MaterializeInput, Materialized, Observation,
    SourceObservation,
};
pub use error::EngineError;
pub use watch::{InstanceKey, OwnerLink, WatchPlace, WatchedKind};
