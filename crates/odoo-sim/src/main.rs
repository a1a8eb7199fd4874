//! `odoo-sim`: a SIMULATOR of the Odoo control plane's side of the vWorkspace protocol
//! (not Odoo). `odoo-sim serve` runs it; the other subcommands drive its admin API.

use std::{future::IntoFuture as _, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use odoo_sim::{Sim, SimConfig};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// How long requests in flight may take to finish once a stop is asked.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Resolves on SIGTERM (how `hack/demo.sh`, the e2e harness and Kubernetes stop it) or
/// ctrl-c.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops gracefully"),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[derive(Parser)]
#[command(
    name = "odoo-sim",
    version,
    about = "A simulator of the Odoo control plane's side of the vWorkspace protocol (JSON-2), for tests, demos and \
             Odoo module authors. Not Odoo."
)]
struct Cli {
    /// Base URL of a running simulator (for every subcommand but `serve`).
    #[arg(long, env = "ODOO_SIM_URL", default_value = "http://127.0.0.1:8069", global = true)]
    url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the simulator.
    Serve {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:8069")]
        listen: SocketAddr,
        /// Keep state in this JSON file (loaded at start, saved soon after every change and
        /// at once on SIGTERM or ctrl-c).
        #[arg(long)]
        state_file: Option<PathBuf>,
        /// Create this cluster record at start (with --api-key-file) unless it exists.
        #[arg(long, requires = "api_key_file")]
        cluster: Option<String>,
        /// File holding the API key of --cluster.
        #[arg(long)]
        api_key_file: Option<PathBuf>,
        /// Require this X-Odoo-Database value when the header is sent.
        #[arg(long)]
        database: Option<String>,
        /// Suggest this sync interval (seconds) at registration.
        #[arg(long)]
        sync_interval_seconds: Option<u32>,
        /// Show an agent offline after this many seconds without a call.
        #[arg(long, default_value_t = 90)]
        offline_after_seconds: u64,
    },
    /// Create a cluster record and its API key.
    AddCluster {
        name: String,
        #[arg(long)]
        api_key_file: PathBuf,
    },
    /// Show a cluster record: intent, acknowledgements, reports, per-object summary.
    Show { cluster: String },
    /// Show every report a cluster's agent sent, in order, with its receive time.
    ReportLog {
        cluster: String,
        /// Only entries after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Show the calls, errors and bytes the simulator counted (per method, syncs at rest).
    Stats,
    /// Set a desired ApplicationInstance from a JSON spec file (`-` for stdin).
    SetApp {
        cluster: String,
        namespace: String,
        name: String,
        #[arg(long)]
        spec: PathBuf,
    },
    /// Remove a desired ApplicationInstance and ask for its deletion.
    DeleteApp {
        cluster: String,
        namespace: String,
        name: String,
    },
    /// Set a desired Operation from a JSON spec file (`-` for stdin).
    SetOp {
        cluster: String,
        namespace: String,
        name: String,
        #[arg(long)]
        spec: PathBuf,
    },
    /// Inject a fault: none, unavailable, server_error, malformed, hang:<seconds>, oversize:<bytes>,
    /// no_kwargs, committed_then_late:<seconds>, concurrent_insert, body_limit:<bytes>, drop_ack.
    Fault { mode: String },
    /// Push mode for a cluster: the simulator calls the agent's endpoint (apply on every
    /// intent change, status every --poll-seconds) instead of waiting for agent_sync.
    SetPush {
        cluster: String,
        /// The agent's endpoint, e.g. https://agent.example.com:8443.
        #[arg(long)]
        endpoint: String,
        /// File holding the push token.
        #[arg(long)]
        token_file: PathBuf,
        /// PEM CA of the agent's certificate (besides the system roots).
        #[arg(long)]
        ca_file: Option<PathBuf>,
        /// PEM client certificate and key, for an agent with --push-client-ca.
        #[arg(long)]
        client_identity_file: Option<PathBuf>,
        /// Seconds between two status calls.
        #[arg(long, default_value_t = odoo_sim::push::DEFAULT_POLL_SECONDS)]
        poll_seconds: u64,
    },
    /// Back to pull mode for a cluster.
    UnsetPush { cluster: String },
}

fn read_json(path: &PathBuf) -> anyhow::Result<Value> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    Ok(serde_json::from_str(&text)?)
}

async fn admin(url: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let mut req = client.request(method, format!("{}{path}", url.trim_end_matches('/')));
    if let Some(b) = body {
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&b)?);
    }
    let resp = req.send().await.with_context(|| format!("calling {url}"))?;
    let status = resp.status();
    let text = resp.text().await?;
    let pretty = serde_json::from_str::<Value>(&text)
        .map(|v| serde_json::to_string_pretty(&v).unwrap_or_default())
        .unwrap_or(text);
    println!("{pretty}");
    anyhow::ensure!(status.is_success(), "HTTP {status}");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    use reqwest::Method;
    match cli.command {
        Command::Serve {
            listen,
            state_file,
            cluster,
            api_key_file,
            database,
            sync_interval_seconds,
            offline_after_seconds,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
                )
                .init();
            let sim = Sim::new(SimConfig {
                state_file,
                database,
                sync_interval_seconds,
                offline_after: Duration::from_secs(offline_after_seconds),
            })?;
            if let (Some(name), Some(file)) = (cluster, api_key_file) {
                let key = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
                match sim.add_cluster(&name, key.trim()) {
                    Ok(()) => tracing::info!(cluster = %name, "cluster record created"),
                    Err(e) => tracing::info!(cluster = %name, "{e}; keeping the existing record"),
                }
            }
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            tracing::info!(addr = %listener.local_addr()?, "odoo-sim (a simulator of the vWorkspace control plane, not Odoo) listening");
            // Clusters given a push target are called from here.
            let pushing = tokio::spawn(odoo_sim::push::drive(sim.clone()));
            let stopping = Arc::new(Notify::new());
            let serving = axum::serve(listener, odoo_sim::router(sim.clone()))
                .with_graceful_shutdown({
                    let stopping = stopping.clone();
                    async move {
                        stop_signal().await;
                        stopping.notify_one();
                    }
                })
                .into_future();
            tokio::pin!(serving);
            tokio::select! {
                served = &mut serving => served?,
                () = stopping.notified() => {
                    // Requests in flight finish (their changes are then saved), but a
                    // hanging one (the `hang` fault) must not hold the exit.
                    match tokio::time::timeout(SHUTDOWN_GRACE, &mut serving).await {
                        Ok(served) => served?,
                        Err(_) => tracing::warn!("requests still in flight after {SHUTDOWN_GRACE:?}; stopping anyway"),
                    }
                }
            }
            pushing.abort();
            let _ = pushing.await;
            // The background writer may hold changes of the last moments: written now.
            sim.shutdown().await?;
            tracing::info!("odoo-sim stopped; state saved");
            Ok(())
        }
        Command::AddCluster { name, api_key_file } => {
            let key = std::fs::read_to_string(&api_key_file)?;
            admin(
                &cli.url,
                Method::POST,
                "/sim/clusters",
                Some(json!({"name": name, "api_key": key.trim()})),
            )
            .await
        }
        Command::Show { cluster } => admin(&cli.url, Method::GET, &format!("/sim/clusters/{cluster}"), None).await,
        Command::ReportLog { cluster, after } => {
            let path = format!("/sim/clusters/{cluster}/report-log?after={after}");
            admin(&cli.url, Method::GET, &path, None).await
        }
        Command::Stats => admin(&cli.url, Method::GET, "/sim/stats", None).await,
        Command::SetApp {
            cluster,
            namespace,
            name,
            spec,
        } => {
            let path = format!("/sim/clusters/{cluster}/applications/{namespace}/{name}");
            admin(&cli.url, Method::PUT, &path, Some(read_json(&spec)?)).await
        }
        Command::DeleteApp {
            cluster,
            namespace,
            name,
        } => {
            let path = format!("/sim/clusters/{cluster}/applications/{namespace}/{name}");
            admin(&cli.url, Method::DELETE, &path, None).await
        }
        Command::SetOp {
            cluster,
            namespace,
            name,
            spec,
        } => {
            let path = format!("/sim/clusters/{cluster}/operations/{namespace}/{name}");
            admin(&cli.url, Method::PUT, &path, Some(read_json(&spec)?)).await
        }
        Command::Fault { mode } => {
            let body = match mode.split_once(':') {
                Some(("hang", s)) => json!({"mode": "hang", "seconds": s.parse::<u64>()?}),
                Some(("oversize", b)) => json!({"mode": "oversize", "bytes": b.parse::<usize>()?}),
                Some(("committed_then_late", s)) => {
                    json!({"mode": "committed_then_late", "seconds": s.parse::<u64>()?})
                }
                Some(("body_limit", b)) => json!({"mode": "body_limit", "bytes": b.parse::<usize>()?}),
                _ => json!({"mode": mode}),
            };
            admin(&cli.url, Method::PUT, "/sim/fault", Some(body)).await
        }
        Command::SetPush {
            cluster,
            endpoint,
            token_file,
            ca_file,
            client_identity_file,
            poll_seconds,
        } => {
            let token =
                std::fs::read_to_string(&token_file).with_context(|| format!("reading {}", token_file.display()))?;
            let body = json!({"url": endpoint, "token": token.trim(), "ca_file": ca_file,
                "client_identity_file": client_identity_file, "poll_seconds": poll_seconds});
            admin(
                &cli.url,
                Method::PUT,
                &format!("/sim/clusters/{cluster}/push"),
                Some(body),
            )
            .await
        }
        Command::UnsetPush { cluster } => {
            admin(&cli.url, Method::DELETE, &format!("/sim/clusters/{cluster}/push"), None).await
        }
    }
}
