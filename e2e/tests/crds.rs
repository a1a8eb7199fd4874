//! The generated CRDs in deploy/crds/ are accepted by the real API server, and
//! their schema and CEL rules refuse invalid objects with our messages.

use std::path::PathBuf;

use api::{Operation, OperationType};
use e2e::{TestContext, apply_dynamic, repo_root, yaml_documents};
use kube::api::{ListParams, Patch, PatchParams};

fn example_files(kind: &str) -> Vec<PathBuf> {
    let dir = repo_root().join("docs/examples").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

#[tokio::test]
async fn valid_examples_are_accepted() -> anyhow::Result<()> {
    let ctx = TestContext::new("crd-valid").await?;
    for file in example_files("valid") {
        for doc in yaml_documents(&std::fs::read_to_string(&file)?)? {
            apply_dynamic(&ctx.client, &ctx.namespace, doc)
                .await
                .map_err(|e| anyhow::anyhow!("{} was refused: {e:#}", file.display()))?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn invalid_examples_are_refused_with_our_messages() -> anyhow::Result<()> {
    let ctx = TestContext::new("crd-invalid").await?;
    for file in example_files("invalid") {
        let text = std::fs::read_to_string(&file)?;
        let expect = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect:"))
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()))
            .trim()
            .to_string();
        let doc = yaml_documents(&text)?.pop().expect("one object");
        match apply_dynamic(&ctx.client, &ctx.namespace, doc).await {
            Ok(_) => panic!(
                "{} was accepted; expected refusal containing {expect:?}",
                file.display()
            ),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(
                    msg.contains(&expect),
                    "{}: refusal {msg:?} does not contain {expect:?}",
                    file.display()
                );
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn operation_spec_is_immutable_and_selectable_by_type() -> anyhow::Result<()> {
    let ctx = TestContext::new("crd-operation").await?;
    for (name, type_) in [("backup-1", "Backup"), ("snap-1", "Snapshot")] {
        let op = serde_json::json!({
            "apiVersion": "vworkspace.io/v1alpha1", "kind": "Operation",
            "metadata": {"name": name},
            "spec": {"type": type_, "applicationRef": {"name": "app"}, "requestId": format!("req-{name}")}
        });
        apply_dynamic(&ctx.client, &ctx.namespace, op).await?;
    }

    let ops = ctx.api::<Operation>();
    let patch = serde_json::json!({"spec": {"requestId": "changed"}});
    let err = ops
        .patch("backup-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("changing an Operation's spec must be refused");
    assert!(
        err.to_string().contains("Operation spec is immutable"),
        "unexpected error: {err}"
    );

    let backups = ops.list(&ListParams::default().fields("spec.type=Backup")).await?;
    let names: Vec<_> = backups
        .items
        .iter()
        .map(|o| o.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(names, ["backup-1"]);
    assert!(backups.items.iter().all(|o| o.spec.type_ == OperationType::Backup));
    let by_app = ops
        .list(&ListParams::default().fields("spec.applicationRef.name=app"))
        .await?;
    assert_eq!(by_app.items.len(), 2);
    Ok(())
}
