//! The agent against a **real** Odoo 19 with the reference addon (`odoo/addons/vworkspace`,
//! docs/connectivity/odoo-addon.md), not the simulator: one database per test binary, created
//! once ([`database`], `hack/odoo.sh init`, about 13 s) and shared by every test, each test
//! with its own Odoo server process ([`OdooProcess`], `hack/odoo.sh serve`, on a free loopback
//! port of the cluster's network namespace) and its own cluster records in that database.
//!
//! Odoo reaches PostgreSQL over its Unix socket (`VWS_ODOO_DB_SOCKET=1`: the host's TCP
//! 127.0.0.1 does not exist inside the network namespace), as the role of the OS user (peer
//! authentication; `hack/odoo.sh db-up` creates it). Intent is declared the way a person does it
//! in Odoo's web client, as `admin` over JSON-2 (`POST /json/2/<model>/<method>` with an API key
//! of `admin`'s, made once server-side): `create` and `write` of `vworkspace.application` and
//! `vworkspace.operation`, the buttons' methods (`action_generate_api_key`,
//! `action_delete_on_cluster`, `action_request_resync`). What Odoo holds is read back the same
//! way (`read`, `search_read` of the computed status fields).
//!
//! At the end of the test binary a janitor (started with the database, in its own process
//! group) stops any Odoo of the database still running and drops the database, unless
//! `VWS_E2E_KEEP_NAMESPACES` is set: then it is kept for inspection, and its name printed.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::{
    TestContext,
    agent::{AgentProcess, PullAgentFlags, work_dir},
    cluster_dir, eventually, log_tail,
    peer::Peer,
    process::{ControllerProcess, free_loopback_addr, retry_address_race},
    repo_root,
};

/// The environment variable naming Odoo 19's source tree.
pub const ODOO_SRC_ENV: &str = "VWS_ODOO_SRC";

/// The sync interval of every test cluster record (Odoo's minimum, `sync_interval_seconds`):
/// the agent follows Odoo's `next_sync_seconds`, 30 s by default.
pub const SYNC_INTERVAL_SECONDS: i64 = 5;

/// Odoo 19's source: `VWS_ODOO_SRC`, else `<repo>/../shared/odoo-19` where it exists. One
/// error line naming the variable otherwise.
pub fn odoo_src() -> anyhow::Result<PathBuf> {
    let src = match std::env::var_os(ODOO_SRC_ENV) {
        Some(s) => PathBuf::from(s),
        None => repo_root().join("../shared/odoo-19"),
    };
    if !src.join("odoo-bin").is_file() {
        bail!(
            "no Odoo 19 source at {}: set {ODOO_SRC_ENV} to an Odoo 19.0 tree (with odoo-bin)",
            src.display()
        );
    }
    Ok(src.canonicalize()?)
}

fn odoo_sh() -> PathBuf {
    repo_root().join("hack/odoo.sh")
}

/// Where `hack/odoo.sh` writes Odoo's logs of the database creation and the shell runs.
fn odoo_log_dir() -> PathBuf {
    cluster_dir().join("logs/odoo-e2e")
}

/// Runs `hack/odoo.sh <args>` (Unix socket mode), returning its stdout; on failure its
/// stdout and stderr are in the error.
async fn run_odoo_sh(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let src = odoo_src()?;
    let mut cmd = Command::new(odoo_sh());
    cmd.args(args)
        .env("VWS_ODOO_SRC", &src)
        .env("VWS_ODOO_DB_SOCKET", "1")
        .env("VWS_ODOO_LOG_DIR", odoo_log_dir())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .with_context(|| format!("hack/odoo.sh {} did not end within 180 s", args.join(" ")))??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "hack/odoo.sh {} failed ({}):\n{stdout}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The database shared by the tests of one binary, and the key of its `admin`.
pub struct OdooDatabase {
    /// `vws_e2e_<pid>`.
    pub name: String,
    /// An API key of `admin` (scope `rpc`), for JSON-2 as a person with every right.
    admin_key: String,
    /// How long `hack/odoo.sh init` took (base, rpc, web and vworkspace installed).
    pub created_in: Duration,
    /// How long making `admin`'s API key took (`odoo-bin shell`).
    pub admin_key_in: Duration,
}

static DATABASE: tokio::sync::OnceCell<OdooDatabase> = tokio::sync::OnceCell::const_new();

/// The database of this test binary, created at the first call: base, rpc, web and
/// vworkspace installed (`hack/odoo.sh init`), and an API key of `admin`. The janitor that
/// drops it when the binary ends starts with it.
pub async fn database() -> anyhow::Result<&'static OdooDatabase> {
    DATABASE
        .get_or_try_init(|| async {
            odoo_src()?;
            let name = format!("vws_e2e_{}", std::process::id());
            let started = Instant::now();
            run_odoo_sh(&["init", &name], &[]).await?;
            let created_in = started.elapsed();
            let started = Instant::now();
            let admin_key = run_odoo_sh(&["admin-key", &name], &[]).await?.trim().to_owned();
            let admin_key_in = started.elapsed();
            anyhow::ensure!(admin_key.len() == 40, "hack/odoo.sh admin-key printed {admin_key:?}");
            start_janitor(&name)?;
            eprintln!(
                "odoo: database {name} created with base, rpc, web and vworkspace in {:.1} s, admin's API key in {:.1} s",
                created_in.as_secs_f64(),
                admin_key_in.as_secs_f64()
            );
            anyhow::Ok(OdooDatabase {
                name,
                admin_key,
                created_in,
                admin_key_in,
            })
        })
        .await
}

/// The pid files of this binary's Odoo servers (for the janitor).
fn pid_dir(db: &str) -> PathBuf {
    cluster_dir().join("odoo-e2e").join(db)
}

/// Starts the process that cleans up after this test binary: once the binary's pid is gone, it
/// stops the Odoo servers of `db` still running (by their pid files, each checked to be an
/// odoo-bin of `db`), then drops `db`, unless `VWS_E2E_KEEP_NAMESPACES` is set. Its own process
/// group, stdin and stdout closed: an interrupted test run does not stop it, nor waits for it.
fn start_janitor(db: &str) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let dir = pid_dir(db);
    std::fs::create_dir_all(&dir)?;
    let keep = std::env::var_os("VWS_E2E_KEEP_NAMESPACES").is_some();
    if keep {
        eprintln!(
            "odoo: keeping database {db} (VWS_E2E_KEEP_NAMESPACES); serve it with \
             `VWS_ODOO_DB_SOCKET=1 hack/odoo.sh serve {db} <port>`, drop it with `VWS_ODOO_DB_SOCKET=1 hack/odoo.sh drop {db}`"
        );
    }
    let script = r#"
while kill -0 "$1" 2>/dev/null; do sleep 1; done
for f in "$2"/*.pid; do
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--db-filter=^$3\$"; then
    kill "$pid"
  fi
  rm -f "$f"
done
if [ "$4" = drop ]; then sleep 1; "$5" drop "$3"; fi
rmdir "$2" 2>/dev/null
"#;
    let log = std::fs::File::create(odoo_log_dir().join(format!("janitor-{db}.log"))).or_else(|_| {
        std::fs::create_dir_all(odoo_log_dir())?;
        std::fs::File::create(odoo_log_dir().join(format!("janitor-{db}.log")))
    })?;
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("janitor")
        .arg(std::process::id().to_string())
        .arg(&dir)
        .arg(db)
        .arg(if keep { "keep" } else { "drop" })
        .arg(odoo_sh())
        .env("VWS_ODOO_SRC", odoo_src()?)
        .env("VWS_ODOO_DB_SOCKET", "1")
        .env("VWS_ODOO_LOG_DIR", odoo_log_dir())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the janitor of the Odoo database")?;
    Ok(())
}

/// A cluster record of Odoo and the API key of its bot user.
#[derive(Debug, Clone)]
pub struct OdooCluster {
    /// `vworkspace.cluster` id.
    pub id: i64,
    /// The record's name (the agent registers with it as `--cluster-name` too).
    pub name: String,
    /// The bot's valid API key (scope `rpc`).
    pub key: String,
    /// A file holding [`Self::key`], for the agent's `--api-key-file`.
    pub key_file: PathBuf,
}

/// A cluster record made server-side by `hack/odoo.sh cluster` (`odoo-bin shell`), with the
/// keys asked for: `rpc`, `expired`, `expires-in:<seconds>`, `scope:<scope>`.
#[derive(Debug, Clone)]
pub struct ShellCluster {
    /// `vworkspace.cluster` id.
    pub id: i64,
    /// The record's name.
    pub name: String,
    /// Each key asked for, by its spec.
    pub keys: std::collections::BTreeMap<String, String>,
}

/// One test's Odoo server: odoo-bin on `127.0.0.1:<free port>` of the cluster's network
/// namespace, serving only the binary's [`database`]. Killed on drop.
pub struct OdooProcess {
    process: Option<ControllerProcess>,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The port (the same after [`Self::start_again`]).
    pub port: u16,
    /// The database's name (the agent's `--database`, sent as `X-Odoo-Database`).
    pub database: String,
    admin_key: String,
    scope: String,
    log_name: String,
    restarts: u32,
    clock_offset: Option<i64>,
    http: reqwest::Client,
    /// How long the first start took, until `/web/login` answered 200.
    pub started_in: Duration,
}

impl OdooProcess {
    /// Creates the binary's database if this is the first test to need it, then starts an
    /// Odoo server for this test on a free port and waits until `/web/login` answers.
    pub async fn start(ctx: &TestContext) -> anyhow::Result<Self> {
        let db = database().await?;
        let mut odoo = Self {
            process: None,
            url: String::new(),
            port: 0,
            database: db.name.clone(),
            admin_key: db.admin_key.clone(),
            scope: ctx.process_scope().to_owned(),
            log_name: format!("odoo-{}", ctx.namespace),
            restarts: 0,
            clock_offset: None,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()?,
            started_in: Duration::ZERO,
        };
        let started = Instant::now();
        retry_address_race(async || {
            odoo.port = free_loopback_addr()?.port();
            odoo.url = format!("http://127.0.0.1:{}", odoo.port);
            odoo.spawn().await
        })
        .await?;
        odoo.started_in = started.elapsed();
        eprintln!(
            "odoo: {} serving {} at {} after {:.1} s",
            ctx.namespace,
            odoo.database,
            odoo.url,
            odoo.started_in.as_secs_f64()
        );
        Ok(odoo)
    }

    fn current_log_name(&self) -> String {
        if self.restarts == 0 {
            self.log_name.clone()
        } else {
            format!("{}-{}", self.log_name, self.restarts)
        }
    }

    /// Starts odoo-bin on `self.port` (`hack/odoo.sh serve`, which execs it: the process is
    /// Odoo itself) and waits until `/web/login` answers 200.
    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log_name = self.current_log_name();
        let pid_file = pid_dir(&self.database).join(format!("{log_name}.pid"));
        let pid_arg = format!("--pidfile={}", pid_file.display());
        let port = self.port.to_string();
        let src = odoo_src()?;
        let src = src.to_string_lossy().into_owned();
        let log_dir = odoo_log_dir().to_string_lossy().into_owned();
        let offset = self.clock_offset.map(|o| o.to_string());
        let mut env = vec![
            ("VWS_ODOO_SRC", src.as_str()),
            ("VWS_ODOO_DB_SOCKET", "1"),
            ("VWS_ODOO_LOG_DIR", log_dir.as_str()),
            // Odoo's log to stderr: the process's log file.
            ("VWS_ODOO_SERVE_LOG", ""),
        ];
        if let Some(offset) = &offset {
            env.push(("VWS_ODOO_CLOCK_OFFSET", offset.as_str()));
        }
        let process = ControllerProcess::start_program(
            &self.scope,
            None,
            &odoo_sh(),
            &log_name,
            // No cron thread: nothing runs but the requests (autovacuum would also delete
            // expired API keys).
            &["serve", &self.database, &port, "--max-cron-threads=0", &pid_arg],
            &env,
        )?;
        process
            .wait_http_ok(
                &format!("127.0.0.1:{}", self.port),
                "/web/login",
                Duration::from_secs(90),
            )
            .await?;
        self.process = Some(process);
        Ok(())
    }

    /// Kills Odoo (SIGKILL: the control plane is gone at once, whatever it was doing) and
    /// waits until it is gone. Every call it answered was committed: nothing is lost.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut p) = self.process.take() {
            p.kill().await?;
        }
        Ok(())
    }

    /// Starts Odoo again on the same port and database (the agent knows only that URL).
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        self.kill().await?;
        self.restarts += 1;
        self.spawn().await
    }

    /// Starts Odoo again on the same port and database with its clock shifted by
    /// `offset_seconds` (`hack/odoo.sh serve` with `VWS_ODOO_CLOCK_OFFSET`): e.g. -7200 for a
    /// server two hours late, whose documents' `generated_at` are two hours old to the agent.
    pub async fn start_again_with_clock_offset(&mut self, offset_seconds: i64) -> anyhow::Result<()> {
        self.clock_offset = Some(offset_seconds);
        self.start_again().await
    }

    /// Everything Odoo logged (all runs).
    pub fn logs(&self) -> String {
        (0..=self.restarts)
            .map(|i| {
                let name = if i == 0 {
                    self.log_name.clone()
                } else {
                    format!("{}-{i}", self.log_name)
                };
                std::fs::read_to_string(cluster_dir().join("logs").join(format!("{name}.log"))).unwrap_or_default()
            })
            .collect()
    }

    /// The last lines of the current run's log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(
            &cluster_dir()
                .join("logs")
                .join(format!("{}.log", self.current_log_name())),
            n,
            None,
        )
    }

    /// `POST /json/2/<model>/<method>` with `body` as `admin`; the JSON answer. An answer
    /// other than 200 is an error carrying Odoo's error object.
    pub async fn call(&self, model: &str, method: &str, body: Value) -> anyhow::Result<Value> {
        let res = self
            .http
            .post(format!("{}/json/2/{model}/{method}", self.url))
            .header("authorization", format!("bearer {}", self.admin_key))
            .header("content-type", "application/json")
            .header("x-odoo-database", &self.database)
            .body(body.to_string())
            .send()
            .await
            .with_context(|| format!("JSON-2 {model}.{method}"))?;
        let status = res.status().as_u16();
        let text = res.text().await?;
        if status != 200 {
            bail!("JSON-2 {model}.{method} as admin: HTTP {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("JSON-2 {model}.{method}: not JSON: {text}"))
    }

    /// `create` one record; its id.
    pub async fn create(&self, model: &str, vals: Value) -> anyhow::Result<i64> {
        let ids = self.call(model, "create", json!({"vals_list": [vals]})).await?;
        ids.get(0)
            .and_then(Value::as_i64)
            .with_context(|| format!("{model}.create answered {ids}"))
    }

    /// `write` `vals` on one record.
    pub async fn write(&self, model: &str, id: i64, vals: Value) -> anyhow::Result<()> {
        self.call(model, "write", json!({"ids": [id], "vals": vals})).await?;
        Ok(())
    }

    /// `read` of one record (archived ones too); `fields` empty: all of them.
    pub async fn read(&self, model: &str, id: i64, fields: &[&str]) -> anyhow::Result<Value> {
        let rows = self
            .call(
                model,
                "read",
                json!({"ids": [id], "fields": fields, "context": {"active_test": false}}),
            )
            .await?;
        rows.get(0)
            .cloned()
            .with_context(|| format!("{model} {id} not found: {rows}"))
    }

    /// `search_read` (archived records included).
    pub async fn search_read(&self, model: &str, domain: Value, fields: &[&str]) -> anyhow::Result<Vec<Value>> {
        let rows = self
            .call(
                model,
                "search_read",
                json!({"domain": domain, "fields": fields, "context": {"active_test": false}}),
            )
            .await?;
        Ok(rows.as_array().cloned().unwrap_or_default())
    }

    /// A cluster record made as an Administrator does in the web client: *Clusters → New*
    /// (sync interval [`SYNC_INTERVAL_SECONDS`]), then *New API key*
    /// (`action_generate_api_key`, whose dialog shows the key once). The key is written to
    /// `<work dir>/<file>`.
    pub async fn create_cluster(&self, ctx: &TestContext, name: &str, file: &str) -> anyhow::Result<OdooCluster> {
        let id = self
            .create(
                "vworkspace.cluster",
                json!({"name": name, "sync_interval_seconds": SYNC_INTERVAL_SECONDS}),
            )
            .await?;
        let action = self
            .call("vworkspace.cluster", "action_generate_api_key", json!({"ids": [id]}))
            .await?;
        let key = action
            .pointer("/context/default_key")
            .and_then(Value::as_str)
            .with_context(|| format!("action_generate_api_key answered {action}"))?
            .to_owned();
        let key_file = work_dir(ctx)?.join(file);
        std::fs::write(&key_file, &key)?;
        Ok(OdooCluster {
            id,
            name: name.to_owned(),
            key,
            key_file,
        })
    }

    /// A cluster record made server-side by `hack/odoo.sh cluster` (`odoo-bin shell` on the
    /// database), with the keys of `keys` (`rpc`, `expired`, `expires-in:<s>`, `scope:<s>`),
    /// its sync interval then set to [`SYNC_INTERVAL_SECONDS`].
    pub async fn shell_cluster(&self, name: &str, keys: &[&str]) -> anyhow::Result<ShellCluster> {
        let mut args = vec!["cluster", self.database.as_str(), name];
        args.extend_from_slice(keys);
        let out = run_odoo_sh(&args, &[]).await?;
        let v: Value =
            serde_json::from_str(out.trim()).with_context(|| format!("hack/odoo.sh cluster printed {out}"))?;
        let id = v["id"].as_i64().context("cluster id")?;
        self.write(
            "vworkspace.cluster",
            id,
            json!({"sync_interval_seconds": SYNC_INTERVAL_SECONDS}),
        )
        .await?;
        Ok(ShellCluster {
            id,
            name: name.to_owned(),
            keys: serde_json::from_value(v["keys"].clone())?,
        })
    }

    /// Declares an application as a *User* does in *Applications → New*: chart `chart` at
    /// `version` from the local chart repository (interval 1m), `values`, timeout 1m; the id.
    pub async fn declare_app(
        &self,
        cluster: i64,
        namespace: &str,
        name: &str,
        chart: &str,
        version: &str,
        values: &Value,
    ) -> anyhow::Result<i64> {
        self.create(
            "vworkspace.application",
            json!({
                "cluster_id": cluster, "namespace": namespace, "name": name,
                "chart_name": chart, "chart_version": version,
                "chart_repository_url": crate::CHART_REPO, "chart_repository_interval": "1m",
                "values_json": values.to_string(), "timeout": "1m",
            }),
        )
        .await
    }

    /// Declares a Runbook Operation on `app` as in *Operations → New*: the payload is
    /// `spec.runbook` (a Job running `command`), `deadline` and `not_before` as Odoo datetimes
    /// (`None`: the field left empty; Odoo's form would default the deadline to a day ahead).
    /// The request id is Odoo's sequence (`odoo-op-N`), the name `<app>-runbook-<request id>`.
    pub async fn declare_runbook(
        &self,
        cluster: i64,
        namespace: &str,
        app: &str,
        command: &str,
        not_before: Option<jiff::Timestamp>,
        deadline: Option<jiff::Timestamp>,
    ) -> anyhow::Result<i64> {
        let runbook = crate::agent::runbook_spec(app, "unused", command)["runbook"].clone();
        self.create(
            "vworkspace.operation",
            json!({
                "cluster_id": cluster, "namespace": namespace, "application_name": app,
                "op_type": "Runbook", "payload_json": runbook.to_string(),
                "not_before": not_before.map(odoo_datetime).map_or(Value::Bool(false), Value::String),
                "deadline": deadline.map(odoo_datetime).map_or(Value::Bool(false), Value::String),
            }),
        )
        .await
    }

    /// The application record as Odoo shows it: the status computed from the latest
    /// acknowledgement and report.
    pub async fn application(&self, id: i64) -> anyhow::Result<Value> {
        self.read("vworkspace.application", id, APPLICATION_FIELDS).await
    }

    /// The Operation record as Odoo shows it.
    pub async fn operation(&self, id: i64) -> anyhow::Result<Value> {
        self.read("vworkspace.operation", id, OPERATION_FIELDS).await
    }

    /// The cluster record as Odoo shows it.
    pub async fn cluster(&self, id: i64) -> anyhow::Result<Value> {
        self.read("vworkspace.cluster", id, CLUSTER_FIELDS).await
    }

    /// The latest report Odoo holds for `kind/namespace/name` of cluster `cluster`.
    pub async fn report(&self, cluster: i64, kind: &str, namespace: &str, name: &str) -> anyhow::Result<Option<Value>> {
        Ok(self
            .search_read(
                "vworkspace.report",
                json!([
                    ["cluster_id", "=", cluster],
                    ["kind", "=", kind],
                    ["namespace", "=", namespace],
                    ["name", "=", name]
                ]),
                REPORT_FIELDS,
            )
            .await?
            .into_iter()
            .next())
    }

    /// Every report Odoo holds for cluster `cluster`.
    pub async fn reports(&self, cluster: i64) -> anyhow::Result<Vec<Value>> {
        self.search_read(
            "vworkspace.report",
            json!([["cluster_id", "=", cluster]]),
            REPORT_FIELDS,
        )
        .await
    }

    /// Every acknowledgement Odoo holds for cluster `cluster`, with its object entries.
    pub async fn acks(&self, cluster: i64) -> anyhow::Result<Vec<Value>> {
        let mut acks = self
            .search_read(
                "vworkspace.ack",
                json!([["cluster_id", "=", cluster]]),
                &["epoch", "revision", "outcome", "reason", "message", "object_ids"],
            )
            .await?;
        for ack in &mut acks {
            let ids = ack["object_ids"].clone();
            ack["objects"] = self
                .call(
                    "vworkspace.ack.object",
                    "read",
                    json!({"ids": ids, "fields": ["kind", "namespace", "name", "outcome", "reason", "message", "uid"]}),
                )
                .await?;
        }
        Ok(acks)
    }

    /// Polls `read(model, id)` until `check` accepts the record; on timeout the error has the
    /// last record read, the test's diagnostics and the tail of Odoo's log.
    pub async fn wait_record(
        &self,
        ctx: &TestContext,
        model: &str,
        id: i64,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let fields = match model {
            "vworkspace.application" => APPLICATION_FIELDS,
            "vworkspace.operation" => OPERATION_FIELDS,
            "vworkspace.cluster" => CLUSTER_FIELDS,
            "vworkspace.deletion" => DELETION_FIELDS,
            _ => &[],
        };
        self.wait(ctx, &format!("Odoo {model} {id}: {what}"), timeout, || async {
            let rec = self.read(model, id, fields).await?;
            Ok(if check(&rec) { Ok(rec) } else { Err(compact(&rec)) })
        })
        .await
    }

    /// [`eventually`], with the tail of Odoo's log added to a failure.
    pub async fn wait<T, F, Fut>(&self, ctx: &TestContext, what: &str, timeout: Duration, probe: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
    {
        eventually(ctx, what, timeout, probe)
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}\n--- tail of Odoo's log ---\n{}", self.log_tail(30)))
    }
}

/// Fields of `vworkspace.application` the tests read (computed ones from the latest
/// acknowledgement and report included).
pub const APPLICATION_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "active",
    "status",
    "status_message",
    "acknowledged",
    "changed_revision",
    "ack_epoch",
    "ack_revision",
    "ack_outcome",
    "ack_reason",
    "ack_message",
    "ack_uid",
    "ack_generation",
    "report_state",
    "report_uid",
    "report_resource_version",
    "report_conditions",
    "deployed_chart_version",
    "desired_chart_version",
    "ready_reason",
    "ready_since",
    "reconciling",
];

/// Fields of `vworkspace.operation` the tests read.
pub const OPERATION_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "request_id",
    "status",
    "status_message",
    "acknowledged",
    "changed_revision",
    "ack_revision",
    "ack_outcome",
    "ack_reason",
    "ack_message",
    "ack_uid",
    "report_state",
    "report_uid",
    "report_conditions",
    "phase",
    "result",
    "start_time",
    "completion_time",
    "succeeded_reason",
    "deadline",
    "not_before",
];

/// Fields of `vworkspace.deletion` the tests read.
pub const DELETION_FIELDS: &[&str] = &[
    "kind",
    "namespace",
    "name",
    "uid",
    "reason",
    "status",
    "status_message",
    "ack_revision",
    "ack_outcome",
    "ack_reason",
    "ack_message",
];

/// Fields of `vworkspace.cluster` the tests read.
pub const CLUSTER_FIELDS: &[&str] = &[
    "name",
    "bound_uid",
    "reported_name",
    "last_seen",
    "agent_online",
    "status",
    "epoch",
    "revision",
    "acknowledged_revision",
    "intent_acknowledged",
    "max_reports_per_sync",
    "sync_interval_seconds",
    "agent_protocol_version",
    "allowed_namespaces",
    "syncs",
    "resync_requested",
    "resyncs_completed",
    "resync_completed_at",
    "last_error_reason",
    "last_error_message",
    "last_error_attempts",
];

/// Fields of `vworkspace.report` the tests read.
pub const REPORT_FIELDS: &[&str] = &[
    "kind",
    "namespace",
    "name",
    "uid",
    "state",
    "generation",
    "observed_generation",
    "resource_version",
    "managed_by_agent",
    "conditions",
    "ready_status",
    "ready_reason",
    "phase",
    "result",
    "start_time",
    "completion_time",
    "request_id",
    "deployed_chart_version",
    "received_at",
    "raw",
];

/// A record in one line, without its long text fields, for "last observed" messages.
pub fn compact(rec: &Value) -> String {
    let Some(obj) = rec.as_object() else {
        return rec.to_string();
    };
    obj.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "raw" | "report_conditions" | "conditions"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A timestamp as Odoo's JSON-2 takes and gives a Datetime: `YYYY-MM-DD HH:MM:SS`, UTC.
pub fn odoo_datetime(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S").to_string()
}

/// An Odoo Datetime (`YYYY-MM-DD HH:MM:SS`, UTC) read back; `None` for `false`.
pub fn parse_odoo_datetime(v: &Value) -> Option<jiff::Timestamp> {
    let s = v.as_str()?;
    jiff::civil::DateTime::strptime("%Y-%m-%d %H:%M:%S", s)
        .ok()?
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// The conditions of a record's `report_conditions` or `conditions` (JSON text).
pub fn conditions(rec: &Value, field: &str) -> Vec<Value> {
    rec[field]
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Starts an agent for the test namespace against `odoo` as the cluster `cluster` (its
/// `--cluster-name`), with the key in `key_file` and `--database`, and waits until its admin
/// server answers (again on new addresses if it lost the race for one). As
/// [`crate::agent::start_agent`] does for the simulator: debug logging everywhere, its own
/// status ConfigMap.
pub async fn start_agent(
    ctx: &TestContext,
    odoo: &OdooProcess,
    cluster: &str,
    key_file: &Path,
    tag: &str,
    extra: &[&str],
) -> anyhow::Result<AgentProcess> {
    start_agent_at(ctx, &odoo.url, &odoo.database, cluster, key_file, tag, extra).await
}

/// [`start_agent`] against Odoo at `url` (a proxy in front of it, say) serving `database`.
pub async fn start_agent_at(
    ctx: &TestContext,
    url: &str,
    database: &str,
    cluster: &str,
    key_file: &Path,
    tag: &str,
    extra: &[&str],
) -> anyhow::Result<AgentProcess> {
    let mut args = vec!["--database", database];
    args.extend_from_slice(extra);
    crate::agent::start_pull_agent(ctx, url, cluster, key_file, tag, &args).await
}

/// What the Odoo tests do with the peer cluster ([`Peer`]).
impl Peer {
    /// Carries `127.0.0.1:<port>` of this namespace (Odoo) into the peer's namespace at
    /// `127.0.0.1:<peer_port>` (`hack/netns-bridge.py` over a Unix socket); both bridge
    /// processes are returned (stopped on drop).
    pub async fn bridge(&self, ctx: &TestContext, port: u16, peer_port: u16) -> anyhow::Result<[ControllerProcess; 2]> {
        let script = repo_root().join("hack/netns-bridge.py");
        let socket = work_dir(ctx)?.join("odoo.sock");
        let (script, socket) = (path_str(&script)?, path_str(&socket)?);
        let python = Path::new("python3");
        let here = ControllerProcess::start_program(
            ctx.process_scope(),
            None,
            python,
            &format!("bridge-{}-odoo", ctx.namespace),
            &[script, "unix-to-tcp", socket, &format!("127.0.0.1:{port}")],
            &[],
        )?;
        wait_logged(ctx, &here, "ready").await?;
        let there = ControllerProcess::start_program(
            ctx.process_scope(),
            Some(&self.netns),
            python,
            &format!("bridge-{}-peer", ctx.namespace),
            &[script, "tcp-to-unix", &format!("127.0.0.1:{peer_port}"), socket],
            &[],
        )?;
        wait_logged(ctx, &there, "ready").await?;
        Ok([here, there])
    }

    /// Starts an agent in the peer's namespace, against the peer's API server, pulling from
    /// Odoo through the bridge at `127.0.0.1:<odoo_port>` as cluster `cluster`.
    pub fn start_agent(
        &self,
        ctx: &TestContext,
        odoo: &OdooProcess,
        odoo_port: u16,
        cluster: &str,
        key_file: &Path,
        tag: &str,
    ) -> anyhow::Result<ControllerProcess> {
        let url = format!("http://127.0.0.1:{odoo_port}");
        // The peer's namespace has only this test's agents: a port free here is free there.
        let admin = free_loopback_addr()?.to_string();
        let channel = free_loopback_addr()?.to_string();
        let status_configmap = format!("agent-status{tag}-{}", ctx.namespace);
        let mut args = PullAgentFlags {
            control_plane_url: &url,
            key_file: path_str(key_file)?,
            cluster,
            namespace: &ctx.namespace,
            admin_addr: &admin,
            channel_addr: &channel,
            status_configmap: &status_configmap,
        }
        .args();
        args.extend_from_slice(&["--database", &odoo.database]);
        ControllerProcess::start_program(
            ctx.process_scope(),
            Some(&self.netns),
            &crate::process::binary_path("agent"),
            &format!("agent-{}-peer{tag}", ctx.namespace),
            &args,
            &[
                ("KUBECONFIG", path_str(&self.kubeconfig)?),
                ("POD_NAMESPACE", "vworkspace-system"),
                ("RUST_LOG", "debug,tower=info,h2=info"),
            ],
        )
    }
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

async fn wait_logged(ctx: &TestContext, process: &ControllerProcess, line: &str) -> anyhow::Result<()> {
    eventually(
        ctx,
        &format!("{} logs {line:?}", process.log_path.display()),
        Duration::from_secs(20),
        || async {
            Ok(if process.logs().lines().any(|l| l == line) {
                Ok(())
            } else {
                Err(process.logs())
            })
        },
    )
    .await
}
