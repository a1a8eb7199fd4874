//! The endpoint's TLS: the certificate, key and client CA files, parsed into a rustls
//! configuration and re-read while serving so a renewed certificate needs no restart.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use controller_kit::CancellationToken;
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::WebPkiClientVerifier,
};
use tokio_rustls::TlsAcceptor;

use super::PushError;

/// How often the TLS certificate, key and client CA files are re-read.
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

fn pem_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> PushError {
    PushError::Pem {
        what,
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

fn parse_certs(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PushError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, e))?;
    if certs.is_empty() {
        return Err(pem_error(what, path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The files of the endpoint's TLS configuration. They are re-read while serving (every
/// [`TLS_RELOAD_INTERVAL`]), so a renewed certificate (cert-manager, a rotated Secret
/// volume) or a changed client CA takes effect without a restart.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CAs a client certificate must chain to; `None`: no client certificate asked.
    pub client_ca: Option<PathBuf>,
}

/// The bytes of [`TlsFiles`], read once: what a reload compares is what it parses.
#[derive(PartialEq, Eq)]
struct TlsPem {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    async fn read(&self) -> Result<TlsPem, PushError> {
        let read = |what: &'static str, path: PathBuf| async move {
            tokio::fs::read(&path).await.map_err(|e| pem_error(what, &path, e))
        };
        Ok(TlsPem {
            cert: read("TLS certificate", self.cert.clone()).await?,
            key: read("TLS key", self.key.clone()).await?,
            client_ca: match &self.client_ca {
                Some(path) => Some(read("client CA", path.clone()).await?),
                None => None,
            },
        })
    }

    /// The server's TLS configuration these files hold now: the certificate and key, and,
    /// with a client CA, client certificates required and verified against it (WebPKI
    /// rules). TLS 1.2 and 1.3 on ring. A key that does not match the certificate is an
    /// error (rustls compares their public keys).
    pub async fn load(&self) -> Result<Arc<ServerConfig>, PushError> {
        self.build(&self.read().await?)
    }

    fn build(&self, pem: &TlsPem) -> Result<Arc<ServerConfig>, PushError> {
        let certs = parse_certs("TLS certificate", &self.cert, &pem.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| pem_error("TLS key", &self.key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| PushError::Tls(e.to_string()))?;
        let builder = match (&self.client_ca, &pem.client_ca) {
            (Some(path), Some(ca_pem)) => {
                let mut roots = RootCertStore::empty();
                for ca in parse_certs("client CA", path, ca_pem)? {
                    roots.add(ca).map_err(|e| pem_error("client CA", path, e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| PushError::Tls(format!("client CA {}: {e}", path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| PushError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The TLS configuration in use, and the files' bytes it was built from.
pub(super) struct ReloadingTls {
    files: TlsFiles,
    current: std::sync::RwLock<(TlsAcceptor, TlsPem)>,
}

impl ReloadingTls {
    pub(super) async fn load(files: TlsFiles) -> Result<Self, PushError> {
        let pem = files.read().await?;
        let config = files.build(&pem)?;
        Ok(Self {
            files,
            current: std::sync::RwLock::new((TlsAcceptor::from(config), pem)),
        })
    }

    pub(super) fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone()
    }

    /// Re-reads the files: `Ok(true)` when changed ones are now in use, `Ok(false)` when
    /// nothing changed. On an error (a file missing, or a certificate and key that do not
    /// match yet, half-way through a rotation) the previous configuration stays in use.
    async fn reload(&self) -> Result<bool, PushError> {
        let pem = self.files.read().await?;
        if self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).1 == pem {
            return Ok(false);
        }
        let config = self.files.build(&pem)?;
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = (TlsAcceptor::from(config), pem);
        Ok(true)
    }

    /// Reloads every `every` until `shutdown`; logs what changed and, once per distinct
    /// error, why new files are not used.
    pub(super) async fn keep_reloading(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // Just loaded.
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            match self.reload().await {
                Ok(true) => {
                    last_error = None;
                    tracing::info!(cert = %self.files.cert.display(), "push endpoint: TLS files changed, new connections use them");
                }
                Ok(false) => last_error = None,
                Err(e) => {
                    let message = e.to_string();
                    if last_error.as_ref() != Some(&message) {
                        tracing::warn!(error = %message, "push endpoint: new TLS files are not usable, still serving the previous ones");
                        last_error = Some(message);
                    }
                }
            }
        }
    }
}
