//! The connectivity agent: the cluster side of the vWorkspace control-plane protocol
//! (`crates/protocol`, `docs/connectivity/`), in pull mode (the default: the agent calls
//! Odoo) or push mode (opt-in: Odoo calls the agent).
//!
//! * [`client`]: JSON-2 calls to Odoo over HTTPS (timeouts, size cap, CA bundle, proxies).
//! * [`apply`]: "apply this desired-state document, return its acknowledgement", the one
//!   apply path for pull mode and push mode.
//! * [`status`]: status rebuilt from the CRs (watches, relists) and the hook of the gRPC
//!   status channel ([`status::StatusHint`]).
//! * [`sync`]: the loop: register, then sync with backoff and jitter.
//! * [`push`]: push mode's authenticated HTTPS endpoint (same document, same
//!   acknowledgements, same apply path).
//! * [`health`]: the agent's own condition, on `/readyz`, in metrics and in a ConfigMap.
//! * [`ledger_store`]: `known`, retired epochs and undelivered acknowledgements, kept in
//!   that ConfigMap across restarts and leader changes.
//! * [`credentials`]: the API key, from a file or a Secret, always [`controller_kit::Redacted`].
//! * [`run`]: wires it all for `main`.

pub mod apply;
pub mod channel;
pub mod channel_auth;
pub mod cli;
pub mod client;
pub mod credentials;
pub mod health;
pub mod ledger_store;
pub mod push;
pub mod status;
pub mod sync;

use std::sync::Arc;

use anyhow::Context as _;
use controller_kit::CancellationToken;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use protocol::{
    backoff::Backoff,
    messages::{AgentInfo, AgentMode, ClusterIdentity},
};
use tokio::sync::{Notify, mpsc};

use crate::{
    apply::KubeCluster,
    cli::AgentArgs,
    client::{ClientConfig, ControlPlaneClient},
    credentials::CredentialSource,
    health::{AgentMetrics, Health},
    push::{PushServer, PushState, TokenCache},
    status::{SharedStatus, StatusHint},
    sync::{SyncLoop, SyncSettings},
};

/// Capacity of the status-hint channel (the status channel's events).
pub const HINT_BUFFER: usize = 1024;

/// The cluster's stable identity: the `kube-system` namespace's UID. Retried with backoff
/// (the API server may not be reachable yet).
pub async fn cluster_uid(client: &Client, shutdown: &CancellationToken) -> Option<String> {
    let api: Api<Namespace> = Api::all(client.clone());
    let backoff = Backoff::default();
    let mut attempt = 0;
    loop {
        match api.get("kube-system").await {
            Ok(ns) => {
                if let Some(uid) = ns.metadata.uid {
                    return Some(uid);
                }
                tracing::error!("namespace kube-system has no uid");
            }
            Err(e) => tracing::error!(error = %e, "cannot read namespace kube-system (the cluster identity)"),
        }
        let delay = backoff.delay(attempt, fastrand::f64());
        attempt += 1;
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return None,
        }
    }
}

/// Handles `main` passes in: controller-kit's runtime (client, leader gate, metrics,
/// `/readyz`, shutdown signal).
pub use controller_kit::Runtime;

/// How intent reaches this agent.
enum Inbound {
    Pull(ControlPlaneClient, CredentialSource),
    Push(PushSetup),
}

/// Push mode's endpoint, bound, and where its token comes from.
struct PushSetup {
    server: PushServer,
    token: CredentialSource,
    client_certificates: bool,
}

fn pull_setup(args: &AgentArgs, own_namespace: &str) -> anyhow::Result<(ControlPlaneClient, CredentialSource)> {
    let client = ControlPlaneClient::new(&ClientConfig {
        url: args.control_plane_url.clone().unwrap_or_default(),
        database: args.database.clone(),
        timeout: args.request_timeout,
        max_response_bytes: args.max_response_size,
        ca_bundle: args.ca_bundle.clone(),
        insecure_allow_http: args.insecure_allow_http,
    })
    .context("configuring the control plane client")?;
    if args.insecure_allow_http && client.base_url().starts_with("http://") {
        tracing::warn!(
            url = client.base_url(),
            "plain http to the control plane (--insecure-allow-http): for development only"
        );
    }
    let credentials = match (&args.api_key_file, &args.credentials_secret) {
        (Some(path), _) => CredentialSource::File(path.clone()),
        (None, Some(name)) => CredentialSource::Secret {
            namespace: own_namespace.to_owned(),
            name: name.clone(),
            key: args.credentials_secret_key.clone(),
        },
        (None, None) => anyhow::bail!("set --api-key-file or --credentials-secret"),
    };
    Ok((client, credentials))
}

async fn push_setup(args: &AgentArgs, own_namespace: &str) -> anyhow::Result<PushSetup> {
    let tls = match (&args.push_tls_cert, &args.push_tls_key) {
        (Some(cert), Some(key)) => Some(push::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.push_client_ca.clone(),
        }),
        _ => {
            tracing::warn!(
                addr = %args.push_addr,
                "push endpoint on plain http (--push-insecure-http): the token travels in clear; for development only"
            );
            None
        }
    };
    let token = match (&args.push_token_file, &args.push_token_secret) {
        (Some(path), _) => CredentialSource::File(path.clone()),
        (None, Some(name)) => CredentialSource::Secret {
            namespace: own_namespace.to_owned(),
            name: name.clone(),
            key: args.push_token_secret_key.clone(),
        },
        (None, None) => anyhow::bail!("set --push-token-file or --push-token-secret"),
    };
    if args.control_plane_url.is_some() {
        tracing::info!("--control-plane-url is ignored in push mode: the agent makes no outbound call");
    }
    let server = PushServer::bind(args.push_addr, tls)
        .await
        .context("setting up the push endpoint")?
        .with_connections_per_ip(args.push_max_connections_per_ip);
    Ok(PushSetup {
        server,
        token,
        client_certificates: args.push_client_ca.is_some(),
    })
}

/// Runs the agent until shutdown.
pub async fn run(args: AgentArgs, rt: Runtime) -> anyhow::Result<()> {
    args.validate()?;
    let scope = args.common.watch_scope()?;
    let own_namespace = args
        .common
        .lease_namespace
        .clone()
        .unwrap_or_else(|| rt.client.default_namespace().to_owned());
    let status_clients = channel_auth::allowed_users(&args.status_channel_clients, &own_namespace)
        .map_err(|e| anyhow::anyhow!("--status-channel-clients: {e}"))?;
    // Pull needs the control plane's client and key; push a bound endpoint and a token.
    // Both are set up before anything else, so a wrong flag or file fails the start.
    let inbound = match args.mode {
        AgentMode::Push => Inbound::Push(push_setup(&args, &own_namespace).await?),
        _ => {
            let (client, credentials) = pull_setup(&args, &own_namespace)?;
            Inbound::Pull(client, credentials)
        }
    };

    // A push token that can be read must be long enough to start; one that cannot be read
    // yet is waited for (every request refused until then, as before).
    if let Inbound::Push(setup) = &inbound
        && let Ok(token) = setup.token.load(&rt.client).await
        && let Some(short) = push::limits::token_too_short(token.expose())
    {
        anyhow::bail!("{short} ({})", setup.token);
    }

    let Some(uid) = cluster_uid(&rt.client, &rt.shutdown).await else {
        return Ok(());
    };
    let identity = ClusterIdentity {
        uid,
        name: args.cluster_name.clone(),
    };
    let agent = AgentInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        instance: args.common.identity.clone(),
        mode: args.mode,
        started_at: Timestamp::now(),
    };
    let (endpoint_key, endpoint) = match &inbound {
        Inbound::Pull(client, credentials) => {
            tracing::info!(
                cluster_uid = %identity.uid,
                cluster_name = %identity.name,
                control_plane = client.base_url(),
                credentials = %credentials,
                policy = %scope.policy(),
                "starting the agent (pull mode)"
            );
            ("controlPlane", client.base_url().to_owned())
        }
        Inbound::Push(setup) => {
            tracing::info!(
                cluster_uid = %identity.uid,
                cluster_name = %identity.name,
                endpoint = %setup.server.url(),
                token = %setup.token,
                client_certificates = setup.client_certificates,
                policy = %scope.policy(),
                "starting the agent (push mode: no outbound call; Odoo calls the endpoint)"
            );
            ("pushEndpoint", setup.server.url())
        }
    };

    let ledger_store = ledger_store::LedgerStore::new(rt.client.clone(), &own_namespace, &args.status_configmap);
    let health = Health::new(
        rt.readiness.clone(),
        AgentMetrics::register(&rt.metrics),
        Some((rt.client.clone(), own_namespace, args.status_configmap.clone())),
        serde_json::json!({
            "clusterUid": identity.uid,
            "clusterName": identity.name,
            "instance": agent.instance,
            "mode": agent.mode,
            endpoint_key: endpoint,
        }),
    );
    let status = SharedStatus::new();
    let resync_wanted = Arc::new(Notify::new());
    let mut tasks = controller_kit::tasks::Background::new();
    for watch in status::spawn_watches(rt.client.clone(), scope.clone(), status.clone(), rt.shutdown.clone()) {
        tasks.adopt("status watch", watch);
    }
    if let Some(addr) = args.status_channel_addr.0 {
        let (hint_tx, hints) = mpsc::channel::<StatusHint>(HINT_BUFFER);
        let auth = channel_auth::TokenReviewAuth::new(
            rt.client.clone(),
            args.status_channel_audience.clone(),
            status_clients,
            &rt.metrics,
        );
        // Not critical: without the channel (it could not bind, say), status still flows
        // through the watches; the server says so itself, and a panic is logged here.
        for server in channel::spawn(addr, Arc::new(auth), hint_tx, &rt.metrics, rt.shutdown.clone()) {
            tokio::spawn(controller_kit::tasks::join_logged("status channel", server));
        }
        tasks.spawn(
            "status hint consumer",
            status::consume_hints(
                rt.client.clone(),
                scope.clone(),
                status.clone(),
                hints,
                resync_wanted.clone(),
                rt.shutdown.clone(),
            ),
        );
    }

    let recorder = kube::runtime::events::Recorder::new(
        rt.client.clone(),
        kube::runtime::events::Reporter {
            controller: "vworkspace-agent".into(),
            instance: Some(args.common.identity.clone()),
        },
    );
    let background_failure = match inbound {
        Inbound::Pull(client, credentials) => {
            let sync = SyncLoop {
                client,
                credentials,
                kube: rt.client.clone(),
                cluster: KubeCluster::new(rt.client.clone()),
                scope,
                identity,
                agent,
                status,
                resync_wanted,
                health,
                gate: rt.gate,
                recorder: Some(recorder),
                ledger_store: Some(ledger_store),
                settings: SyncSettings {
                    interval: args.sync_interval,
                    report_delay: args.report_delay,
                    batch_size: args.report_batch_size as usize,
                    full_resync_interval: args.full_resync_interval,
                    backoff: Backoff {
                        max: args.max_backoff,
                        ..Backoff::default()
                    },
                },
            };
            supervise(sync.run(rt.shutdown.clone()), &mut tasks, &rt.shutdown).await
        }
        Inbound::Push(setup) => {
            let state = Arc::new(PushState {
                cluster: KubeCluster::new(rt.client.clone()),
                scope,
                identity,
                agent,
                status,
                health,
                gate: rt.gate,
                recorder: Some(recorder),
                token: TokenCache::new(setup.token, rt.client.clone()),
                max_body: args.push_max_body,
                batch_size: args.report_batch_size as usize,
                ledger: Default::default(),
                ledger_store: Some(ledger_store),
            });
            // The status channel's resync requests need no answer here: Odoo asks for a
            // full snapshot when it wants one.
            drop(resync_wanted);
            supervise(
                push::run(state, setup.server, rt.shutdown.clone()),
                &mut tasks,
                &rt.shutdown,
            )
            .await
        }
    };
    rt.shutdown.cancel();
    tasks.join_all().await;
    match background_failure {
        // The pod restarts clean rather than serve with, say, a status watch gone.
        Some(failure) => anyhow::bail!("stopping: {failure}"),
        None => Ok(()),
    }
}

/// Runs `main` until it returns; a background task ending first, other than at shutdown,
/// is a failure (logged and returned).
async fn supervise(
    main: impl std::future::Future<Output = ()>,
    tasks: &mut controller_kit::tasks::Background,
    shutdown: &CancellationToken,
) -> Option<String> {
    tokio::pin!(main);
    tokio::select! {
        () = &mut main => None,
        failure = tasks.ended() => {
            if shutdown.is_cancelled() {
                main.await;
                return None;
            }
            tracing::error!(task = %failure, "a background task ended while the agent runs; stopping so the pod restarts clean");
            Some(failure)
        }
    }
}
