//! What the simulator counts (`GET /sim/stats`): calls, errors and bytes per JSON-2
//! method, with syncs at rest told apart. For measurements (`just bench-agent`).

use std::sync::PoisonError;

use axum::{
    body::HttpBody as _,
    http::{HeaderMap, header},
    response::Response,
};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::Sim;

/// Traffic of one kind of JSON-2 call, as counted by the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCounters {
    /// Calls answered.
    pub calls: u64,
    /// Calls answered with a non-2xx status.
    pub errors: u64,
    /// Request bodies (the JSON parameters), bytes.
    pub request_body_bytes: u64,
    /// Request line and headers as received (HTTP/1.1 framing), bytes.
    pub request_header_bytes: u64,
    /// Response bodies, bytes.
    pub response_body_bytes: u64,
    /// Status line and headers of the answers (HTTP/1.1 framing, including the
    /// `content-length` and `date` headers the server adds), bytes.
    pub response_header_bytes: u64,
}

impl CallCounters {
    pub(crate) fn add(&mut self, ok: bool, request: (u64, u64), response: (u64, u64)) {
        self.calls += 1;
        self.errors += u64::from(!ok);
        self.request_body_bytes += request.0;
        self.request_header_bytes += request.1;
        self.response_body_bytes += response.0;
        self.response_header_bytes += response.1;
    }
}

/// What the simulator counted since it started (`GET /sim/stats`): the control plane's
/// view of the load the agents put on it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimStats {
    /// When counting started (the simulator's start).
    pub since: Timestamp,
    /// When this snapshot was taken.
    pub now: Timestamp,
    /// `agent_register` calls.
    pub register: CallCounters,
    /// `agent_sync` calls.
    pub sync: CallCounters,
    /// Of those, syncs at rest: no acknowledgement, no report, no resync marker, no
    /// error streak up, no document down.
    pub sync_at_rest: CallCounters,
    /// Any other JSON-2 call (unknown methods or models, unauthenticated calls, faults).
    pub other: CallCounters,
    /// Reports received.
    pub reports: u64,
    /// Cluster records.
    pub clusters: usize,
}

/// Marks an `agent_sync` answer that carried nothing either way (see [`SimStats`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncAtRest;

impl Sim {
    /// What the simulator counted so far.
    pub fn stats(&self) -> SimStats {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
        stats.now = Timestamp::now();
        stats.clusters = self.lock().clusters.len();
        stats
    }

    pub(crate) fn count(&self, method: &str, request: (u64, u64), response: &Response) {
        let ok = response.status().is_success();
        let body = response.body().size_hint().exact().unwrap_or_default();
        let headers = response_header_bytes(response, body);
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let counters = match method {
            protocol::METHOD_REGISTER => &mut stats.register,
            protocol::METHOD_SYNC => &mut stats.sync,
            _ => &mut stats.other,
        };
        counters.add(ok, request, (body, headers));
        if response.extensions().get::<SyncAtRest>().is_some() {
            stats.sync_at_rest.add(ok, request, (body, headers));
        }
    }

    pub(crate) fn count_reports(&self, n: usize) {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner).reports += n as u64;
    }
}

/// Bytes of HTTP/1.1 header lines (`name: value\r\n` each, and the blank line).
pub(crate) fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + 2
}

/// Status line and headers of an answer as hyper writes it: the response's own headers
/// plus the `content-length` and `date` it adds.
fn response_header_bytes(response: &Response, body: u64) -> u64 {
    let reason = response.status().canonical_reason().unwrap_or_default();
    let status_line = format!("HTTP/1.1 {} {reason}\r\n", response.status().as_u16()).len();
    let mut bytes = status_line + header_bytes(response.headers());
    if !response.headers().contains_key(header::CONTENT_LENGTH) {
        bytes += format!("content-length: {body}\r\n").len();
    }
    if !response.headers().contains_key(header::DATE) {
        bytes += "date: Sat, 21 Nov 2026 10:00:00 GMT\r\n".len();
    }
    bytes as u64
}
