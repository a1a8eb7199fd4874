//! Who may publish: every stream carries the publisher's ServiceAccount token (a projected
//! token with its own audience, [`AUDIENCE`]), and the server asks an [`Authenticator`]
//! before it reads a single event. The agent's authenticator is a TokenReview against the
//! API server (crate `agent`); this crate only defines the hook, so it needs no API client.

use std::path::PathBuf;

use futures::future::BoxFuture;

/// Audience of the projected ServiceAccount token a publisher sends. A dedicated audience
/// means a token stolen from this channel is useless against the API server, and the
/// pod's ordinary API token is refused here.
pub const AUDIENCE: &str = "vworkspace-status-channel";

/// Where the bundle's Deployments mount the projected token (volume `status-channel-token`).
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/vworkspace.io/status-channel/token";

/// Environment variable naming another token file (e2e: a token minted with the
/// TokenRequest API for a process that runs outside the cluster).
pub const TOKEN_FILE_ENV: &str = "VWS_STATUS_CHANNEL_TOKEN_FILE";

/// Largest event the server decodes. The largest real event is one object's conditions:
/// a handful of conditions whose relayed messages the app controller cuts at 4 KiB each
/// (crates/app-controller status.rs), so 64 KiB leaves room, where tonic's default of
/// 4 MiB times the agent's 1024 buffered events would be gigabytes. The publisher shrinks
/// anything larger before sending ([`crate::publisher`]).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The token file a publisher uses: `$VWS_STATUS_CHANNEL_TOKEN_FILE`, else
/// [`DEFAULT_TOKEN_FILE`].
pub fn token_file_from_env() -> PathBuf {
    std::env::var_os(TOKEN_FILE_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_TOKEN_FILE), PathBuf::from)
}

/// Why a publisher was refused. The texts go back to the publisher and into debug logs:
/// they never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No `authorization: Bearer` metadata.
    #[error("a bearer token (the publisher's ServiceAccount token, audience {AUDIENCE}) is required")]
    MissingToken,
    /// The token is not valid (expired, forged, wrong audience).
    #[error("the token is not valid for the status channel: {0}")]
    Unauthenticated(String),
    /// A valid token of an identity that may not publish.
    #[error("{0} may not publish to the status channel")]
    NotAllowed(String),
    /// The check itself failed (API server unreachable); the publisher retries.
    #[error("cannot check the token now: {0}")]
    Unavailable(String),
}

impl Refused {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Refused::MissingToken => "missing_token",
            Refused::Unauthenticated(_) => "unauthenticated",
            Refused::NotAllowed(_) => "not_allowed",
            Refused::Unavailable(_) => "unavailable",
        }
    }
}

/// Checks a publisher's bearer token; on success, the publisher's identity (it replaces
/// the name the publisher gives itself in the events, which anyone could forge).
pub trait Authenticator: Send + Sync + 'static {
    /// Authenticates `token` (without the `Bearer ` prefix).
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<String, Refused>>;

    /// Told of every refused stream, [`Refused::MissingToken`] included (which never
    /// reaches [`Authenticator::authenticate`]): a hook for metrics, since the server only
    /// logs refusals at debug level.
    fn refused(&self, _refused: &Refused) {}
}

/// The token of `authorization: Bearer <token>` metadata, if any.
pub fn bearer(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataMap;

    use super::*;

    #[test]
    fn bearer_tokens() {
        let cases: [(Option<&str>, Option<&str>); 6] = [
            (None, None),
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Basic abc"), None),
            (Some("Bearer "), None),
            (Some("abc"), None),
        ];
        for (header, want) in cases {
            let mut m = MetadataMap::new();
            if let Some(h) = header {
                m.insert("authorization", h.parse().unwrap());
            }
            assert_eq!(bearer(&m), want, "{header:?}");
        }
    }
}
