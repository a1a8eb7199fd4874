//! Helpers for the agent tests: the control-plane simulator (`odoo-sim`) and the agent as
//! processes, the simulator's admin API, and waits on what the simulator has received.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{TestContext, cluster_dir, deploy::free_port, eventually, process::ControllerProcess};

/// How long the agent may take to carry intent and status across (a few sync intervals).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A running simulator, with the cluster record `cluster` and its API key.
pub struct SimProcess {
    process: Option<ControllerProcess>,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The cluster record name.
    pub cluster: String,
    /// File holding the valid API key.
    pub key_file: PathBuf,
    /// The valid API key (for leak checks).
    pub key: String,
    state_file: PathBuf,
    port: u16,
    log_name: String,
    restarts: u32,
}

/// A test's working directory under the cluster dir.
pub fn work_dir(ctx: &TestContext) -> anyhow::Result<PathBuf> {
    let dir = cluster_dir().join("agent-e2e").join(&ctx.namespace);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A random-looking API key, distinctive enough to grep for.
pub fn api_key(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("vwsk{tag}{nanos:x}4f1d9c0b7e")
}

impl SimProcess {
    /// Starts a simulator on a free port with one cluster record named after the test.
    pub async fn start(ctx: &TestContext) -> anyhow::Result<Self> {
        let dir = work_dir(ctx)?;
        let key = api_key("good");
        let key_file = dir.join("api-key");
        std::fs::write(&key_file, &key)?;
        let state_file = dir.join("sim-state.json");
        let _ = std::fs::remove_file(&state_file);
        let port = free_port()?;
        let mut sim = Self {
            process: None,
            url: format!("http://127.0.0.1:{port}"),
            cluster: format!("cluster-{}", ctx.namespace),
            key_file,
            key,
            state_file,
            port,
            log_name: format!("odoo-sim-{}", ctx.namespace),
            restarts: 0,
        };
        sim.spawn().await?;
        Ok(sim)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let listen = format!("127.0.0.1:{}", self.port);
        let state = self.state_file.to_string_lossy().into_owned();
        let key_file = self.key_file.to_string_lossy().into_owned();
        let log_name = if self.restarts == 0 {
            self.log_name.clone()
        } else {
            format!("{}-{}", self.log_name, self.restarts)
        };
        let process = ControllerProcess::start(
            "odoo-sim",
            &log_name,
            &[
                "serve",
                "--listen",
                &listen,
                "--state-file",
                &state,
                "--cluster",
                &self.cluster,
                "--api-key-file",
                &key_file,
                "--offline-after-seconds",
                "20",
            ],
            &[("RUST_LOG", "info")],
        )
        .await?;
        self.process = Some(process);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if http(&self.url, "GET", "/sim/health", None).await.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("odoo-sim did not answer on {} within 20s", self.url);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the simulator (SIGKILL): the agent sees connection errors.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut p) = self.process.take() {
            p.kill().await?;
        }
        Ok(())
    }

    /// Starts it again on the same port with the same state file.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        self.restarts += 1;
        self.spawn().await
    }

    /// Everything the simulator logged (all runs).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for i in 0..=self.restarts {
            let name = if i == 0 {
                self.log_name.clone()
            } else {
                format!("{}-{i}", self.log_name)
            };
            out.push_str(
                &std::fs::read_to_string(cluster_dir().join("logs").join(format!("{name}.log"))).unwrap_or_default(),
            );
        }
        out
    }

    /// An admin call; returns the JSON answer.
    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let (status, text) = http(&self.url, method, path, body).await?;
        anyhow::ensure!((200..300).contains(&status), "{method} {path}: HTTP {status}: {text}");
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn cluster_path(&self, rest: &str) -> String {
        format!("/sim/clusters/{}{rest}", self.cluster)
    }

    /// The cluster record as the simulator sees it (reports, acks, per-object summary).
    pub async fn view(&self) -> anyhow::Result<Value> {
        self.admin("GET", &self.cluster_path(""), None).await
    }

    /// Sets a desired ApplicationInstance; returns the new revision.
    pub async fn set_app(&self, namespace: &str, name: &str, spec: Value) -> anyhow::Result<u64> {
        let v = self
            .admin(
                "PUT",
                &self.cluster_path(&format!("/applications/{namespace}/{name}")),
                Some(spec),
            )
            .await?;
        v["revision"].as_u64().context("revision")
    }

    /// Removes a desired ApplicationInstance and adds a deletion intent.
    pub async fn delete_app(&self, namespace: &str, name: &str) -> anyhow::Result<u64> {
        let v = self
            .admin(
                "DELETE",
                &self.cluster_path(&format!("/applications/{namespace}/{name}")),
                None,
            )
            .await?;
        v["revision"].as_u64().context("revision")
    }

    /// Sets a desired Operation.
    pub async fn set_op(&self, namespace: &str, name: &str, spec: Value) -> anyhow::Result<u64> {
        let v = self
            .admin(
                "PUT",
                &self.cluster_path(&format!("/operations/{namespace}/{name}")),
                Some(spec),
            )
            .await?;
        v["revision"].as_u64().context("revision")
    }

    /// Sends this raw document from now on (`null` to stop).
    pub async fn set_document(&self, raw: Value) -> anyhow::Result<u64> {
        let v = self.admin("PUT", &self.cluster_path("/document"), Some(raw)).await?;
        v["revision"].as_u64().context("revision")
    }

    /// Empties the intent (no deletion entries): the next document is empty.
    pub async fn reset_intent(&self) -> anyhow::Result<u64> {
        let v = self.admin("POST", &self.cluster_path("/reset-intent"), None).await?;
        v["revision"].as_u64().context("revision")
    }
}

/// The acknowledgement of `revision` in a cluster view.
pub fn ack_of(view: &Value, revision: u64) -> Option<&Value> {
    view["acks"]
        .as_array()?
        .iter()
        .rev()
        .find(|a| a["revision"].as_u64() == Some(revision))
}

/// The acknowledgement of one object in the ack of `revision`.
pub fn object_ack<'a>(view: &'a Value, revision: u64, namespace: &str, name: &str) -> Option<&'a Value> {
    ack_of(view, revision)?["objects"]
        .as_array()?
        .iter()
        .find(|o| o["namespace"] == namespace && o["name"] == name)
}

/// The report of `Kind/namespace/name` in a cluster view.
pub fn report<'a>(view: &'a Value, kind: &str, namespace: &str, name: &str) -> Option<&'a Value> {
    view["reports"].get(format!("{kind}/{namespace}/{name}"))?.get("report")
}

/// The per-object summary of an intent object.
pub fn summary<'a>(view: &'a Value, namespace: &str, name: &str) -> Option<&'a Value> {
    view["objects"]
        .as_array()?
        .iter()
        .find(|o| o["namespace"] == namespace && o["name"] == name)
}

/// Polls the simulator's view until `check` returns `Some`.
pub async fn wait_sim<T>(
    ctx: &TestContext,
    sim: &SimProcess,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Value) -> Option<T>,
) -> anyhow::Result<T> {
    eventually(ctx, &format!("simulator: {what}"), timeout, || {
        let check = &check;
        async move {
            let view = sim.view().await?;
            Ok(match check(&view) {
                Some(t) => Ok(t),
                None => Err(compact(&view)),
            })
        }
    })
    .await
}

fn compact(view: &Value) -> String {
    let objects: Vec<String> = view["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| format!("{}/{}={}", o["namespace"], o["name"], o["status"]))
        .collect();
    let acks: Vec<String> = view["acks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| format!("r{}:{}({})", a["revision"], a["outcome"], a["reason"]))
        .collect();
    format!(
        "cursor {}, last_seen {}, syncs {}, objects [{}], acks [{}], reports {}",
        view["cursor"],
        view["last_seen"],
        view["syncs"],
        objects.join(", "),
        acks.join(", "),
        view["reports"].as_object().map(|r| r.len()).unwrap_or_default()
    )
}

/// A running agent and its admin address.
pub struct AgentProcess {
    /// The process.
    pub process: ControllerProcess,
    /// `127.0.0.1:<port>` of `/livez`, `/readyz`, `/metrics`.
    pub admin_addr: String,
    /// Name of its status ConfigMap in `vworkspace-system`.
    pub status_configmap: String,
    /// `http://127.0.0.1:<port>` of its gRPC status channel (the controllers'
    /// `--status-channel-endpoint`).
    pub status_channel: String,
}

/// Starts an agent for the test namespace against `sim`, with the key in `key_file`.
pub async fn start_agent(
    ctx: &TestContext,
    sim: &SimProcess,
    key_file: &std::path::Path,
    tag: &str,
    extra: &[&str],
) -> anyhow::Result<AgentProcess> {
    let admin_addr = format!("127.0.0.1:{}", free_port()?);
    let channel_addr = format!("127.0.0.1:{}", free_port()?);
    let status_configmap = format!("agent-status-{}{tag}", ctx.namespace);
    let key = key_file.to_string_lossy().into_owned();
    let mut args = vec![
        "--control-plane-url",
        sim.url.as_str(),
        "--insecure-allow-http",
        "--api-key-file",
        key.as_str(),
        "--cluster-name",
        sim.cluster.as_str(),
        "--watch-namespace",
        ctx.namespace.as_str(),
        "--allowed-namespaces",
        ctx.namespace.as_str(),
        "--admin-addr",
        admin_addr.as_str(),
        "--sync-interval",
        "2s",
        "--request-timeout",
        "3s",
        "--max-backoff",
        "4s",
        "--status-configmap",
        status_configmap.as_str(),
        "--status-channel-addr",
        channel_addr.as_str(),
    ];
    args.extend_from_slice(extra);
    let process = ControllerProcess::start(
        "agent",
        &format!("agent-{}{tag}", ctx.namespace),
        &args,
        &[
            ("POD_NAMESPACE", crate::deploy::SYSTEM_NAMESPACE),
            // Debug everywhere, HTTP and TLS libraries included: the leak test is only as
            // strong as what gets logged.
            ("RUST_LOG", "debug,tower=info,h2=info"),
        ],
    )
    .await?;
    Ok(AgentProcess {
        process,
        admin_addr,
        status_configmap,
        status_channel: format!("http://{channel_addr}"),
    })
}

/// Minimal HTTP/1.1 request on loopback; returns (status, body).
pub async fn http(base: &str, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<(u16, String)> {
    let addr = base.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A Runbook Operation spec on `app` running `command`.
pub fn runbook_spec(app: &str, request_id: &str, command: &str) -> Value {
    json!({
        "type": "Runbook",
        "applicationRef": {"name": app},
        "requestId": request_id,
        "runbook": {"job": {"backoffLimit": 0, "template": {"spec": {"containers": [
            {"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", command]}]}}}}
    })
}
