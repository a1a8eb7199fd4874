//! Helpers for the agent tests: the control-plane simulator (`odoo-sim`) and the agent as
//! processes, the simulator's admin API, and waits on what the simulator has received.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::{Api, api::ListParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{
    TestContext, cluster_dir, eventually,
    process::{ControllerProcess, free_loopback_addr, retry_address_race},
};

/// The `status.json` of an agent's status ConfigMap in `vworkspace-system`.
pub async fn status_configmap(name: &str) -> anyhow::Result<Option<Value>> {
    let cm = Api::<ConfigMap>::namespaced(crate::client().await?, crate::deploy::SYSTEM_NAMESPACE)
        .get_opt(name)
        .await?;
    Ok(cm
        .and_then(|c| c.data)
        .and_then(|d| d.get("status.json").cloned())
        .and_then(|s| serde_json::from_str(&s).ok()))
}

/// `secret`, or a 16-character part of it, must appear nowhere the agent writes: its log
/// (at debug level, HTTP and TLS libraries included, so the check means something), its
/// metrics, the test namespace's Events and its status ConfigMap; nor in `more` (what it
/// reported or answered).
pub async fn assert_never_leaked(
    ctx: &TestContext,
    secret: &str,
    agent: &AgentProcess,
    more: &[(&str, String)],
) -> anyhow::Result<()> {
    let logs = agent.process.logs();
    let metrics = crate::deploy::http_get(&agent.admin_addr, "/metrics").await?;
    let events: Vec<Event> = ctx.api::<Event>().list(&ListParams::default()).await?.items;
    let cm = status_configmap(&agent.status_configmap)
        .await?
        .map(|v| v.to_string())
        .unwrap_or_default();
    let mut places = vec![
        ("agent log", logs.clone()),
        ("metrics", metrics),
        ("events", serde_json::to_string(&events)?),
        ("status ConfigMap", cm),
    ];
    places.extend(more.iter().map(|(what, text)| (*what, text.clone())));
    for (what, text) in places {
        assert!(!text.is_empty() || what == "events", "{what}: nothing to check");
        assert!(!text.contains(secret), "the secret leaked into the {what}");
        assert!(
            !text.contains(&secret[4..20]),
            "a part of the secret leaked into the {what}"
        );
    }
    assert!(
        logs.contains("DEBUG"),
        "the agent logged at debug level, so the check means something"
    );
    Ok(())
}

/// How long the agent may take to carry intent and status across (a few sync intervals).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A running simulator, with the cluster record `cluster` and its API key.
pub struct SimProcess {
    process: Option<ControllerProcess>,
    /// `http://<host>:<port>` (`127.0.0.1` unless started with [`Self::start_on`]).
    pub url: String,
    /// The cluster record name.
    pub cluster: String,
    /// File holding the valid API key.
    pub key_file: PathBuf,
    /// The valid API key (for leak checks).
    pub key: String,
    state_file: PathBuf,
    /// The address it listens on (`127.0.0.1`, or e.g. the node IP for pods to reach it).
    host: String,
    port: u16,
    log_name: String,
    restarts: u32,
    /// The test's process scope (its waits watch the simulator too).
    scope: String,
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
    /// Starts a simulator on a free port with one cluster record named after the test
    /// (on another port if it lost the race for the first).
    pub async fn start(ctx: &TestContext) -> anyhow::Result<Self> {
        Self::start_on(ctx, "127.0.0.1").await
    }

    /// As [`Self::start`], listening on `host` (an address of the cluster's network
    /// namespace, e.g. the real node's IP, which its pods reach) with a port that is free on
    /// loopback (if another process holds it on `host`, the race is lost and retried).
    pub async fn start_on(ctx: &TestContext, host: &str) -> anyhow::Result<Self> {
        let dir = work_dir(ctx)?;
        let key = api_key("good");
        let key_file = dir.join("api-key");
        std::fs::write(&key_file, &key)?;
        let state_file = dir.join("sim-state.json");
        let _ = std::fs::remove_file(&state_file);
        let mut sim = Self {
            process: None,
            url: String::new(),
            cluster: format!("cluster-{}", ctx.namespace),
            key_file,
            key,
            state_file,
            host: host.to_owned(),
            port: 0,
            log_name: format!("odoo-sim-{}", ctx.namespace),
            restarts: 0,
            scope: ctx.process_scope().to_owned(),
        };
        retry_address_race(async || {
            let addr = free_loopback_addr()?;
            sim.port = addr.port();
            sim.url = format!("http://{}:{}", sim.host, sim.port);
            sim.spawn().await
        })
        .await?;
        Ok(sim)
    }

    /// Starts the process on `self.port` and waits until it answers.
    async fn spawn(&mut self) -> anyhow::Result<()> {
        let listen = format!("{}:{}", self.host, self.port);
        let state = self.state_file.to_string_lossy().into_owned();
        let key_file = self.key_file.to_string_lossy().into_owned();
        let log_name = if self.restarts == 0 {
            self.log_name.clone()
        } else {
            format!("{}-{}", self.log_name, self.restarts)
        };
        let process = ControllerProcess::start(
            &self.scope,
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
        process
            .wait_http_ok(&listen, "/sim/health", Duration::from_secs(20))
            .await?;
        self.process = Some(process);
        Ok(())
    }

    /// Stops the simulator (SIGTERM, as an orchestrator would): the agent sees connection
    /// errors. The simulator saves its state file in the background and writes what is
    /// pending on SIGTERM, so a [`Self::restart`] finds every change made before the stop.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut p) = self.process.take() {
            p.terminate(Duration::from_secs(10)).await?;
        }
        Ok(())
    }

    /// Starts it again on the same port with the same state file (the agent knows only
    /// that URL: no retry on another port).
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

/// Starts the agent binary for the test namespace, logging at debug level everywhere
/// (HTTP and TLS libraries included): the leak checks are only as strong as what gets
/// logged.
async fn spawn_agent(ctx: &TestContext, tag: &str, args: &[&str]) -> anyhow::Result<ControllerProcess> {
    ControllerProcess::start(
        ctx.process_scope(),
        "agent",
        &format!("agent-{}{tag}", ctx.namespace),
        args,
        &[
            ("POD_NAMESPACE", crate::deploy::SYSTEM_NAMESPACE),
            ("RUST_LOG", "debug,tower=info,h2=info"),
        ],
    )
    .await
}

/// Starts an agent for the test namespace against `sim`, with the key in `key_file`, and
/// waits until its admin server answers (started again on new addresses if it lost the
/// race for one).
pub async fn start_agent(
    ctx: &TestContext,
    sim: &SimProcess,
    key_file: &std::path::Path,
    tag: &str,
    extra: &[&str],
) -> anyhow::Result<AgentProcess> {
    start_pull_agent(ctx, &sim.url, &sim.cluster, key_file, tag, extra).await
}

/// Starts a pull agent for the test namespace against the control plane at `url` as cluster
/// `cluster` (the simulator's or a real Odoo's), with the key in `key_file`, its own status
/// ConfigMap (`tag`) and `extra` flags, and waits until its admin server answers (started
/// again on new addresses if it lost the race for one).
pub async fn start_pull_agent(
    ctx: &TestContext,
    url: &str,
    cluster: &str,
    key_file: &std::path::Path,
    tag: &str,
    extra: &[&str],
) -> anyhow::Result<AgentProcess> {
    let status_configmap = format!("agent-status-{}{tag}", ctx.namespace);
    grant_status_configmap(&status_configmap).await?;
    let key = key_file.to_string_lossy().into_owned();
    retry_address_race(async || {
        let admin_addr = free_loopback_addr()?.to_string();
        let channel_addr = free_loopback_addr()?.to_string();
        let mut args = PullAgentFlags {
            control_plane_url: url,
            key_file: &key,
            cluster,
            namespace: &ctx.namespace,
            admin_addr: &admin_addr,
            channel_addr: &channel_addr,
            status_configmap: &status_configmap,
        }
        .args();
        args.extend_from_slice(extra);
        let process = spawn_agent(ctx, tag, &args).await?;
        process.wait_http_ok(&admin_addr, "/livez", AGENT_TIMEOUT).await?;
        Ok(AgentProcess {
            process,
            admin_addr,
            status_configmap: status_configmap.clone(),
            status_channel: format!("http://{channel_addr}"),
        })
    })
    .await
}

/// The flags of a pull-mode agent in a test: plain HTTP to the simulator, one namespace
/// watched and allowed, and short sync, timeout and backoff so tests move quickly.
pub struct PullAgentFlags<'a> {
    /// The simulator's base URL (`--control-plane-url`), plain `http://` on loopback.
    pub control_plane_url: &'a str,
    /// The file holding the cluster's API key (`--api-key-file`).
    pub key_file: &'a str,
    /// The cluster name the agent registers as (`--cluster-name`).
    pub cluster: &'a str,
    /// The test's namespace: the only one watched and the only one intent may target.
    pub namespace: &'a str,
    /// Where the agent serves `/livez` and its admin endpoints (`--admin-addr`).
    pub admin_addr: &'a str,
    /// Where the agent serves the gRPC status channel (`--status-channel-addr`).
    pub channel_addr: &'a str,
    /// The ConfigMap recording the agent's own condition (`--status-configmap`), one per test.
    pub status_configmap: &'a str,
}

impl<'a> PullAgentFlags<'a> {
    /// The agent's command line; a test may push further flags before starting it.
    pub fn args(&self) -> Vec<&'a str> {
        vec![
            "--control-plane-url",
            self.control_plane_url,
            "--insecure-allow-http",
            "--api-key-file",
            self.key_file,
            "--cluster-name",
            self.cluster,
            "--watch-namespace",
            self.namespace,
            "--allowed-namespaces",
            self.namespace,
            "--admin-addr",
            self.admin_addr,
            "--sync-interval",
            "2s",
            "--request-timeout",
            "3s",
            "--max-backoff",
            "4s",
            "--status-configmap",
            self.status_configmap,
            "--status-channel-addr",
            self.channel_addr,
        ]
    }
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

/// Push mode: test certificates, generated at test time into a test's working directory.
/// `server-ca.pem` issued `server.pem`/`server-key.pem` (for 127.0.0.1 and localhost);
/// `client-ca.pem` issued `client.pem` (certificate and key, for Odoo); `rogue-ca.pem`
/// issued `rogue.pem`, a client certificate the agent must not accept.
pub struct PushPki {
    /// Where the PEM files are.
    pub dir: PathBuf,
}

fn test_ca(name: &str) -> anyhow::Result<(rcgen::Issuer<'static, rcgen::KeyPair>, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((rcgen::Issuer::new(params, key), cert.pem()))
}

fn test_leaf(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    names: &[&str],
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new CA named `ca_name` and a server certificate for 127.0.0.1 and localhost signed
/// by it: (CA PEM, certificate PEM, key PEM).
fn server_pki(ca_name: &str) -> anyhow::Result<(String, String, String)> {
    let (ca, ca_pem) = test_ca(ca_name)?;
    let (cert, key) = test_leaf(
        &ca,
        &["127.0.0.1", "localhost"],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    Ok((ca_pem, cert, key))
}

impl PushPki {
    /// Generates every file under `<work dir>/pki`.
    pub fn generate(ctx: &TestContext) -> anyhow::Result<Self> {
        let dir = work_dir(ctx)?.join("pki");
        std::fs::create_dir_all(&dir)?;
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text);
        let (server_ca_pem, cert, key) = server_pki("vworkspace e2e push server CA")?;
        write("server-ca.pem", &server_ca_pem)?;
        write("server.pem", &cert)?;
        write("server-key.pem", &key)?;
        for (tag, name) in [("client", "Odoo clients CA"), ("rogue", "someone else's CA")] {
            let (ca, ca_pem) = test_ca(name)?;
            let (cert, key) = test_leaf(&ca, &["odoo"], rcgen::ExtendedKeyUsagePurpose::ClientAuth)?;
            write(&format!("{tag}-ca.pem"), &ca_pem)?;
            write(&format!("{tag}.pem"), &format!("{cert}{key}"))?;
        }
        Ok(Self { dir })
    }

    /// The path of one of the files.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// Renews the server certificate, from a new CA, the way a Secret volume changes:
    /// each file replaced atomically (so for a moment the key and certificate do not
    /// match), then `server-ca.pem`.
    pub fn renew_server(&self) -> anyhow::Result<()> {
        let (ca_pem, cert, key) = server_pki("vworkspace e2e push server CA, renewed")?;
        for (name, text) in [("server-key.pem", key), ("server.pem", cert), ("server-ca.pem", ca_pem)] {
            let aside = self.dir.join(format!(".{name}.new"));
            std::fs::write(&aside, text)?;
            std::fs::rename(&aside, self.dir.join(name))?;
        }
        Ok(())
    }

    /// An HTTPS client trusting only the server CA, presenting `identity` (`client.pem`,
    /// `rogue.pem`) when given: what Odoo would use. Each client has its own connection
    /// pool.
    pub fn client(&self, identity: Option<&str>) -> anyhow::Result<reqwest::Client> {
        self.client_trusting("server-ca.pem", identity)
    }

    /// As [`Self::client`], trusting the CA in `ca_file` instead.
    pub fn client_trusting(&self, ca_file: &str, identity: Option<&str>) -> anyhow::Result<reqwest::Client> {
        let ca = std::fs::read(self.dir.join(ca_file))?;
        let mut builder = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
            .no_proxy()
            .timeout(Duration::from_secs(30));
        if let Some(id) = identity {
            builder = builder.identity(reqwest::Identity::from_pem(&std::fs::read(self.dir.join(id))?)?);
        }
        Ok(builder.build()?)
    }
}

/// An agent in push mode and its endpoint.
pub struct PushAgent {
    /// The process, admin address and status ConfigMap, as for pull mode.
    pub agent: AgentProcess,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
}

/// Starts an agent in push mode for the test namespace: TLS with `pki`'s server
/// certificate, the token in `token_file`, client certificates required when
/// `client_ca` is set. No control plane: the agent makes no outbound call. Waits until its
/// admin server answers, as [`start_agent`].
pub async fn start_push_agent(
    ctx: &TestContext,
    pki: &PushPki,
    token_file: &std::path::Path,
    client_ca: bool,
    tag: &str,
) -> anyhow::Result<PushAgent> {
    let status_configmap = format!("agent-status-{}{tag}", ctx.namespace);
    grant_status_configmap(&status_configmap).await?;
    let token = token_file.to_string_lossy().into_owned();
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server-key.pem"),
        pki.path("client-ca.pem"),
    );
    retry_address_race(async || {
        let admin_addr = free_loopback_addr()?.to_string();
        let push_addr = free_loopback_addr()?.to_string();
        let mut args = vec![
            "--mode",
            "push",
            "--push-addr",
            push_addr.as_str(),
            "--push-tls-cert",
            cert.as_str(),
            "--push-tls-key",
            key.as_str(),
            "--push-token-file",
            token.as_str(),
            "--cluster-name",
            "push-e2e",
            "--watch-namespace",
            ctx.namespace.as_str(),
            "--allowed-namespaces",
            ctx.namespace.as_str(),
            "--admin-addr",
            admin_addr.as_str(),
            "--status-configmap",
            status_configmap.as_str(),
            "--status-channel-addr",
            "off",
        ];
        if client_ca {
            args.extend(["--push-client-ca", ca.as_str()]);
        }
        let process = spawn_agent(ctx, tag, &args).await?;
        process.wait_http_ok(&admin_addr, "/livez", AGENT_TIMEOUT).await?;
        Ok(PushAgent {
            agent: AgentProcess {
                process,
                admin_addr,
                status_configmap: status_configmap.clone(),
                status_channel: String::new(),
            },
            url: format!("https://{push_addr}"),
        })
    })
    .await
}

/// `POST <url>/json/2/vworkspace.agent/<method>` with `token` as bearer; returns the
/// status and the JSON answer. An `Err` means no HTTP answer at all (e.g. a TLS handshake
/// refused).
pub async fn push_call(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    token: Option<&str>,
    body: &Value,
) -> anyhow::Result<(u16, Value)> {
    let mut req = client
        .post(format!("{url}/json/2/vworkspace.agent/{method}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.header("authorization", format!("bearer {t}"));
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    let text = res.text().await?;
    let value = serde_json::from_str(&text).with_context(|| format!("HTTP {status}, not JSON: {text}"))?;
    Ok((status, value))
}

/// The binaries that publish to the agent's status channel, each as its ServiceAccount of
/// the same name in `vworkspace-system` (the agent's default `--status-channel-clients`).
pub const STATUS_PUBLISHERS: [&str; 5] = [
    "app-controller",
    "backup-engine",
    "restore-engine",
    "upgrade-engine",
    "runbook-engine",
];

/// A token of ServiceAccount `vworkspace-system/<service_account>` for `audience` (the
/// status channel's by default), minted with the TokenRequest API (`kubectl create
/// token`): what the kubelet projects into the bundle's pods, for processes that run
/// outside the cluster. Written to a file (once per test process, ServiceAccount and
/// audience); returns its path.
pub async fn service_account_token(service_account: &str, audience: Option<&str>) -> anyhow::Result<PathBuf> {
    static MINTED: tokio::sync::Mutex<Vec<(String, PathBuf)>> = tokio::sync::Mutex::const_new(Vec::new());
    let audience = audience.unwrap_or(status_channel::auth::AUDIENCE);
    let key = format!("{service_account}.{audience}");
    let mut minted = MINTED.lock().await;
    if let Some((_, path)) = minted.iter().find(|(k, _)| *k == key) {
        return Ok(path.clone());
    }
    crate::deploy::ensure_bundle_rbac().await?;
    let token = crate::deploy::kubectl(
        &[
            "create",
            "token",
            service_account,
            "-n",
            crate::deploy::SYSTEM_NAMESPACE,
            "--audience",
            audience,
            "--duration",
            "2h",
        ],
        None,
    )
    .await?;
    let dir = cluster_dir().join("tokens");
    std::fs::create_dir_all(&dir)?;
    let file: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("{file}.{}.token", std::process::id()));
    std::fs::write(&path, token.trim())?;
    minted.push((key, path.clone()));
    Ok(path)
}

/// Lets the agent's ServiceAccount write the status ConfigMap `name` in `vworkspace-system`
/// (patch and update by name): the bundle grants only `vworkspace-agent-status`, and each
/// test agent writes its own, so tests running side by side never share one.
pub async fn grant_status_configmap(name: &str) -> anyhow::Result<()> {
    use crate::deploy::SYSTEM_NAMESPACE;
    crate::deploy::ensure_bundle_rbac().await?;
    let role = format!("e2e-{name}");
    let docs = [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role, "namespace": SYSTEM_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name],
                "verbs": ["patch", "update"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": SYSTEM_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": SYSTEM_NAMESPACE}],
        }),
    ];
    crate::deploy::apply(&crate::deploy::to_yaml(&docs.iter().collect::<Vec<_>>())?, false).await?;
    Ok(())
}
