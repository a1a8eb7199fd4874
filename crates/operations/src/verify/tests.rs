use super::*;
use crate::meta::tests::op;
use api::OperationType;

const SCRATCH: &str = "vws-verify-0123456789";

fn restore(phase: &str, verdict: Option<&RestoreVerificationStatus>) -> Value {
    let mut restore = json!({
        "metadata": {"name": "team-a-check-abc", "namespace": "velero", "annotations": {}},
        "status": {"phase": phase, "completionTimestamp": "2026-11-26T10:00:00Z", "progress": {"itemsRestored": 7}},
    });
    if let Some(verdict) = verdict {
        restore["metadata"]["annotations"][ANNOTATION_VERDICT] =
            json!(serde_json::to_string(verdict).unwrap_or_default());
    }
    restore
}

fn deployment(name: &str, ready: i64, wanted: i64) -> Value {
    json!({"kind": "Deployment", "metadata": {"name": name}, "spec": {"replicas": wanted}, "status": {"readyReplicas": ready}})
}

fn job(condition: Option<&str>) -> Value {
    let conditions: Vec<Value> = condition
        .map(|c| json!({"type": c, "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}))
        .into_iter()
        .collect();
    json!({"metadata": {"name": JOB_NAME, "namespace": SCRATCH}, "status": {"conditions": conditions, "succeeded": 1}})
}

fn namespace(terminating: bool) -> Value {
    let mut ns = json!({"metadata": {"name": SCRATCH}});
    if terminating {
        ns["metadata"]["deletionTimestamp"] = json!("2026-11-26T10:05:00Z");
    }
    ns
}

fn verdict(passed: bool) -> RestoreVerificationStatus {
    RestoreVerificationStatus {
        backup: "b".into(),
        scratch_namespace: SCRATCH.into(),
        passed,
        message: "checked".into(),
        ..RestoreVerificationStatus::default()
    }
}

fn at(minutes_after_restore: i64) -> Timestamp {
    let base: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
    base.checked_add(jiff::SignedDuration::from_mins(minutes_after_restore))
        .unwrap_or(base)
}

/// What a step amounts to, for the table: its name, and whether and how it decided.
fn summary(step: &Step) -> (String, Option<bool>, String) {
    match step {
        Step::CreateNamespace => ("CreateNamespace".into(), None, String::new()),
        Step::CreateRestore => ("CreateRestore".into(), None, String::new()),
        Step::CreateJob => ("CreateJob".into(), None, String::new()),
        Step::Wait(m) => ("Wait".into(), None, m.clone()),
        Step::Record(v) => ("Record".into(), Some(v.passed), v.message.clone()),
        Step::RemoveNamespace(v) => ("RemoveNamespace".into(), Some(v.passed), v.message.clone()),
        Step::Done(v) => ("Done".into(), Some(v.passed), v.message.clone()),
    }
}

type Case<'a> = (
    &'a str,
    Option<Value>,
    Option<Value>,
    Vec<Value>,
    Option<Value>,
    bool,
    i64,
    (&'a str, Option<bool>, &'a str),
);

#[test]
fn steps() {
    let with_job = RestoreVerification {
        timeout_seconds: Some(600),
        job: Some(json!({"template": {"spec": {"containers": [{"name": "check", "image": "x"}]}}})),
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "nothing yet",
            None,
            None,
            vec![],
            None,
            true,
            0,
            ("CreateNamespace", None, ""),
        ),
        (
            "namespace made",
            Some(namespace(false)),
            None,
            vec![],
            None,
            true,
            0,
            ("CreateRestore", None, ""),
        ),
        (
            "an earlier attempt's namespace is going",
            Some(namespace(true)),
            None,
            vec![],
            None,
            true,
            0,
            ("Wait", None, "still being removed"),
        ),
        (
            "Velero restoring",
            Some(namespace(false)),
            Some(restore("InProgress", None)),
            vec![],
            None,
            true,
            0,
            ("Wait", None, "InProgress"),
        ),
        (
            "Velero could not restore it whole",
            Some(namespace(false)),
            Some(restore("PartiallyFailed", None)),
            vec![],
            None,
            true,
            0,
            ("Record", Some(false), "the copy is not whole"),
        ),
        (
            "a workload not ready yet",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 0, 1)],
            None,
            true,
            1,
            ("Wait", None, "Deployment/files: 0/1 ready"),
        ),
        (
            "a workload not ready in time",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 0, 1)],
            None,
            true,
            11,
            (
                "Record",
                Some(false),
                "not ready 600 s after the restore: Deployment/files: 0/1 ready",
            ),
        ),
        (
            "ready, the Job is next",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 1, 1)],
            None,
            true,
            1,
            ("CreateJob", None, ""),
        ),
        (
            "ready, no Job declared",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 1, 1)],
            None,
            false,
            1,
            ("Record", Some(true), "ready: Deployment/files"),
        ),
        (
            "the Job runs",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 1, 1)],
            Some(job(None)),
            true,
            2,
            ("Wait", None, "Job vws-verify-0123456789/vworkspace-verification"),
        ),
        (
            "the Job runs past the timeout",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 1, 1)],
            Some(job(None)),
            true,
            11,
            ("Record", Some(false), "did not finish within 600 s"),
        ),
        (
            "the Job passed",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 1, 1)],
            Some(job(Some("Complete"))),
            true,
            2,
            ("Record", Some(true), "completed"),
        ),
        (
            "the Job failed",
            Some(namespace(false)),
            Some(restore("Completed", None)),
            vec![deployment("files", 1, 1)],
            Some(job(Some("Failed"))),
            true,
            2,
            ("Record", Some(false), "backoff limit"),
        ),
        (
            "someone removed the namespace mid-way",
            None,
            Some(restore("Completed", None)),
            vec![],
            None,
            true,
            2,
            ("Record", Some(false), "removed by someone else"),
        ),
        (
            "recorded: remove the namespace",
            Some(namespace(false)),
            Some(restore("Completed", Some(&verdict(true)))),
            vec![],
            None,
            true,
            3,
            ("RemoveNamespace", Some(true), "checked"),
        ),
        (
            "recorded, namespace going",
            Some(namespace(true)),
            Some(restore("Completed", Some(&verdict(false)))),
            vec![],
            None,
            true,
            3,
            ("Wait", None, "verification failed; removing the scratch namespace"),
        ),
        (
            "recorded, namespace gone",
            None,
            Some(restore("Completed", Some(&verdict(true)))),
            vec![],
            None,
            true,
            3,
            ("Done", Some(true), "checked"),
        ),
    ];
    for (name, scratch, velero_restore, workloads, job, declares_job, minutes, (want, passed, contains)) in cases {
        let plan = Plan {
            backup: "b",
            scratch: SCRATCH,
            verification: declares_job.then_some(&with_job),
        };
        let seen = Observed {
            scratch: scratch.as_ref(),
            restore: velero_restore.as_ref(),
            workloads: &workloads,
            job: job.as_ref(),
            volumes_restored: Some(1),
            now: at(minutes),
        };
        let (got, got_passed, message) = summary(&step(&plan, &seen));
        assert_eq!((got.as_str(), got_passed), (want, passed), "{name}: {message}");
        assert!(message.contains(contains), "{name}: {message:?} lacks {contains:?}");
    }
}

#[test]
fn evidence_names_what_was_restored_and_checked() {
    let plan = Plan {
        backup: "team-a-nightly",
        scratch: SCRATCH,
        verification: None,
    };
    let workloads = [deployment("files", 1, 1), deployment("api", 2, 2)];
    let velero_restore = restore("Completed", None);
    let namespace = namespace(false);
    let seen = Observed {
        scratch: Some(&namespace),
        restore: Some(&velero_restore),
        workloads: &workloads,
        job: None,
        volumes_restored: Some(1),
        now: at(1),
    };
    let Step::Record(evidence) = step(&plan, &seen) else {
        panic!("expected a verdict");
    };
    assert_eq!(evidence.backup, "team-a-nightly");
    assert_eq!(evidence.scratch_namespace, SCRATCH);
    assert_eq!(evidence.items_restored, Some(7));
    assert_eq!(evidence.volumes_restored, Some(1));
    assert_eq!(evidence.workloads_ready, ["Deployment/api", "Deployment/files"]);
    assert!(evidence.passed && !evidence.scratch_namespace_removed);
    // The verdict survives the round trip through the annotation.
    let recorded = restore("Completed", Some(&evidence));
    assert_eq!(recorded_verdict(&recorded), Some(evidence.clone()));
    let patch = verdict_patch(&evidence).unwrap_or_default();
    assert!(patch.pointer("/metadata/annotations").is_some());
}

#[test]
fn the_scratch_namespace_is_named_by_the_operation_and_copies_only_pod_security_labels() {
    let operation = op("check", OperationType::Restore);
    let Ok(id) = OpId::of(&operation) else {
        panic!("identity");
    };
    let name = scratch_namespace(&id);
    assert!(name.starts_with(SCRATCH_PREFIX) && name.len() <= 63, "{name}");
    assert_eq!(name, scratch_namespace(&id), "deterministic");
    let source = BTreeMap::from([
        ("pod-security.kubernetes.io/enforce".to_owned(), "baseline".to_owned()),
        ("tenant".to_owned(), "a".to_owned()),
    ]);
    let ns = namespace_object(&id, "team-a", &source);
    assert_eq!(ns["metadata"]["name"], json!(name));
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        json!("baseline")
    );
    assert_eq!(ns["metadata"]["labels"].get("tenant"), None);
    assert_eq!(ns["metadata"]["labels"][LABEL_SCRATCH], json!(SCRATCH_VALUE));
    assert_eq!(
        ns["metadata"]["annotations"][ANNOTATION_SOURCE_NAMESPACE],
        json!("team-a")
    );
    assert!(is_scratch_of(&ns, &id));
    assert!(ns["metadata"].get("ownerReferences").is_none());
}

#[test]
fn the_verification_job_is_restricted_and_told_where_it_runs() {
    let operation = op("check", OperationType::Restore);
    let Ok(id) = OpId::of(&operation) else {
        panic!("identity");
    };
    let spec =
        json!({"template": {"spec": {"containers": [{"name": "check", "image": "busybox", "command": ["true"]}]}}});
    let job = job_object(&id, &spec, SCRATCH, "team-a", "nightly").unwrap_or_default();
    assert_eq!(job["metadata"]["namespace"], json!(SCRATCH));
    assert_eq!(job["metadata"]["name"], json!(JOB_NAME));
    assert!(
        job["metadata"].get("ownerReferences").is_none(),
        "no cross-namespace owner"
    );
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let env: Vec<&str> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(env, ["VWS_BACKUP_NAME", "VWS_SOURCE_NAMESPACE", "VWS_VERIFY_NAMESPACE"]);
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], json!(false));

    let privileged = json!({"template": {"spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": true}}]}}});
    let refused = job_object(&id, &privileged, SCRATCH, "team-a", "nightly");
    assert!(
        matches!(&refused, Err(Error::InvalidSpec(m)) if m.contains("spec.restoreVerification.job.template")),
        "{refused:?}"
    );
}

#[test]
fn a_scratch_namespace_outliving_its_operation_is_orphaned() {
    let operation = op("check", OperationType::Restore);
    let Ok(id) = OpId::of(&operation) else {
        panic!("identity");
    };
    let ns = namespace_object(&id, "team-a", &BTreeMap::new());
    assert_eq!(
        owner_of(&ns),
        Some(("team-a".to_owned(), "check".to_owned(), "uid-check".to_owned()))
    );
    let mut replaced = operation.clone();
    replaced.metadata.uid = Some("uid-other".into());
    let mut ended = operation.clone();
    ended.status = Some(api::OperationStatus {
        phase: Some(api::OperationPhase::Failed),
        ..Default::default()
    });
    let mut deleting = ns.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-26T10:00:00Z");
    let cases: [(&str, &Value, Option<&api::Operation>, bool); 5] = [
        ("its Operation runs", &ns, Some(&operation), false),
        ("its Operation is gone", &ns, None, true),
        ("another Operation of the name", &ns, Some(&replaced), true),
        ("its Operation has ended", &ns, Some(&ended), true),
        ("already being deleted", &deleting, None, false),
    ];
    for (name, scratch, operation, orphaned) in cases {
        assert_eq!(is_orphaned(scratch, operation), orphaned, "{name}");
    }
    let not_ours = json!({"metadata": {"name": "vws-verify-x", "labels": {LABEL_SCRATCH: SCRATCH_VALUE}}});
    assert!(
        !is_orphaned(&not_ours, None),
        "a namespace that does not name its Operation is left alone"
    );
}
