//! Push mode (opt-in, `--mode push`): Odoo calls the agent instead of the agent calling
//! Odoo. The agent serves an HTTPS endpoint (axum on hyper, TLS by rustls) shaped like
//! Odoo's JSON-2 API, and makes no outbound call at all:
//!
//! * `POST /json/2/vworkspace.agent/apply` with `{"protocol_version", "document"}` (the
//!   desired-state document of `agent_sync`'s result) answers the document's
//!   [`DocumentAck`], exactly what pull mode sends back. The document goes through the
//!   same path as in pull mode ([`crate::apply::apply_received`], so
//!   [`crate::apply::apply_document`]): validation, the namespace allow-list, server-side
//!   apply without force, deletion only by explicit intent; and the same revision rules
//!   ([`decide`], [`AckLedger`]).
//! * `POST /json/2/vworkspace.agent/status` with `{"full": bool}` answers the status
//!   reports (the same [`ObjectReport`]s as `agent_sync`'s), either all of them or the
//!   changes not yet delivered, with the cluster's identity and the agent's.
//!
//! Every request needs `Authorization: bearer <token>` (compared in constant time; the
//! token is read from a file or a Secret and re-read when it may have been rotated) and,
//! with `--push-client-ca`, a client certificate chained to that CA (checked by rustls
//! during the handshake, before any HTTP). Errors are Odoo's JSON-2 error objects
//! ([`protocol::error::OdooError`]) with the status Odoo would use. Only the leader answers (`503` on a
//! follower), so one replica writes, as in pull mode.
//!
//! One module per job: [`auth`] (the token and its cache), [`handlers`] (the two methods
//! and the acknowledgement ledger), [`router`] (routes and error answers), [`tls`] (the
//! certificate files and their hot reload), [`server`] (the accept loop, per-connection
//! limits, the token refresh) and [`limits`] (per-address caps and log budgets).

use std::net::SocketAddr;

pub mod auth;
pub mod handlers;
pub mod limits;
pub mod router;
pub mod server;
pub mod tls;

pub use auth::{AuthError, TOKEN_MIN_RELOAD, TOKEN_TTL, TokenCache};
pub use handlers::{ApiError, PushState};
pub use protocol::push::{
    ApplyParams, ApplyResult, METHOD_APPLY, METHOD_STATUS, PUSH_MODEL, StatusParams, StatusResult, error_names,
};
pub use router::router;
pub use server::{HANDSHAKE_TIMEOUT, HEADER_TIMEOUT, MAX_CONNECTIONS, PushServer, run};
pub use tls::{TLS_RELOAD_INTERVAL, TlsFiles};

/// The condition's reason while the token cannot be read (pull mode's, for the API key).
pub const CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";

/// Why the endpoint cannot be set up. Never contains the token.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// A PEM file cannot be read or parsed.
    #[error("cannot read the {what} {path}: {detail}")]
    Pem {
        /// Which file (`TLS certificate`, …).
        what: &'static str,
        /// Its path.
        path: String,
        /// The reader's error.
        detail: String,
    },
    /// rustls refused the certificate, key or client CA.
    #[error("invalid TLS configuration: {0}")]
    Tls(String),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
