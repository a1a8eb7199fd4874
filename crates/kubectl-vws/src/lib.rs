//! `kubectl vws`: vWorkspace applications and their day-2 Operations from a terminal.
//!
//! kubectl finds the binary `kubectl-vws` on `PATH` and runs it for `kubectl vws …`. It
//! acts with the caller's own kubeconfig credentials, so it can do exactly what the caller's
//! RBAC allows and nothing more: it creates Operations and reads objects like any kubectl
//! user (docs/cli.md).
//!
//! Layers: the pure modules ([`apps`], [`request`], [`progress`], [`history`], [`trace`],
//! [`age`]) turn objects into rows, lines and Operations and are table-tested; [`commands`]
//! only reads and writes through the API server and prints what they return.

pub mod age;
pub mod apps;
pub mod cli;
pub mod commands;
pub mod history;
pub mod progress;
pub mod request;
pub mod table;
pub mod trace;

/// What a command can fail with. Printed by `main` as `error: …`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    Usage(String),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {message}")]
    Parse { what: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("encoding the output: {0}")]
    Output(String),
    /// The followed Operation ended `Failed` or `Expired`; the reason was printed.
    #[error("Operation {name} {phase}: {reason}: {message}")]
    OperationFailed {
        name: String,
        phase: String,
        reason: String,
        message: String,
    },
    #[error("timed out after {0} waiting for {1}")]
    Timeout(String, String),
}
