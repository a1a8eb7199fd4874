//! `--wait`: what the progress line says about an Operation, and when following ends.

use api::{Operation, OperationPhase};
use jiff::Timestamp;
use kube::ResourceExt;

use crate::{age, apps::condition};

/// Where a followed Operation stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not terminal yet.
    Going,
    /// Ended `Succeeded` (also a duplicate request, which points at the first).
    Succeeded { result: String },
    /// Ended `Failed` or `Expired`.
    Failed {
        phase: String,
        reason: String,
        message: String,
    },
}

/// The verdict on `op` as it is now.
pub fn verdict(op: &Operation) -> Verdict {
    let status = op.status.as_ref();
    let succeeded = status.and_then(|s| condition(&s.conditions, "Succeeded"));
    let result = status
        .and_then(|s| s.result.clone())
        .or_else(|| succeeded.map(|c| c.message.clone()))
        .unwrap_or_default();
    match status.and_then(|s| s.phase) {
        Some(OperationPhase::Succeeded) => Verdict::Succeeded { result },
        Some(phase @ (OperationPhase::Failed | OperationPhase::Expired)) => Verdict::Failed {
            phase: phase.as_str().to_owned(),
            reason: succeeded.map(|c| c.reason.clone()).unwrap_or_default(),
            message: result,
        },
        Some(OperationPhase::Pending | OperationPhase::Running) | None => Verdict::Going,
    }
}

/// One line: phase, current child, elapsed, and the engine's message (Flux's or Velero's
/// words, as the engine relays them), e.g.
/// `Running  Backup/velero/wiki-backup-1  1m05s  Backup InProgress: 12/40 items`.
pub fn line(op: &Operation, now: Timestamp) -> String {
    let status = op.status.as_ref();
    let phase = status.and_then(|s| s.phase).map_or("Pending", OperationPhase::as_str);
    let child = status
        .and_then(|s| s.children.last())
        .map(|c| match &c.namespace {
            Some(ns) => format!("{}/{ns}/{}", c.kind, c.name),
            None => format!("{}/{}", c.kind, c.name),
        })
        .unwrap_or_else(|| "-".to_owned());
    let since = status
        .and_then(|s| s.start_time.as_ref())
        .or(op.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    let until = status.and_then(|s| s.completion_time.as_ref()).map_or(now, |t| t.0);
    let elapsed = since.map_or_else(|| "0s".to_owned(), |t| age::clock(until.duration_since(t)));
    let message = status
        .and_then(|s| condition(&s.conditions, "Succeeded"))
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
        .or_else(|| status.and_then(|s| s.result.as_deref()))
        .unwrap_or("waiting for the engine");
    // One line, whatever the message holds, and nothing a terminal would act on.
    let message = crate::table::printable(message);
    format!("{} {phase}  {child}  {elapsed}  {message}", op.name_any())
}

/// Prints progress lines: on a terminal one line rewritten in place, otherwise a plain
/// line each time the text (without the clock) changes.
#[derive(Debug, Default)]
pub struct Printer {
    terminal: bool,
    last: Option<String>,
}

impl Printer {
    pub fn new(terminal: bool) -> Self {
        Self { terminal, last: None }
    }

    /// What to write for `line` (possibly nothing).
    pub fn update(&mut self, line: &str) -> Option<String> {
        if self.terminal {
            return Some(format!("\r\x1b[2K{line}"));
        }
        let key = without_clock(line);
        if self.last.as_deref() == Some(key.as_str()) {
            return None;
        }
        self.last = Some(key);
        Some(format!("{line}\n"))
    }

    /// What to write when following ends: a terminal's line is closed with a newline.
    pub fn finish(&self) -> &'static str {
        if self.terminal { "\n" } else { "" }
    }
}

/// `line` without its elapsed field (the third of the two-space separated fields).
fn without_clock(line: &str) -> String {
    let mut fields: Vec<&str> = line.splitn(4, "  ").collect();
    if fields.len() == 4 {
        fields.remove(2);
    }
    fields.join("  ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(status: serde_json::Value) -> Operation {
        serde_json::from_value(json!({
            "apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation",
            "metadata": {"name": "wiki-backup-1", "namespace": "team-a",
                         "creationTimestamp": "2026-11-27T11:59:00Z"},
            "spec": {"type": "Backup", "applicationRef": {"name": "wiki"}, "requestId": "r1"},
            "status": status,
        }))
        .unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    fn now() -> Timestamp {
        "2026-11-27T12:01:05Z".parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn cond(status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!([{"type": "Succeeded", "status": status, "reason": reason, "message": message,
                "lastTransitionTime": "2026-11-27T12:00:00Z"}])
    }

    #[test]
    fn a_running_operation_shows_its_child_elapsed_time_and_message() {
        let running = op(json!({
            "phase": "Running", "startTime": "2026-11-27T12:00:00Z",
            "children": [{"apiVersion": "velero.io/v1", "kind": "Backup", "name": "wiki-backup-1", "namespace": "velero"}],
            "conditions": cond("Unknown", "Running", "Backup InProgress: 12/40 items\nmore"),
        }));
        assert_eq!(
            line(&running, now()),
            "wiki-backup-1 Running  Backup/velero/wiki-backup-1  1m05s  Backup InProgress: 12/40 items more"
        );
        assert_eq!(verdict(&running), Verdict::Going);
    }

    #[test]
    fn a_new_operation_counts_from_its_creation() {
        assert_eq!(
            line(&op(json!(null)), now()),
            "wiki-backup-1 Pending  -  2m05s  waiting for the engine"
        );
    }

    #[test]
    fn terminal_phases_decide_the_exit() {
        let done = op(json!({"phase": "Succeeded", "result": "Backup Completed",
                             "conditions": cond("True", "Completed", "Backup Completed")}));
        assert_eq!(
            verdict(&done),
            Verdict::Succeeded {
                result: "Backup Completed".into()
            }
        );
        for phase in ["Failed", "Expired"] {
            let failed = op(json!({"phase": phase, "result": "Job failed",
                                   "conditions": cond("False", "BackoffLimitExceeded", "Job failed")}));
            assert_eq!(
                verdict(&failed),
                Verdict::Failed {
                    phase: phase.into(),
                    reason: "BackoffLimitExceeded".into(),
                    message: "Job failed".into()
                }
            );
        }
    }

    #[test]
    fn the_elapsed_time_stops_at_completion() {
        let done = op(json!({"phase": "Succeeded", "startTime": "2026-11-27T12:00:00Z",
                             "completionTime": "2026-11-27T12:00:07Z", "result": "ok"}));
        assert!(line(&done, now()).contains("  7s  ok"), "{}", line(&done, now()));
    }

    #[test]
    fn without_a_terminal_only_changed_lines_are_printed() {
        let mut plain = Printer::new(false);
        assert_eq!(
            plain.update("op Running  -  1s  a").as_deref(),
            Some("op Running  -  1s  a\n")
        );
        assert_eq!(plain.update("op Running  -  2s  a"), None, "only the clock moved");
        assert!(plain.update("op Running  -  3s  b").is_some());
        assert_eq!(plain.finish(), "");
        let mut tty = Printer::new(true);
        assert_eq!(tty.update("x").as_deref(), Some("\r\x1b[2Kx"));
        assert_eq!(tty.update("x").as_deref(), Some("\r\x1b[2Kx"));
        assert_eq!(tty.finish(), "\n");
    }
}
