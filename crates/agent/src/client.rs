//! The HTTP client to the control plane: JSON-2 calls with timeouts, a response size
//! cap, TLS verification (system roots plus an optional CA bundle) and proxies from the
//! environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`, also lowercase).
//!
//! Why reqwest (on rustls with ring): proxy support (CONNECT tunnelling and `NO_PROXY`
//! matching) and per-request timeouts come built in, it sits on the hyper and rustls
//! versions kube already pulls in, and rustls with ring keeps OpenSSL and aws-lc (a C
//! and CMake build) out of the image. Hand-rolling the same on hyper-util would mean
//! re-implementing proxy tunnelling.
//!
//! The API key is passed per call as a [`Redacted`] and put in a header marked
//! sensitive; no error message of this module can contain it.

use std::{path::PathBuf, time::Duration};

use controller_kit::Redacted;
use protocol::{
    ProtocolVersion,
    error::{ErrorClass, OdooError, classify},
    odoo_compat::AnswerError,
};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, USER_AGENT};
use serde::Serialize;
use serde_json::Value;

/// `User-Agent` of every call.
pub const USER_AGENT_VALUE: &str = concat!("vworkspace-agent/", env!("CARGO_PKG_VERSION"));

/// How to reach the control plane.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Base URL, e.g. `https://odoo.example.com` (no path, or a path prefix).
    pub url: String,
    /// `X-Odoo-Database`, when the server hosts several databases.
    pub database: Option<String>,
    /// Whole-request timeout (connect, send, answer).
    pub timeout: Duration,
    /// Largest answer read; a larger one is refused without being parsed.
    pub max_response_bytes: usize,
    /// Extra PEM CA certificates trusted besides the system roots.
    pub ca_bundle: Option<PathBuf>,
    /// Allow `http://` (development only).
    pub insecure_allow_http: bool,
}

/// The client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `https://` (or `http://` with the dev flag).
    #[error(
        "control plane URL {0:?} must use https:// (plain http:// only with --insecure-allow-http, for development)"
    )]
    InsecureUrl(String),
    /// The URL carries `user[:password]@`: credentials belong in the API key's Secret. The
    /// URL is shown without them, so the error never echoes a password.
    #[error(
        "control plane URL {0:?} must not carry credentials (user:password@): put the API key in the Secret (--credentials-secret) or --api-key-file"
    )]
    CredentialsInUrl(String),
    /// The URL does not parse.
    #[error("invalid control plane URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The CA bundle cannot be read or holds no certificate.
    #[error("cannot use CA bundle {path}: {reason}")]
    CaBundle {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// reqwest refused the configuration.
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

/// A failed call. `Display` is a clear, credential-free sentence for logs and reports.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No complete answer within the timeout.
    #[error("no answer from {url} within {after:?}")]
    Timeout {
        /// Base URL.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// Connecting failed (DNS, TCP, TLS, proxy).
    #[error("cannot reach {url}: {detail}")]
    Connect {
        /// Base URL.
        url: String,
        /// The underlying error chain.
        detail: String,
    },
    /// A non-2xx answer.
    #[error("{method} failed with HTTP {status} ({}): {}{}{}", class.reason(), name.as_deref().map(|n| format!("{n}: ")).unwrap_or_default(), message, hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    Remote {
        /// The method called.
        method: String,
        /// HTTP status.
        status: u16,
        /// What it means.
        class: ErrorClass,
        /// Odoo's exception name, when the body is Odoo's error object.
        name: Option<String>,
        /// Odoo's message, or the start of a non-JSON body.
        message: String,
        /// What the class means here and what to change, when the status and message do
        /// not say it ([`hint`]).
        hint: Option<String>,
    },
    /// The answer is larger than allowed.
    #[error(
        "answer to {method} is larger than {limit} bytes; refused unread (raise --max-response-size if legitimate)"
    )]
    TooLarge {
        /// The method called.
        method: String,
        /// The limit.
        limit: usize,
    },
    /// A 2xx answer that is not what the protocol says.
    #[error("malformed answer to {method}: {detail}")]
    Malformed {
        /// The method called.
        method: String,
        /// What is wrong: the JSON path, what came (bounded) and what is expected
        /// ([`protocol::odoo_compat::AnswerError`]); never the whole body.
        detail: String,
    },
    /// `agent_sync` was refused with `413` though it carried at most one acknowledgement and
    /// one report: it cannot be split further, so the limit in front of Odoo must be raised.
    #[error(
        "{method} carrying {acks} acknowledgement(s) and {reports} report(s) ({bytes} bytes) was refused with HTTP 413: \
         that is the smallest call the agent can make, so Odoo or a proxy in front of it (nginx's client_max_body_size \
         is 1 MiB by default) must accept request bodies of at least {bytes} bytes"
    )]
    RequestTooLarge {
        /// The method called.
        method: String,
        /// Acknowledgements in the refused call.
        acks: usize,
        /// Reports in the refused call.
        reports: usize,
        /// Its body size.
        bytes: usize,
    },
    /// The control plane speaks another MAJOR protocol version.
    #[error("the control plane speaks protocol {theirs}, this agent {ours}: incompatible")]
    Incompatible {
        /// Theirs.
        theirs: ProtocolVersion,
        /// Ours.
        ours: ProtocolVersion,
    },
    /// The credentials could not be loaded.
    #[error("cannot load the API key: {0}")]
    Credentials(String),
    /// The acknowledgement ledger could not be read or recorded: no document is processed
    /// and no acknowledgement leaves the agent until it can be.
    #[error(transparent)]
    Ledger(#[from] crate::ledger_store::StoreError),
}

impl CallError {
    /// Stable reason code: metric label and the agent condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "Timeout",
            Self::Connect { .. } => "ConnectionFailed",
            Self::Remote { class, .. } => class.reason(),
            Self::TooLarge { .. } => "ResponseTooLarge",
            Self::Malformed { .. } => "MalformedResponse",
            Self::RequestTooLarge { .. } => ErrorClass::RequestTooLarge.reason(),
            Self::Incompatible { .. } => "IncompatibleProtocol",
            Self::Credentials(_) => "CredentialsUnavailable",
            Self::Ledger(e) => e.reason(),
        }
    }

    /// Whether the error needs someone to act (wrong key, module missing, versions):
    /// the agent reports itself not ready at once instead of after a few failures.
    pub fn needs_attention(&self) -> bool {
        match self {
            Self::Remote { class, .. } => !class.is_transient(),
            Self::Incompatible { .. } | Self::Credentials(_) | Self::TooLarge { .. } | Self::RequestTooLarge { .. } => {
                true
            }
            Self::Ledger(e) => matches!(e, crate::ledger_store::StoreError::Unreadable { .. }),
            _ => false,
        }
    }

    /// The error class of a remote error.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            Self::Remote { class, .. } => Some(*class),
            _ => None,
        }
    }
}

/// Reads a 2xx answer of `method` as `T` ([`protocol::odoo_compat::decode`]): Odoo's own
/// forms are accepted, and what still does not read is a [`CallError::Malformed`] naming
/// the member's JSON path, what came and what is expected.
pub fn decode<T: serde::de::DeserializeOwned>(method: &str, answer: &Value) -> Result<T, CallError> {
    protocol::odoo_compat::decode(answer).map_err(|e| CallError::Malformed {
        method: method.to_owned(),
        detail: e.to_string(),
    })
}

/// What a class of failure means for this call and what to change, where Odoo's status
/// and message do not say it. `database` is the `X-Odoo-Database` the agent sends.
pub fn hint(
    class: ErrorClass,
    method: &str,
    message: &str,
    database: Option<&str>,
    request_bytes: usize,
) -> Option<String> {
    match class {
        ErrorClass::ConcurrentUpdate => Some(
            "Odoo raises this ValidationError when a concurrent call inserted the same unique key (an \
             acknowledgement or a report) first, and does not retry it; the call was rolled back and the agent \
             repeats it after a backoff"
                .to_owned(),
        ),
        ErrorClass::UnexpectedParameter => {
            let parameter = protocol::error::unexpected_parameter(message).unwrap_or("?");
            Some(format!(
                "the module's {}.{method} does not take the parameter `{parameter}`: declare `**kwargs` in its \
                 signature (docs/connectivity/protocol.md, module checklist); the agent sends each optional parameter \
                 when it has a value",
                protocol::MODEL
            ))
        }
        ErrorClass::UnsupportedMediaType => Some(
            "Odoo serves JSON-2 only with the request header `Content-Type: application/json`; the agent sends \
             `Content-Type: application/json; charset=utf-8`, so a proxy between them drops or rewrites it"
                .to_owned(),
        ),
        ErrorClass::DatabaseNotSelected => Some(match database {
            Some(db) => format!(
                "a 404 without Odoo's JSON error object (an HTML page) means Odoo selected no database for the \
                 call: the agent sends `X-Odoo-Database: {db}` \
                 (--database, VWS_ODOO_DATABASE); check that this database exists and that Odoo's --db-filter \
                 matches it"
            ),
            None => "a 404 without Odoo's JSON error object (an HTML page) means Odoo selected no database for the \
                     call: with several databases, set the \
                     agent's --database (VWS_ODOO_DATABASE, sent as X-Odoo-Database) to the one holding the \
                     vWorkspace module, and make Odoo's --db-filter match it"
                .to_owned(),
        }),
        ErrorClass::RequestTooLarge => Some(format!(
            "the request body was {request_bytes} bytes, more than Odoo or a proxy in front of it accepts (nginx's \
             client_max_body_size is 1 MiB by default)"
        )),
        _ => None,
    }
}

/// The JSON-2 client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ControlPlaneClient {
    http: reqwest::Client,
    base: String,
    database: Option<HeaderValue>,
    timeout: Duration,
    max_response_bytes: usize,
}

/// `url` with its userinfo replaced by `***`, when it has any (`https://u:p@h/x` gives
/// `https://***@h/x`); `None` when it has none. Works on the raw text, so a URL that
/// would not parse is caught too.
pub fn without_userinfo(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let at = authority.rfind('@')?;
    // `@` is one byte, so the byte after it starts a character.
    let host = authority.get(at + 1..).unwrap_or_default();
    Some(if scheme.is_empty() {
        format!("***@{host}{tail}")
    } else {
        format!("{scheme}://***@{host}{tail}")
    })
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

impl ControlPlaneClient {
    /// Builds the client; checks the scheme and loads the CA bundle.
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        let url = config.url.trim().trim_end_matches('/').to_owned();
        // Before anything that could echo the URL: later errors, logs, the status ConfigMap.
        if let Some(redacted) = without_userinfo(&url) {
            return Err(ClientError::CredentialsInUrl(redacted));
        }
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("https") => {}
            Some("http") if config.insecure_allow_http => {}
            Some("http") => return Err(ClientError::InsecureUrl(url)),
            _ => {
                return Err(ClientError::InvalidUrl {
                    url,
                    reason: "expected https://host[:port][/prefix]".into(),
                });
            }
        }
        reqwest::Url::parse(&url).map_err(|e| ClientError::InvalidUrl {
            url: url.clone(),
            reason: e.to_string(),
        })?;

        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(USER_AGENT_VALUE)
            .https_only(!config.insecure_allow_http)
            // Redirects could carry the Authorization header to another host.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(90));
        if let Some(path) = &config.ca_bundle {
            let err = |reason: String| ClientError::CaBundle {
                path: path.display().to_string(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| err(e.to_string()))?;
            if certs.is_empty() {
                return Err(err("no PEM certificate found".into()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| ClientError::Build(error_chain(&e)))?;
        let database = match &config.database {
            Some(db) => Some(HeaderValue::from_str(db).map_err(|_| ClientError::InvalidUrl {
                url: url.clone(),
                reason: format!("database name {db:?} is not a valid header value"),
            })?),
            None => None,
        };
        Ok(Self {
            http,
            base: url,
            database,
            timeout: config.timeout,
            max_response_bytes: config.max_response_bytes,
        })
    }

    /// The base URL (for logs).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Calls `MODEL.method` with `params`; returns the JSON answer of a 2xx.
    pub async fn call<P: Serialize>(
        &self,
        api_key: &Redacted<String>,
        method: &str,
        params: &P,
    ) -> Result<Value, CallError> {
        let url = format!("{}{}", self.base, protocol::json2_path(protocol::MODEL, method));
        let body = serde_json::to_vec(params).map_err(|e| CallError::Malformed {
            method: method.to_owned(),
            detail: format!("cannot encode the parameters: {e}"),
        })?;
        let mut headers = HeaderMap::new();
        let mut auth = HeaderValue::from_str(&format!("bearer {}", api_key.expose().trim()))
            .map_err(|_| CallError::Credentials("the API key contains characters not allowed in a header".into()))?;
        auth.set_sensitive(true);
        headers.insert(AUTHORIZATION, auth);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        if let Some(db) = &self.database {
            headers.insert("X-Odoo-Database", db.clone());
        }

        let request_bytes = body.len();
        let sent = self.http.post(&url).headers(headers).body(body).send().await;
        let mut response = sent.map_err(|e| self.transport_error(e))?;
        let status = response.status().as_u16();
        if let Some(len) = response.content_length()
            && len as usize > self.max_response_bytes
        {
            return Err(CallError::TooLarge {
                method: method.to_owned(),
                limit: self.max_response_bytes,
            });
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.transport_error(e))? {
            if bytes.len() + chunk.len() > self.max_response_bytes {
                return Err(CallError::TooLarge {
                    method: method.to_owned(),
                    limit: self.max_response_bytes,
                });
            }
            bytes.extend_from_slice(&chunk);
        }

        if !(200..300).contains(&status) {
            let odoo: Option<OdooError> = serde_json::from_slice(&bytes).ok();
            let message = match &odoo {
                Some(e) => e.message.clone(),
                None => {
                    let text = String::from_utf8_lossy(&bytes);
                    let text: String = text.chars().take(200).collect();
                    if text.trim().is_empty() {
                        "(empty body)".to_owned()
                    } else {
                        format!("non-JSON body: {}", text.trim())
                    }
                }
            };
            let class = classify(status, odoo.as_ref());
            let database = self.database.as_ref().and_then(|d| d.to_str().ok());
            return Err(CallError::Remote {
                method: method.to_owned(),
                status,
                class,
                hint: hint(class, method, &message, database, request_bytes),
                name: odoo.map(|e| e.name),
                message,
            });
        }
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| CallError::Malformed {
            method: method.to_owned(),
            detail: format!(
                "not JSON ({:?} at line {} column {}, {} bytes)",
                e.classify(),
                e.line(),
                e.column(),
                bytes.len()
            ),
        })?;
        // The version is read before the rest of the answer, so that another MAJOR is
        // reported as such rather than as whatever else its answer breaks.
        let malformed = |expected: &str| {
            let path = if value.is_object() {
                vec!["protocol_version".into()]
            } else {
                Vec::new()
            };
            let expected = if value.is_object() { expected } else { "a JSON object" };
            CallError::Malformed {
                method: method.to_owned(),
                detail: AnswerError::at(&value, &path, expected).to_string(),
            }
        };
        const VERSION_EXPECTED: &str = "the control plane's protocol version as a string \"MAJOR.MINOR\"";
        let theirs: ProtocolVersion = value
            .get("protocol_version")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(VERSION_EXPECTED))?
            .parse()
            .map_err(|_| malformed(VERSION_EXPECTED))?;
        if !theirs.is_compatible_with(protocol::PROTOCOL_VERSION) {
            return Err(CallError::Incompatible {
                theirs,
                ours: protocol::PROTOCOL_VERSION,
            });
        }
        Ok(value)
    }

    fn transport_error(&self, e: reqwest::Error) -> CallError {
        if e.is_timeout() {
            CallError::Timeout {
                url: self.base.clone(),
                after: self.timeout,
            }
        } else {
            CallError::Connect {
                url: self.base.clone(),
                detail: error_chain(&e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_credentials_are_refused_without_echoing_them() {
        // (url, redacted form when it carries userinfo)
        let cases = [
            ("https://odoo.example.com", None),
            ("https://odoo.example.com/odoo?db=a@b", None),
            (
                "https://bot:s3cret@odoo.example.com",
                Some("https://***@odoo.example.com"),
            ),
            (
                "https://bot@odoo.example.com:8443/x",
                Some("https://***@odoo.example.com:8443/x"),
            ),
            ("http://a:b@c@odoo/p", Some("http://***@odoo/p")),
            ("bot:s3cret@odoo", Some("***@odoo")),
        ];
        for (url, want) in cases {
            assert_eq!(without_userinfo(url).as_deref(), want, "{url}");
        }
        for url in [
            "https://bot:s3cret@odoo.example.com",
            "http://bot:s3cret@odoo",
            "bot:s3cret@odoo",
        ] {
            let err = ControlPlaneClient::new(&config(url)).unwrap_err();
            assert!(matches!(err, ClientError::CredentialsInUrl(_)), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
            assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");
        }
    }

    fn config(url: &str) -> ClientConfig {
        ClientConfig {
            url: url.into(),
            database: Some("prod".into()),
            timeout: Duration::from_secs(2),
            max_response_bytes: 1024,
            ca_bundle: None,
            insecure_allow_http: false,
        }
    }

    #[test]
    fn https_only_unless_the_dev_flag_is_set() {
        assert!(ControlPlaneClient::new(&config("https://odoo.example.com/")).is_ok());
        assert!(matches!(
            ControlPlaneClient::new(&config("http://odoo.example.com")),
            Err(ClientError::InsecureUrl(_))
        ));
        assert!(matches!(
            ControlPlaneClient::new(&config("odoo.example.com")),
            Err(ClientError::InvalidUrl { .. })
        ));
        let mut dev = config("http://127.0.0.1:8069");
        dev.insecure_allow_http = true;
        assert_eq!(
            ControlPlaneClient::new(&dev).unwrap().base_url(),
            "http://127.0.0.1:8069"
        );
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("agent-ca-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate").unwrap();
        let mut c = config("https://odoo.example.com");
        c.ca_bundle = Some(dir.clone());
        let err = ControlPlaneClient::new(&c).unwrap_err();
        assert!(matches!(err, ClientError::CaBundle { .. }), "{err}");
        let _ = std::fs::remove_file(dir);
    }

    #[test]
    fn reasons_are_stable() {
        let remote = CallError::Remote {
            method: "agent_sync".into(),
            status: 401,
            class: ErrorClass::Unauthorized,
            name: Some("werkzeug.exceptions.Unauthorized".into()),
            message: "Invalid apikey".into(),
            hint: None,
        };
        assert_eq!(remote.reason(), "Unauthorized");
        assert!(remote.needs_attention());
        assert_eq!(
            remote.to_string(),
            "agent_sync failed with HTTP 401 (Unauthorized): werkzeug.exceptions.Unauthorized: Invalid apikey"
        );
        let timeout = CallError::Timeout {
            url: "https://x".into(),
            after: Duration::from_secs(1),
        };
        assert_eq!(timeout.reason(), "Timeout");
        assert!(!timeout.needs_attention());
    }
}
