//! Test-only helpers of vworkspace-operator, used as a dev-dependency only.
//!
//! [`ApiServer`] is a scripted Kubernetes API server on `tower_test::mock`: a test lists the
//! exact requests the code under test must make, in order ([`Step`]: method, path, and the
//! answer), runs the code against a [`kube::Client`] whose transport is the script, and gets
//! back every request as sent ([`Seen`]: method, path, query, JSON body) for assertions on
//! bodies and parameters. A request that is not the next scripted one, a request after the
//! script ended, and a scripted request that never came are all errors, so a test asserts the
//! full sequence, including "no write" (a script of GETs only) and "no request at all".
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use test_support::{Step, run};
//! let script = vec![Step::not_found("/api/v1/namespaces/team-a/configmaps/values")];
//! let (result, seen) = run(script, async |client| {
//!     let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "team-a");
//!     api.get_opt("values").await
//! })
//! .await?;
//! assert!(result?.is_none());
//! assert!(seen.iter().all(|s| !s.is_write()));
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

/// The server side of the mock transport.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// How long the code under test may take for one scripted run.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What a [`Step`] answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// This JSON body.
    Json(Value),
    /// The request's own body (what server-side apply of a new object returns, near enough).
    Echo,
}

/// One expected request and the answer to it.
#[derive(Debug, Clone)]
pub struct Step {
    /// Expected method.
    pub method: Method,
    /// Expected path (without the query).
    pub path: String,
    /// Status code of the answer.
    pub status: StatusCode,
    /// Body of the answer.
    pub answer: Answer,
}

impl Step {
    /// Expects `method path` and answers `status` with `body`.
    pub fn new(method: Method, path: impl Into<String>, status: StatusCode, body: Value) -> Self {
        Self {
            method,
            path: path.into(),
            status,
            answer: Answer::Json(body),
        }
    }

    /// Expects `GET path` and answers 200 with `body`.
    pub fn get(path: impl Into<String>, body: Value) -> Self {
        Self::ok(Method::GET, path, body)
    }

    /// Expects `method path` and answers 200 with `body`.
    pub fn ok(method: Method, path: impl Into<String>, body: Value) -> Self {
        Self::new(method, path, StatusCode::OK, body)
    }

    /// Expects `GET path` and answers 404 NotFound.
    pub fn not_found(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path, StatusCode::NOT_FOUND, status_body(404, "NotFound"))
    }

    /// Expects `method path` and answers 200 with the request's own body.
    pub fn echo(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            status: StatusCode::OK,
            answer: Answer::Echo,
        }
    }

    /// Expects `method path` and answers with a `Status` failure of `code` and `reason`
    /// (e.g. 409 `Conflict`, 403 `Forbidden`).
    pub fn fail(method: Method, path: impl Into<String>, code: u16, reason: &str) -> Self {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(method, path, status, status_body(code, reason))
    }

    fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// A `Status` failure object as the API server returns it.
pub fn status_body(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{reason} (test)"),
        "reason": reason,
        "code": code,
    })
}

/// A request as the code under test sent it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: Method,
    /// Path, without the query.
    pub path: String,
    /// Query parameters, in order, not percent-decoded.
    pub query: Vec<(String, String)>,
    /// The body, if it was JSON.
    pub body: Option<Value>,
}

impl Seen {
    /// The first value of query parameter `key`.
    pub fn query(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The JSON body, or an error naming the request.
    pub fn body(&self) -> anyhow::Result<&Value> {
        self.body
            .as_ref()
            .with_context(|| format!("{} {} has no JSON body", self.method, self.path))
    }

    /// Whether the request changes something (anything but GET, HEAD, OPTIONS).
    pub fn is_write(&self) -> bool {
        !matches!(self.method, Method::GET | Method::HEAD | Method::OPTIONS)
    }

    async fn read(request: Request<Body>) -> anyhow::Result<Self> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.context("reading the request body")?;
        let query = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(Self {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query,
            body: serde_json::from_slice(&bytes).ok(),
        })
    }

    fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// The scripted API server behind one [`kube::Client`]; serves one script per [`ApiServer::run`],
/// so one client (and whatever caches its users keep) can face several scripts in turn.
pub struct ApiServer {
    handle: Handle,
}

/// A client whose every request goes to the returned [`ApiServer`] (default namespace `default`).
pub fn pair() -> (kube::Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), ApiServer { handle })
}

/// Runs `call` on a fresh client against `script` (see [`ApiServer::run`]).
pub async fn run<T>(script: Vec<Step>, call: impl AsyncFnOnce(kube::Client) -> T) -> anyhow::Result<(T, Vec<Seen>)> {
    let (client, mut server) = pair();
    server.run(script, call(client)).await
}

impl ApiServer {
    /// Drives `call` while serving `script`: each request must be the next scripted one
    /// (method and path), and when `call` finishes every scripted request must have been made.
    /// Returns what `call` returned and every request it made. A mismatch is answered with a
    /// 500 (so the call ends quickly) and reported as the error.
    pub async fn run<F: IntoFuture>(&mut self, script: Vec<Step>, call: F) -> anyhow::Result<(F::Output, Vec<Seen>)> {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let call = async move {
            let output = tokio::time::timeout(CALL_TIMEOUT, call).await;
            let _ = done_tx.send(());
            output
        };
        let (output, served) = tokio::join!(call, serve(&mut self.handle, script, done_rx));
        let seen = served?;
        let output = output.map_err(|_| {
            anyhow!(
                "the call did not finish within {CALL_TIMEOUT:?}; it made {:?}",
                seen.iter().map(Seen::describe).collect::<Vec<_>>()
            )
        })?;
        Ok((output, seen))
    }
}

/// Serves `script` until `done`; see [`ApiServer::run`].
async fn serve(
    handle: &mut Handle,
    script: Vec<Step>,
    mut done: tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<Vec<Seen>> {
    let mut script = script.into_iter();
    let mut seen: Vec<Seen> = Vec::new();
    let mut failure: Option<String> = None;
    loop {
        let next = tokio::select! {
            biased;
            request = handle.next_request() => request,
            _ = &mut done => None,
        };
        let Some((request, send)) = next else {
            let made = || seen.iter().map(Seen::describe).collect::<Vec<_>>();
            if let Some(failure) = failure {
                bail!("{failure}; requests made: {:?}", made());
            }
            let missing: Vec<String> = script.map(|s| s.describe()).collect();
            if !missing.is_empty() {
                bail!(
                    "the call finished without making the scripted requests {missing:?}; requests made: {:?}",
                    made()
                );
            }
            return Ok(seen);
        };
        let request = Seen::read(request).await?;
        let expected = script.next();
        let (status, answer) = match (&failure, expected) {
            (None, Some(step)) if step.method == request.method && step.path == request.path => {
                let answer = match step.answer {
                    Answer::Json(body) => body,
                    Answer::Echo => request.body.clone().unwrap_or(Value::Null),
                };
                (step.status, answer)
            }
            (None, step) => {
                failure = Some(match step {
                    Some(step) => format!(
                        "request {} was {}, expected {}",
                        seen.len() + 1,
                        request.describe(),
                        step.describe()
                    ),
                    None => format!("unexpected request {} after the script ended", request.describe()),
                });
                (StatusCode::INTERNAL_SERVER_ERROR, status_body(500, "ScriptMismatch"))
            }
            (Some(_), _) => (StatusCode::INTERNAL_SERVER_ERROR, status_body(500, "ScriptMismatch")),
        };
        let response = Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&answer)?))?;
        send.send_response(response);
        seen.push(request);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;

    fn config_maps(client: kube::Client) -> Api<ConfigMap> {
        Api::namespaced(client, "team-a")
    }

    const PATH: &str = "/api/v1/namespaces/team-a/configmaps/values";

    #[tokio::test]
    async fn serves_the_script_and_returns_what_was_sent() -> anyhow::Result<()> {
        let cm =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "values", "namespace": "team-a"}});
        let script = vec![Step::not_found(PATH), Step::echo(Method::PATCH, PATH)];
        let (result, seen) = run(script, async |client| {
            let api = config_maps(client);
            let before = api.get_opt("values").await?;
            let params = kube::api::PatchParams::apply("test").force();
            let after = api.patch("values", &params, &kube::api::Patch::Apply(&cm)).await?;
            Ok::<_, kube::Error>((before, after))
        })
        .await?;
        let (before, after) = result?;
        assert!(before.is_none());
        assert_eq!(after.metadata.name.as_deref(), Some("values"));
        assert_eq!(seen.len(), 2);
        assert!(!seen[0].is_write() && seen[1].is_write());
        assert_eq!(seen[1].query("fieldManager"), Some("test"));
        assert_eq!(seen[1].body()?, &cm);
        Ok(())
    }

    #[tokio::test]
    async fn a_wrong_request_is_an_error_naming_both() -> anyhow::Result<()> {
        let script = vec![Step::not_found("/api/v1/namespaces/team-a/configmaps/other")];
        let err = run(script, async |client| config_maps(client).get_opt("values").await)
            .await
            .err()
            .context("a mismatch fails the run")?;
        let message = err.to_string();
        assert!(
            message.contains("was GET /api/v1/namespaces/team-a/configmaps/values"),
            "{message}"
        );
        assert!(
            message.contains("expected GET /api/v1/namespaces/team-a/configmaps/other"),
            "{message}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_missing_or_extra_request_is_an_error() -> anyhow::Result<()> {
        let missing = run(vec![Step::not_found(PATH)], async |_client| ()).await;
        assert!(
            missing.is_err_and(|e| e.to_string().contains("without making the scripted requests")),
            "a scripted request that never came"
        );
        let extra = run(Vec::new(), async |client| config_maps(client).get_opt("values").await).await;
        assert!(
            extra.is_err_and(|e| e.to_string().contains("after the script ended")),
            "a request after the script"
        );
        Ok(())
    }

    #[tokio::test]
    async fn one_server_serves_scripts_in_turn() -> anyhow::Result<()> {
        let (client, mut server) = pair();
        let api = config_maps(client);
        let (first, _) = server.run(vec![Step::not_found(PATH)], api.get_opt("values")).await?;
        assert!(first?.is_none());
        let (second, seen) = server.run(Vec::new(), async { 42 }).await?;
        assert_eq!((second, seen.len()), (42, 0));
        Ok(())
    }
}
