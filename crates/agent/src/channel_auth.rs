//! Who may publish to the status channel: a TokenReview of the publisher's projected
//! ServiceAccount token, for the channel's own audience, accepted only for the configured
//! ServiceAccounts (`--status-channel-clients`, by default the bundle's controllers and
//! engines in the agent's namespace).
//!
//! Results are cached by the token's SHA-256 digest (never the token itself) for a short
//! while, and at most [`CONCURRENT_REVIEWS`] reviews run at once, so a flood of connections
//! with bogus tokens costs the API server little.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
    time::{Duration, Instant},
};

use controller_kit::Metrics;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::{Api, Client, api::PostParams};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use status_channel::{Authenticator, Refused};
use tokio::sync::Semaphore;

/// TokenReviews in flight at once; more connections wait for a slot.
pub const CONCURRENT_REVIEWS: usize = 4;
/// How long an accepted token is trusted without a new review.
const ACCEPTED_TTL: Duration = Duration::from_secs(60);
/// How long a refused token stays refused without a new review.
const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Cached results; beyond this the cache is emptied (it only saves reviews).
const CACHE_ENTRIES: usize = 1024;

/// The prefix of a ServiceAccount's user name.
const SA_PREFIX: &str = "system:serviceaccount:";

/// The user names of `--status-channel-clients` entries: `name` (a ServiceAccount in
/// `own_namespace`) or `namespace/name`.
pub fn allowed_users(entries: &[String], own_namespace: &str) -> Result<BTreeSet<String>, String> {
    entries
        .iter()
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (ns, name) = e.split_once('/').unwrap_or((own_namespace, e));
            let valid = |s: &str| !s.is_empty() && !s.contains([':', '/']);
            if valid(ns) && valid(name) {
                Ok(format!("{SA_PREFIX}{ns}:{name}"))
            } else {
                Err(format!(
                    "invalid status channel client {e:?}: use name or namespace/name"
                ))
            }
        })
        .collect()
}

/// The verdict on a TokenReview's status: the publisher's identity (`namespace/name`), or
/// why it is refused. Fails closed: an answer without the audience is a refusal.
pub fn judge(
    status: Option<&TokenReviewStatus>,
    audience: &str,
    allowed: &BTreeSet<String>,
) -> Result<String, Refused> {
    let Some(status) = status.filter(|s| s.authenticated == Some(true)) else {
        return Err(Refused::Unauthenticated(
            "the API server did not authenticate it".into(),
        ));
    };
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|x| x == audience))
    {
        return Err(Refused::Unauthenticated(format!("not issued for audience {audience}")));
    }
    let user = status
        .user
        .as_ref()
        .and_then(|u| u.username.as_deref())
        .unwrap_or_default();
    if !allowed.contains(user) {
        return Err(Refused::NotAllowed(if user.is_empty() {
            "an anonymous user".into()
        } else {
            user.to_owned()
        }));
    }
    Ok(user.strip_prefix(SA_PREFIX).unwrap_or(user).replacen(':', "/", 1))
}

/// A review's verdict and when it was made, by token digest.
type Cache = HashMap<[u8; 32], (Result<String, Refused>, Instant)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    reason: &'static str,
}

/// The agent's [`Authenticator`]: TokenReview, cached.
pub struct TokenReviewAuth {
    client: Client,
    audience: String,
    allowed: BTreeSet<String>,
    cache: Mutex<Cache>,
    reviews: Semaphore,
    refused: Family<RefusedLabels, Counter>,
}

impl TokenReviewAuth {
    /// Counts refusals in `vworkspace_agent_status_channel_refused_total{reason}`.
    pub fn new(client: Client, audience: String, allowed: BTreeSet<String>, metrics: &Metrics) -> Self {
        let refused = Family::<RefusedLabels, Counter>::default();
        metrics.register(
            "agent_status_channel_refused",
            "Status channel streams refused, by reason (missing_token, unauthenticated, not_allowed, unavailable)",
            refused.clone(),
        );
        // Every reason at zero from the start: a refusal shows as an increase, not as a
        // series appearing (which `rate()` and alerts miss).
        for reason in [
            Refused::MissingToken,
            Refused::Unauthenticated(String::new()),
            Refused::NotAllowed(String::new()),
            Refused::Unavailable(String::new()),
        ] {
            drop(refused.get_or_create(&RefusedLabels { reason: reason.label() }));
        }
        Self {
            client,
            audience,
            allowed,
            cache: Mutex::default(),
            reviews: Semaphore::new(CONCURRENT_REVIEWS),
            refused,
        }
    }

    fn cached(&self, key: &[u8; 32], now: Instant) -> Option<Result<String, Refused>> {
        let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (result, at) = cache.get(key)?;
        let ttl = if result.is_ok() { ACCEPTED_TTL } else { REFUSED_TTL };
        (now.duration_since(*at) < ttl).then(|| result.clone())
    }

    fn remember(&self, key: [u8; 32], result: &Result<String, Refused>, now: Instant) {
        // An API server outage is not the token's fault: ask again next time.
        if matches!(result, Err(Refused::Unavailable(_))) {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, (result.clone(), now));
    }

    async fn review(&self, token: &str) -> Result<String, Refused> {
        let key = digest(token);
        if let Some(r) = self.cached(&key, Instant::now()) {
            return r;
        }
        let _slot = self
            .reviews
            .acquire()
            .await
            .map_err(|_| Refused::Unavailable("shutting down".into()))?;
        // Another stream may have reviewed the same token while this one waited.
        if let Some(r) = self.cached(&key, Instant::now()) {
            return r;
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let result = match api.create(&PostParams::default(), &review).await {
            Ok(answer) => judge(answer.status.as_ref(), &self.audience, &self.allowed),
            Err(e) => Err(Refused::Unavailable(e.to_string())),
        };
        self.remember(key, &result, Instant::now());
        result
    }
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Authenticator for TokenReviewAuth {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<String, Refused>> {
        Box::pin(self.review(token))
    }

    fn refused(&self, refused: &Refused) {
        self.refused
            .get_or_create(&RefusedLabels {
                reason: refused.label(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    const AUD: &str = "vworkspace-status-channel";

    fn status(authenticated: Option<bool>, audiences: Option<&[&str]>, user: &str) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated,
            audiences: audiences.map(|a| a.iter().map(|s| (*s).to_owned()).collect()),
            user: Some(UserInfo {
                username: Some(user.to_owned()),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        }
    }

    #[test]
    fn allowed_users_from_flags() {
        let users = allowed_users(&["app-controller".into(), "ops/runner".into(), " ".into()], "vws").unwrap();
        assert_eq!(
            users.into_iter().collect::<Vec<_>>(),
            [
                "system:serviceaccount:ops:runner",
                "system:serviceaccount:vws:app-controller"
            ]
        );
        assert!(allowed_users(&["a/b/c".into()], "vws").is_err());
        assert!(allowed_users(&["/x".into()], "vws").is_err());
        assert!(allowed_users(&["x:y".into()], "vws").is_err());
    }

    #[test]
    fn token_review_verdicts() {
        let allowed = allowed_users(&["app-controller".into()], "vws").unwrap();
        let ok = "system:serviceaccount:vws:app-controller";
        let cases: [(Option<TokenReviewStatus>, Result<&str, &str>); 7] = [
            (Some(status(Some(true), Some(&[AUD]), ok)), Ok("vws/app-controller")),
            (None, Err("unauthenticated")),
            (Some(status(Some(false), Some(&[AUD]), ok)), Err("unauthenticated")),
            (Some(status(None, Some(&[AUD]), ok)), Err("unauthenticated")),
            (Some(status(Some(true), None, ok)), Err("unauthenticated")),
            (
                Some(status(Some(true), Some(&["https://kubernetes.default.svc"]), ok)),
                Err("unauthenticated"),
            ),
            (
                Some(status(Some(true), Some(&[AUD]), "system:serviceaccount:vws:default")),
                Err("not_allowed"),
            ),
        ];
        for (s, want) in cases {
            let got = judge(s.as_ref(), AUD, &allowed);
            match want {
                Ok(id) => assert_eq!(got.as_deref(), Ok(id), "{s:?}"),
                Err(label) => assert_eq!(got.map_err(|r| r.label()), Err(label), "{s:?}"),
            }
        }
    }
}
