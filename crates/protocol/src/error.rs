//! Errors as Odoo 19's JSON-2 API returns them, and their classification.
//!
//! An error is a `4xx`/`5xx` answer whose body is a JSON object with `name` (the fully
//! qualified Python exception class), `message` (usually `arguments[0]`), `arguments`,
//! `context` and `debug` (the traceback). The status comes from the exception:
//! `werkzeug.exceptions.*` carry their own code (401 `Unauthorized` for a bad API key,
//! 404 `NotFound` for an unknown model or method, 400 `BadRequest` for a body that is not
//! JSON, 422 `UnprocessableEntity` for parameters that do not bind); `odoo.exceptions.*`
//! carry `http_status`: `UserError` and `ValidationError` 422, `AccessDenied` and
//! `AccessError` 403, `MissingError` 404; anything else is 500.
//!
//! The vWorkspace module raises its own subclasses (names in [`names`]), so the agent
//! tells them apart by `name` and falls back to the status for anything else. A few of
//! Odoo's own answers need more than the status to be understood ([`classify`]): a `422`
//! `ValidationError` is a unique key that a concurrent call inserted first (Odoo turns the
//! `IntegrityError` into it and does not retry it), a `422` `UnprocessableEntity` "got an
//! unexpected keyword argument" is a method without `**kwargs`, and a `404` whose body is
//! not Odoo's error object (an HTML page) means no database was selected for the call.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Odoo's JSON-2 error object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct OdooError {
    /// Fully qualified exception class, e.g. `werkzeug.exceptions.Unauthorized`.
    pub name: String,
    /// The exception message.
    #[serde(default, deserialize_with = "crate::odoo_compat::or_default")]
    pub message: String,
    /// The exception arguments.
    #[serde(default, deserialize_with = "crate::odoo_compat::or_default")]
    pub arguments: Vec<Value>,
    /// The request's context.
    #[serde(default, deserialize_with = "crate::odoo_compat::or_default")]
    pub context: Map<String, Value>,
    /// The traceback (may be empty; never shown to users by the agent, only its length).
    #[serde(default, deserialize_with = "crate::odoo_compat::or_default")]
    pub debug: String,
}

impl OdooError {
    /// An error object with `arguments = [message]` (and the status for werkzeug's).
    pub fn new(name: &str, message: &str, status: Option<u16>) -> Self {
        let mut arguments = vec![Value::from(message)];
        if let Some(status) = status {
            arguments.push(Value::from(status));
        }
        Self {
            name: name.to_owned(),
            message: message.to_owned(),
            arguments,
            context: Map::new(),
            debug: String::new(),
        }
    }
}

/// Exception names: Odoo's and the vWorkspace module's.
pub mod names {
    /// 401: missing, unknown, expired or revoked API key (message `Invalid apikey`).
    pub const UNAUTHORIZED: &str = "werkzeug.exceptions.Unauthorized";
    /// 404: unknown model or method (the module is not installed), or unknown database.
    pub const NOT_FOUND: &str = "werkzeug.exceptions.NotFound";
    /// 400: the body is not a JSON object.
    pub const BAD_REQUEST: &str = "werkzeug.exceptions.BadRequest";
    /// 422: parameters that do not bind to the method's signature.
    pub const UNPROCESSABLE_ENTITY: &str = "werkzeug.exceptions.UnprocessableEntity";
    /// 500: anything unexpected.
    pub const INTERNAL_SERVER_ERROR: &str = "werkzeug.exceptions.InternalServerError";
    /// 403: the API key's user may not use the model.
    pub const ACCESS_ERROR: &str = "odoo.exceptions.AccessError";
    /// 403.
    pub const ACCESS_DENIED: &str = "odoo.exceptions.AccessDenied";
    /// 422.
    pub const USER_ERROR: &str = "odoo.exceptions.UserError";
    /// 422.
    pub const VALIDATION_ERROR: &str = "odoo.exceptions.ValidationError";

    /// Prefix of the vWorkspace module's exceptions (`odoo/addons/vworkspace/exceptions.py`).
    pub const MODULE_PREFIX: &str = "odoo.addons.vworkspace.exceptions.";
    /// 422 (`UserError`): the agent's MAJOR protocol version is not supported.
    pub const PROTOCOL_VERSION_MISMATCH: &str = "odoo.addons.vworkspace.exceptions.ProtocolVersionMismatch";
    /// 403 (`AccessDenied`): the API key's cluster record is bound to another cluster UID.
    pub const CLUSTER_MISMATCH: &str = "odoo.addons.vworkspace.exceptions.ClusterMismatch";
    /// 404 (`MissingError`): `agent_sync` before `agent_register` (or the record was reset).
    pub const CLUSTER_NOT_REGISTERED: &str = "odoo.addons.vworkspace.exceptions.ClusterNotRegistered";
    /// 422 (`ValidationError`): a parameter breaks a protocol rule (message says which).
    pub const INVALID_PARAMS: &str = "odoo.addons.vworkspace.exceptions.InvalidParams";
}

/// What a failed call means for the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// 401: the API key is wrong, expired or revoked. Re-read credentials; back off.
    Unauthorized,
    /// 403: the key's user lacks rights, or the key belongs to another cluster.
    Forbidden,
    /// The cluster UID does not match the key's cluster record.
    ClusterMismatch,
    /// 404 on the model or method: the vWorkspace module is not installed (or wrong database).
    NotInstalled,
    /// Must register first (re-register at once).
    NotRegistered,
    /// Incompatible protocol versions.
    IncompatibleProtocol,
    /// 400/422: Odoo rejected what the agent sent (a bug on one side).
    Rejected,
    /// 422 `odoo.exceptions.ValidationError`: a unique key (an acknowledgement's or a
    /// report's) inserted by a concurrent call first. The whole call was rolled back;
    /// repeating it later succeeds.
    ConcurrentUpdate,
    /// 422 `UnprocessableEntity` "got an unexpected keyword argument": the module's method
    /// does not take a parameter of the protocol (it lacks `**kwargs`); see
    /// [`unexpected_parameter`].
    UnexpectedParameter,
    /// 415: the request reached Odoo without `Content-Type: application/json`.
    UnsupportedMediaType,
    /// 404 whose body is not Odoo's error object: Odoo selected no database for the call
    /// (several databases, and no or a filtered-out `X-Odoo-Database`).
    DatabaseNotSelected,
    /// 413: the request body is larger than Odoo or a proxy in front of it accepts.
    RequestTooLarge,
    /// 429: slow down.
    RateLimited,
    /// 5xx (other than below): a server error.
    ServerError,
    /// 502/503/504: Odoo or its proxy is unavailable.
    Unavailable,
    /// Any other status.
    Other,
}

impl ErrorClass {
    /// The stable reason code (metrics label, agent condition reason).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden => "Forbidden",
            Self::ClusterMismatch => "ClusterMismatch",
            Self::NotInstalled => "NotInstalled",
            Self::NotRegistered => "NotRegistered",
            Self::IncompatibleProtocol => "IncompatibleProtocol",
            Self::Rejected => "Rejected",
            Self::ConcurrentUpdate => "ConcurrentUpdate",
            Self::UnexpectedParameter => "UnexpectedParameter",
            Self::UnsupportedMediaType => "UnsupportedMediaType",
            Self::DatabaseNotSelected => "DatabaseNotSelected",
            Self::RequestTooLarge => "RequestTooLarge",
            Self::RateLimited => "RateLimited",
            Self::ServerError => "ServerError",
            Self::Unavailable => "Unavailable",
            Self::Other => "HttpError",
        }
    }

    /// Whether retrying without a configuration change can help soon. Non-transient
    /// errors are retried too, but at the longest backoff.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::NotRegistered
                | Self::RateLimited
                | Self::ServerError
                | Self::Unavailable
                | Self::ConcurrentUpdate
                | Self::Other
        )
    }
}

/// Classifies a non-2xx answer by exception `name` first, then by HTTP status. `error`
/// is `None` when the body is not Odoo's error object (HTML from Odoo's router or a proxy).
pub fn classify(status: u16, error: Option<&OdooError>) -> ErrorClass {
    if let Some(e) = error {
        match e.name.as_str() {
            names::PROTOCOL_VERSION_MISMATCH => return ErrorClass::IncompatibleProtocol,
            names::CLUSTER_MISMATCH => return ErrorClass::ClusterMismatch,
            names::CLUSTER_NOT_REGISTERED => return ErrorClass::NotRegistered,
            names::UNAUTHORIZED => return ErrorClass::Unauthorized,
            names::NOT_FOUND => return ErrorClass::NotInstalled,
            // Exactly Odoo's class: the module's `InvalidParams` (a subclass) has its own
            // name and stays `Rejected`.
            names::VALIDATION_ERROR if status == 422 => return ErrorClass::ConcurrentUpdate,
            names::UNPROCESSABLE_ENTITY if unexpected_parameter(&e.message).is_some() => {
                return ErrorClass::UnexpectedParameter;
            }
            _ => {}
        }
    }
    match status {
        401 => ErrorClass::Unauthorized,
        403 => ErrorClass::Forbidden,
        // Odoo's JSON-2 route answers an unknown model or method with its JSON error
        // object; an HTML 404 comes from before any database was picked.
        404 if error.is_none() => ErrorClass::DatabaseNotSelected,
        404 => ErrorClass::NotInstalled,
        413 => ErrorClass::RequestTooLarge,
        415 => ErrorClass::UnsupportedMediaType,
        400 | 422 => ErrorClass::Rejected,
        429 => ErrorClass::RateLimited,
        502..=504 => ErrorClass::Unavailable,
        500..=599 => ErrorClass::ServerError,
        _ => ErrorClass::Other,
    }
}

/// The parameter named by Python's binding error, as JSON-2 passes it on
/// (`got an unexpected keyword argument 'last_error'` gives `last_error`).
pub fn unexpected_parameter(message: &str) -> Option<&str> {
    const MARKER: &str = "got an unexpected keyword argument ";
    let (_, rest) = message.split_once(MARKER)?;
    let quote = rest.chars().next().filter(|c| matches!(c, '\'' | '"'))?;
    let name = rest.get(quote.len_utf8()..)?.split(quote).next()?;
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_table() {
        let e = |n: &str| OdooError::new(n, "x", None);
        let cases = [
            (401, Some(e(names::UNAUTHORIZED)), ErrorClass::Unauthorized),
            (401, None, ErrorClass::Unauthorized),
            (403, Some(e(names::ACCESS_ERROR)), ErrorClass::Forbidden),
            (403, Some(e(names::CLUSTER_MISMATCH)), ErrorClass::ClusterMismatch),
            (404, Some(e(names::NOT_FOUND)), ErrorClass::NotInstalled),
            (404, Some(e(names::CLUSTER_NOT_REGISTERED)), ErrorClass::NotRegistered),
            (
                422,
                Some(e(names::PROTOCOL_VERSION_MISMATCH)),
                ErrorClass::IncompatibleProtocol,
            ),
            (422, Some(e(names::INVALID_PARAMS)), ErrorClass::Rejected),
            (422, Some(e(names::USER_ERROR)), ErrorClass::Rejected),
            (422, Some(e(names::VALIDATION_ERROR)), ErrorClass::ConcurrentUpdate),
            (
                422,
                Some(OdooError::new(
                    names::UNPROCESSABLE_ENTITY,
                    "got an unexpected keyword argument 'last_error'",
                    Some(422),
                )),
                ErrorClass::UnexpectedParameter,
            ),
            (
                422,
                Some(OdooError::new(
                    names::UNPROCESSABLE_ENTITY,
                    "missing a required argument: 'cluster'",
                    Some(422),
                )),
                ErrorClass::Rejected,
            ),
            (404, None, ErrorClass::DatabaseNotSelected),
            (413, None, ErrorClass::RequestTooLarge),
            (
                413,
                Some(e("werkzeug.exceptions.RequestEntityTooLarge")),
                ErrorClass::RequestTooLarge,
            ),
            (415, None, ErrorClass::UnsupportedMediaType),
            (400, None, ErrorClass::Rejected),
            (429, None, ErrorClass::RateLimited),
            (500, Some(e(names::INTERNAL_SERVER_ERROR)), ErrorClass::ServerError),
            (503, None, ErrorClass::Unavailable),
            (418, None, ErrorClass::Other),
        ];
        for (status, body, want) in cases {
            assert_eq!(classify(status, body.as_ref()), want, "{status} {body:?}");
        }
        assert!(ErrorClass::Unavailable.is_transient());
        assert!(ErrorClass::ConcurrentUpdate.is_transient(), "retried with backoff");
        assert!(!ErrorClass::Unauthorized.is_transient());
        for needs_a_fix in [
            ErrorClass::UnexpectedParameter,
            ErrorClass::UnsupportedMediaType,
            ErrorClass::DatabaseNotSelected,
            ErrorClass::RequestTooLarge,
        ] {
            assert!(!needs_a_fix.is_transient(), "{needs_a_fix:?}");
        }
        assert_eq!(ErrorClass::Other.reason(), "HttpError");
    }

    #[test]
    fn the_parameter_of_a_binding_error_is_read() {
        let cases = [
            ("got an unexpected keyword argument 'last_error'", Some("last_error")),
            (
                "agent_sync() got an unexpected keyword argument \"known\"",
                Some("known"),
            ),
            ("got an unexpected keyword argument ''", None),
            ("got an unexpected keyword argument last_error", None),
            ("missing a required argument: 'cluster'", None),
            ("", None),
        ];
        for (message, want) in cases {
            assert_eq!(unexpected_parameter(message), want, "{message}");
        }
    }

    #[test]
    fn an_error_object_with_odoo_false_members_parses() {
        let body = r#"{"name": "odoo.exceptions.ValidationError", "message": false, "arguments": false,
            "context": false, "debug": false}"#;
        let e: OdooError = serde_json::from_str(body).unwrap();
        assert_eq!(
            e,
            OdooError {
                name: names::VALIDATION_ERROR.into(),
                ..OdooError::default()
            }
        );
    }

    #[test]
    fn odoo_documented_401_body_parses() {
        // The example of Odoo 19's "External JSON-2 API" reference (debug shortened).
        let body = r#"{"name": "werkzeug.exceptions.Unauthorized", "message": "Invalid apikey",
            "arguments": ["Invalid apikey", 401], "context": {}, "debug": "Traceback ..."}"#;
        let e: OdooError = serde_json::from_str(body).unwrap();
        assert_eq!(e, {
            let mut want = OdooError::new(names::UNAUTHORIZED, "Invalid apikey", Some(401));
            want.debug = "Traceback ...".into();
            want
        });
        assert_eq!(classify(401, Some(&e)), ErrorClass::Unauthorized);
    }
}
