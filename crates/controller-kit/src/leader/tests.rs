use std::sync::{Arc, Mutex};

use http_body_util::BodyExt as _;

use super::*;

// ---------------------------------------------------------------------------
// decide(): pure decision table
// ---------------------------------------------------------------------------

const TIMING: ElectionTiming = ElectionTiming {
    lease_duration: Duration::from_secs(15),
};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn held(holder: &str, renew: &str, duration: Option<i32>, transitions: i32) -> LeaseState {
    LeaseState {
        holder_identity: Some(holder.to_owned()),
        acquire_time: Some(ts("2026-01-01T00:00:00Z")),
        renew_time: Some(ts(renew)),
        lease_duration_seconds: duration,
        lease_transitions: transitions,
    }
}

fn mine(now: Timestamp, acquired: Timestamp, transitions: i32) -> LeaseState {
    LeaseState {
        holder_identity: Some("me".into()),
        acquire_time: Some(acquired),
        renew_time: Some(now),
        lease_duration_seconds: Some(15),
        lease_transitions: transitions,
    }
}

#[test]
fn absent_lease_is_acquired_with_zero_transitions() {
    let now = ts("2026-01-01T12:00:00Z");
    assert_eq!(
        decide(None, "me", now, &TIMING),
        Decision::Acquire {
            lease: mine(now, now, 0),
            takeover_from: None
        }
    );
}

#[test]
fn free_lease_is_acquired_and_counts_a_transition() {
    let now = ts("2026-01-01T12:00:00Z");
    for holder in [None, Some(String::new())] {
        let free = LeaseState {
            holder_identity: holder,
            lease_transitions: 3,
            ..LeaseState::default()
        };
        assert_eq!(
            decide(Some(&free), "me", now, &TIMING),
            Decision::Acquire {
                lease: mine(now, now, 4),
                takeover_from: None
            }
        );
    }
}

#[test]
fn fresh_lease_of_another_is_followed() {
    let now = ts("2026-01-01T12:00:10Z");
    let lease = held("other", "2026-01-01T12:00:00Z", Some(15), 2);
    assert_eq!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Follow {
            holder: "other".into(),
            expires_at: ts("2026-01-01T12:00:15Z")
        }
    );
}

#[test]
fn expiry_boundary_is_strict() {
    let lease = held("other", "2026-01-01T12:00:00Z", Some(15), 2);
    // renewTime + duration == now: still held.
    let at = ts("2026-01-01T12:00:15Z");
    assert!(matches!(
        decide(Some(&lease), "me", at, &TIMING),
        Decision::Follow { .. }
    ));
    // One microsecond later (MicroTime's resolution): expired, taken over.
    let after = ts("2026-01-01T12:00:15.000001Z");
    assert_eq!(
        decide(Some(&lease), "me", after, &TIMING),
        Decision::Acquire {
            lease: mine(after, after, 3),
            takeover_from: Some("other".into())
        }
    );
}

#[test]
fn own_lease_is_renewed_keeping_acquire_time_and_transitions() {
    let now = ts("2026-01-01T12:00:05Z");
    let lease = held("me", "2026-01-01T12:00:03Z", Some(15), 7);
    assert_eq!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Renew(mine(now, ts("2026-01-01T00:00:00Z"), 7))
    );
    // Even past expiry it is still ours as long as nobody else took it.
    let late = ts("2026-01-01T13:00:00Z");
    assert!(matches!(decide(Some(&lease), "me", late, &TIMING), Decision::Renew(_)));
    // Without an acquire time, the renewal fills it in.
    let bare = LeaseState {
        acquire_time: None,
        ..lease
    };
    assert_eq!(
        decide(Some(&bare), "me", now, &TIMING),
        Decision::Renew(mine(now, now, 7))
    );
}

#[test]
fn renew_time_in_the_future_keeps_the_lease_held() {
    // The holder's clock is ahead of ours: never treat that as expired.
    let now = ts("2026-01-01T12:00:00Z");
    let lease = held("other", "2026-01-01T12:05:00Z", Some(15), 0);
    assert_eq!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Follow {
            holder: "other".into(),
            expires_at: ts("2026-01-01T12:05:15Z")
        }
    );
}

#[test]
fn the_records_own_duration_wins_over_ours() {
    let lease = held("other", "2026-01-01T12:00:00Z", Some(60), 0);
    let now = ts("2026-01-01T12:00:30Z");
    assert!(matches!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Follow { .. }
    ));
    let now = ts("2026-01-01T12:01:01Z");
    assert!(matches!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Acquire { .. }
    ));
}

#[test]
fn missing_or_nonsensical_duration_falls_back_to_ours() {
    for duration in [None, Some(0), Some(-5)] {
        let lease = held("other", "2026-01-01T12:00:00Z", duration, 0);
        let within = ts("2026-01-01T12:00:14Z");
        assert!(
            matches!(decide(Some(&lease), "me", within, &TIMING), Decision::Follow { .. }),
            "{duration:?}"
        );
        let past = ts("2026-01-01T12:00:16Z");
        assert!(
            matches!(decide(Some(&lease), "me", past, &TIMING), Decision::Acquire { .. }),
            "{duration:?}"
        );
    }
}

#[test]
fn acquire_time_is_used_when_renew_time_is_missing() {
    let lease = LeaseState {
        renew_time: None,
        ..held("other", "2026-01-01T00:00:00Z", Some(15), 0)
    };
    let now = ts("2026-01-01T00:00:10Z");
    assert!(matches!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Follow { .. }
    ));
}

#[test]
fn held_lease_without_any_time_is_taken_over() {
    let lease = LeaseState {
        holder_identity: Some("other".into()),
        lease_transitions: 1,
        ..LeaseState::default()
    };
    let now = ts("2026-01-01T00:00:10Z");
    assert_eq!(
        decide(Some(&lease), "me", now, &TIMING),
        Decision::Acquire {
            lease: mine(now, now, 2),
            takeover_from: Some("other".into())
        }
    );
}

#[test]
fn extreme_values_do_not_panic() {
    let lease = LeaseState {
        holder_identity: Some("other".into()),
        renew_time: Some(Timestamp::MAX),
        lease_duration_seconds: Some(i32::MAX),
        lease_transitions: i32::MAX,
        ..LeaseState::default()
    };
    let now = ts("2026-01-01T00:00:00Z");
    assert!(
        matches!(decide(Some(&lease), "me", now, &TIMING), Decision::Follow { expires_at, .. } if expires_at == Timestamp::MAX)
    );
    let expired = LeaseState {
        renew_time: Some(Timestamp::MIN),
        ..lease
    };
    let Decision::Acquire { lease: taken, .. } = decide(Some(&expired), "me", now, &TIMING) else {
        panic!("expected a takeover")
    };
    assert_eq!(taken.lease_transitions, i32::MAX, "transitions saturate");
}

#[test]
fn released_lease_is_free_for_anyone() {
    let now = ts("2026-01-01T00:00:00Z");
    let ours = mine(now, now, 4);
    let free = released(&ours, now);
    assert_eq!(free.holder(), None);
    assert_eq!(free.lease_duration_seconds, Some(1));
    assert_eq!(free.lease_transitions, 4);
    let later = ts("2026-01-01T00:00:00.5Z");
    assert_eq!(
        decide(Some(&free), "next", later, &TIMING),
        Decision::Acquire {
            lease: LeaseState {
                holder_identity: Some("next".into()),
                ..mine(later, later, 5)
            },
            takeover_from: None,
        }
    );
}

/// Two replicas over time: transitions count every change of holder, never renewals.
#[test]
fn transitions_over_a_lifetime() {
    let t = |s: u32| {
        ts("2026-01-01T00:00:00Z")
            .checked_add(SignedDuration::from_secs(s.into()))
            .unwrap()
    };
    let write = |d: Decision| match d {
        Decision::Acquire { lease, .. } | Decision::Renew(lease) => lease,
        Decision::Follow { .. } => panic!("expected a write, got {d:?}"),
    };
    let a = write(decide(None, "a", t(0), &TIMING));
    assert!(matches!(decide(Some(&a), "b", t(1), &TIMING), Decision::Follow { .. }));
    let a = write(decide(Some(&a), "a", t(2), &TIMING));
    assert_eq!(a.lease_transitions, 0);
    // a crashes at t=2; b takes over after t=17.
    assert!(matches!(decide(Some(&a), "b", t(17), &TIMING), Decision::Follow { .. }));
    let b = write(decide(Some(&a), "b", t(18), &TIMING));
    assert_eq!((b.holder(), b.lease_transitions), (Some("b"), 1));
    // a restarts and follows; b shuts down gracefully and a re-acquires at once.
    assert!(matches!(decide(Some(&b), "a", t(19), &TIMING), Decision::Follow { .. }));
    let free = released(&b, t(20));
    let a = write(decide(Some(&free), "a", t(20), &TIMING));
    assert_eq!((a.holder(), a.lease_transitions), (Some("a"), 2));
}

#[test]
fn spec_round_trip_keeps_foreign_fields() {
    let mut spec = LeaseSpec {
        strategy: Some("OldestEmulationVersion".into()),
        ..LeaseSpec::default()
    };
    let state = held("me", "2026-01-01T12:00:00Z", Some(15), 1);
    state.apply_to(&mut spec);
    assert_eq!(LeaseState::from_spec(&spec), state);
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
}

// ---------------------------------------------------------------------------
// Config and gate
// ---------------------------------------------------------------------------

fn args(extra: &[&str]) -> CommonArgs {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }
    Cli::parse_from(std::iter::once("bin").chain(extra.iter().copied())).common
}

#[test]
fn config_from_args_uses_defaults_then_flags() {
    let c = LeaderConfig::from_args(&args(&["--identity", "pod-0"]), "app-controller", "vws").unwrap();
    assert_eq!(
        (c.lease_name.as_str(), c.lease_namespace.as_str()),
        ("app-controller", "vws")
    );
    let c = LeaderConfig::from_args(
        &args(&[
            "--identity",
            "pod-0",
            "--lease-name",
            "custom",
            "--lease-namespace",
            "ops",
        ]),
        "app-controller",
        "vws",
    )
    .unwrap();
    assert_eq!((c.lease_name.as_str(), c.lease_namespace.as_str()), ("custom", "ops"));
    assert!(LeaderConfig::from_args(&args(&["--retry-period", "9s"]), "x", "vws").is_err());
    assert!(LeaderConfig::from_args(&args(&[]), "x", "").is_err());
}

#[tokio::test]
async fn gate_follows_the_elector_and_closes_when_it_dies() {
    assert!(LeaderGate::always_leader().is_leader());
    assert!(LeaderGate::always_leader().wait_for_leadership().await);

    let (tx, rx) = watch::channel(false);
    let gate = LeaderGate::new(rx);
    assert!(!gate.is_leader());
    tx.send_replace(true);
    assert!(gate.clone().is_leader());
    assert!(gate.wait_for_leadership().await);
    drop(tx);
    assert!(!gate.is_leader(), "no elector, no writes");
    assert!(!gate.wait_for_leadership().await);
}

#[test]
fn jitter_is_in_unit_range() {
    for _ in 0..1000 {
        let j = jitter();
        assert!((0.0..1.0).contains(&j), "{j}");
    }
}

// ---------------------------------------------------------------------------
// The elector against an in-memory API server
// ---------------------------------------------------------------------------

const NS: &str = "vws";
const NAME: &str = "test-lease";

#[derive(Default)]
struct FakeState {
    lease: Option<Lease>,
    rv: u64,
    failing: bool,
}

/// Just enough of the API server for Leases: GET, POST and PUT with resourceVersion checks.
#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<FakeState>>);

fn status_response(code: u16, reason: &str) -> http::Response<kube::client::Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": reason, "reason": reason, "code": code,
    });
    json_response(code, &body)
}

fn json_response(code: u16, body: &impl serde::Serialize) -> http::Response<kube::client::Body> {
    let mut res = http::Response::new(kube::client::Body::from(serde_json::to_vec(body).unwrap()));
    *res.status_mut() = http::StatusCode::from_u16(code).unwrap();
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

impl FakeApi {
    fn client(&self) -> Client {
        let fake = self.clone();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let fake = fake.clone();
            async move { Ok::<_, std::convert::Infallible>(fake.handle(req).await) }
        });
        Client::new(svc, NS)
    }

    async fn handle(&self, req: http::Request<kube::client::Body>) -> http::Response<kube::client::Body> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
        let path = parts.uri.path();
        let mut st = self.0.lock().unwrap();
        if st.failing {
            return status_response(500, "InternalError");
        }
        match (parts.method, path) {
            (http::Method::GET, p) if p == format!("{collection}/{NAME}") => match &st.lease {
                Some(lease) => json_response(200, lease),
                None => status_response(404, "NotFound"),
            },
            (http::Method::POST, p) if p == collection => {
                if st.lease.is_some() {
                    return status_response(409, "AlreadyExists");
                }
                let mut lease: Lease = serde_json::from_slice(&bytes).unwrap();
                st.rv += 1;
                lease.metadata.resource_version = Some(st.rv.to_string());
                st.lease = Some(lease.clone());
                json_response(201, &lease)
            }
            (http::Method::PUT, p) if p == format!("{collection}/{NAME}") => {
                let mut lease: Lease = serde_json::from_slice(&bytes).unwrap();
                let stored = st.lease.as_ref().and_then(|l| l.metadata.resource_version.clone());
                if stored.is_none() || lease.metadata.resource_version != stored {
                    return status_response(409, "Conflict");
                }
                st.rv += 1;
                lease.metadata.resource_version = Some(st.rv.to_string());
                st.lease = Some(lease.clone());
                json_response(200, &lease)
            }
            (method, path) => panic!("unexpected request {method} {path}"),
        }
    }

    fn state(&self) -> LeaseState {
        let st = self.0.lock().unwrap();
        LeaseState::from_spec(st.lease.as_ref().and_then(|l| l.spec.as_ref()).unwrap())
    }

    fn rv(&self) -> u64 {
        self.0.lock().unwrap().rv
    }

    fn set_failing(&self, failing: bool) {
        self.0.lock().unwrap().failing = failing;
    }

    /// Simulates another process writing the Lease directly.
    fn overwrite(&self, state: &LeaseState) {
        let mut st = self.0.lock().unwrap();
        st.rv += 1;
        let rv = st.rv.to_string();
        let lease = st.lease.get_or_insert_with(Lease::default);
        lease.metadata.resource_version = Some(rv);
        state.apply_to(lease.spec.get_or_insert_with(LeaseSpec::default));
    }
}

fn config(identity: &str) -> LeaderConfig {
    config_with(identity, 2)
}

fn config_with(identity: &str, lease_secs: u64) -> LeaderConfig {
    LeaderConfig {
        lease_name: NAME.into(),
        lease_namespace: NS.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(lease_secs),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(100),
    }
}

struct Candidate {
    gate: LeaderGate,
    task: JoinHandle<Result<(), LeaderError>>,
    shutdown: CancellationToken,
}

fn candidate(fake: &FakeApi, identity: &str, metrics: Option<&Metrics>) -> Candidate {
    candidate_with(fake, config(identity), metrics)
}

fn candidate_with(fake: &FakeApi, config: LeaderConfig, metrics: Option<&Metrics>) -> Candidate {
    let mut elector = LeaderElector::new(fake.client(), config).unwrap();
    if let Some(m) = metrics {
        elector = elector.with_metrics(m.clone());
    }
    let shutdown = CancellationToken::new();
    let (rx, task) = elector.spawn(shutdown.clone());
    Candidate {
        gate: LeaderGate::new(rx),
        task,
        shutdown,
    }
}

async fn within<T>(secs: u64, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .expect("timed out")
}

#[tokio::test]
async fn acquires_renews_and_releases_on_shutdown() {
    let fake = FakeApi::default();
    let metrics = Metrics::new("t");
    let a = candidate(&fake, "a", Some(&metrics));
    assert!(within(5, a.gate.wait_for_leadership()).await);
    assert!(a.gate.is_leader());
    let st = fake.state();
    assert_eq!(
        (st.holder(), st.lease_transitions, st.lease_duration_seconds),
        (Some("a"), 0, Some(2))
    );

    let rv = fake.rv();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        fake.rv() >= rv + 2,
        "renews every retry period: rv {rv} -> {}",
        fake.rv()
    );
    let text = metrics.encode().unwrap();
    assert!(text.contains("t_leader 1"), "{text}");
    assert!(
        text.contains(r#"t_api_writes_total{controller="leader-election",verb="replace",kind="Lease"}"#),
        "{text}"
    );

    a.shutdown.cancel();
    within(5, a.task).await.unwrap().unwrap();
    assert!(!a.gate.is_leader());
    let st = fake.state();
    assert_eq!(
        (st.holder(), st.lease_duration_seconds),
        (None, Some(1)),
        "released on shutdown"
    );
    assert!(metrics.encode().unwrap().contains("t_leader 0"));
}

#[tokio::test]
async fn follower_takes_over_at_once_after_a_graceful_release() {
    let fake = FakeApi::default();
    // A long lease, so that "at once" is clearly not "after expiry".
    let a = candidate_with(&fake, config_with("a", 30), None);
    assert!(within(5, a.gate.wait_for_leadership()).await);
    let b = candidate_with(&fake, config_with("b", 30), None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!b.gate.is_leader(), "b follows while a renews");
    assert!(a.gate.is_leader());

    a.shutdown.cancel();
    within(5, a.task).await.unwrap().unwrap();
    let started = Instant::now();
    assert!(within(5, b.gate.wait_for_leadership()).await);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no need to wait for expiry: {:?}",
        started.elapsed()
    );
    let st = fake.state();
    assert_eq!((st.holder(), st.lease_transitions), (Some("b"), 1));

    b.shutdown.cancel();
    within(5, b.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn follower_takes_over_a_crashed_leader_only_after_expiry() {
    let fake = FakeApi::default();
    let a = candidate(&fake, "a", None);
    assert!(within(5, a.gate.wait_for_leadership()).await);
    let b = candidate(&fake, "b", None);
    tokio::time::sleep(Duration::from_millis(200)).await;

    a.task.abort(); // a crash: no release
    assert!(within(1, a.task).await.unwrap_err().is_cancelled());
    assert!(!a.gate.is_leader(), "a dead elector closes the gate");
    let crashed = Instant::now();
    assert!(within(6, b.gate.wait_for_leadership()).await);
    let waited = crashed.elapsed();
    assert!(
        waited >= Duration::from_millis(1800),
        "took over before the lease expired: {waited:?}"
    );
    assert_eq!(fake.state().holder(), Some("b"));
    assert_eq!(fake.state().lease_transitions, 1);

    b.shutdown.cancel();
    within(5, b.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn leader_steps_down_when_renewals_fail_past_the_deadline() {
    let fake = FakeApi::default();
    let a = candidate(&fake, "a", None);
    assert!(within(5, a.gate.wait_for_leadership()).await);

    fake.set_failing(true);
    let failing_since = Instant::now();
    within(5, async {
        while a.gate.is_leader() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let took = failing_since.elapsed();
    // The safety property: stepped down before the Lease could expire for anyone else.
    assert!(took < config("a").lease_duration, "stepped down late: {took:?}");
    assert!(
        took >= Duration::from_millis(800),
        "stepped down before the renew deadline: {took:?}"
    );
    // Issue 18: an API server outage does not end the elector (the binary would exit);
    // once the API server answers again, the replica leads again.
    assert!(!a.task.is_finished(), "the elector follows; it does not exit");
    fake.set_failing(false);
    assert!(within(6, a.gate.wait_for_leadership()).await);
    assert_eq!(fake.state().holder(), Some("a"));
    a.shutdown.cancel();
    within(5, a.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn leader_steps_down_when_another_holder_appears_and_follows() {
    let fake = FakeApi::default();
    let a = candidate(&fake, "a", None);
    assert!(within(5, a.gate.wait_for_leadership()).await);

    fake.overwrite(&LeaseState {
        holder_identity: Some("intruder".into()),
        renew_time: Some(Timestamp::now()),
        lease_duration_seconds: Some(2),
        ..LeaseState::default()
    });
    within(5, async {
        while a.gate.is_leader() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(!a.task.is_finished(), "the elector follows; it does not exit");
    // The intruder never renews: after its Lease expired, a takes over again.
    assert!(within(6, a.gate.wait_for_leadership()).await);
    assert_eq!(fake.state().holder(), Some("a"));
    a.shutdown.cancel();
    within(5, a.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn disabled_election_is_always_leader_and_ends_on_shutdown() {
    let fake = FakeApi::default();
    let metrics = Metrics::new("t");
    let shutdown = CancellationToken::new();
    let mut election = LeaderElection::start(fake.client(), &args(&[]), "x", &metrics, &shutdown).unwrap();
    assert!(election.gate().is_leader());
    assert!(metrics.encode().unwrap().contains("t_leader 1"));
    shutdown.cancel();
    within(1, election.wait()).await.unwrap();
    assert_eq!(fake.rv(), 0, "no Lease traffic without --leader-elect");
}

#[tokio::test]
async fn enabled_election_through_the_wiring_helper() {
    let fake = FakeApi::default();
    let metrics = Metrics::new("t");
    let shutdown = CancellationToken::new();
    let flags = args(&[
        "--leader-elect",
        "--identity",
        "pod-0",
        "--lease-name",
        NAME,
        "--lease-duration",
        "2s",
        "--renew-deadline",
        "1s",
        "--retry-period",
        "100ms",
    ]);
    let mut election = LeaderElection::start(fake.client(), &flags, "unused", &metrics, &shutdown).unwrap();
    let gate = election.gate();
    assert!(within(5, gate.wait_for_leadership()).await);
    assert_eq!(fake.state().holder(), Some("pod-0"));
    shutdown.cancel();
    within(5, election.wait()).await.unwrap();
    assert!(!gate.is_leader());
    assert_eq!(fake.state().holder(), None);
}
