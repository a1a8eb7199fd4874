//! The protocol, pull mode: `agent_register` and `agent_sync` with Odoo 19's JSON-2
//! conventions (bearer API keys, the optional `X-Odoo-Database` header, Odoo's error
//! objects and statuses), and the faults an admin can inject in front of them.
//!
//! Where a real Odoo 19 differs from a forgiving server, the simulator answers as Odoo
//! does (read in `../shared/odoo-19`): datetimes as Odoo's `json_default` writes a
//! `fields.Datetime` (`YYYY-MM-DD HH:MM:SS`, UTC, no offset); a request that is not
//! `application/json` is a `415` with werkzeug's HTML page (`odoo/http.py`,
//! `_set_request_dispatcher`); a database that is not served is an HTML `404`. Faults add
//! the rest: a module without `**kwargs` (`addons/rpc/controllers/json2.py` binds the
//! body with `inspect.signature(...).bind`: an unknown keyword is a `422`), a call
//! committed and then answered late (Odoo's in-transaction retries of
//! `odoo/service/model.py` `retrying`, about 30 s), a concurrent insert of the same key
//! (a `422 ValidationError` Odoo does not retry), a front proxy's body limit (`413`), and
//! an acknowledgement confirmed but not stored (`drop_ack`: what chaos must count as lost).

use std::{sync::PoisonError, time::Duration};

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use jiff::Timestamp;
use protocol::{
    MODEL, PROTOCOL_VERSION, ProtocolVersion,
    error::{OdooError, names},
    messages::{Cursor, DesiredState, RegisterParams, RegisterResult, SyncParams, SyncResult},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    Sim,
    state::ClusterRecord,
    stats::{SyncAtRest, header_bytes},
};

/// Most reports accepted per sync (as a real module would cap them).
pub const MAX_REPORTS_PER_SYNC: usize = 500;

/// Faults to inject.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Fault {
    /// Normal service.
    #[default]
    None,
    /// 503 with an HTML body, as a reverse proxy in front of a stopped Odoo answers.
    Unavailable,
    /// 500 with Odoo's error object.
    ServerError,
    /// No answer for `seconds`.
    Hang {
        /// How long.
        seconds: u64,
    },
    /// 200 with a body that is not JSON.
    Malformed,
    /// 200 with a JSON body of `bytes` bytes.
    Oversize {
        /// Size of the answer.
        bytes: usize,
    },
    /// The module's methods declare no `**kwargs`: a body with a keyword they do not name
    /// is a `422` ("got an unexpected keyword argument"), before the method runs.
    NoKwargs,
    /// The call is carried out and committed, then answered `seconds` later (past the
    /// agent's timeout: it sees no answer for a call that took effect).
    CommittedThenLate {
        /// How long after the commit the answer comes.
        seconds: u64,
    },
    /// `422 odoo.exceptions.ValidationError` from a concurrent insert of the same
    /// acknowledgement or report key, nothing committed; the next call is served.
    ConcurrentInsert,
    /// A front proxy that answers `413` with its HTML page to a body over `bytes`.
    BodyLimit {
        /// Largest body let through.
        bytes: usize,
    },
    /// The next `agent_sync` carrying acknowledgements is served and answered as usual, but
    /// its first acknowledgement is not stored: a control plane that lost one it confirmed
    /// (what a one-to-one count of acknowledgements must see). Once; then normal service.
    DropAck,
}

/// The keywords `agent_register` and `agent_sync` name (`RegisterParams`, `SyncParams`):
/// what a module without `**kwargs` accepts ([`Fault::NoKwargs`]).
pub(crate) const REGISTER_KEYWORDS: &[&str] = &[
    "protocol_version",
    "cluster",
    "agent",
    "allowed_namespaces",
    "capabilities",
];
/// See [`REGISTER_KEYWORDS`].
pub(crate) const SYNC_KEYWORDS: &[&str] = &[
    "protocol_version",
    "cluster_uid",
    "agent_instance",
    "known",
    "acks",
    "reports",
    "resync",
    "more",
    "last_error",
];

/// A timestamp as Odoo 19's `json_default` writes a `fields.Datetime` (`odoo/tools/json.py`
/// via `fields.Datetime.to_string`): `YYYY-MM-DD HH:MM:SS`, UTC, no offset.
pub(crate) fn odoo_datetime(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S").to_string()
}

/// `value[field]` as Odoo writes a datetime, when it is a timestamp.
fn as_odoo_datetime(value: &mut Value, field: &str) {
    if let Some(slot) = value.get_mut(field)
        && let Some(t) = slot.as_str().and_then(|s| s.parse::<Timestamp>().ok())
    {
        *slot = Value::String(odoo_datetime(t));
    }
}

/// werkzeug's HTML error page, as Odoo (or a proxy) sends it.
fn html_error(status: StatusCode, title: &str, text: &str) -> Response {
    let code = status.as_u16();
    let page =
        format!("<!doctype html>\n<html lang=en>\n<title>{code} {title}</title>\n<h1>{title}</h1>\n<p>{text}</p>\n");
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

pub(crate) fn odoo_error(status: StatusCode, name: &str, message: &str) -> Response {
    let with_status = name.starts_with("werkzeug.").then_some(status.as_u16());
    let mut body = OdooError::new(name, message, with_status);
    body.debug = format!("Traceback (most recent call last):\n  (odoo-sim)\n{name}: {message}\n");
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        serde_json::to_string(&body).unwrap_or_default(),
    )
        .into_response()
}

pub(crate) fn json_ok(value: &impl Serialize) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        serde_json::to_string(value).unwrap_or_default(),
    )
        .into_response()
}

impl Sim {
    pub(crate) fn document(record: &ClusterRecord) -> Option<Value> {
        if record.revision == 0 {
            return None;
        }
        if let Some(raw) = &record.raw_document {
            let mut raw = raw.clone();
            if let Some(obj) = raw.as_object_mut() {
                obj.entry("epoch").or_insert_with(|| json!(record.epoch));
                obj.entry("revision").or_insert_with(|| json!(record.revision));
            }
            return Some(raw);
        }
        let doc = DesiredState {
            epoch: record.epoch.clone(),
            revision: record.revision,
            generated_at: Some(Timestamp::now()),
            applications: record.applications.values().map(|(_, a)| a.clone()).collect(),
            operations: record.operations.values().map(|(_, o)| o.clone()).collect(),
            deletions: record.deletions.values().map(|(_, d)| d.clone()).collect(),
        };
        let mut doc = serde_json::to_value(doc).ok()?;
        as_odoo_datetime(&mut doc, "generated_at");
        Some(doc)
    }

    /// The cluster of the bearer key, if the key is known.
    fn authenticate(&self, headers: &HeaderMap) -> Option<String> {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, key) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.lock().keys.get(key.trim()).cloned()
    }

    fn register(&self, cluster: &str, params: RegisterParams) -> Response {
        let mut s = self.lock();
        let Some(record) = s.clusters.get_mut(cluster) else {
            return odoo_error(StatusCode::UNAUTHORIZED, names::UNAUTHORIZED, "Invalid apikey");
        };
        let now = Timestamp::now();
        record.last_seen = Some(now);
        if let Some(uid) = &record.uid
            && *uid != params.cluster.uid
        {
            let message = format!("this API key belongs to cluster {} (uid {uid})", record.name);
            return odoo_error(StatusCode::FORBIDDEN, names::CLUSTER_MISMATCH, &message);
        }
        record.uid = Some(params.cluster.uid.clone());
        record.registered_at.get_or_insert(now);
        record.agent = Some(params.agent);
        record.allowed_namespaces = params.allowed_namespaces;
        let result = RegisterResult {
            protocol_version: PROTOCOL_VERSION,
            cluster_id: record.id,
            server_time: now,
            sync_interval_seconds: self.config.sync_interval_seconds,
            max_reports_per_sync: Some(u32::try_from(self.max_reports_per_sync()).unwrap_or(u32::MAX)),
        };
        self.schedule_save();
        let mut result = serde_json::to_value(&result).unwrap_or_default();
        as_odoo_datetime(&mut result, "server_time");
        json_ok(&result)
    }

    fn sync(&self, cluster: &str, mut params: SyncParams, fault: &Fault) -> Response {
        let mut s = self.lock();
        let Some(record) = s.clusters.get_mut(cluster) else {
            return odoo_error(StatusCode::UNAUTHORIZED, names::UNAUTHORIZED, "Invalid apikey");
        };
        let now = Timestamp::now();
        record.last_seen = Some(now);
        let Some(uid) = record.uid.clone() else {
            return odoo_error(
                StatusCode::NOT_FOUND,
                names::CLUSTER_NOT_REGISTERED,
                "call agent_register first",
            );
        };
        if uid != params.cluster_uid {
            let message = format!("this API key belongs to cluster {} (uid {uid})", record.name);
            return odoo_error(StatusCode::FORBIDDEN, names::CLUSTER_MISMATCH, &message);
        }
        let limit = self.max_reports_per_sync();
        if params.reports.len() > limit {
            let message = format!(
                "reports: at most {limit} reports per call (got {})",
                params.reports.len()
            );
            return odoo_error(StatusCode::UNPROCESSABLE_ENTITY, names::INVALID_PARAMS, &message);
        }
        let acks_received = params.acks.len();
        if *fault == Fault::DropAck && !params.acks.is_empty() {
            let dropped = params.acks.remove(0);
            tracing::warn!(
                revision = dropped.revision,
                "fault drop_ack: an acknowledgement confirmed, not stored"
            );
            self.set_fault(Fault::None);
        }
        for ack in params.acks {
            record.store_ack(ack);
        }
        let resync_broken = params
            .resync
            .as_ref()
            .is_some_and(|marker| record.resync_marker(&marker.id, marker.batch));
        let reports_received = params.reports.len();
        record.store_reports(params.reports, params.resync.is_some(), now);
        if let Some(marker) = &params.resync
            && marker.last_batch
            && !resync_broken
        {
            record.complete_resync(now);
        }
        let carried_nothing_up =
            reports_received == 0 && acks_received == 0 && params.resync.is_none() && params.last_error.is_none();
        if params.last_error.is_some() {
            record.last_agent_error = params.last_error;
        }
        record.syncs += 1;
        let current = Cursor {
            epoch: record.epoch.clone(),
            revision: record.revision,
        };
        let desired = if params.known.as_ref() == Some(&current) {
            None
        } else {
            Self::document(record)
        };
        self.schedule_save();
        let mut result = serde_json::to_value(SyncResult {
            protocol_version: PROTOCOL_VERSION,
            server_time: now,
            desired: None,
            // A resync arriving out of order sweeps nothing: ask for a new one.
            resync_requested: resync_broken,
            next_sync_seconds: None,
            // An older agent ignores it (it is only an added field).
            max_reports_per_sync: Some(u32::try_from(limit).unwrap_or(u32::MAX)),
        })
        .unwrap_or_default();
        as_odoo_datetime(&mut result, "server_time");
        let at_rest = carried_nothing_up && desired.is_none();
        if let Some(d) = desired
            && let Some(object) = result.as_object_mut()
        {
            // Raw documents may deliberately not parse as a DesiredState.
            object.insert("desired".to_owned(), d);
        }
        drop(s);
        self.count_reports(reports_received);
        let mut response = json_ok(&result);
        if at_rest {
            response.extensions_mut().insert(SyncAtRest);
        }
        response
    }

    pub(crate) async fn json2(&self, model: &str, method: &str, headers: &HeaderMap, body: &Bytes) -> Response {
        let fault = self.fault.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match fault {
            Fault::None | Fault::NoKwargs | Fault::DropAck => {}
            Fault::CommittedThenLate { seconds } => {
                let response = self.serve(model, method, headers, body, &fault);
                tokio::time::sleep(Duration::from_secs(seconds)).await;
                return response;
            }
            Fault::ConcurrentInsert => {
                self.set_fault(Fault::None);
                return odoo_error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "odoo.exceptions.ValidationError",
                    "The operation cannot be completed: One report per cluster and object.",
                );
            }
            Fault::BodyLimit { bytes } if body.len() > bytes => {
                return html_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Request Entity Too Large",
                    "The data value transmitted exceeds the capacity limit.",
                );
            }
            Fault::BodyLimit { .. } => {}
            Fault::Unavailable => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::CONTENT_TYPE, "text/html")],
                    "<html><body><h1>503 Service Unavailable</h1></body></html>",
                )
                    .into_response();
            }
            Fault::ServerError => {
                return odoo_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "psycopg2.OperationalError",
                    "internal server error",
                );
            }
            Fault::Hang { seconds } => tokio::time::sleep(Duration::from_secs(seconds)).await,
            Fault::Malformed => {
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    "{\"protocol_version\": \"1.0\", \"desired\": ",
                )
                    .into_response();
            }
            Fault::Oversize { bytes } => {
                let filler = "x".repeat(bytes);
                return json_ok(&json!({"protocol_version": "1.0", "filler": filler}));
            }
        }
        self.serve(model, method, headers, body, &fault)
    }

    /// The call itself, as Odoo's JSON-2 controller serves it.
    fn serve(&self, model: &str, method: &str, headers: &HeaderMap, body: &Bytes, fault: &Fault) -> Response {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
        if !json {
            return html_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported Media Type",
                "Request inferred type is compatible with [&#39;http&#39;] but &#39;/json/2/&lt;model&gt;/&lt;method&gt;&#39; is type=&#39;json2&#39;.\n\nPlease verify the Content-Type request header and try again.",
            );
        }
        if let (Some(want), Some(got)) = (
            &self.config.database,
            headers.get("x-odoo-database").and_then(|v| v.to_str().ok()),
        ) && want != got
        {
            // Odoo answers a database it does not serve before any JSON-2 routing: HTML.
            return html_error(
                StatusCode::NOT_FOUND,
                "Not Found",
                "The requested URL was not found on the server. If you entered the URL manually please check your spelling and try again.",
            );
        }
        let Some(cluster) = self.authenticate(headers) else {
            return odoo_error(StatusCode::UNAUTHORIZED, names::UNAUTHORIZED, "Invalid apikey");
        };
        if model != MODEL {
            return odoo_error(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                &format!("the model {model:?} does not exist"),
            );
        }
        let params: Value = match serde_json::from_slice(body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return odoo_error(
                    StatusCode::BAD_REQUEST,
                    names::BAD_REQUEST,
                    "could not parse the body, expecting a json object",
                );
            }
            Err(e) => {
                return odoo_error(
                    StatusCode::BAD_REQUEST,
                    names::BAD_REQUEST,
                    &format!("could not parse the body as json: {e}"),
                );
            }
        };
        if *fault == Fault::NoKwargs {
            let named = if method == protocol::METHOD_REGISTER {
                REGISTER_KEYWORDS
            } else {
                SYNC_KEYWORDS
            };
            if let Some(unknown) = params
                .as_object()
                .and_then(|o| o.keys().find(|k| !named.contains(&k.as_str())))
            {
                return odoo_error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "werkzeug.exceptions.UnprocessableEntity",
                    &format!("got an unexpected keyword argument '{unknown}'"),
                );
            }
        }
        let version = params
            .get("protocol_version")
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<ProtocolVersion>().ok());
        if let Some(v) = version
            && !v.is_compatible_with(PROTOCOL_VERSION)
        {
            let message = format!(
                "protocol version {v} is not supported; this server speaks {}.x",
                PROTOCOL_VERSION.major
            );
            return odoo_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                names::PROTOCOL_VERSION_MISMATCH,
                &message,
            );
        }
        let unprocessable = |e: serde_json::Error| {
            odoo_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                names::UNPROCESSABLE_ENTITY,
                &format!("{method}() got invalid arguments: {e}"),
            )
        };
        match method {
            protocol::METHOD_REGISTER => match serde_json::from_value(params) {
                Ok(p) => self.register(&cluster, p),
                Err(e) => unprocessable(e),
            },
            protocol::METHOD_SYNC => match serde_json::from_value(params) {
                Ok(p) => self.sync(&cluster, p, fault),
                Err(e) => unprocessable(e),
            },
            other => odoo_error(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                &format!("The method '{other}' does not exist on the model '{MODEL}'"),
            ),
        }
    }
}

/// `POST /json/2/{model}/{method}`: the call answered, logged and counted.
pub(crate) async fn handler(
    State(sim): State<Sim>,
    Path((model, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let response = sim.json2(&model, &method, &headers, &body).await;
    tracing::info!(%model, %method, status = response.status().as_u16(), "json-2 call");
    let request_line = format!("POST {} HTTP/1.1\r\n", protocol::json2_path(&model, &method)).len();
    let request = (body.len() as u64, (request_line + header_bytes(&headers)) as u64);
    sim.count(if model == MODEL { &method } else { "" }, request, &response);
    response
}

/// Any other `/json/2` path or method.
pub(crate) async fn not_found() -> Response {
    odoo_error(
        StatusCode::NOT_FOUND,
        names::NOT_FOUND,
        "Did you mean POST /json/2/<model>/<method>?",
    )
}
