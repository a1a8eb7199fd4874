//! The ApplicationInstance controller: materialises each ApplicationInstance
//! through a [`helmengine::Engine`] (Flux by default) and relays the engine's
//! status back, per docs/api/conditions.md.
//!
//! Layers: [`status`], [`references`], [`repositories`] and [`maintenance`] are pure (unit-tested), [`reconciler`]
//! is the thin IO pipeline, [`controller`] wires the watches; `main.rs` is tiny.

pub mod controller;
pub mod maintenance;
pub mod reconciler;
pub mod references;
pub mod repositories;
pub mod status;
pub mod tenancy;
