//! The app controller end to end: ApplicationInstance → Flux HelmRelease → real
//! Helm release on the local cluster, and Flux's status relayed back.

use api::{
    ApplicationDependency, ApplicationInstance, ReleaseActionSpec, Remediation, RemediationStrategy, ValuesReference,
    ValuesSourceKind,
};
use e2e::{
    TestContext,
    apps::{
        FinalizerAtAdmission, RELEASE_TIMEOUT, ReadyClaims, app, apply_app, condition, config_value, start_controller,
        wait_app, wait_config, wait_deployed, wait_ready,
    },
    eventually, flux,
};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret};
use kube::{
    ResourceExt,
    api::{DeleteParams, ListParams},
};

fn sha256_hex(input: &str) -> String {
    // Tiny SHA-256 to compare with the chart's sha256sum without another dependency.
    sha256::digest(input)
}

mod sha256 {
    //! Minimal SHA-256 (FIPS 180-4), test-only.
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    pub fn digest(input: &str) -> String {
        let mut h: [u32; 8] = [
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
        ];
        let mut msg = input.as_bytes().to_vec();
        let bits = (msg.len() as u64) * 8;
        msg.push(0x80);
        while msg.len() % 64 != 56 {
            msg.push(0);
        }
        msg.extend_from_slice(&bits.to_be_bytes());
        for chunk in msg.chunks(64) {
            let mut w = [0u32; 64];
            for i in 0..16 {
                w[i] = u32::from_be_bytes([chunk[4 * i], chunk[4 * i + 1], chunk[4 * i + 2], chunk[4 * i + 3]]);
            }
            for i in 16..64 {
                let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
                let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
                w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
            }
            let mut v = h;
            for i in 0..64 {
                let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
                let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
                let t1 = v[7]
                    .wrapping_add(s1)
                    .wrapping_add(ch)
                    .wrapping_add(K[i])
                    .wrapping_add(w[i]);
                let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
                let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
                let t2 = s0.wrapping_add(maj);
                v = [
                    t1.wrapping_add(t2),
                    v[0],
                    v[1],
                    v[2],
                    v[3].wrapping_add(t1),
                    v[4],
                    v[5],
                    v[6],
                ];
            }
            for (a, b) in h.iter_mut().zip(v) {
                *a = a.wrapping_add(b);
            }
        }
        h.iter().map(|x| format!("{x:08x}")).collect()
    }
}

#[tokio::test]
async fn install_reaches_ready_with_values_rendered_and_status_mirrored() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-install").await?;
    let claims = ReadyClaims::watch(&ctx).await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(
        &ctx,
        &app(
            "wiki",
            "demo-app",
            "0.1.0",
            serde_json::json!({"greeting": "hello from odoo"}),
        ),
    )
    .await?;

    let ready = wait_deployed(&ctx, "wiki", "InstallSucceeded", "0.1.0").await?;
    assert!(claims.assert_each_names_its_release(1).await >= 1);
    let status = ready.status.clone().expect("status");
    assert_eq!(status.deployed_chart_version.as_deref(), Some("0.1.0"));
    assert_eq!(status.app_version.as_deref(), Some("1.0.0"));
    assert_eq!(status.engine.as_deref(), Some("flux"));
    assert_eq!(status.engine_ref.as_ref().map(|r| r.kind.as_str()), Some("HelmRelease"));
    assert_eq!(
        status.history.first().map(|h| (h.revision, h.status.as_str())),
        Some((1, "deployed"))
    );
    assert_eq!(
        condition(&ready, "Released").map(|c| c.1),
        Some("InstallSucceeded".into())
    );
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.observed_generation == ready.metadata.generation)
    );
    // Every write is attributed: the finalizer's merge patch too, not `unknown`.
    let writers: Vec<(String, String, String)> = ready
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            let fields = m.fields_v1.as_ref().map(|f| f.0.to_string()).unwrap_or_default();
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
                fields,
            )
        })
        .collect();
    assert!(
        writers
            .iter()
            .any(|(manager, operation, fields)| manager == "vworkspace-app-controller"
                && operation == "Update"
                && fields.contains("f:finalizers")),
        "{writers:?}"
    );
    assert!(
        writers
            .iter()
            .all(|(manager, ..)| !manager.is_empty() && manager != "unknown"),
        "{writers:?}"
    );

    // Relayed verbatim: our Ready message is the HelmRelease's.
    let hr = flux::helm_releases(&ctx).get("wiki").await?;
    let hr = serde_json::to_value(hr)?;
    assert_eq!(
        e2e::condition(&hr, "Ready").map(|c| c.2),
        condition(&ready, "Ready").map(|c| c.2)
    );

    assert_eq!(
        config_value(&ctx, "wiki-config", "greeting").await?.as_deref(),
        Some("hello from odoo")
    );
    let deploy = ctx.api::<Deployment>().get("wiki").await?;
    assert!(
        deploy.status.and_then(|s| s.available_replicas).unwrap_or(0) >= 1,
        "Deployment available via kwok"
    );

    // Changing values re-applies promptly.
    apply_app(
        &ctx,
        &app("wiki", "demo-app", "0.1.0", serde_json::json!({"greeting": "changed"})),
    )
    .await?;
    wait_config(&ctx, "wiki-config", "greeting", "changed").await?;
    wait_ready(&ctx, "wiki", "True", "UpgradeSucceeded").await?;
    Ok(())
}

#[tokio::test]
async fn values_from_a_secret_follow_the_secret_and_never_leak() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-secret").await?;
    let password = "s3cr3t-Pa55-do-not-log";
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vault-auth", "labels": {"reconcile.fluxcd.io/watch": "Enabled"}},
        "stringData": {"password": password}
    }))?;
    ctx.apply(&secret).await?;
    let controller = start_controller(&ctx, &[]).await?;

    let mut vault = app("vault", "secret-app", "1.0.0", serde_json::json!({}));
    vault.spec.values_from = vec![ValuesReference {
        kind: ValuesSourceKind::Secret,
        name: "vault-auth".into(),
        values_key: Some("password".into()),
        target_path: Some("auth.password".into()),
        optional: false,
    }];
    apply_app(&ctx, &vault).await?;
    let ready = wait_ready(&ctx, "vault", "True", "InstallSucceeded").await?;
    wait_config(&ctx, "vault-config", "passwordSha256", &sha256_hex(password)).await?;

    // Changing the Secret re-applies the release without touching the ApplicationInstance: the
    // app controller does not read Secrets, helm-controller watches those labelled
    // reconcile.fluxcd.io/watch=Enabled.
    let rotated = "r0tated-Pa55-do-not-log";
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vault-auth", "labels": {"reconcile.fluxcd.io/watch": "Enabled"}},
        "stringData": {"password": rotated}
    }))?;
    ctx.apply(&secret).await?;
    wait_config(&ctx, "vault-config", "passwordSha256", &sha256_hex(rotated)).await?;
    let after = wait_ready(&ctx, "vault", "True", "UpgradeSucceeded").await?;
    assert_eq!(
        after.metadata.generation, ready.metadata.generation,
        "no spec change was needed"
    );

    // Secret material appears nowhere we write: logs, events, conditions.
    let logs = controller.logs();
    assert!(
        logs.contains("vault"),
        "the controller log should mention the app (debug logging is on)"
    );
    let events = ctx
        .api::<k8s_openapi::api::core::v1::Event>()
        .list(&ListParams::default())
        .await?;
    let events = serde_json::to_string(&events.items)?;
    let status = serde_json::to_string(&after.status)?;
    for secret_value in [password, rotated] {
        assert!(!logs.contains(secret_value), "controller log contains secret material");
        assert!(!events.contains(secret_value), "an event contains secret material");
        assert!(!status.contains(secret_value), "status contains secret material");
    }
    Ok(())
}

#[tokio::test]
async fn upgrade_by_version_and_broken_upgrade_relays_flux_reasons() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-upgrade").await?;
    let claims = ReadyClaims::watch(&ctx).await?;
    let _controller = start_controller(&ctx, &[]).await?;

    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", serde_json::json!({}))).await?;
    wait_ready(&ctx, "shop", "True", "InstallSucceeded").await?;
    apply_app(&ctx, &app("shop", "demo-app", "0.2.0", serde_json::json!({}))).await?;
    let upgraded = wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.2.0").await?;
    // Neither the install nor the upgrade claimed Ready=True before its release showed.
    assert!(claims.assert_each_names_its_release(2).await >= 2);
    assert_eq!(
        upgraded
            .status
            .as_ref()
            .and_then(|s| s.deployed_chart_version.as_deref()),
        Some("0.2.0")
    );
    assert_eq!(
        config_value(&ctx, "shop-config", "chartVersion").await?.as_deref(),
        Some("0.2.0")
    );

    // A broken version with rollback remediation: Flux's reasons, verbatim, and the app keeps running.
    let mut broken = app("crm", "broken-app", "1.0.0", serde_json::json!({}));
    apply_app(&ctx, &broken).await?;
    wait_ready(&ctx, "crm", "True", "InstallSucceeded").await?;
    broken.spec.chart.version = Some("2.0.0".into());
    broken.spec.upgrade = Some(ReleaseActionSpec {
        remediation: Some(Remediation {
            retries: Some(1),
            strategy: Some(RemediationStrategy::Rollback),
            ..Default::default()
        }),
    });
    apply_app(&ctx, &broken).await?;
    let failed = wait_app(&ctx, "crm", "upgrade failed and remediated", RELEASE_TIMEOUT, |a| {
        condition(a, "Ready").is_some_and(|(s, _, _)| s == "False")
            && condition(a, "Remediated").is_some_and(|(s, r, _)| s == "True" && r == "RollbackSucceeded")
            && condition(a, "Reconciling").is_none()
            && a.status.as_ref().and_then(|s| s.deployed_chart_version.as_deref()) == Some("1.0.0")
    })
    .await?;
    let released = condition(&failed, "Released").expect("Released");
    assert_eq!((released.0.as_str(), released.1.as_str()), ("False", "UpgradeFailed"));
    assert!(
        released.2.contains("tls.key"),
        "Flux's message is relayed verbatim: {}",
        released.2
    );
    assert_eq!(
        failed.status.as_ref().and_then(|s| s.deployed_chart_version.as_deref()),
        Some("1.0.0")
    );
    let deploy = ctx.api::<Deployment>().get("crm").await?;
    assert!(
        deploy.status.and_then(|s| s.available_replicas).unwrap_or(0) >= 1,
        "the previous release keeps running"
    );
    Ok(())
}

#[tokio::test]
async fn suspend_holds_changes_until_resumed() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-suspend").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let mut blog = app("blog", "demo-app", "0.1.0", serde_json::json!({"greeting": "v1"}));
    apply_app(&ctx, &blog).await?;
    wait_ready(&ctx, "blog", "True", "InstallSucceeded").await?;

    blog.spec.suspend = true;
    blog.spec.values = Some(serde_json::json!({"greeting": "v2"}));
    apply_app(&ctx, &blog).await?;
    let suspended = wait_ready(&ctx, "blog", "True", "Suspended").await?;
    assert!(condition(&suspended, "Ready").unwrap().2.contains("spec.suspend"));
    // The engine object holds the change suspended: the HelmRelease carries the new values
    // and `spec.suspend`, so helm-controller does not act on it, and its history is still
    // the one install.
    let hr = e2e::get_json(&flux::helm_releases(&ctx), "blog")
        .await?
        .expect("the HelmRelease");
    assert_eq!(hr.pointer("/spec/suspend"), Some(&serde_json::json!(true)), "{hr}");
    assert_eq!(hr.pointer("/spec/values/greeting"), Some(&serde_json::json!("v2")));
    assert_eq!(
        hr.pointer("/status/history").and_then(|h| h.as_array()).map(Vec::len),
        Some(1),
        "one release, the install"
    );
    assert_eq!(
        config_value(&ctx, "blog-config", "greeting").await?.as_deref(),
        Some("v1"),
        "nothing applied while suspended"
    );

    blog.spec.suspend = false;
    apply_app(&ctx, &blog).await?;
    wait_config(&ctx, "blog-config", "greeting", "v2").await?;
    wait_ready(&ctx, "blog", "True", "UpgradeSucceeded").await?;
    Ok(())
}

#[tokio::test]
async fn depends_on_orders_installs() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-deps").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let mut frontend = app("frontend", "demo-app", "0.1.0", serde_json::json!({}));
    frontend.spec.depends_on = vec![ApplicationDependency {
        name: "database".into(),
        namespace: None,
    }];
    apply_app(&ctx, &frontend).await?;
    let waiting = wait_ready(&ctx, "frontend", "False", "DependencyNotFound").await?;
    assert!(condition(&waiting, "Ready").unwrap().2.contains("database"));
    assert!(
        flux::helm_releases(&ctx).get_opt("frontend").await?.is_none(),
        "nothing installed before its dependency exists"
    );

    apply_app(&ctx, &app("database", "demo-app", "0.1.0", serde_json::json!({}))).await?;
    let database = wait_deployed(&ctx, "database", "InstallSucceeded", "0.1.0").await?;
    let frontend = wait_deployed(&ctx, "frontend", "InstallSucceeded", "0.1.0").await?;
    let deployed_at = |a: &ApplicationInstance| {
        a.status
            .as_ref()
            .and_then(|s| s.history.first())
            .and_then(|h| h.deployed_at.clone())
    };
    let (db, fe) = (
        deployed_at(&database).expect("db deployed"),
        deployed_at(&frontend).expect("fe deployed"),
    );
    assert!(
        fe.0 >= db.0,
        "frontend ({fe:?}) must be released after database ({db:?})"
    );
    let hr = serde_json::to_value(flux::helm_releases(&ctx).get("frontend").await?)?;
    assert_eq!(
        hr.pointer("/spec/dependsOn/0/name").and_then(|v| v.as_str()),
        Some("database")
    );
    Ok(())
}

#[tokio::test]
async fn deletion_uninstalls_the_release() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-delete").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("temp", "demo-app", "0.1.0", serde_json::json!({}))).await?;
    wait_ready(&ctx, "temp", "True", "InstallSucceeded").await?;
    let helm_secrets = ListParams::default().labels("owner=helm,name=temp");
    assert_eq!(
        ctx.api::<Secret>().list(&helm_secrets).await?.items.len(),
        1,
        "one Helm release Secret"
    );

    ctx.api::<ApplicationInstance>()
        .delete("temp", &DeleteParams::default())
        .await?;
    eventually(
        &ctx,
        "ApplicationInstance, HelmRelease and Helm release Secret gone",
        RELEASE_TIMEOUT,
        || async {
            let app = ctx.api::<ApplicationInstance>().get_opt("temp").await?;
            let hr = flux::helm_releases(&ctx).get_opt("temp").await?;
            let secrets = ctx.api::<Secret>().list(&helm_secrets).await?.items.len();
            let deploy = ctx.api::<Deployment>().get_opt("temp").await?;
            Ok(if app.is_none() && hr.is_none() && secrets == 0 && deploy.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "app {} hr {} helm secrets {secrets} deployment {}",
                    app.is_some(),
                    hr.is_some(),
                    deploy.is_some()
                ))
            })
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn disallowed_target_namespace_is_refused() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-refuse").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let mut escape = app("escape", "demo-app", "0.1.0", serde_json::json!({}));
    escape.spec.target_namespace = Some("kube-system".into());
    apply_app(&ctx, &escape).await?;
    let refused = wait_ready(&ctx, "escape", "False", "NamespaceNotAllowed").await?;
    assert_eq!(
        condition(&refused, "Stalled").map(|c| c.1),
        Some("NamespaceNotAllowed".into())
    );
    assert!(condition(&refused, "Ready").unwrap().2.contains("kube-system"));
    assert!(
        flux::helm_releases(&ctx).get_opt("escape").await?.is_none(),
        "nothing materialised"
    );
    Ok(())
}

#[tokio::test]
async fn restart_mid_install_converges_without_duplicates() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-restart").await?;
    let mut controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("crash", "hook-app", "1.0.0", serde_json::json!({}))).await?;
    flux::wait_helm_release_exists(&ctx, "crash", RELEASE_TIMEOUT).await?;
    controller.kill().await?;

    let _controller = start_controller(&ctx, &[]).await?;
    wait_ready(&ctx, "crash", "True", "InstallSucceeded").await?;
    assert_eq!(
        flux::helm_releases(&ctx)
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        1
    );
    assert_eq!(
        flux::helm_repositories(&ctx)
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        1
    );
    let releases = ctx
        .api::<Secret>()
        .list(&ListParams::default().labels("owner=helm,name=crash"))
        .await?;
    assert_eq!(releases.items.len(), 1, "exactly one Helm revision");
    Ok(())
}

#[tokio::test]
async fn deleting_the_namespace_mid_install_never_wedges() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-nsdel").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    apply_app(&ctx, &app("doomed", "hook-app", "1.0.0", serde_json::json!({}))).await?;
    flux::wait_helm_release_exists(&ctx, "doomed", RELEASE_TIMEOUT).await?;

    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(ctx.client.clone());
    namespaces.delete(&ctx.namespace, &DeleteParams::default()).await?;
    eventually(&ctx, "namespace fully deleted", RELEASE_TIMEOUT, || async {
        Ok(match namespaces.get_opt(&ctx.namespace).await? {
            None => Ok(()),
            Some(ns) => Err(format!("phase {:?}", ns.status.and_then(|s| s.phase))),
        })
    })
    .await?;
    Ok(())
}

/// Source problems surface as `SourceReady=False` with the Flux source's own reason.
#[tokio::test]
async fn source_problems_surface_with_the_sources_reason() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-source").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let mut offline = app("offline", "demo-app", "0.1.0", serde_json::json!({}));
    if let Some(repo) = offline.spec.chart.repository.as_mut() {
        repo.url = "http://127.0.0.1:9".into(); // nothing listens there: unreachable
    }
    apply_app(&ctx, &offline).await?;
    apply_app(&ctx, &app("missing", "demo-app", "9.9.9", serde_json::json!({}))).await?;

    let charts = e2e::dynamic_api(
        &ctx.client,
        &ctx.namespace,
        "source.toolkit.fluxcd.io",
        "v1",
        "HelmChart",
        "helmcharts",
    );
    let chart_name = format!("{}-missing", ctx.namespace);
    for (app_name, source_api, source_name) in [
        (
            "offline",
            flux::helm_repositories(&ctx),
            flux::managed_source_name(&ctx, "offline").await?,
        ),
        ("missing", charts, chart_name),
    ] {
        let apps = ctx.api::<ApplicationInstance>();
        eventually(
            &ctx,
            &format!("{app_name}: SourceReady=False with the source's reason"),
            RELEASE_TIMEOUT,
            || async {
                let app = apps.get(app_name).await?;
                let source = e2e::get_json(&source_api, &source_name).await?;
                let source_ready = source.as_ref().and_then(|s| e2e::condition(s, "Ready"));
                // Ready follows once the HelmRelease reports on the same failure: poll for both.
                let ready = condition(&app, "Ready").map(|c| c.0);
                Ok(match (condition(&app, "SourceReady"), source_ready) {
                    (Some((status, reason, message)), Some((src_status, src_reason, src_message)))
                        if status == "False"
                            && src_status == "False"
                            && reason == src_reason
                            && message.contains(&src_message)
                            && ready.as_deref() == Some("False") =>
                    {
                        Ok(())
                    }
                    (ours, theirs) => Err(format!("ours {ours:?}, Ready {ready:?}, source {theirs:?}")),
                })
            },
        )
        .await?;
    }
    Ok(())
}

/// Tenant isolation (issue 14): an app in one namespace may not install into, take its chart
/// from, or depend on another namespace, even one in the allow-list, unless a cluster
/// administrator allowed the pair. Nothing is materialised for a refused app.
#[tokio::test]
async fn cross_namespace_references_are_refused_unless_the_pair_is_allowed() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-xns").await?;
    let other = TestContext::new("app-xns-other").await?;
    let allowed = format!("{},{}", ctx.namespace, other.namespace);
    let mut controller = start_controller(&ctx, &["--allowed-namespaces", &allowed]).await?;

    let mut into_other = app("into-other", "demo-app", "0.1.0", serde_json::json!({}));
    into_other.spec.target_namespace = Some(other.namespace.clone());
    let mut from_other = app("from-other", "demo-app", "0.1.0", serde_json::json!({}));
    from_other.spec.chart.repository = None;
    from_other.spec.chart.source_ref = Some(api::SourceReference {
        kind: api::SourceKind::HelmRepository,
        name: "private-charts".into(),
        namespace: Some(other.namespace.clone()),
    });
    let mut after_other = app("after-other", "demo-app", "0.1.0", serde_json::json!({}));
    after_other.spec.depends_on = vec![ApplicationDependency {
        name: "db".into(),
        namespace: Some(other.namespace.clone()),
    }];
    for (escape, field) in [
        (&into_other, "spec.targetNamespace"),
        (&from_other, "spec.chart.sourceRef.namespace"),
        (&after_other, "spec.dependsOn[0].namespace"),
    ] {
        apply_app(&ctx, escape).await?;
        let name = escape.name_any();
        let refused = wait_ready(&ctx, &name, "False", "NamespaceNotAllowed").await?;
        let message = condition(&refused, "Ready").map(|c| c.2).unwrap_or_default();
        assert!(
            message.starts_with(&format!("{field} {}", other.namespace))
                && message.contains("--allowed-namespace-pairs"),
            "{name}: {message}"
        );
        assert!(
            flux::helm_releases(&ctx).get_opt(&name).await?.is_none(),
            "{name}: nothing materialised"
        );
    }

    // The cluster administrator allows the pair: the same app now installs into the other namespace.
    controller.kill().await?;
    let pair = format!("{}={}", ctx.namespace, other.namespace);
    let _controller = start_controller(
        &ctx,
        &["--allowed-namespaces", &allowed, "--allowed-namespace-pairs", &pair],
    )
    .await?;
    wait_deployed(&ctx, "into-other", "InstallSucceeded", "0.1.0").await?;
    Ok(())
}

/// The names of the HelmRepositories of the test namespace, sorted.
async fn helm_repository_names(ctx: &TestContext) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = flux::helm_repositories(ctx)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|r| r.name_any())
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until the test namespace's HelmRepositories are exactly `want` (sorted).
async fn wait_helm_repositories(ctx: &TestContext, what: &str, want: &[&str]) -> anyhow::Result<()> {
    eventually(ctx, what, RELEASE_TIMEOUT, || async {
        let names = helm_repository_names(ctx).await?;
        Ok(if names == want {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        })
    })
    .await
}

/// ADR 0013: apps of a namespace with the same repository spec read from one HelmRepository;
/// it has no owner, each HelmRelease names it in a label, a release left on a per-app source
/// (as written before shared sources) moves to it and the old one is deleted, and the shared
/// source goes when the last release naming it does.
#[tokio::test]
async fn apps_of_a_namespace_share_one_chart_source_until_the_last_leaves() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-shared").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    for name in ["one", "two"] {
        apply_app(&ctx, &app(name, "demo-app", "0.1.0", serde_json::json!({}))).await?;
    }
    for name in ["one", "two"] {
        wait_ready(&ctx, name, "True", "InstallSucceeded").await?;
    }
    let shared = flux::managed_source_name(&ctx, "one").await?;
    assert_eq!(flux::managed_source_name(&ctx, "two").await?, shared);
    assert_eq!(
        helm_repository_names(&ctx).await?,
        std::slice::from_ref(&shared),
        "one source for both"
    );
    let source = flux::helm_repositories(&ctx).get(&shared).await?;
    assert_eq!(source.metadata.owner_references, None, "a shared source has no owner");
    assert_eq!(
        source.labels().get("app.kubernetes.io/component").map(String::as_str),
        Some("chart-source")
    );
    for name in ["one", "two"] {
        let release = flux::helm_releases(&ctx).get(name).await?;
        assert_eq!(
            release.labels().get("vworkspace.io/chart-source"),
            Some(&shared),
            "{name}"
        );
    }

    // A release left on a per-app HelmRepository of its app (what versions before shared
    // sources wrote) is moved back to the shared one, and the per-app one is deleted.
    let one = ctx.api::<ApplicationInstance>().get("one").await?;
    let owner = serde_json::json!([{
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance", "name": "one",
        "uid": one.uid(), "controller": true, "blockOwnerDeletion": true,
    }]);
    e2e::apply_dynamic(
        &ctx.client,
        &ctx.namespace,
        serde_json::json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
            "metadata": {"name": "one", "ownerReferences": owner},
            "spec": {"url": e2e::CHART_REPO, "interval": "1m"},
        }),
    )
    .await?;
    flux::helm_releases(&ctx)
        .patch(
            "one",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"chart": {"spec": {"sourceRef": {"name": "one"}}}}})),
        )
        .await?;
    wait_helm_repositories(&ctx, "the per-app HelmRepository deleted", &[shared.as_str()]).await?;
    let release = flux::helm_releases(&ctx).get("one").await?;
    assert_eq!(
        release.data.pointer("/spec/chart/spec/sourceRef/name"),
        Some(&serde_json::json!(shared)),
        "back on the shared source"
    );

    // Another repository spec (interval) is another source; the old one stays for "one".
    let mut two = app("two", "demo-app", "0.1.0", serde_json::json!({}));
    if let Some(repository) = two.spec.chart.repository.as_mut() {
        repository.interval = Some("2m".into());
    }
    apply_app(&ctx, &two).await?;
    let other = flux::managed_source_name(&ctx, "two").await?;
    assert_ne!(other, shared);
    let mut both = [shared.as_str(), other.as_str()];
    both.sort();
    wait_helm_repositories(&ctx, "two sources", &both).await?;

    // The last release naming a source takes it along.
    ctx.api::<ApplicationInstance>()
        .delete("one", &DeleteParams::default())
        .await?;
    wait_helm_repositories(&ctx, "the first source gone with its last user", &[other.as_str()]).await?;
    ctx.api::<ApplicationInstance>()
        .delete("two", &DeleteParams::default())
        .await?;
    wait_helm_repositories(&ctx, "no source left", &[]).await?;
    Ok(())
}

/// deploy/components/admission-finalizer: the finalizer is on the ApplicationInstance from
/// its creation (before any controller runs), the controller writes no finalizer patch of
/// its own, and deletion still uninstalls the release and lets the object go. The policy
/// is the shipped one; the binding is this test's, limited to its namespace, because tests
/// in the same cluster run applications with no app controller to remove a finalizer.
#[tokio::test]
async fn the_finalizer_set_at_admission_spares_the_controller_a_write() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-admfin").await?;
    let apps = ctx.api::<ApplicationInstance>();
    let admission = FinalizerAtAdmission::bind(
        &format!("e2e-{}", ctx.namespace),
        "e2e",
        serde_json::json!({"matchLabels": {"kubernetes.io/metadata.name": ctx.namespace}}),
        &apps,
        &app("probe", "demo-app", "0.1.0", serde_json::json!({})),
    )
    .await?;

    let created = apply_app(&ctx, &app("kept", "demo-app", "0.1.0", serde_json::json!({}))).await?;
    assert_eq!(created.finalizers(), ["vworkspace.io/app-controller"]);
    let _controller = start_controller(&ctx, &[]).await?;
    let ready = wait_ready(&ctx, "kept", "True", "InstallSucceeded").await?;
    let controller_updates: Vec<_> = ready
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.manager.as_deref() == Some("vworkspace-app-controller") && m.operation.as_deref() == Some("Update")
        })
        .collect();
    assert!(controller_updates.is_empty(), "{controller_updates:?}");

    apps.delete("kept", &DeleteParams::default()).await?;
    let helm_secrets = ListParams::default().labels("owner=helm,name=kept");
    eventually(
        &ctx,
        "ApplicationInstance, HelmRelease and Helm release gone",
        RELEASE_TIMEOUT,
        || async {
            let app = apps.get_opt("kept").await?;
            let hr = flux::helm_releases(&ctx).get_opt("kept").await?;
            let secrets = ctx.api::<Secret>().list(&helm_secrets).await?.items.len();
            Ok(if app.is_none() && hr.is_none() && secrets == 0 {
                Ok(())
            } else {
                Err(format!(
                    "app {} hr {} helm secrets {secrets}",
                    app.is_some(),
                    hr.is_some()
                ))
            })
        },
    )
    .await?;
    admission.remove().await?;
    Ok(())
}

/// The label several app controllers share a cluster by, in this test (ADR 0015).
const SHARD_LABEL: &str = "vworkspace.io/shard";

/// ADR 0015: two app controllers side by side, with different allow-lists, each acting only
/// on the ApplicationInstances its `--watch-label-selector` selects. The main instance watches
/// this namespace and selects apps without a shard label; the shard watches every namespace,
/// is allowed only the other one, and selects shard `b`. Without the selectors the shard
/// would refuse the main instance's app (`NamespaceNotAllowed`, over its `Ready=True`); with
/// them, that app's whole timeline shows no refusal, the shard's app installs in its
/// namespace, and an app labelled for the shard in this namespace gets the shard's refusal
/// alone (the main instance says nothing of it, and nothing is materialised).
#[tokio::test]
async fn two_app_controllers_side_by_side_act_only_on_what_they_select() -> anyhow::Result<()> {
    let ctx = TestContext::new("app-shards").await?;
    let other = TestContext::new("app-shards-b").await?;
    let main_selector = format!("!{SHARD_LABEL}");
    let _main = start_controller(&ctx, &["--watch-label-selector", &main_selector]).await?;
    let shard_selector = format!("{SHARD_LABEL}=b");
    let shard_log = format!("app-controller-shard-{}", other.namespace);
    let _shard = e2e::process::ControllerProcess::start(
        ctx.process_scope(),
        "app-controller",
        &shard_log,
        &[
            "--allowed-namespaces",
            &other.namespace,
            "--watch-label-selector",
            &shard_selector,
            "--insecure-repository-hosts",
            "127.0.0.1",
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[],
    )
    .await?;

    apply_app(&ctx, &app("main", "demo-app", "0.1.0", serde_json::json!({}))).await?;
    let timeline = e2e::apps::ReadyTimeline::watch(&ctx, "main").await?;
    wait_deployed(&ctx, "main", "InstallSucceeded", "0.1.0").await?;

    apply_app_for_shard(&other, "sharded", "b").await?;
    wait_deployed(&other, "sharded", "InstallSucceeded", "0.1.0").await?;

    apply_app_for_shard(&ctx, "stray", "b").await?;
    let refused = wait_ready(&ctx, "stray", "False", "NamespaceNotAllowed").await?;
    let message = condition(&refused, "Ready").map(|c| c.2).unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "namespace {} is not allowed (allowed namespaces: {})",
            ctx.namespace, other.namespace
        )
    );
    assert!(
        flux::helm_releases(&ctx).get_opt("stray").await?.is_none(),
        "stray: nothing materialised"
    );

    let main = wait_deployed(&ctx, "main", "InstallSucceeded", "0.1.0").await?;
    let steps = timeline.stop();
    let refusals: Vec<_> = steps
        .iter()
        .filter(|(_, reason, _)| reason.as_deref() == Some("NamespaceNotAllowed"))
        .collect();
    assert!(
        refusals.is_empty(),
        "the shard refused the main instance's app: {refusals:?} in {steps:?}"
    );
    assert_eq!(
        condition(&main, "Ready").map(|c| (c.0, c.1)),
        Some(("True".to_owned(), "InstallSucceeded".to_owned()))
    );
    Ok(())
}

/// Applies the demo app `name` labelled for shard `shard`.
async fn apply_app_for_shard(ctx: &TestContext, name: &str, shard: &str) -> anyhow::Result<()> {
    let body = serde_json::json!({
        "apiVersion": "vworkspace.io/v1alpha1", "kind": "ApplicationInstance",
        "metadata": {"name": name, "labels": {SHARD_LABEL: shard}},
        "spec": app(name, "demo-app", "0.1.0", serde_json::json!({})).spec,
    });
    ctx.api::<ApplicationInstance>()
        .patch(
            name,
            &kube::api::PatchParams::apply(e2e::FIELD_MANAGER).force(),
            &kube::api::Patch::Apply(&body),
        )
        .await?;
    Ok(())
}
