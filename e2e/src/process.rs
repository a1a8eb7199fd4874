//! Runs our own binaries out of cluster as child processes, with their output
//! captured to a file (so tests can prove what they log and what they do not).
//!
//! Every process started here is tracked in a registry, under a *scope*: a test's
//! namespace in e2e (so parallel tests never fail each other), the benchmark's name in
//! the bench binaries. A wait ([`crate::eventually`], the bench helpers) calls
//! [`check_exits`] on every round and fails at once, quoting the log, when a process of
//! its scope has exited while nobody stopped it: a process that died at start (a port
//! already taken, a bad flag) otherwise looks exactly like a slow one until the timeout.
//! [`ControllerProcess::kill`] and [`ControllerProcess::expect_exit`] mark an exit as
//! expected; dropping a process removes it from the registry.

use std::{
    ffi::OsString,
    fmt,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

use crate::{cluster_dir, log_tail, repo_root};

/// Lines of its log quoted when a process exits unexpectedly.
pub const LOG_TAIL_LINES: usize = 40;

/// How often a process that lost the race for its address is started again.
const ADDRESS_ATTEMPTS: u32 = 3;

/// What the OS says when an address is taken (EADDRINUSE, as Rust's io::Error prints it).
const ADDRESS_IN_USE: &str = "Address already in use";

/// The ports [`free_loopback_addr`] hands out: below the cluster's ephemeral range, which
/// `hack/cluster.sh` sets to 40000-60999 in its network namespace, so no client socket (of
/// the many the real node's components open towards the API server) ever holds one, and
/// above every fixed port of the local cluster and of `just demo` (all below 20000).
pub const TEST_PORTS: std::ops::Range<u16> = 20000..40000;

/// A free loopback address (`127.0.0.1:<port>`) for a process to listen on.
///
/// The port is bound and released, so another process could still take it before ours
/// binds it: a process that then fails to bind exits, which the waits report with its log,
/// and [`retry_address_race`] starts it again on a new address. Within this process a
/// port is never handed out twice, so parallel tests cannot pick the same one before
/// either has bound it. Ports come from [`TEST_PORTS`]; each test process starts at its own
/// offset: slice `VWS_E2E_PORT_SLOT` of `VWS_E2E_PORT_SLOTS` when `hack/e2e-lanes.py` runs
/// test files side by side (so they never try the same ports), else from its pid.
pub fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let span = TEST_PORTS.end - TEST_PORTS.start;
    let mut next = lock(&NEXT);
    let mut offset = next.unwrap_or_else(|| first_port_offset(span));
    for _ in 0..span {
        let port = TEST_PORTS.start + offset;
        offset = (offset + 1) % span;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            *next = Some(offset);
            return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        }
    }
    bail!("no free loopback port in {TEST_PORTS:?}")
}

/// Where this process starts handing out ports, as an offset into a span of `span` ports.
fn first_port_offset(span: u16) -> u16 {
    let slot = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let span = u32::from(span);
    let offset = match (slot("VWS_E2E_PORT_SLOT"), slot("VWS_E2E_PORT_SLOTS")) {
        (Some(slot), Some(slots)) if slot < slots => slot * (span / slots),
        _ => std::process::id() % span,
    };
    u16::try_from(offset).unwrap_or(0)
}

/// Path of a workspace binary built by cargo (same profile as the tests).
pub fn binary_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    target.join(profile).join(name)
}

/// A started process that exited while nobody stopped it: the error of a wait that noticed.
#[derive(Debug)]
pub struct ProcessExited {
    /// The binary's file name.
    pub binary: String,
    /// How it ended.
    pub status: ExitStatus,
    /// Its log.
    pub log_path: PathBuf,
    /// What the wait was waiting for.
    pub what: String,
    /// The last [`LOG_TAIL_LINES`] lines of its log.
    pub tail: String,
}

impl fmt::Display for ProcessExited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} exited ({}) while waiting for {}; last {LOG_TAIL_LINES} lines of {}:\n{}",
            self.binary,
            self.status,
            self.what,
            self.log_path.display(),
            self.tail
        )
    }
}

impl std::error::Error for ProcessExited {}

impl ProcessExited {
    /// Whether it exited because an address it was to listen on was taken (lost the race
    /// between [`free_loopback_addr`] and its own bind).
    pub fn address_taken(&self) -> bool {
        std::fs::read_to_string(&self.log_path).is_ok_and(|log| log.contains(ADDRESS_IN_USE))
    }
}

/// Fails with [`ProcessExited`] (the first such process, in start order) when a process
/// of `scope` (all scopes when `None`) has exited unless it was killed or expected to
/// exit. `what` is what the caller is waiting for, for the message.
pub fn check_exits(scope: Option<&str>, what: &str) -> Result<(), ProcessExited> {
    // Upgrade under the registry lock, look at the children after releasing it.
    let tracked: Vec<Arc<Tracked>> = lock(&REGISTRY)
        .iter()
        .filter(|(s, _)| scope.is_none_or(|want| want == s))
        .filter_map(|(_, weak)| weak.upgrade())
        .collect();
    tracked.iter().try_for_each(|t| t.check(what))
}

/// Runs `attempt` (start a process on addresses from [`free_loopback_addr`] and wait
/// until it serves) again, up to 3 times in all, while it fails because the process lost
/// the race for one of its addresses; any other failure is returned at once.
pub async fn retry_address_race<T>(mut attempt: impl AsyncFnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(e)
                if tries < ADDRESS_ATTEMPTS
                    && e.downcast_ref::<ProcessExited>()
                        .is_some_and(ProcessExited::address_taken) =>
            {
                eprintln!("(another process took the address; starting again on a new one: {e:#})");
                tries += 1;
            }
            result => return result,
        }
    }
}

/// One started process, shared by its [`ControllerProcess`] and (weakly) the registry.
struct Tracked {
    binary: String,
    log_path: PathBuf,
    /// Killed on purpose or expected to exit on its own: its exit is no failure.
    exit_expected: AtomicBool,
    child: Mutex<Child>,
}

impl Tracked {
    /// The exit status once it has exited (reaping it if needed).
    fn exit_status(&self) -> Option<ExitStatus> {
        lock(&self.child).try_wait().ok().flatten()
    }

    fn check(&self, what: &str) -> Result<(), ProcessExited> {
        if self.exit_expected.load(Ordering::SeqCst) {
            return Ok(());
        }
        match self.exit_status() {
            // A kill() that raced with this check: expected after all.
            Some(_) if self.exit_expected.load(Ordering::SeqCst) => Ok(()),
            Some(status) => Err(ProcessExited {
                binary: self.binary.clone(),
                status,
                log_path: self.log_path.clone(),
                what: what.to_owned(),
                tail: log_tail(&self.log_path, LOG_TAIL_LINES, None),
            }),
            None => Ok(()),
        }
    }
}

/// Live processes by scope, in start order. Weak: dropping a [`ControllerProcess`]
/// (which kills it) is what removes it.
static REGISTRY: Mutex<Vec<(String, Weak<Tracked>)>> = Mutex::new(Vec::new());

/// A poisoned lock only means another test panicked while holding it; the data is fine.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running controller binary; killed on drop.
pub struct ControllerProcess {
    tracked: Arc<Tracked>,
    /// The file its stdout and stderr go to, kept after the process ends for failure dumps.
    pub log_path: PathBuf,
}

impl ControllerProcess {
    /// Starts `binary` with `args`, KUBECONFIG for the local cluster, and logs to
    /// `<cluster>/logs/<log_name>.log`. `scope` says whose waits watch it: in e2e the
    /// test's namespace, in a benchmark its name.
    pub async fn start(
        scope: &str,
        binary: &str,
        log_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let path = binary_path(binary);
        anyhow::ensure!(
            path.exists(),
            "{} is not built; run `cargo build --bins` first",
            path.display()
        );
        // Later entries win: the admin kubeconfig, else least privilege by default (our
        // controllers run as their ServiceAccount, with the RBAC of the deploy bundle), and
        // an explicit KUBECONFIG in `env` over both.
        let mut all_env: Vec<(String, OsString)> =
            vec![("KUBECONFIG".into(), cluster_dir().join("admin.kubeconfig").into())];
        if let Some(kubeconfig) = crate::deploy::least_privilege_kubeconfig(binary).await? {
            all_env.push(("KUBECONFIG".into(), kubeconfig.into()));
        }
        // Publishers authenticate to the agent's status channel with their ServiceAccount's
        // token, as the projected volume gives them in the bundle.
        if crate::agent::STATUS_PUBLISHERS.contains(&binary) {
            let token = crate::agent::service_account_token(binary, None).await?;
            all_env.push((status_channel::auth::TOKEN_FILE_ENV.into(), token.into()));
        }
        all_env.extend(env.iter().map(|(k, v)| ((*k).into(), (*v).into())));
        let log_path = cluster_dir().join("logs").join(format!("{log_name}.log"));
        Self::spawn(scope, &path, &log_path, args, &all_env)
    }

    /// Starts `program` with `args` and exactly `env` added (not the local cluster's
    /// KUBECONFIG: it may be meant for another cluster), inside network namespace `netns`
    /// when given (`ip netns exec`, which then becomes the process itself), logging to
    /// `<cluster>/logs/<log_name>.log`.
    pub fn start_program(
        scope: &str,
        netns: Option<&str>,
        program: &Path,
        log_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let env: Vec<(String, OsString)> = env.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        let log_path = cluster_dir().join("logs").join(format!("{log_name}.log"));
        match netns {
            None => Self::spawn(scope, program, &log_path, args, &env),
            Some(netns) => {
                let program = program.to_str().context("program path is not UTF-8")?;
                let mut in_netns = vec!["netns", "exec", netns, program];
                in_netns.extend_from_slice(args);
                Self::spawn(scope, Path::new("ip"), &log_path, &in_netns, &env)
            }
        }
    }

    /// Starts `program` (no cluster involved), its output to `log_path`, and registers it.
    fn spawn(
        scope: &str,
        program: &Path,
        log_path: &Path,
        args: &[&str],
        env: &[(String, OsString)],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(log_path.parent().context("log dir")?)?;
        let log = std::fs::File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
        let tracked = Arc::new(Tracked {
            binary: program
                .file_name()
                .map_or_else(|| program.display().to_string(), |n| n.to_string_lossy().into_owned()),
            log_path: log_path.to_owned(),
            exit_expected: AtomicBool::new(false),
            child: Mutex::new(child),
        });
        let mut registry = lock(&REGISTRY);
        registry.retain(|(_, weak)| weak.strong_count() > 0);
        registry.push((scope.to_owned(), Arc::downgrade(&tracked)));
        Ok(Self {
            tracked,
            log_path: log_path.to_owned(),
        })
    }

    /// Starts a process with an admin server (`/livez`) on a free loopback address and
    /// waits until it answers; `make_args` gets the address (`127.0.0.1:<port>`). Started
    /// again on a new address when it lost the race for the first one. Returns the process
    /// and its admin address.
    pub async fn start_with_admin(
        scope: &str,
        binary: &str,
        log_name: &str,
        make_args: impl Fn(&str) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<(Self, String)> {
        retry_address_race(async || {
            let admin = free_loopback_addr()?.to_string();
            let args = make_args(&admin);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let process = Self::start(scope, binary, log_name, &args, env).await?;
            process.wait_http_ok(&admin, "/livez", Duration::from_secs(60)).await?;
            Ok((process, admin))
        })
        .await
    }

    /// Everything the process has logged so far.
    pub fn logs(&self) -> String {
        read_log(&self.log_path)
    }

    /// Stops the process (SIGKILL; tests use it to simulate crashes too) and waits until
    /// it is gone. Its exit is expected from now on.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.expect_exit();
        {
            let mut child = lock(&self.tracked.child);
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            child.start_kill()?;
        }
        // Poll rather than `Child::wait`: the child sits behind a std Mutex the registry
        // shares, which must not be held across an await.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while lock(&self.tracked.child).try_wait()?.is_none() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{} still running 10 s after SIGKILL",
                self.tracked.binary
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Stops the process as an orchestrator does: SIGTERM, then SIGKILL if it is still
    /// running after `grace`. Waits until it is gone; its exit is expected from now on.
    pub async fn terminate(&mut self, grace: Duration) -> anyhow::Result<()> {
        self.expect_exit();
        let Some(pid) = self.pid() else { return Ok(()) };
        // `kill` the command: no signal crate for one call.
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .with_context(|| format!("sending SIGTERM to {}", self.tracked.binary))?;
        let deadline = tokio::time::Instant::now() + grace;
        while sent.success() && tokio::time::Instant::now() < deadline {
            if lock(&self.tracked.child).try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.kill().await
    }

    /// Declares that the process may exit on its own (e.g. a replica that loses its
    /// Lease, or one started with flags it must refuse): waits ignore its exit.
    pub fn expect_exit(&self) {
        self.tracked.exit_expected.store(true, Ordering::SeqCst);
    }

    /// The process id (for RSS measurements); `None` once it has exited and been reaped.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.tracked.child).id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// How it ended, once it has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.tracked.exit_status()
    }

    /// Fails with [`ProcessExited`] if this process has exited unexpectedly.
    pub fn check_running(&self, what: &str) -> Result<(), ProcessExited> {
        self.tracked.check(what)
    }

    /// Waits until `GET http://<addr><path>` answers 200, failing at once, with the log,
    /// if the process exits meanwhile.
    pub async fn wait_http_ok(&self, addr: &str, path: &str, timeout: Duration) -> anyhow::Result<()> {
        let what = format!("GET http://{addr}{path} to answer 200");
        let base = format!("http://{addr}");
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Bounded: a process that accepts but never answers must not hang the wait.
            let last = match tokio::time::timeout(Duration::from_secs(5), crate::agent::http(&base, "GET", path, None))
                .await
            {
                Ok(Ok((200, _))) => return Ok(()),
                Ok(Ok((status, body))) => format!("HTTP {status}: {body}"),
                Ok(Err(e)) => format!("{e:#}"),
                Err(_) => "no answer within 5 s".to_owned(),
            };
            self.check_running(&what)?;
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {what} ({}); last observed: {last}; last {LOG_TAIL_LINES} lines of {}:\n{}",
                    self.tracked.binary,
                    self.log_path.display(),
                    log_tail(&self.log_path, LOG_TAIL_LINES, None)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The logs of one test's processes, under the system temp dir (no cluster involved).
    fn log_dir(scope: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vws-e2e-process-{}-{scope}", std::process::id()))
    }

    fn sh(scope: &str, name: &str, script: &str) -> ControllerProcess {
        let log = log_dir(scope).join(format!("{name}.log"));
        ControllerProcess::spawn(scope, Path::new("/bin/sh"), &log, &["-c", script], &[]).expect("spawn sh")
    }

    async fn wait_exited(p: &ControllerProcess) {
        while p.exit_status().is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls until a check of `scope` fails (the process has exited), at most 10 s.
    async fn exit_noticed(scope: &str, what: &str) -> ProcessExited {
        for _ in 0..1000 {
            if let Err(e) = check_exits(Some(scope), what) {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no exit noticed in scope {scope}");
    }

    #[test]
    fn free_loopback_addresses_are_loopback_distinct_and_bindable() {
        let addrs: Vec<SocketAddr> = (0..50).map(|_| free_loopback_addr().expect("addr")).collect();
        let ports: BTreeSet<u16> = addrs.iter().map(SocketAddr::port).collect();
        assert_eq!(ports.len(), addrs.len(), "never the same port twice: {addrs:?}");
        for addr in &addrs {
            assert_eq!(addr.ip(), Ipv4Addr::LOCALHOST);
            assert!(TEST_PORTS.contains(&addr.port()), "outside the test ports: {addr}");
        }
        // Released: the process it is meant for can bind it. Any other process in the
        // network namespace may take one in the meantime (the reason `retry_address_race`
        // exists), so one bindable address of the fifty shows the release, without a flake.
        assert!(
            addrs.iter().any(|a| TcpListener::bind(a).is_ok()),
            "none of {addrs:?} can be bound again"
        );
    }

    #[tokio::test]
    async fn an_unexpected_exit_fails_the_checks_of_its_scope_only_with_its_log() {
        let _crashed = sh("unit-crash", "crash", "echo starting; echo 'fatal: no way' >&2; exit 3");
        let _other = sh("unit-bystander", "bystander", "sleep 30");
        let exited = exit_noticed("unit-crash", "the app to be Ready").await;
        assert_eq!(exited.binary, "sh");
        assert_eq!(exited.status.code(), Some(3));
        let message = exited.to_string();
        assert!(
            message.starts_with("sh exited (exit status: 3) while waiting for the app to be Ready; last 40 lines of "),
            "{message}"
        );
        assert!(message.contains("crash.log"), "{message}");
        assert!(message.contains("starting\nfatal: no way"), "{message}");
        assert!(!exited.address_taken());
        // Another test's waits are not concerned; waits over every scope (benches) are.
        check_exits(Some("unit-bystander"), "x").expect("other scope unaffected");
        assert!(check_exits(None, "x").is_err());
        for scope in ["unit-crash", "unit-bystander"] {
            let _ = std::fs::remove_dir_all(log_dir(scope));
        }
    }

    #[tokio::test]
    async fn killed_expected_and_dropped_processes_are_no_failure() {
        let mut killed = sh("unit-quiet", "killed", "sleep 30");
        assert!(killed.is_running());
        assert!(killed.pid().is_some());
        killed.kill().await.expect("kill");
        assert!(!killed.is_running());
        killed.kill().await.expect("killing twice is fine");

        let expected = sh("unit-quiet", "expected", "exit 1");
        expected.expect_exit();
        wait_exited(&expected).await;

        let dropped = sh("unit-quiet", "dropped", "exit 1");
        wait_exited(&dropped).await;
        drop(dropped);
        check_exits(Some("unit-quiet"), "x").expect("nothing unexpected");
        drop((killed, expected));
        // A concurrent check over every scope may hold one for a moment.
        let live = || {
            lock(&REGISTRY)
                .iter()
                .any(|(s, w)| s == "unit-quiet" && w.strong_count() > 0)
        };
        for _ in 0..100 {
            if !live() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!live(), "dropped processes leave the registry");
        let _ = std::fs::remove_dir_all(log_dir("unit-quiet"));
    }

    #[tokio::test]
    async fn waiting_for_http_stops_as_soon_as_the_process_exits() {
        let addr = free_loopback_addr().expect("addr").to_string();
        let p = sh(
            "unit-http",
            "http",
            "echo 'Error: binding admin server: Address already in use (os error 98)'; exit 1",
        );
        let started = std::time::Instant::now();
        let err = p
            .wait_http_ok(&addr, "/livez", Duration::from_secs(60))
            .await
            .expect_err("it exited");
        assert!(started.elapsed() < Duration::from_secs(10), "failed fast");
        let exited = err.downcast_ref::<ProcessExited>().expect("a ProcessExited");
        assert!(exited.address_taken());
        assert!(exited.what.contains(&addr), "{exited}");
        let _ = std::fs::remove_dir_all(log_dir("unit-http"));
    }

    #[tokio::test]
    async fn a_lost_address_race_is_retried_and_other_failures_are_not() {
        let mut attempts = 0;
        let result = retry_address_race(async || {
            attempts += 1;
            let p = if attempts == 1 {
                let p = sh(
                    "unit-retry",
                    "lost",
                    "echo 'Address already in use (os error 98)'; exit 1",
                );
                wait_exited(&p).await;
                p
            } else {
                sh("unit-retry", "won", "sleep 30")
            };
            p.check_running("it to serve")?;
            Ok(p)
        })
        .await;
        assert!(result.is_ok(), "{:?}", result.err());
        assert_eq!(attempts, 2);

        let mut attempts = 0;
        let result: anyhow::Result<()> = retry_address_race(async || {
            attempts += 1;
            let p = sh("unit-retry-other", "other", "echo 'bad flag'; exit 2");
            wait_exited(&p).await;
            Ok(p.check_running("it to serve")?)
        })
        .await;
        assert!(result.expect_err("failed").to_string().contains("bad flag"));
        assert_eq!(attempts, 1, "no retry for anything but a taken address");
        for scope in ["unit-retry", "unit-retry-other"] {
            let _ = std::fs::remove_dir_all(log_dir(scope));
        }
    }
}
