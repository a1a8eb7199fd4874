//! The ApplicationInstance controller: materialises each ApplicationInstance
//! through a [`helmengine::Engine`] (Flux by default) and relays the engine's
//! status back, per docs/api/conditions.md.
//!
//! Layers: [`status`], [`app_metrics`] (its pure half), [`references`], [`repositories`] and [`maintenance`] are pure (unit-tested), [`reconciler`]
//! is the thin IO pipeline, [`controller`] wires the watches; `main.rs` is tiny.

pub mod app_metrics;
pub mod controller;
pub mod maintenance;
pub mod reconciler;
pub mod references;
pub mod repositories;
pub mod status;
pub mod tenancy;
