//! The endpoint's routes, and how every answer is counted and logged.

use std::sync::Arc;

use axum::{
    Json, Router,
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use protocol::{
    error::names,
    push::{METHOD_APPLY, METHOD_STATUS, PUSH_MODEL, error_names},
};
use serde::Serialize;

use super::{
    handlers::{ApiError, PushState},
    limits,
};
use crate::{apply::Cluster, health::Health};

fn respond<T: Serialize>(health: &Health, endpoint: &'static str, result: Result<T, ApiError>) -> Response {
    match result {
        Ok(v) => {
            health.metrics().push_request(endpoint, 200);
            (StatusCode::OK, Json(v)).into_response()
        }
        Err(e) => {
            health.metrics().push_request(endpoint, e.status.as_u16());
            let message = if e.loggable {
                e.error.message.as_str()
            } else {
                "(a parser's message, returned to the caller only)"
            };
            // 503 is this agent asking a caller to retry (still listing, not the leader, its
            // token unreadable: logged where it happens), not a refusal of the caller: it must
            // not use up the refusal lines' budget, or a flood of bad tokens right after start
            // would leave no line naming them.
            if e.status == StatusCode::SERVICE_UNAVAILABLE {
                tracing::debug!(endpoint, message, "push request answered: retry later");
            // One line per interval at most (`suppressed` counts the others since the
            // previous line); the request metrics count every refusal.
            } else if let Some(suppressed) = limits::refusal_to_log() {
                tracing::info!(endpoint, status = e.status.as_u16(), error = %e.error.name, message, suppressed, "push request refused");
            }
            e.into_response()
        }
    }
}

async fn apply_handler<C: Cluster + 'static>(
    State(state): State<Arc<PushState<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = state.apply(&headers, body).await;
    respond(&state.health, METHOD_APPLY, result)
}

async fn status_handler<C: Cluster + 'static>(
    State(state): State<Arc<PushState<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = state.status(&headers, body).await;
    respond(&state.health, METHOD_STATUS, result)
}

/// The endpoint's routes (no TLS: [`PushServer`] adds it).
pub fn router<C: Cluster + 'static>(state: Arc<PushState<C>>) -> Router {
    let health = state.health.clone();
    let not_found = move || {
        let health = health.clone();
        async move {
            health.metrics().push_request("other", 404);
            ApiError::new(
                StatusCode::NOT_FOUND,
                names::NOT_FOUND,
                format!(
                    "unknown path: use POST {} or {}",
                    protocol::json2_path(PUSH_MODEL, METHOD_APPLY),
                    protocol::json2_path(PUSH_MODEL, METHOD_STATUS)
                ),
            )
        }
    };
    let health = state.health.clone();
    let not_allowed = move || {
        let health = health.clone();
        async move {
            health.metrics().push_request("other", 405);
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                error_names::METHOD_NOT_ALLOWED,
                "use POST",
            )
        }
    };
    Router::new()
        .route(
            &protocol::json2_path(PUSH_MODEL, METHOD_APPLY),
            post(apply_handler::<C>),
        )
        .route(
            &protocol::json2_path(PUSH_MODEL, METHOD_STATUS),
            post(status_handler::<C>),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .with_state(state)
}
