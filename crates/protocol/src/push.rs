//! Push mode's messages: Odoo calls the agent's endpoint, a JSON-2-shaped "model"
//! [`PUSH_MODEL`] with two methods (docs/connectivity/protocol.md, "Push mode"):
//!
//! * [`METHOD_APPLY`]: [`ApplyParams`] → [`ApplyResult`], the desired-state document in,
//!   its acknowledgement out;
//! * [`METHOD_STATUS`]: [`StatusParams`] → [`StatusResult`], status reports out (the
//!   changes not yet handed out, or all of them).
//!
//! The document, acknowledgement and reports are pull mode's; only the transport turns
//! around.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    ProtocolVersion,
    messages::{AgentInfo, ClusterIdentity, Cursor, DocumentAck, ObjectReport},
};

/// The JSON-2 "model" of the agent's endpoint.
pub const PUSH_MODEL: &str = "vworkspace.agent";
/// Applies a document; answers its acknowledgement.
pub const METHOD_APPLY: &str = "apply";
/// Reads status reports.
pub const METHOD_STATUS: &str = "status";

/// Error names the endpoint uses besides [`crate::error::names`] (Werkzeug's, as Odoo would send them).
pub mod error_names {
    /// 413: the body is larger than `--push-max-body`.
    pub const REQUEST_ENTITY_TOO_LARGE: &str = "werkzeug.exceptions.RequestEntityTooLarge";
    /// 503: a follower replica, the status cache not listed yet, or no readable token.
    pub const SERVICE_UNAVAILABLE: &str = "werkzeug.exceptions.ServiceUnavailable";
    /// 409: a document older than the one already processed.
    pub const CONFLICT: &str = "werkzeug.exceptions.Conflict";
    /// 405: not a POST.
    pub const METHOD_NOT_ALLOWED: &str = "werkzeug.exceptions.MethodNotAllowed";
}

/// `vworkspace.agent/apply` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplyParams {
    /// The caller's protocol version (same MAJOR required).
    pub protocol_version: ProtocolVersion,
    /// The cluster the caller means; when given, it must be this cluster's UID (a
    /// document sent to the wrong endpoint is refused before anything is read).
    #[serde(
        default,
        deserialize_with = "crate::odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_uid: Option<String>,
    /// The desired-state document, as in `agent_sync`'s `desired`. Kept raw here so that a
    /// document that does not parse is acknowledged `refused`/`MalformedDocument` by its
    /// cursor, as pull mode does.
    pub document: Value,
}

/// `vworkspace.agent/apply` result: the [`DocumentAck`] plus `protocol_version` (every
/// successful answer carries it); it parses as a plain [`DocumentAck`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplyResult {
    /// The agent's protocol version.
    pub protocol_version: ProtocolVersion,
    /// The acknowledgement.
    #[serde(flatten)]
    pub ack: DocumentAck,
}

/// `vworkspace.agent/status` parameters (all optional; an empty body means deltas).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusParams {
    /// The caller's protocol version, checked when given.
    #[serde(
        default,
        deserialize_with = "crate::odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub protocol_version: Option<ProtocolVersion>,
    /// Every report (a full resync), instead of the undelivered changes.
    #[serde(default, deserialize_with = "crate::odoo_compat::or_default")]
    pub full: bool,
    /// As in [`ApplyParams::cluster_uid`].
    #[serde(
        default,
        deserialize_with = "crate::odoo_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_uid: Option<String>,
}

/// `vworkspace.agent/status` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusResult {
    /// The agent's protocol version.
    pub protocol_version: ProtocolVersion,
    /// The agent's clock.
    pub server_time: Timestamp,
    /// The cluster (as `agent_register` carries it in pull mode).
    pub cluster: ClusterIdentity,
    /// The agent (mode `push`).
    pub agent: AgentInfo,
    /// The cluster owner's allow-list; `["*"]` for all.
    pub allowed_namespaces: Vec<String>,
    /// The last document processed (`applied` or `refused`), as `agent_sync`'s `known`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<Cursor>,
    /// Whether `reports` is every object's report: Odoo marks any object it holds a
    /// report for and that is not in it as `deleted`, as after a pull-mode resync.
    pub full: bool,
    /// Reports, sorted by kind, namespace and name (full) or oldest change first.
    pub reports: Vec<ObjectReport>,
    /// More changes wait: call again (deltas only).
    pub more: bool,
}
