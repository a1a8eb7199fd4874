//! Logging, tracing and secret hygiene.
//!
//! [`init`] installs the global `tracing` subscriber: an `EnvFilter` from
//! `--log-filter`, a text or JSON stdout layer, and, when `--otlp-endpoint` is set,
//! an OpenTelemetry layer exporting spans over OTLP/gRPC with a batch processor.
//! Hold the returned [`TelemetryGuard`] in `main` for the life of the process: dropping
//! it flushes and shuts down the exporter, so the last spans before exit are not lost.
//!
//! [`Redacted`] carries secret material through code that logs freely.

use std::{fmt, future::Future, time::Duration};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{SdkTracerProvider, SpanData, SpanExporter},
};
use tracing_subscriber::{EnvFilter, Layer, Registry, layer::SubscriberExt as _, util::SubscriberInitExt as _};

use crate::args::{CommonArgs, LogFormat};

/// Time the exporter may spend on one export call.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why telemetry could not be initialised.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--log-filter` is not valid `RUST_LOG` syntax.
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        /// The rejected filter.
        filter: String,
        /// The parse error.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// The dedicated exporter runtime could not be started.
    #[error("cannot start the OTLP exporter runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The OTLP exporter rejected its configuration (e.g. a malformed endpoint).
    #[error("cannot build the OTLP exporter for {endpoint:?}: {source}")]
    Exporter {
        /// The configured endpoint.
        endpoint: String,
        /// The builder error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// A global subscriber was already installed (`init` called twice).
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInitialized(#[source] tracing_subscriber::util::TryInitError),
}

/// Keeps the trace exporter alive; dropping it flushes pending spans and shuts it down.
///
/// Drop it inside the Tokio runtime, at the end of `main` (shutdown waits a few
/// seconds at most for the collector).
#[must_use = "dropping the guard shuts the trace exporter down immediately"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TelemetryGuard {
    /// Whether spans are exported over OTLP.
    pub fn exports_traces(&self) -> bool {
        self.provider.is_some()
    }
}

impl fmt::Debug for TelemetryGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelemetryGuard")
            .field("exports_traces", &self.exports_traces())
            .finish()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            // The subscriber may already be half torn down; stderr is the reliable sink.
            eprintln!("OpenTelemetry tracer provider shutdown failed: {err}");
        }
        if let Some(runtime) = self.runtime.take() {
            // Not `drop(runtime)`: that blocks, and panics when called from async code.
            runtime.shutdown_background();
        }
    }
}

/// Installs the global subscriber for `service_name` (used as the OTLP `service.name`).
pub fn init(service_name: &str, args: &CommonArgs) -> Result<TelemetryGuard, TelemetryError> {
    let filter = EnvFilter::try_new(&args.log_filter).map_err(|source| TelemetryError::Filter {
        filter: args.log_filter.clone(),
        source,
    })?;

    let fmt_layer: Box<dyn Layer<Registry> + Send + Sync> = match args.log_format {
        // Colour only for a terminal: log files and collectors get plain text.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };

    // The guard exists before anything can fail, so an error below still shuts the
    // exporter and its runtime down cleanly.
    let mut guard = TelemetryGuard {
        provider: None,
        runtime: None,
    };
    let otel_layer = match &args.otlp_endpoint {
        Some(endpoint) => {
            let (provider, runtime) = otlp_provider(service_name, endpoint)?;
            guard.runtime = Some(runtime);
            let tracer = provider.tracer(service_name.to_owned());
            guard.provider = Some(provider);
            Some(tracing_opentelemetry::layer().with_tracer(tracer).boxed())
        }
        None => None,
    };

    tracing_subscriber::registry()
        .with(fmt_layer)
        .with(otel_layer)
        .with(filter)
        .try_init()
        .map_err(TelemetryError::AlreadyInitialized)?;

    Ok(guard)
}

/// Builds the OTLP/gRPC tracer provider and the small runtime its exporter runs on.
///
/// Why a runtime of its own: the SDK's stable batch processor exports from a plain OS
/// thread, while tonic needs a Tokio reactor for its connection task, timeouts and
/// retry backoff; exporters built or polled without one panic with "there is no
/// reactor running" and silently drop every span (a well-known OpenTelemetry Rust
/// pitfall). The channel is created inside this runtime and every export future is
/// polled with it entered ([`InRuntime`]). Being separate from the application's
/// runtime, it still works while `main` is shutting down, so the final flush lands.
fn otlp_provider(
    service_name: &str,
    endpoint: &str,
) -> Result<(SdkTracerProvider, tokio::runtime::Runtime), TelemetryError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(TelemetryError::Runtime)?;

    // The lazy tonic channel spawns its connection worker on the current runtime.
    let built = {
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
    };
    let exporter = match built {
        Ok(exporter) => exporter,
        Err(source) => {
            // A plain drop would panic when `init` is called from async code.
            runtime.shutdown_background();
            return Err(TelemetryError::Exporter {
                endpoint: endpoint.to_owned(),
                source,
            });
        }
    };
    let exporter = InRuntime {
        inner: exporter,
        handle: runtime.handle().clone(),
    };

    let provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(service_name.to_owned()).build())
        .with_batch_exporter(exporter)
        .build();
    Ok((provider, runtime))
}

/// A span exporter whose futures are always polled inside a given Tokio runtime.
#[derive(Debug)]
struct InRuntime<E> {
    inner: E,
    handle: tokio::runtime::Handle,
}

impl<E: SpanExporter> SpanExporter for InRuntime<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let handle = self.handle.clone();
        let mut export = Box::pin(self.inner.export(batch));
        std::future::poll_fn(move |cx| {
            let _entered = handle.enter();
            export.as_mut().poll(cx)
        })
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let _entered = self.handle.enter();
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        let _entered = self.handle.enter();
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Wraps secret material (tokens, passwords, Secret data) so that it can be passed
/// around, stored in structs and put in `#[instrument]`ed arguments without ever
/// reaching a log line: both `Debug` and `Display` print `<redacted>`.
///
/// Deliberately not `Serialize`: writing a secret anywhere must go through
/// [`Redacted::expose`], which is easy to grep for in review.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Redacted<T>(T);

impl<T> Redacted<T> {
    /// Wraps a secret.
    pub const fn new(secret: T) -> Self {
        Self(secret)
    }

    /// Borrows the secret, for the one place that really needs it.
    pub fn expose(&self) -> &T {
        &self.0
    }

    /// Unwraps the secret.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(secret: T) -> Self {
        Self(secret)
    }
}

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T> fmt::Display for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    #[test]
    fn redacted_never_prints_the_secret() {
        #[derive(Debug)]
        #[allow(dead_code)] // Only read through Debug.
        struct Creds {
            user: &'static str,
            password: Redacted<String>,
        }
        let creds = Creds {
            user: "admin",
            password: Redacted::new("hunter2".to_owned()),
        };
        let debug = format!("{creds:?} {:#?}", creds);
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("<redacted>"));
        assert_eq!(creds.password.to_string(), "<redacted>");
        assert_eq!(format!("{:>20}", creds.password), "<redacted>");
        assert_eq!(creds.password.expose(), "hunter2");
        assert_eq!(Redacted::from(7).into_inner(), 7);
    }

    #[test]
    fn invalid_filter_is_a_typed_error() {
        let cli = Cli::parse_from(["bin", "--log-filter", "info,[=bad"]);
        assert!(matches!(init("test", &cli.common), Err(TelemetryError::Filter { .. })));
    }

    /// The only test that installs the global subscriber (once per test binary).
    ///
    /// A loopback listener stands in for the collector: it reads the HTTP/2 preface of
    /// the gRPC export, then hangs up. This proves spans really leave the process
    /// (the export thread has a reactor) and that shutdown stays prompt when the
    /// collector misbehaves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn init_with_otlp_exports_and_shuts_down() {
        use std::io::Read as _;

        let collector = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", collector.local_addr().unwrap());
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in collector.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut preface = [0u8; 14];
                if conn.read_exact(&mut preface).is_ok() && seen_tx.send(preface).is_err() {
                    return;
                }
            }
        });

        let cli = Cli::parse_from(["bin", "--otlp-endpoint", &endpoint, "--log-filter", "info"]);
        let guard = init("controller-kit-test", &cli.common).unwrap();
        assert!(guard.exports_traces());
        tracing::info_span!("reconcile", object = "ns/name").in_scope(|| tracing::info!("inside a span"));

        let started = std::time::Instant::now();
        drop(guard); // flushes the batch
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "shutdown took {:?}",
            started.elapsed()
        );
        let preface = seen_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("no export reached the collector");
        assert_eq!(&preface, b"PRI * HTTP/2.0");

        assert!(matches!(
            init("again", &cli.common),
            Err(TelemetryError::AlreadyInitialized(_))
        ));
    }
}
