//! The push token: read from its [`CredentialSource`], kept only as a SHA-256 digest,
//! compared in constant time, and re-read when it may have been rotated or revoked.

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use controller_kit::Redacted;
use subtle::ConstantTimeEq as _;
use tokio::sync::Mutex;

use super::limits;
use crate::credentials::{CredentialError, CredentialSource};

/// How long a token read from its source is trusted: a revoked token stops working within
/// this delay.
pub const TOKEN_TTL: Duration = Duration::from_secs(30);
/// Least delay between two reads caused by a token that does not match: a rotated token
/// is picked up at once, and a flood of wrong tokens costs at most one read (a Secret
/// GET) per this delay.
pub const TOKEN_MIN_RELOAD: Duration = Duration::from_secs(2);

/// The token, read from its [`CredentialSource`] and kept only as its SHA-256 digest.
pub struct TokenCache {
    source: CredentialSource,
    kube: kube::Client,
    ttl: Duration,
    min_reload: Duration,
    state: Mutex<TokenState>,
}

#[derive(Default)]
struct TokenState {
    digest: Option<Redacted<[u8; 32]>>,
    loaded_at: Option<Instant>,
    /// Why the last read failed (credential-free), while it did.
    error: Option<String>,
}

/// Why a request is not authenticated.
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: bearer …` header.
    Missing,
    /// A token that does not match.
    Invalid,
    /// The agent's own token cannot be read (nobody can be authenticated).
    Unavailable(String),
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The error of a token load, worded for the push token (the loader words it for the
/// pull mode's API key).
fn token_error(e: &CredentialError, source: &CredentialSource) -> String {
    match e {
        CredentialError::File { path, source } => format!("cannot read the push token file {path}: {source}"),
        CredentialError::Invalid(_) => format!("the push token from {source} is empty or not printable ASCII"),
        other => format!("push token: {other}"),
    }
}

impl TokenCache {
    /// A cache reading `source` (`kube` reads a Secret source).
    pub fn new(source: CredentialSource, kube: kube::Client) -> Self {
        Self::with_timing(source, kube, TOKEN_TTL, TOKEN_MIN_RELOAD)
    }

    /// The same with other delays (tests).
    pub fn with_timing(source: CredentialSource, kube: kube::Client, ttl: Duration, min_reload: Duration) -> Self {
        Self {
            source,
            kube,
            ttl,
            min_reload,
            state: Mutex::new(TokenState::default()),
        }
    }

    /// Where the token comes from (for logs).
    pub fn source(&self) -> &CredentialSource {
        &self.source
    }

    /// How often it is re-read at the latest.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn reload(&self, state: &mut TokenState) -> Result<(), AuthError> {
        state.loaded_at = Some(Instant::now());
        match self.source.load(&self.kube).await {
            // A rotated token that is too short is refused like an unreadable one: fail closed.
            Ok(token) if limits::token_too_short(token.expose()).is_some() => {
                let detail = format!(
                    "push token from {}: {}",
                    self.source,
                    limits::token_too_short(token.expose()).unwrap_or_default()
                );
                state.digest = None;
                state.error = Some(detail.clone());
                Err(AuthError::Unavailable(detail))
            }
            Ok(token) => {
                state.digest = Some(Redacted::new(digest(token.expose().as_bytes())));
                state.error = None;
                Ok(())
            }
            Err(e) => {
                // Fail closed: a token that cannot be read any more (a deleted Secret)
                // authenticates nobody.
                let detail = token_error(&e, &self.source);
                state.digest = None;
                state.error = Some(detail.clone());
                Err(AuthError::Unavailable(detail))
            }
        }
    }

    /// Reads the token now (at start, so a broken source shows before the first push).
    pub async fn load(&self) -> Result<(), AuthError> {
        let mut state = self.state.lock().await;
        self.reload(&mut state).await
    }

    /// Checks a presented token, in constant time over digests (neither its content nor
    /// its length leaks through timing).
    pub async fn verify(&self, presented: &[u8]) -> Result<(), AuthError> {
        let want = digest(presented);
        let mut state = self.state.lock().await;
        let due = |s: &TokenState, after: Duration| s.loaded_at.is_none_or(|t| t.elapsed() >= after);
        let matches = |s: &TokenState| s.digest.as_ref().is_some_and(|d| bool::from(d.expose().ct_eq(&want)));
        // Read it when never read or expired (a revoked token must stop working), and
        // retry an unreadable one no more often than min_reload.
        if due(&state, self.ttl) || (state.digest.is_none() && due(&state, self.min_reload)) {
            self.reload(&mut state).await?;
        }
        if matches(&state) {
            return Ok(());
        }
        // Perhaps rotated: read it again, at most once per min_reload.
        if state.digest.is_some() && due(&state, self.min_reload) {
            self.reload(&mut state).await?;
            if matches(&state) {
                return Ok(());
            }
        }
        match state.digest {
            Some(_) => Err(AuthError::Invalid),
            None => Err(AuthError::Unavailable(
                state
                    .error
                    .clone()
                    .unwrap_or_else(|| "the push token could not be read".into()),
            )),
        }
    }
}

/// The bearer token of an `Authorization` header (scheme case-insensitive, as Odoo's).
pub(super) fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    let token = token.trim_ascii();
    (scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty()).then_some(token)
}
