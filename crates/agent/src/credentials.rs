//! Where the API key comes from: a file (a mounted Secret) or a Secret read through the
//! API in the agent's own namespace. The key is re-read after a 401, so a rotated key is
//! picked up without a restart. It only ever exists as a [`Redacted`].

use std::path::PathBuf;

use controller_kit::Redacted;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

/// Source of the API key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    /// A file holding the key (e.g. a Secret volume).
    File(PathBuf),
    /// A key of a Secret in the agent's namespace.
    Secret {
        /// Namespace (the agent's own).
        namespace: String,
        /// Secret name.
        name: String,
        /// Data key.
        key: String,
    },
}

/// Why the key could not be loaded. Never contains the key.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The file cannot be read.
    #[error("cannot read the API key file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The Secret cannot be read.
    #[error("cannot read Secret {namespace}/{name}: {source}")]
    Secret {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The Secret or the key is missing.
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    MissingKey {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The data key.
        key: String,
    },
    /// The key is empty, not UTF-8 or holds characters an HTTP header cannot carry.
    #[error("the API key from {0} is empty or not printable ASCII")]
    Invalid(String),
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "file {}", p.display()),
            Self::Secret { namespace, name, key } => write!(f, "Secret {namespace}/{name} key {key:?}"),
        }
    }
}

fn check(raw: Vec<u8>, source: &CredentialSource) -> Result<Redacted<String>, CredentialError> {
    let text = String::from_utf8(raw).map_err(|_| CredentialError::Invalid(source.to_string()))?;
    let key = text.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CredentialError::Invalid(source.to_string()));
    }
    Ok(Redacted::new(key.to_owned()))
}

impl CredentialSource {
    /// Loads the key now.
    pub async fn load(&self, client: &Client) -> Result<Redacted<String>, CredentialError> {
        match self {
            Self::File(path) => {
                let raw = tokio::fs::read(path).await.map_err(|source| CredentialError::File {
                    path: path.display().to_string(),
                    source,
                })?;
                check(raw, self)
            }
            Self::Secret { namespace, name, key } => {
                let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
                let secret = secrets.get(name).await.map_err(|source| CredentialError::Secret {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    source: Box::new(source),
                })?;
                let raw = secret
                    .data
                    .and_then(|mut d| d.remove(key))
                    .map(|b| b.0)
                    .ok_or_else(|| CredentialError::MissingKey {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        key: key.clone(),
                    })?;
                check(raw, self)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_trimmed_and_checked() {
        let src = CredentialSource::File("/k".into());
        assert_eq!(check(b" abc123\n".to_vec(), &src).unwrap().expose(), "abc123");
        for bad in [&b""[..], b"  \n", b"a b", b"\xff\xfe", b"key\x07"] {
            let err = check(bad.to_vec(), &src).unwrap_err().to_string();
            assert!(err.contains("file /k"), "{err}");
        }
    }
}
