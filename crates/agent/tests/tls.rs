//! Pull mode over real TLS: the agent's client trusts a control plane whose certificate
//! chains to `--ca-bundle`, and refuses one it cannot verify with a clear, key-free
//! `ConnectionFailed` (never a silent downgrade); and it reaches the control plane through
//! the proxy named by `HTTPS_PROXY` (a CONNECT tunnel, so the proxy never sees the key),
//! unless `NO_PROXY` names the host. The simulator is served over rustls by the agent's
//! own push server, with certificates made at test time.
//!
//! The proxy variables are read from the environment when a client is built. Setting them
//! in this process would race other threads, so the proxied calls run in a child process
//! (this test binary, re-run for one test) that gets them in its environment.

mod common;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use agent::{
    client::{ClientConfig, ControlPlaneClient},
    push::{PushServer, TlsFiles},
};
use controller_kit::{CancellationToken, Redacted};
use odoo_sim::Sim;
use protocol::METHOD_REGISTER;
use serde_json::json;

const KEY: &str = "tls-test-api-key-0123456789abcdef01234567";

/// A CA and a server certificate for 127.0.0.1 signed by it, as PEM files in `dir`.
fn pki(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "odoo test CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server-key.pem"));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

fn client(url: &str, ca_bundle: Option<&Path>) -> ControlPlaneClient {
    ControlPlaneClient::new(&ClientConfig {
        url: url.into(),
        database: None,
        timeout: Duration::from_secs(5),
        max_response_bytes: 1024 * 1024,
        ca_bundle: ca_bundle.map(Path::to_path_buf),
        insecure_allow_http: false,
    })
    .unwrap()
}

fn register_params() -> serde_json::Value {
    json!({"protocol_version": "1.0", "cluster": {"uid": "uid-tls", "name": "edge-tls"},
        "agent": {"version": "0.1.0", "instance": "agent-0", "mode": "pull", "started_at": "2026-11-21T10:00:00Z"},
        "allowed_namespaces": ["*"]})
}

/// The simulator over HTTPS with a certificate from a test CA: (CA file, URL, shutdown,
/// serving task). `dir` keeps the files.
async fn tls_sim(dir: &Path) -> (PathBuf, String, CancellationToken, tokio::task::JoinHandle<()>) {
    let (ca, cert, key) = pki(dir);
    let sim = Sim::new(common::sim_config()).unwrap();
    sim.add_cluster("edge-tls", KEY).unwrap();
    let server = PushServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Some(TlsFiles {
            cert,
            key,
            client_ca: None,
        }),
    )
    .await
    .unwrap();
    let url = server.url();
    assert!(url.starts_with("https://"), "{url}");
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(server.serve(odoo_sim::router(sim), shutdown.clone()));
    (ca, url, shutdown, serving)
}

#[tokio::test]
async fn https_with_a_ca_bundle_is_trusted_and_an_unknown_issuer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, url, shutdown, serving) = tls_sim(dir.path()).await;
    let register = register_params();
    let key = Redacted::new(KEY.to_owned());

    // Trusted through --ca-bundle: the call goes through.
    let ok = client(&url, Some(&ca))
        .call(&key, METHOD_REGISTER, &register)
        .await
        .unwrap();
    assert_eq!(ok["cluster_id"], 1);

    // Only the system roots: the certificate cannot be verified, the call fails before
    // any request (the key never left), with a reason the agent's condition can show.
    let err = client(&url, None)
        .call(&key, METHOD_REGISTER, &register)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "ConnectionFailed", "{err}");
    assert!(err.to_string().contains("UnknownIssuer"), "says why: {err}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains(KEY), "the key leaked into {text}");
    }

    shutdown.cancel();
    serving.await.unwrap();
}

/// A minimal HTTP CONNECT proxy on loopback; records each request head it receives.
async fn connect_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                seen.lock().unwrap().push(head.clone());
                let target = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (url, heads)
}

const CHILD_URL: &str = "VWS_TLS_TEST_CHILD_URL";
const CHILD_CA: &str = "VWS_TLS_TEST_CHILD_CA";

/// Runs [`child_registers_through_the_environment_proxy`] in a child process with `env` (this
/// test binary again, running the one test that calls this, which sees [`CHILD_URL`]),
/// off the runtime's thread (the simulator and the proxy run on it); panics with the
/// child's output when it fails.
async fn run_child(url: &str, ca: &Path, env: &[(&str, &str)]) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "https_proxy_from_the_environment_tunnels_the_calls_and_no_proxy_bypasses_it",
        "--exact",
        "--nocapture",
    ])
    .env(CHILD_URL, url)
    .env(CHILD_CA, ca);
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the child failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The child's side: one `agent_register` with whatever proxy the environment names.
async fn child_registers_through_the_environment_proxy(url: &str, ca: &str) {
    let key = Redacted::new(KEY.to_owned());
    let ok = client(url, Some(Path::new(ca)))
        .call(&key, METHOD_REGISTER, &register_params())
        .await
        .unwrap();
    assert_eq!(ok["cluster_id"], 1);
}

#[tokio::test]
async fn https_proxy_from_the_environment_tunnels_the_calls_and_no_proxy_bypasses_it() {
    // Started by `run_child`: this process is the child, with the proxy variables to test
    // (one test, so the child's side is never counted as a test of its own).
    if let (Ok(url), Ok(ca)) = (std::env::var(CHILD_URL), std::env::var(CHILD_CA)) {
        child_registers_through_the_environment_proxy(&url, &ca).await;
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ca, url, shutdown, serving) = tls_sim(dir.path()).await;
    let (proxy, heads) = connect_proxy().await;
    let target = url.trim_start_matches("https://").to_owned();

    run_child(&url, &ca, &[("HTTPS_PROXY", &proxy)]).await;
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one tunnel: {seen:?}");
    assert!(seen[0].starts_with(&format!("CONNECT {target} ")), "{seen:?}");
    // TLS runs inside the tunnel: the proxy sees the target, never the key.
    assert!(
        !seen[0].contains(KEY) && !seen[0].to_ascii_lowercase().contains("authorization"),
        "{seen:?}"
    );

    // The lowercase spelling works too; NO_PROXY naming the host bypasses the proxy.
    run_child(&url, &ca, &[("https_proxy", &proxy)]).await;
    assert_eq!(heads.lock().unwrap().len(), 2);
    run_child(&url, &ca, &[("HTTPS_PROXY", &proxy), ("NO_PROXY", "127.0.0.1")]).await;
    assert_eq!(heads.lock().unwrap().len(), 2, "NO_PROXY: no tunnel");

    shutdown.cancel();
    serving.await.unwrap();
}
