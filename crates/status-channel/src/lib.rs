//! The gRPC status channel (`proto/vworkspace/status/v1/status.proto`).
//!
//! Controllers and day-2 engines [`Publisher::publish`] every status they write; the
//! connectivity agent hosts the [`server`] and forwards what it receives to the control
//! plane within a second instead of waiting for its periodic list.
//!
//! The channel is best effort by contract: a publisher never blocks or fails when no agent
//! is deployed (platform teams run the app controller alone). Events go into a bounded
//! buffer; a background task connects with backoff and streams them. When the buffer
//! overflows or the connection is (re)established, buffered events are dropped and a
//! `Resync` marker is sent instead: the agent re-lists the CRs, which is always correct
//! because every event carries full state, not a delta.
//!
//! The channel is authenticated ([`auth`]): a publisher sends its projected ServiceAccount
//! token (audience [`auth::AUDIENCE`]) with each stream, and the server refuses a stream
//! before reading it unless its [`auth::Authenticator`] accepts the token. Messages are
//! capped at [`auth::MAX_MESSAGE_BYTES`].

#![warn(missing_docs)]

pub mod auth;
pub mod convert;
pub mod publisher;
pub mod server;

pub use auth::{Authenticator, Refused};
pub use publisher::{Publisher, PublisherConfig};
pub use server::{Received, serve};

/// Generated protobuf types and tonic client/server.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("vworkspace.status.v1");
}

/// Errors of the server side (the publisher never returns errors to its caller).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The gRPC server failed (bind, transport).
    #[error("status channel server: {0}")]
    Transport(#[from] tonic::transport::Error),
}
