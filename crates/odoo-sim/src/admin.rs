//! The admin API's handlers (`/sim/...`): cluster records, intent, push targets, faults,
//! and the views and counters read back. A real Odoo has its own UI instead.

use axum::{
    Json,
    extract::{Path, RawQuery, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use protocol::messages::{ApplicationIntent, DeletionIntent, ObjectKind, OperationIntent};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Fault, Sim, SimError, SimStats, push, state::report_key};

#[derive(Deserialize)]
pub(crate) struct NewCluster {
    name: String,
    api_key: String,
}

/// One record (`{"name", "api_key"}`), or many at once (an array of them).
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum NewClusters {
    One(NewCluster),
    Many(Vec<NewCluster>),
}

pub(crate) async fn add_cluster(State(sim): State<Sim>, Json(c): Json<NewClusters>) -> Result<Response, SimError> {
    match c {
        NewClusters::One(c) => {
            sim.add_cluster(&c.name, &c.api_key)?;
            Ok((StatusCode::CREATED, Json(json!({"name": c.name}))).into_response())
        }
        NewClusters::Many(list) => {
            let pairs: Vec<(String, String)> = list.into_iter().map(|c| (c.name, c.api_key)).collect();
            let created = sim.add_clusters(&pairs)?;
            Ok((StatusCode::CREATED, Json(json!({"created": created}))).into_response())
        }
    }
}

pub(crate) async fn get_stats(State(sim): State<Sim>) -> Json<SimStats> {
    Json(sim.stats())
}

pub(crate) async fn get_report_log(
    State(sim): State<Sim>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, SimError> {
    let after = match query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("after=")))
    {
        Some(n) => n
            .parse()
            .map_err(|_| SimError::BadRequest(format!("after={n}: expected a number")))?,
        None => 0,
    };
    let entries = sim.report_log(&name, after)?;
    Ok(Json(json!({"cluster": name, "entries": entries})))
}

pub(crate) async fn list_clusters(State(sim): State<Sim>) -> Json<Value> {
    let s = sim.lock();
    Json(json!(
        s.clusters
            .values()
            .map(|r| json!({"name": r.name, "id": r.id, "uid": r.uid,
        "last_seen": r.last_seen, "revision": r.revision}))
            .collect::<Vec<_>>()
    ))
}

pub(crate) async fn get_cluster(State(sim): State<Sim>, Path(name): Path<String>) -> Result<Json<Value>, SimError> {
    Ok(Json(sim.view(&name)?))
}

fn revision_response(revision: u64) -> Response {
    Json(json!({"revision": revision})).into_response()
}

pub(crate) async fn put_application(
    State(sim): State<Sim>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
    Json(spec): Json<Value>,
) -> Result<Response, SimError> {
    let spec: api::ApplicationInstanceSpec =
        serde_json::from_value(spec).map_err(|e| SimError::BadRequest(format!("spec: {e}")))?;
    let key = format!("{ns}/{name}");
    let rev = sim.edit(&cluster, |r, rev| {
        r.deletions
            .remove(&report_key(ObjectKind::ApplicationInstance, &ns, &name));
        r.applications.insert(
            key,
            (
                rev,
                ApplicationIntent {
                    namespace: ns.clone(),
                    name: name.clone(),
                    spec,
                },
            ),
        );
    })?;
    Ok(revision_response(rev))
}

pub(crate) async fn delete_application(
    State(sim): State<Sim>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, rev| {
        r.applications.remove(&format!("{ns}/{name}"));
        let key = report_key(ObjectKind::ApplicationInstance, &ns, &name);
        let uid = r.reports.get(&key).and_then(|s| s.report.uid.clone());
        r.deletions.insert(
            key,
            (
                rev,
                DeletionIntent {
                    kind: ObjectKind::ApplicationInstance,
                    namespace: ns.clone(),
                    name: name.clone(),
                    uid,
                    reason: Some("deleted in the control plane (odoo-sim admin)".into()),
                },
            ),
        );
    })?;
    Ok(revision_response(rev))
}

pub(crate) async fn put_operation(
    State(sim): State<Sim>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
    Json(spec): Json<Value>,
) -> Result<Response, SimError> {
    let spec: api::OperationSpec =
        serde_json::from_value(spec).map_err(|e| SimError::BadRequest(format!("spec: {e}")))?;
    let rev = sim.edit(&cluster, |r, rev| {
        r.operations.insert(
            format!("{ns}/{name}"),
            (
                rev,
                OperationIntent {
                    namespace: ns.clone(),
                    name: name.clone(),
                    spec,
                },
            ),
        );
    })?;
    Ok(revision_response(rev))
}

pub(crate) async fn post_deletion(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
    Json(del): Json<DeletionIntent>,
) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, rev| {
        let key = report_key(del.kind, &del.namespace, &del.name);
        let desired = format!("{}/{}", del.namespace, del.name);
        match del.kind {
            ObjectKind::ApplicationInstance => {
                r.applications.remove(&desired);
            }
            ObjectKind::Operation => {
                r.operations.remove(&desired);
            }
        }
        r.deletions.insert(key, (rev, del));
    })?;
    Ok(revision_response(rev))
}

pub(crate) async fn put_document(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
    Json(raw): Json<Value>,
) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, _| {
        r.raw_document = (!raw.is_null()).then_some(raw);
    })?;
    Ok(revision_response(rev))
}

pub(crate) async fn reset_intent(State(sim): State<Sim>, Path(cluster): Path<String>) -> Result<Response, SimError> {
    let rev = sim.edit(&cluster, |r, _| {
        r.applications.clear();
        r.operations.clear();
        r.deletions.clear();
        r.raw_document = None;
    })?;
    Ok(revision_response(rev))
}

pub(crate) async fn put_push_target(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
    Json(target): Json<push::PushTarget>,
) -> Result<Response, SimError> {
    tracing::info!(%cluster, url = %target.url, "push target set: the simulator now calls the agent");
    sim.set_push_target(&cluster, Some(target))?;
    Ok(Json(json!({"cluster": cluster, "mode": "push"})).into_response())
}

pub(crate) async fn delete_push_target(
    State(sim): State<Sim>,
    Path(cluster): Path<String>,
) -> Result<Response, SimError> {
    sim.set_push_target(&cluster, None)?;
    Ok(Json(json!({"cluster": cluster, "mode": "pull"})).into_response())
}

pub(crate) async fn put_fault(State(sim): State<Sim>, Json(fault): Json<Fault>) -> Json<Value> {
    tracing::warn!(?fault, "fault mode set");
    sim.set_fault(fault.clone());
    Json(json!({"fault": fault}))
}
