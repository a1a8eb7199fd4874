//! The admin views: one cluster record with a per-object summary computed the way the
//! Odoo module is expected to (docs/connectivity/protocol.md, "Reading status in Odoo"),
//! and the report log.

use std::time::Duration;

use jiff::Timestamp;
use protocol::messages::{ObjectKind, ObjectOutcome, ObjectState};
use serde_json::{Value, json};

use crate::{
    Sim, SimError,
    state::{ClusterRecord, ReceivedReport, report_key},
};

impl Sim {
    /// The report log of a cluster: entries with `seq > after`.
    pub fn report_log(&self, cluster: &str, after: u64) -> Result<Vec<ReceivedReport>, SimError> {
        let s = self.lock();
        let r = s
            .clusters
            .get(cluster)
            .ok_or_else(|| SimError::NoCluster(cluster.to_owned()))?;
        Ok(r.report_log.iter().filter(|e| e.seq > after).cloned().collect())
    }
    /// The admin view of one cluster, with a per-object summary computed the way the Odoo
    /// module is expected to (docs/connectivity/protocol.md, "Reading status in Odoo").
    pub fn view(&self, name: &str) -> Result<Value, SimError> {
        let s = self.lock();
        let r = s
            .clusters
            .get(name)
            .ok_or_else(|| SimError::NoCluster(name.to_owned()))?;
        Ok(view(r, self.config.offline_after))
    }
}

fn latest_ack_for<'a>(
    r: &'a ClusterRecord,
    kind: ObjectKind,
    ns: &str,
    name: &str,
) -> Option<(u64, &'a protocol::ObjectAck)> {
    r.acks.iter().filter(|a| a.epoch == r.epoch).rev().find_map(|a| {
        a.objects
            .iter()
            .find(|o| o.kind == kind && o.namespace == ns && o.name == name)
            .map(|o| (a.revision, o))
    })
}

/// Summary per object: the distinctions the control plane must make.
fn object_summary(r: &ClusterRecord, kind: ObjectKind, ns: &str, name: &str, changed_at: u64, offline: bool) -> Value {
    let ack = latest_ack_for(r, kind, ns, name).filter(|(rev, _)| *rev >= changed_at);
    let report = r.reports.get(&report_key(kind, ns, name));
    let generation_ok = match (ack, report) {
        (Some((_, a)), Some(rep)) => a.generation.is_none() || rep.report.generation >= a.generation,
        _ => false,
    };
    let status = if offline {
        "agent_offline".to_owned()
    } else if let Some((_, a)) = ack {
        match a.outcome {
            ObjectOutcome::Refused => "refused".to_owned(),
            ObjectOutcome::Failed => "apply_failed".to_owned(),
            _ => match report.map(|r| (r.report.state, r.report.observed_generation == r.report.generation)) {
                Some((ObjectState::Ready, true)) if generation_ok => "ready".to_owned(),
                Some((ObjectState::Succeeded, _)) => "succeeded".to_owned(),
                Some((ObjectState::Failed, _)) => "failed".to_owned(),
                Some((ObjectState::Expired, _)) => "expired".to_owned(),
                Some((ObjectState::Deleted, _)) => "deleted".to_owned(),
                Some(_) | None => "applied_not_ready".to_owned(),
            },
        }
    } else {
        "not_acknowledged".to_owned()
    };
    json!({
        "kind": kind.as_str(), "namespace": ns, "name": name,
        "intent_revision": changed_at,
        "status": status,
        "ack": ack.map(|(rev, a)| json!({"revision": rev, "outcome": a.outcome, "reason": a.reason, "message": a.message, "conflict": a.conflict})),
        "report": report,
    })
}

fn view(r: &ClusterRecord, offline_after: Duration) -> Value {
    let now = Timestamp::now();
    let offline = r
        .last_seen
        .is_none_or(|t| now.duration_since(t).as_secs_f64() > offline_after.as_secs_f64());
    let acknowledged = r.acks.iter().filter(|a| a.epoch == r.epoch).map(|a| a.revision).max();
    let mut objects = Vec::new();
    for (rev, a) in r.applications.values() {
        objects.push(object_summary(
            r,
            ObjectKind::ApplicationInstance,
            &a.namespace,
            &a.name,
            *rev,
            offline,
        ));
    }
    for (rev, o) in r.operations.values() {
        objects.push(object_summary(
            r,
            ObjectKind::Operation,
            &o.namespace,
            &o.name,
            *rev,
            offline,
        ));
    }
    for (rev, d) in r.deletions.values() {
        objects.push(object_summary(r, d.kind, &d.namespace, &d.name, *rev, offline));
    }
    json!({
        "simulator": "odoo-sim (not Odoo)",
        "id": r.id,
        "name": r.name,
        "uid": r.uid,
        "registered_at": r.registered_at,
        "last_seen": r.last_seen,
        "agent_online": !offline,
        "agent": r.agent,
        "allowed_namespaces": r.allowed_namespaces,
        "cursor": {"epoch": r.epoch, "revision": r.revision},
        "acknowledged_revision": acknowledged,
        "intent_acknowledged": r.revision == 0 || acknowledged == Some(r.revision),
        "mode": if r.push.is_some() { "push" } else { "pull" },
        "push": r.push,
        "syncs": r.syncs,
        "last_agent_error": r.last_agent_error,
        "resync": {"id": r.resync.id, "completed_at": r.resync.completed_at, "completed": r.resync.completed},
        "objects": objects,
        "reports": r.reports,
        "acks": r.acks,
        "raw_document": r.raw_document,
    })
}
