//! Lease-based leader election (`coordination.k8s.io/v1` Lease), client-go style.
//!
//! Every replica watches, caches and serves health; only the leader writes. The
//! algorithm, as in client-go's `leaderelection`:
//!
//! * **Acquire** when the Lease is absent, free (no holder) or expired
//!   (`renewTime + leaseDurationSeconds < now`). Taking over from another holder
//!   also requires that this replica itself saw the record unchanged for a full
//!   lease duration (client-go's `observedTime`), so a skewed wall clock cannot make
//!   two leaders.
//! * **Renew** every retry period while leading. Writes use optimistic concurrency
//!   (`replace` with the `resourceVersion` just read), so two candidates can never
//!   both win the same round.
//! * **Step down** when renewals keep failing for longer than the renew deadline
//!   (shorter than the lease duration, so nobody else can have taken over yet) or
//!   when another holder is seen. The gate closes at once (a replica that lost the
//!   lease must stop writing at once) and the replica **follows** again, competing by
//!   the acquire rule above; it does not exit. Exiting would turn an API server outage
//!   of more than the renew deadline into every leader restarting at once, each
//!   relisting everything when the API server comes back. State that assumed leadership
//!   is rebuilt on the next acquisition by whoever keeps it (the agent reads its
//!   acknowledgement ledger back); controllers are level-based and followers requeue.
//! * **Release** on graceful shutdown: the holder is cleared so a successor takes
//!   over on its next attempt instead of waiting for expiry.
//!
//! [`decide`] holds the decision logic as a pure function; [`LeaderElector`] does
//! the I/O around it. Controllers check a [`LeaderGate`] before every write.

use std::{
    hash::{BuildHasher as _, Hasher as _},
    time::Duration,
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, Client, api::PostParams};
use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    args::{ArgsError, CommonArgs, validate_timings},
    metrics::{LEADER_ELECTION_CONTROLLER, Metrics, WriteVerb},
};

/// Field manager recorded on Lease writes.
pub const FIELD_MANAGER: &str = "vworkspace-leader-election";

/// Why leader election stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// Inconsistent flags.
    #[error(transparent)]
    Config(#[from] ArgsError),
    /// The election task panicked or was aborted: no task renews the Lease, so the gate is
    /// closed for good and the binary exits. (Leadership lost is not an error: the replica
    /// steps down and follows again, see [`LeaderElector::spawn`].)
    #[error("leader election task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Timings and names of one election. Build it with [`LeaderConfig::from_args`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace.
    pub lease_namespace: String,
    /// This replica's identity (`holderIdentity`).
    pub identity: String,
    /// Validity of a renewal, as seen by the other replicas.
    pub lease_duration: Duration,
    /// How long the leader retries a failing renewal before stepping down.
    pub renew_deadline: Duration,
    /// Interval between attempts.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// From the common flags: `--lease-name` or `default_lease_name`, `--lease-namespace`
    /// (`POD_NAMESPACE`) or `client_namespace` (the namespace the client runs in).
    pub fn from_args(args: &CommonArgs, default_lease_name: &str, client_namespace: &str) -> Result<Self, LeaderError> {
        let config = Self {
            lease_name: args.lease_name.clone().unwrap_or_else(|| default_lease_name.to_owned()),
            lease_namespace: args
                .lease_namespace
                .clone()
                .unwrap_or_else(|| client_namespace.to_owned()),
            identity: args.identity.clone(),
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the timing rules and that names and identity are non-empty.
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.identity.trim().is_empty() {
            return Err(ArgsError::EmptyIdentity.into());
        }
        if self.lease_name.is_empty() || self.lease_namespace.is_empty() {
            return Err(ArgsError::LeaderTimings("the Lease name and namespace must not be empty".into()).into());
        }
        Ok(validate_timings(
            self.lease_duration,
            self.renew_deadline,
            self.retry_period,
        )?)
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.lease_namespace, self.lease_name)
    }
}

// ---------------------------------------------------------------------------
// Pure decision logic
// ---------------------------------------------------------------------------

/// The election-relevant part of a Lease's spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// Current holder; `None` or empty means free.
    pub holder_identity: Option<String>,
    /// When the current holder acquired it.
    pub acquire_time: Option<Timestamp>,
    /// Last renewal by the holder.
    pub renew_time: Option<Timestamp>,
    /// How long a renewal is valid.
    pub lease_duration_seconds: Option<i32>,
    /// Number of holder changes so far.
    pub lease_transitions: i32,
}

impl LeaseState {
    /// Reads the election fields of a Lease spec.
    pub fn from_spec(spec: &LeaseSpec) -> Self {
        Self {
            holder_identity: spec.holder_identity.clone(),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            lease_duration_seconds: spec.lease_duration_seconds,
            lease_transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// Writes the election fields into `spec`, leaving the others (`strategy`, `preferredHolder`) alone.
    pub fn apply_to(&self, spec: &mut LeaseSpec) {
        spec.holder_identity.clone_from(&self.holder_identity);
        spec.acquire_time = self.acquire_time.map(MicroTime);
        spec.renew_time = self.renew_time.map(MicroTime);
        spec.lease_duration_seconds = self.lease_duration_seconds;
        spec.lease_transitions = Some(self.lease_transitions);
    }

    /// The holder, if any (an empty string counts as none).
    pub fn holder(&self) -> Option<&str> {
        self.holder_identity.as_deref().filter(|h| !h.is_empty())
    }

    /// When the current renewal stops being valid. `None` if the record carries no time
    /// at all (it cannot prove it is fresh). Saturates at the maximum timestamp.
    pub fn expires_at(&self, default_duration: Duration) -> Option<Timestamp> {
        let since = self.renew_time.or(self.acquire_time)?;
        let secs = match self.lease_duration_seconds {
            Some(s) if s > 0 => i64::from(s),
            // Missing or nonsensical: assume our own duration rather than "already expired".
            _ => i64::try_from(default_duration.as_secs()).unwrap_or(i64::MAX),
        };
        Some(
            since
                .checked_add(SignedDuration::from_secs(secs))
                .unwrap_or(Timestamp::MAX),
        )
    }
}

/// What this replica should do with the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Take the Lease: write `lease` (create it, or replace it at the read `resourceVersion`).
    Acquire {
        /// The record to write.
        lease: LeaseState,
        /// The expired holder being replaced (`None` if the Lease was absent or free).
        takeover_from: Option<String>,
    },
    /// We hold it: write `lease` (renewed) at the read `resourceVersion`.
    Renew(LeaseState),
    /// Someone else holds a valid Lease.
    Follow {
        /// The current holder.
        holder: String,
        /// When their renewal expires, by the record's timestamps.
        expires_at: Timestamp,
    },
}

/// The timing inputs of [`decide`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTiming {
    /// Our lease duration, written on acquire/renew and assumed for records without one.
    pub lease_duration: Duration,
}

/// Decides, from the Lease as read (`None` if absent), what `me` should do at `now`.
///
/// A lease is expired when `renewTime + leaseDurationSeconds < now` (strictly: at the
/// exact boundary it is still held). A renew time in the future (skewed clock) keeps
/// the lease held. Every change of holder on an existing record increments
/// `leaseTransitions`; renewing keeps it.
pub fn decide(lease: Option<&LeaseState>, me: &str, now: Timestamp, timing: &ElectionTiming) -> Decision {
    let duration_secs = i32::try_from(timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let mine = |acquire_time, transitions| LeaseState {
        holder_identity: Some(me.to_owned()),
        acquire_time: Some(acquire_time),
        renew_time: Some(now),
        lease_duration_seconds: Some(duration_secs),
        lease_transitions: transitions,
    };

    let Some(current) = lease else {
        return Decision::Acquire {
            lease: mine(now, 0),
            takeover_from: None,
        };
    };
    let next_transitions = current.lease_transitions.saturating_add(1);
    match current.holder() {
        Some(holder) if holder == me => {
            Decision::Renew(mine(current.acquire_time.unwrap_or(now), current.lease_transitions))
        }
        None => Decision::Acquire {
            lease: mine(now, next_transitions),
            takeover_from: None,
        },
        Some(holder) => match current.expires_at(timing.lease_duration) {
            Some(expires_at) if expires_at >= now => Decision::Follow {
                holder: holder.to_owned(),
                expires_at,
            },
            _ => Decision::Acquire {
                lease: mine(now, next_transitions),
                takeover_from: Some(holder.to_owned()),
            },
        },
    }
}

/// The record written on graceful release: no holder, a 1 s duration, transitions kept.
pub fn released(current: &LeaseState, now: Timestamp) -> LeaseState {
    LeaseState {
        holder_identity: None,
        acquire_time: Some(now),
        renew_time: Some(now),
        lease_duration_seconds: Some(1),
        lease_transitions: current.lease_transitions,
    }
}

// ---------------------------------------------------------------------------
// Gate
// ---------------------------------------------------------------------------

/// Cheap, cloneable answer to "may I write now?". Check it right before every write.
#[derive(Clone, Debug)]
pub struct LeaderGate {
    rx: Option<watch::Receiver<bool>>,
}

impl LeaderGate {
    /// A gate that is always open: leader election is disabled (single replica).
    pub fn always_leader() -> Self {
        Self { rx: None }
    }

    /// A gate following an elector's `is_leader` channel.
    pub fn new(rx: watch::Receiver<bool>) -> Self {
        Self { rx: Some(rx) }
    }

    /// Whether this replica may write now. `false` as soon as the elector steps down,
    /// and also if the elector task is gone (panicked or aborted): no task renewing
    /// the Lease means no right to write.
    pub fn is_leader(&self) -> bool {
        self.rx
            .as_ref()
            .is_none_or(|rx| *rx.borrow() && rx.has_changed().is_ok())
    }

    /// Waits until this replica leads (at once if it does). Returns `false` if the
    /// elector is gone (it will never lead).
    pub async fn wait_for_leadership(&self) -> bool {
        let Some(rx) = &self.rx else { return true };
        let mut rx = rx.clone();
        loop {
            if rx.has_changed().is_err() {
                return false;
            }
            if *rx.borrow_and_update() {
                return true;
            }
            if rx.changed().await.is_err() {
                return false;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Elector
// ---------------------------------------------------------------------------

/// Runs the election loop against the API server.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderConfig,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Outcome of one acquire-or-renew attempt.
#[derive(Debug)]
enum Attempt {
    Leading,
    Following {
        holder: String,
    },
    /// Someone wrote between our read and our write; try again next period.
    Conflict,
}

/// The record last read, and since when (monotonic) it has not changed.
struct Observed {
    resource_version: Option<String>,
    since: Instant,
}

impl LeaderElector {
    /// An elector for `config` (validated) using `client`.
    pub fn new(client: Client, config: LeaderConfig) -> Result<Self, LeaderError> {
        config.validate()?;
        let api = Api::namespaced(client, &config.lease_namespace);
        Ok(Self {
            api,
            config,
            metrics: None,
        })
    }

    /// Counts Lease writes in `api_writes_total` and publishes the `leader` gauge.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Starts the election loop. The receiver turns `true` while this replica leads.
    ///
    /// The task returns `Ok(())` after `shutdown` is cancelled (having released the
    /// Lease if it held it). Leadership lost (the renew deadline passed, say while the API
    /// server is unreachable, or another holder appeared) closes the gate at once and makes
    /// this replica a follower again, competing for the Lease by the same rules; it does
    /// not end the task, so an API server outage does not make every leader exit at once.
    pub fn spawn(self, shutdown: CancellationToken) -> (watch::Receiver<bool>, JoinHandle<Result<(), LeaderError>>) {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(self.run(tx, shutdown));
        (rx, task)
    }

    async fn run(self, tx: watch::Sender<bool>, shutdown: CancellationToken) -> Result<(), LeaderError> {
        let cfg = &self.config;
        let lease = cfg.lease_ref();
        tracing::info!(%lease, identity = %cfg.identity, "starting leader election");
        let mut observed: Option<Observed> = None;
        // Monotonic start of the last successful acquire/renew while leading.
        let mut last_renew: Option<Instant> = None;
        let mut last_error: Option<kube::Error> = None;

        loop {
            let started = Instant::now();
            let budget = match last_renew {
                Some(at) => (at + cfg.renew_deadline).saturating_duration_since(started),
                None => cfg.renew_deadline,
            };
            let attempt = tokio::select! {
                () = shutdown.cancelled() => break,
                res = tokio::time::timeout(budget, self.try_acquire_or_renew(&mut observed)) => res,
            };
            match attempt {
                Ok(Ok(Attempt::Leading)) => {
                    last_renew = Some(started);
                    last_error = None;
                    if !*tx.borrow() {
                        tracing::info!(%lease, identity = %cfg.identity, "acquired leadership");
                        self.set_leader(&tx, true);
                    }
                }
                Ok(Ok(Attempt::Following { holder })) => {
                    if last_renew.take().is_some() {
                        self.set_leader(&tx, false);
                        tracing::error!(%lease, %holder, "lost leadership; following again");
                    } else {
                        tracing::debug!(%lease, %holder, "following");
                    }
                }
                Ok(Ok(Attempt::Conflict)) => tracing::debug!(%lease, "Lease changed under us; retrying"),
                Ok(Err(err)) => {
                    tracing::warn!(%lease, error = %err, "leader election attempt failed");
                    last_error = Some(err);
                }
                Err(_elapsed) => tracing::warn!(%lease, ?budget, "leader election attempt timed out"),
            }

            if let Some(at) = last_renew
                && Instant::now() >= at + cfg.renew_deadline
            {
                // Stepped down before the Lease can expire for anyone else; the writes stop
                // now (every controller checks the gate before writing). Then follow: the
                // Lease is taken again only after seeing it unchanged for a full duration.
                self.set_leader(&tx, false);
                let error = last_error
                    .take()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "timed out".to_owned());
                tracing::error!(
                    %lease,
                    deadline = ?cfg.renew_deadline,
                    %error,
                    "renew deadline exceeded; stepped down, following again"
                );
                last_renew = None;
                observed = None;
            }

            let wait = match last_renew {
                // Wake up at the deadline at the latest, to step down on time.
                Some(at) => cfg
                    .retry_period
                    .min((at + cfg.renew_deadline).saturating_duration_since(Instant::now())),
                // Followers spread their attempts a little so they do not hit the API server in lockstep.
                None => cfg.retry_period.mul_f64(1.0 + 0.2 * jitter()),
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }

        let was_leader = *tx.borrow();
        self.set_leader(&tx, false);
        if was_leader {
            match tokio::time::timeout(cfg.renew_deadline, self.release()).await {
                Ok(Ok(())) => tracing::info!(%lease, "released the Lease"),
                Ok(Err(err)) => tracing::warn!(%lease, error = %err, "could not release the Lease; it will expire"),
                Err(_) => tracing::warn!(%lease, "releasing the Lease timed out; it will expire"),
            }
        }
        Ok(())
    }

    fn set_leader(&self, tx: &watch::Sender<bool>, leading: bool) {
        tx.send_replace(leading);
        if let Some(metrics) = &self.metrics {
            metrics.set_leader(leading);
        }
    }

    fn count_write(&self, verb: WriteVerb) {
        if let Some(metrics) = &self.metrics {
            metrics.api_write(LEADER_ELECTION_CONTROLLER, verb, "Lease");
        }
    }

    fn post_params() -> PostParams {
        crate::writes::create_as(FIELD_MANAGER)
    }

    async fn try_acquire_or_renew(&self, observed: &mut Option<Observed>) -> Result<Attempt, kube::Error> {
        let cfg = &self.config;
        let timing = ElectionTiming {
            lease_duration: cfg.lease_duration,
        };
        let now = Timestamp::now();

        let Some(mut current) = self.api.get_opt(&cfg.lease_name).await? else {
            let Decision::Acquire { lease: state, .. } = decide(None, &cfg.identity, now, &timing) else {
                return Ok(Attempt::Conflict); // decide() always acquires an absent Lease
            };
            let mut spec = LeaseSpec::default();
            state.apply_to(&mut spec);
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.lease_name.clone()),
                    namespace: Some(cfg.lease_namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            self.count_write(WriteVerb::Create);
            return match self.api.create(&Self::post_params(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => Ok(Attempt::Conflict),
                Err(err) => Err(err),
            };
        };

        let rv = current.metadata.resource_version.clone();
        let stable_since = match observed {
            Some(o) if o.resource_version == rv => o.since,
            _ => {
                let since = Instant::now();
                *observed = Some(Observed {
                    resource_version: rv,
                    since,
                });
                since
            }
        };

        let spec = current.spec.get_or_insert_with(LeaseSpec::default);
        let state = match decide(Some(&LeaseState::from_spec(spec)), &cfg.identity, now, &timing) {
            Decision::Follow { holder, .. } => return Ok(Attempt::Following { holder }),
            Decision::Acquire {
                takeover_from: Some(holder),
                ..
            } if stable_since.elapsed() < cfg.lease_duration => {
                // Expired by its timestamps, but we have not watched it go stale for a full
                // lease duration ourselves: our clock may be ahead of the holder's.
                return Ok(Attempt::Following { holder });
            }
            Decision::Acquire { lease, .. } | Decision::Renew(lease) => lease,
        };
        state.apply_to(spec);
        self.count_write(WriteVerb::Replace);
        match self.api.replace(&cfg.lease_name, &Self::post_params(), &current).await {
            Ok(_) => Ok(Attempt::Leading),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Conflict),
            Err(err) => Err(err),
        }
    }

    /// Clears the holder if it is still us, so a successor need not wait for expiry.
    async fn release(&self) -> Result<(), kube::Error> {
        let cfg = &self.config;
        let Some(mut current) = self.api.get_opt(&cfg.lease_name).await? else {
            return Ok(());
        };
        let spec = current.spec.get_or_insert_with(LeaseSpec::default);
        let state = LeaseState::from_spec(spec);
        if state.holder() != Some(cfg.identity.as_str()) {
            return Ok(());
        }
        released(&state, Timestamp::now()).apply_to(spec);
        self.count_write(WriteVerb::Replace);
        self.api
            .replace(&cfg.lease_name, &Self::post_params(), &current)
            .await
            .map(drop)
    }
}

/// A number in `[0, 1)`, different per call and per process, without a `rand` dependency.
fn jitter() -> f64 {
    // 53 random bits: exactly representable in an f64, so the casts are lossless.
    let bits = std::hash::RandomState::new().build_hasher().finish() >> 11;
    #[allow(clippy::cast_precision_loss)]
    let unit = bits as f64 / (1u64 << 53) as f64;
    unit
}

// ---------------------------------------------------------------------------
// Wiring helper for binaries
// ---------------------------------------------------------------------------

/// Leader election as a binary uses it: a gate for the controllers and a task to await.
#[derive(Debug)]
pub struct LeaderElection {
    gate: LeaderGate,
    task: Option<JoinHandle<Result<(), LeaderError>>>,
    shutdown: CancellationToken,
}

impl LeaderElection {
    /// Starts leader election if `--leader-elect` is set; otherwise the gate is always open.
    ///
    /// The Lease defaults to `default_lease_name` in the client's namespace.
    pub fn start(
        client: Client,
        args: &CommonArgs,
        default_lease_name: &str,
        metrics: &Metrics,
        shutdown: &CancellationToken,
    ) -> Result<Self, LeaderError> {
        if !args.leader_elect {
            metrics.set_leader(true);
            return Ok(Self {
                gate: LeaderGate::always_leader(),
                task: None,
                shutdown: shutdown.clone(),
            });
        }
        let config = LeaderConfig::from_args(args, default_lease_name, client.default_namespace())?;
        let (rx, task) = LeaderElector::new(client, config)?
            .with_metrics(metrics.clone())
            .spawn(shutdown.clone());
        Ok(Self {
            gate: LeaderGate::new(rx),
            task: Some(task),
            shutdown: shutdown.clone(),
        })
    }

    /// An election from its parts, for tests of what waits on it (no client needed).
    #[cfg(test)]
    pub(crate) fn from_parts(
        gate: LeaderGate,
        task: Option<JoinHandle<Result<(), LeaderError>>>,
        shutdown: CancellationToken,
    ) -> Self {
        Self { gate, task, shutdown }
    }

    /// The gate to hand to controllers.
    pub fn gate(&self) -> LeaderGate {
        self.gate.clone()
    }

    /// Completes when the election ends: `Ok` after shutdown (Lease released), an error
    /// when leadership was lost. Cancel-safe, so it can sit in a `tokio::select!`; once
    /// it has returned, later calls wait for shutdown only.
    pub async fn wait(&mut self) -> Result<(), LeaderError> {
        match &mut self.task {
            None => {
                self.shutdown.cancelled().await;
                Ok(())
            }
            Some(task) => {
                let res = task.await;
                self.task = None;
                res?
            }
        }
    }
}

#[cfg(test)]
mod tests;
