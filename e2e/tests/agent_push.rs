//! The connectivity agent in push mode, end to end: the test plays Odoo and calls the
//! agent's HTTPS endpoint (TLS with certificates generated here, a bearer token, and
//! client certificates when the agent asks for them). A pushed document becomes an
//! ApplicationInstance that Flux installs, its acknowledgement is pull mode's, and the
//! status endpoint reports it ready; a wrong or missing token is refused with 401 and
//! nothing is applied; the namespace allow-list refuses as in pull mode; with a client
//! CA, a client without a valid certificate fails the TLS handshake; a server certificate
//! renewed on disk is served without a restart. The token never
//! shows up in the agent's logs (debug level), metrics, Events or status ConfigMap.
//!
//! odoo-sim also plays the Odoo module's push side against the agent, as it plays the pull
//! side in `agent.rs`.
//!
//! The agent runs as its ServiceAccount with the deploy bundle's RBAC, like the other
//! controllers of the e2e suite, and without any control-plane URL: it makes no
//! outbound call.

use std::{collections::BTreeMap, sync::Mutex};

use api::ApplicationInstance;
use e2e::{
    TestContext,
    agent::{
        AGENT_TIMEOUT, PushAgent, PushPki, SimProcess, api_key, assert_never_leaked, push_call, start_push_agent,
        status_configmap, summary, wait_sim, work_dir,
    },
    apps::{RELEASE_TIMEOUT, app, start_controller},
    cluster_dir,
    deploy::{http_get, metric_sum},
};
use kube::Api;
use protocol::messages::{DocumentAck, DocumentOutcome, ObjectOutcome};
use serde_json::{Value, json};

fn app_spec(values: Value) -> Value {
    serde_json::to_value(app("x", "demo-app", "0.1.0", values).spec).expect("spec")
}

fn apply_body(revision: u64, applications: Value) -> Value {
    json!({"protocol_version": "1.0", "document": {
        "epoch": "odoo-e2e", "revision": revision, "applications": applications}})
}

fn token_file(ctx: &TestContext, tag: &str) -> anyhow::Result<(String, std::path::PathBuf)> {
    let token = api_key(tag);
    let path = work_dir(ctx)?.join(format!("push-token-{tag}"));
    std::fs::write(&path, &token)?;
    Ok((token, path))
}

/// Waits until the endpoint answers an authenticated full status (503 while the agent
/// lists the CRs), and returns it.
async fn wait_serving(
    ctx: &TestContext,
    client: &reqwest::Client,
    agent: &PushAgent,
    token: &str,
) -> anyhow::Result<Value> {
    e2e::eventually(ctx, "push endpoint serving", AGENT_TIMEOUT, || async {
        Ok(
            match push_call(client, &agent.url, "status", Some(token), &json!({"full": true})).await {
                Ok((200, v)) => Ok(v),
                Ok((status, v)) => Err(format!("HTTP {status}: {v}")),
                Err(e) => Err(format!("{e:#}")),
            },
        )
    })
    .await
}

#[tokio::test]
async fn a_pushed_document_becomes_a_ready_release_and_the_status_endpoint_reports_it() -> anyhow::Result<()> {
    let ctx = TestContext::new("push-ready").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let pki = PushPki::generate(&ctx)?;
    let (token, token_path) = token_file(&ctx, "push")?;
    let agent = start_push_agent(&ctx, &pki, &token_path, false, "").await?;
    let odoo = pki.client(None)?;
    let ns = ctx.namespace.as_str();
    let mut answers = Vec::new();

    let first = wait_serving(&ctx, &odoo, &agent, &token).await?;
    assert_eq!(first["agent"]["mode"], "push", "{first}");
    assert_eq!(first["allowed_namespaces"], json!([ns]));
    assert!(
        !first["cluster"]["uid"].as_str().unwrap_or_default().is_empty(),
        "{first}"
    );
    assert_eq!(first["full"], true);

    let body = apply_body(
        1,
        json!([{"namespace": ns, "name": "wiki",
        "spec": app_spec(json!({"greeting": "pushed"}))}]),
    );
    let (status, answer) = push_call(&odoo, &agent.url, "apply", Some(&token), &body).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["protocol_version"], protocol::PROTOCOL_VERSION.to_string());
    // Exactly the acknowledgement pull mode sends back.
    let ack: DocumentAck = serde_json::from_value(answer.clone())?;
    assert_eq!((ack.revision, ack.outcome), (1, DocumentOutcome::Applied));
    let wiki = &ack.objects[0];
    assert_eq!((wiki.name.as_str(), wiki.outcome), ("wiki", ObjectOutcome::Applied));
    let generation = wiki.generation.expect("generation");
    assert!(wiki.uid.is_some());
    answers.push(answer.clone());

    // Applied by the agent, under its field manager, with its label.
    let ai = ctx.api::<ApplicationInstance>().get("wiki").await?;
    assert_eq!(
        ai.metadata.labels.clone().unwrap_or_default()["app.kubernetes.io/managed-by"],
        "vworkspace-agent"
    );
    let managers: Vec<String> = ai
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.iter().any(|m| m == "vworkspace-agent"), "{managers:?}");

    // Odoo polls the changes (each is handed out once) until the release is ready.
    let latest: Mutex<BTreeMap<String, Value>> = Mutex::default();
    let ready = e2e::eventually(&ctx, "wiki reported ready", RELEASE_TIMEOUT, || {
        let (odoo, url, token, latest) = (&odoo, &agent.url, &token, &latest);
        async move {
            let (status, v) = push_call(odoo, url, "status", Some(token), &json!({"full": false})).await?;
            anyhow::ensure!(status == 200, "HTTP {status}: {v}");
            let mut latest = latest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for r in v["reports"].as_array().into_iter().flatten() {
                let key = format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default()
                );
                latest.insert(key, r.clone());
            }
            let wiki = latest.get("ApplicationInstance/wiki").cloned();
            Ok(match wiki {
                Some(r) if r["state"] == "ready" && r["observed_generation"].as_i64() >= Some(generation) => Ok(r),
                other => Err(format!("wiki: {other:?}")),
            })
        }
    })
    .await?;
    assert_eq!(ready["deployed_chart_version"], "0.1.0");
    assert_eq!(ready["managed_by_agent"], true);
    assert_eq!(ready["uid"].as_str(), wiki.uid.as_deref());

    // A full snapshot has it too; the same push again is acknowledged the same way.
    let (_, full) = push_call(&odoo, &agent.url, "status", Some(&token), &json!({"full": true})).await?;
    let reports = full["reports"].as_array().cloned().unwrap_or_default();
    assert!(
        reports.iter().any(|r| r["name"] == "wiki" && r["state"] == "ready"),
        "{full}"
    );
    assert_eq!(full["known"], json!({"epoch": "odoo-e2e", "revision": 1}));
    let (status, again) = push_call(&odoo, &agent.url, "apply", Some(&token), &body).await?;
    assert_eq!(status, 200);
    assert_eq!(again, answer, "a repeated push gets the same acknowledgement");
    answers.extend([full, again]);

    // The agent's condition: serving, in /readyz, metrics and its ConfigMap.
    http_get(&agent.agent.admin_addr, "/readyz").await?;
    let metrics = http_get(&agent.agent.admin_addr, "/metrics").await?;
    assert_eq!(
        metric_sum(&metrics, "vworkspace_agent_condition", &["reason=\"PushServing\""]),
        1.0
    );
    assert_eq!(
        metric_sum(&metrics, "vworkspace_agent_documents_total", &["outcome=\"applied\""]),
        1.0
    );
    assert!(
        metric_sum(
            &metrics,
            "vworkspace_agent_push_requests_total",
            &["endpoint=\"apply\"", "code=\"200\""]
        ) >= 2.0
    );
    let cm = status_configmap(&agent.agent.status_configmap)
        .await?
        .expect("status ConfigMap");
    assert_eq!(cm["condition"]["reason"], "PushServing", "{cm}");
    assert_eq!(cm["agent"]["mode"], "push", "{cm}");
    assert!(
        agent.agent.process.logs().contains("push endpoint listening"),
        "the start is on record"
    );

    assert_never_leaked(
        &ctx,
        &token,
        &agent.agent,
        &[("answers", serde_json::to_string(&answers)?)],
    )
    .await
}

#[tokio::test]
async fn push_without_valid_credentials_applies_nothing_and_the_allow_list_still_refuses() -> anyhow::Result<()> {
    let ctx = TestContext::new("push-auth").await?;
    let pki = PushPki::generate(&ctx)?;
    let (token, token_path) = token_file(&ctx, "push")?;
    let agent = start_push_agent(&ctx, &pki, &token_path, false, "").await?;
    let odoo = pki.client(None)?;
    let ns = ctx.namespace.as_str();
    let apps = ctx.api::<ApplicationInstance>();
    wait_serving(&ctx, &odoo, &agent, &token).await?;
    let mut answers = Vec::new();

    let sneaky = apply_body(
        1,
        json!([{"namespace": ns, "name": "sneaky", "spec": app_spec(json!({}))}]),
    );
    let wrong = api_key("wrong");
    for (what, t) in [("a wrong token", Some(wrong.as_str())), ("no token", None)] {
        let (status, err) = push_call(&odoo, &agent.url, "apply", t, &sneaky).await?;
        assert_eq!(status, 401, "{what}: {err}");
        assert_eq!(err["name"], "werkzeug.exceptions.Unauthorized", "{what}: {err}");
        let (status, _) = push_call(&odoo, &agent.url, "status", t, &json!({"full": true})).await?;
        assert_eq!(status, 401, "{what}: status too");
        answers.push(err);
    }
    assert!(
        apps.get_opt("sneaky").await?.is_none(),
        "nothing applied without a valid token"
    );

    // Broken bodies: a JSON error, nothing applied.
    let res = odoo
        .post(format!("{}/json/2/vworkspace.agent/apply", agent.url))
        .bearer_auth(&token)
        .body("{\"document\": ")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 400);
    let err: Value = serde_json::from_str(&res.text().await?)?;
    assert_eq!(err["name"], "werkzeug.exceptions.BadRequest", "{err}");

    // The cluster owner's allow-list, as in pull mode: a namespace and a target namespace
    // outside it are refused in the acknowledgement, and nothing is created there.
    let mut escape = app_spec(json!({}));
    escape["targetNamespace"] = json!("kube-system");
    let body = apply_body(
        2,
        json!([
            {"namespace": ns, "name": "kept", "spec": app_spec(json!({}))},
            {"namespace": "kube-system", "name": "intruder", "spec": app_spec(json!({}))},
            {"namespace": ns, "name": "escape", "spec": escape},
        ]),
    );
    let (status, ack) = push_call(&odoo, &agent.url, "apply", Some(&token), &body).await?;
    assert_eq!(status, 200, "{ack}");
    let outcomes: Vec<(String, String, String)> = ack["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["name"].as_str().unwrap_or_default().to_owned(),
                o["outcome"].as_str().unwrap_or_default().to_owned(),
                o["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want = |n: &str, o: &str, r: &str| (n.to_owned(), o.to_owned(), r.to_owned());
    assert_eq!(
        outcomes,
        [
            want("kept", "applied", ""),
            want("intruder", "refused", "NamespaceNotAllowed"),
            want("escape", "refused", "NamespaceNotAllowed"),
        ],
        "{ack}"
    );
    answers.push(ack);
    assert!(apps.get_opt("kept").await?.is_some());
    assert!(apps.get_opt("escape").await?.is_none());
    let kube_system = Api::<ApplicationInstance>::namespaced(ctx.client.clone(), "kube-system");
    assert!(kube_system.get_opt("intruder").await?.is_none());

    let metrics = http_get(&agent.agent.admin_addr, "/metrics").await?;
    assert_eq!(
        metric_sum(
            &metrics,
            "vworkspace_agent_push_requests_total",
            &["endpoint=\"apply\"", "code=\"401\""]
        ),
        2.0
    );
    // Refusals are logged, but at most one line per interval (each counting the lines it
    // stands for): a flood of bad tokens costs the log a line or two, the metrics count all.
    for _ in 0..50 {
        let (status, _) = push_call(&odoo, &agent.url, "status", Some(&wrong), &json!({"full": true})).await?;
        assert_eq!(status, 401);
    }
    let metrics = http_get(&agent.agent.admin_addr, "/metrics").await?;
    assert!(metric_sum(&metrics, "vworkspace_agent_push_requests_total", &["code=\"401\""]) >= 54.0);
    let logs = agent.agent.process.logs();
    assert!(logs.contains("invalid push token"), "the first refusal is logged");
    let lines = logs.matches("push request refused").count();
    assert!(
        (1..=4).contains(&lines),
        "55 refusals in a few seconds: {lines} log lines"
    );
    for t in [&token, &wrong] {
        assert_never_leaked(&ctx, t, &agent.agent, &[("answers", serde_json::to_string(&answers)?)]).await?;
    }
    Ok(())
}

#[tokio::test]
async fn with_a_client_ca_only_clients_with_a_valid_certificate_get_through() -> anyhow::Result<()> {
    let ctx = TestContext::new("push-mtls").await?;
    let pki = PushPki::generate(&ctx)?;
    let (token, token_path) = token_file(&ctx, "push")?;
    let agent = start_push_agent(&ctx, &pki, &token_path, true, "").await?;
    let odoo = pki.client(Some("client.pem"))?;
    let ns = ctx.namespace.as_str();
    let apps = ctx.api::<ApplicationInstance>();
    wait_serving(&ctx, &odoo, &agent, &token).await?;

    let body = apply_body(
        1,
        json!([{"namespace": ns, "name": "wiki", "spec": app_spec(json!({}))}]),
    );
    // No certificate, or one from another CA: the TLS handshake fails, no HTTP answer,
    // even with the right token.
    for (what, identity) in [
        ("no client certificate", None),
        ("another CA's certificate", Some("rogue.pem")),
    ] {
        let res = push_call(&pki.client(identity)?, &agent.url, "apply", Some(&token), &body).await;
        let err = res.expect_err(what);
        let chain = format!("{err:#}");
        assert!(!chain.contains("HTTP "), "{what}: no HTTP answer: {chain}");
    }
    assert!(apps.get_opt("wiki").await?.is_none(), "nothing applied");
    assert!(
        agent.agent.process.logs().contains("TLS handshake failed"),
        "refused handshakes are logged"
    );

    // A valid certificate does not replace the token; with both, the push is applied.
    let (status, err) = push_call(&odoo, &agent.url, "apply", None, &body).await?;
    assert_eq!(status, 401, "{err}");
    let (status, ack) = push_call(&odoo, &agent.url, "apply", Some(&token), &body).await?;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["objects"][0]["outcome"], "applied", "{ack}");
    assert!(apps.get_opt("wiki").await?.is_some());

    // The server certificate is renewed in place (as cert-manager renews a Secret): the
    // running agent serves the new one to new connections, and a client that trusts
    // only the old CA can no longer connect.
    std::fs::copy(pki.dir.join("server-ca.pem"), pki.dir.join("old-server-ca.pem"))?;
    pki.renew_server()?;
    let status = json!({"full": false});
    e2e::eventually(&ctx, "renewed certificate served", AGENT_TIMEOUT, || async {
        let renewed = pki.client(Some("client.pem"))?;
        Ok(
            match push_call(&renewed, &agent.url, "status", Some(&token), &status).await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
    })
    .await?;
    let old = pki.client_trusting("old-server-ca.pem", Some("client.pem"))?;
    let refused = push_call(&old, &agent.url, "status", Some(&token), &status).await;
    assert!(
        refused.is_err(),
        "the old CA no longer verifies the endpoint: {refused:?}"
    );
    assert!(
        agent.agent.process.logs().contains("TLS files changed"),
        "the reload is logged"
    );
    assert_never_leaked(
        &ctx,
        &token,
        &agent.agent,
        &[("answers", serde_json::to_string(&[err, ack])?)],
    )
    .await
}

/// odoo-sim playing the Odoo module's push side (its push target set to the agent's
/// endpoint, with the CA, a client certificate and the token): intent set in the
/// simulator is pushed at once and becomes a ready release, shown `ready` with pull
/// mode's summary; after an agent restart (its `known` lost) the simulator sees the new
/// instance, takes a full status and pushes the document again, and nothing changes;
/// a deletion intent deletes.
#[tokio::test]
async fn the_simulator_in_push_mode_drives_the_agent_like_the_odoo_module() -> anyhow::Result<()> {
    let ctx = TestContext::new("push-sim").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let pki = PushPki::generate(&ctx)?;
    let (token, token_path) = token_file(&ctx, "push")?;
    let agent = start_push_agent(&ctx, &pki, &token_path, true, "").await?;
    let sim = SimProcess::start(&ctx).await?;
    let push_path = format!("/sim/clusters/{}/push", sim.cluster);
    let target = |url: &str| {
        json!({"url": url, "token": token, "ca_file": pki.path("server-ca.pem"),
            "client_identity_file": pki.path("client.pem"), "poll_seconds": 1})
    };
    sim.admin("PUT", &push_path, Some(target(&agent.url))).await?;
    let ns = ctx.namespace.as_str();
    let apps = ctx.api::<ApplicationInstance>();

    let revision = sim
        .set_app(ns, "wiki", app_spec(json!({"greeting": "from the simulator"})))
        .await?;
    let ready = wait_sim(&ctx, &sim, "wiki ready", RELEASE_TIMEOUT, |v| {
        (summary(v, ns, "wiki")?["status"] == "ready").then(|| v.clone())
    })
    .await?;
    assert_eq!(ready["mode"], "push");
    assert_eq!(ready["agent"]["mode"], "push");
    assert_eq!(ready["push"]["known"]["revision"], revision);
    assert_eq!(ready["intent_acknowledged"], true);
    let ai = apps.get("wiki").await?;
    assert_eq!(
        ai.spec.values.as_ref().map(|v| v["greeting"].clone()),
        Some(json!("from the simulator"))
    );

    // Another agent takes over (a new endpoint and its own status ConfigMap here, so its
    // ledger starts empty: nothing known): the simulator pushes the same document again
    // after a full status; the release stays as it is. (A restart that keeps the ConfigMap
    // keeps `known`: after_a_restart_a_delayed_push_….)
    let applies = ready["push"]["applies"].as_u64().unwrap_or_default();
    let fulls = ready["resync"]["completed"].as_u64().unwrap_or_default();
    let generation = ai.metadata.generation;
    let mut first = agent;
    first.agent.process.kill().await?;
    let agent = start_push_agent(&ctx, &pki, &token_path, true, "-2").await?;
    sim.admin("PUT", &push_path, Some(target(&agent.url))).await?;
    wait_sim(&ctx, &sim, "re-pushed after the restart", AGENT_TIMEOUT, |v| {
        (v["push"]["applies"].as_u64() > Some(applies)
            && v["resync"]["completed"].as_u64() > Some(fulls)
            && v["push"]["known"]["revision"] == revision
            && summary(v, ns, "wiki")?["status"] == "ready")
            .then_some(())
    })
    .await?;
    assert_eq!(
        apps.get("wiki").await?.metadata.generation,
        generation,
        "nothing changed"
    );

    // Deletion by explicit intent.
    sim.delete_app(ns, "wiki").await?;
    wait_sim(&ctx, &sim, "wiki deleted", AGENT_TIMEOUT, |v| {
        (summary(v, ns, "wiki")?["status"] == "deleted").then_some(())
    })
    .await?;
    assert!(apps.get_opt("wiki").await?.is_none());
    let view = sim.view().await?;
    assert!(view["push"]["last_error"].is_null(), "{}", view["push"]);
    assert_never_leaked(
        &ctx,
        &token,
        &agent.agent,
        &[("simulator view", view.to_string()), ("simulator log", sim.logs())],
    )
    .await
}

/// The attack of review M7: connections opened and never completed (no TLS handshake) held
/// every one of the endpoint's slots for up to 20 s each. Now each client address holds at
/// most its share (`--push-max-connections-per-ip`, 8 by default): the attacker's extra
/// connections are closed at once, and Odoo, from another address, is served meanwhile.
#[tokio::test]
async fn a_client_holding_connections_open_cannot_lock_odoo_out() -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt as _;

    let ctx = TestContext::new("push-slots").await?;
    let pki = PushPki::generate(&ctx)?;
    let (token, token_path) = token_file(&ctx, "push")?;
    let agent = start_push_agent(&ctx, &pki, &token_path, false, "").await?;
    let odoo = pki.client(None)?;
    wait_serving(&ctx, &odoo, &agent, &token).await?;
    let addr: std::net::SocketAddr = agent.url.trim_start_matches("https://").parse()?;

    // The attacker: another loopback address, 80 connections (more than the endpoint's 64
    // slots), none of which ever sends a byte.
    let mut held = Vec::new();
    for _ in 0..80 {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind("127.0.0.2:0".parse()?)?;
        held.push(socket.connect(addr).await?);
    }
    // Those over the per-address limit are closed by the agent (end of stream at once);
    // the first ones stay open, waiting for a handshake.
    let mut closed = 0;
    for stream in &mut held {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(std::time::Duration::from_millis(200), stream.read(&mut buf)).await {
            closed += 1;
        }
    }
    assert!(
        closed >= 80 - 8,
        "connections beyond the per-address limit are closed: {closed} of 80"
    );

    // Odoo is served while the attacker holds its share, well within the handshake timeout.
    let started = std::time::Instant::now();
    let (status, answer) = push_call(&odoo, &agent.url, "status", Some(&token), &json!({"full": true})).await?;
    assert_eq!(status, 200, "{answer}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(held);
    Ok(())
}

/// A push token shorter than 32 bytes is a start-up error, which does not quote it.
#[tokio::test]
async fn a_short_push_token_is_refused_at_start() -> anyhow::Result<()> {
    let ctx = TestContext::new("push-short").await?;
    let pki = PushPki::generate(&ctx)?;
    let short = "short-Token-31-bytes-0123456789";
    assert_eq!(short.len(), 31);
    let path = work_dir(&ctx)?.join("push-token-short");
    std::fs::write(&path, short)?;
    if start_push_agent(&ctx, &pki, &path, false, "-short").await.is_ok() {
        anyhow::bail!("the agent started with a 31-byte push token");
    }
    // The whole log, not the error's tail: with RUST_BACKTRACE set, the backtrace after
    // the error line fills the tail.
    let log = std::fs::read_to_string(
        cluster_dir()
            .join("logs")
            .join(format!("agent-{}-short.log", ctx.namespace)),
    )?;
    assert!(
        log.contains("the push token is 31 bytes; at least 32 are required"),
        "{log}"
    );
    assert!(!log.contains(short), "the log does not quote the token: {log}");
    Ok(())
}

/// Issue 18, item 1: the acknowledgement ledger survives a SIGKILL. Revision 2 deletes an
/// Operation that revision 1 created; after the agent is killed and started again, a
/// delayed retry of revision 1 is refused as stale (409) instead of creating the Operation
/// a second time, a retry of revision 2 gets its recorded acknowledgement, and the epoch it
/// left is never entered again.
#[tokio::test]
async fn after_a_restart_a_delayed_push_of_an_older_document_cannot_run_an_operation_again() -> anyhow::Result<()> {
    use api::Operation;
    let ctx = TestContext::new("push-replay").await?;
    let pki = PushPki::generate(&ctx)?;
    let (token, token_path) = token_file(&ctx, "replay")?;
    let mut agent = start_push_agent(&ctx, &pki, &token_path, false, "-replay").await?;
    let odoo = pki.client(None)?;
    let ns = ctx.namespace.as_str();
    wait_serving(&ctx, &odoo, &agent, &token).await?;

    let deadline = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).to_string();
    // No engine runs here: the Operation is created and stays pending; what matters is
    // whether it is created at all.
    let once = json!({"type": "Backup", "applicationRef": {"name": "wiki"}, "requestId": "odoo-once-1",
        "deadline": deadline});
    let document = |epoch: &str, revision: u64, operations: Value, deletions: Value| {
        json!({"protocol_version": "1.0", "document": {"epoch": epoch, "revision": revision,
            "applications": [], "operations": operations, "deletions": deletions}})
    };
    let first = document(
        "odoo-e2e",
        1,
        json!([{"namespace": ns, "name": "once", "spec": once}]),
        json!([]),
    );
    let (status, answer) = push_call(&odoo, &agent.url, "apply", Some(&token), &first).await?;
    assert_eq!(status, 200, "{answer}");
    let ack: DocumentAck = serde_json::from_value(answer)?;
    assert_eq!(ack.objects[0].outcome, ObjectOutcome::Applied, "{ack:?}");
    let uid = ack.objects[0].uid.clone().expect("uid");

    let second = document(
        "odoo-e2e",
        2,
        json!([]),
        json!([{"kind": "Operation", "namespace": ns, "name": "once", "uid": uid, "reason": "done"}]),
    );
    let (status, second_answer) = push_call(&odoo, &agent.url, "apply", Some(&token), &second).await?;
    assert_eq!(status, 200, "{second_answer}");
    assert_eq!(second_answer["objects"][0]["outcome"], "deleted", "{second_answer}");
    let operations = ctx.api::<Operation>();
    e2e::eventually(&ctx, "Operation once gone", AGENT_TIMEOUT, || async {
        Ok(match operations.get_opt("once").await? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        })
    })
    .await?;

    // SIGKILL: nothing flushed at exit. The next process reads the ledger back.
    agent.agent.process.kill().await?;
    let agent = start_push_agent(&ctx, &pki, &token_path, false, "-replay").await?;
    let serving = wait_serving(&ctx, &odoo, &agent, &token).await?;
    assert_eq!(
        serving["known"],
        json!({"epoch": "odoo-e2e", "revision": 2}),
        "{serving}"
    );

    let (status, refused) = push_call(&odoo, &agent.url, "apply", Some(&token), &first).await?;
    assert_eq!(
        status, 409,
        "a delayed retry of revision 1 after the restart: {refused}"
    );
    assert!(
        operations.get_opt("once").await?.is_none(),
        "the Operation was not created a second time"
    );
    let (status, again) = push_call(&odoo, &agent.url, "apply", Some(&token), &second).await?;
    assert_eq!(
        (status, &again),
        (200, &second_answer),
        "a retry of revision 2 gets its recorded acknowledgement"
    );

    // A new epoch is taken; the one it replaced is never entered again.
    let (status, answer) = push_call(
        &odoo,
        &agent.url,
        "apply",
        Some(&token),
        &document("odoo-e2e-2", 1, json!([]), json!([])),
    )
    .await?;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = push_call(
        &odoo,
        &agent.url,
        "apply",
        Some(&token),
        &document(
            "odoo-e2e",
            3,
            json!([{"namespace": ns, "name": "once", "spec": once}]),
            json!([]),
        ),
    )
    .await?;
    assert_eq!(status, 409, "the old epoch is stale: {answer}");
    assert!(operations.get_opt("once").await?.is_none());
    let cm = status_configmap(&agent.agent.status_configmap)
        .await?
        .expect("status ConfigMap");
    assert_eq!(cm["condition"]["reason"], "PushServing", "{cm}");
    Ok(())
}
