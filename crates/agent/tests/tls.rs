//! Pull mode over real TLS: the agent's client trusts a control plane whose certificate
//! chains to `--ca-bundle`, and refuses one it cannot verify with a clear, key-free
//! `ConnectionFailed` (never a silent downgrade). The simulator is served over rustls by
//! the agent's own push server, with certificates made at test time.

use std::{path::Path, time::Duration};

use agent::{
    client::{ClientConfig, ControlPlaneClient},
    push::{PushServer, TlsFiles},
};
use controller_kit::{CancellationToken, Redacted};
use odoo_sim::{Sim, SimConfig};
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

#[tokio::test]
async fn https_with_a_ca_bundle_is_trusted_and_an_unknown_issuer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let sim = Sim::new(SimConfig {
        state_file: None,
        database: None,
        sync_interval_seconds: None,
        offline_after: Duration::from_secs(90),
    })
    .unwrap();
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
    let register = json!({"protocol_version": "1.0", "cluster": {"uid": "uid-tls", "name": "edge-tls"},
        "agent": {"version": "0.1.0", "instance": "agent-0", "mode": "pull", "started_at": "2026-11-21T10:00:00Z"},
        "allowed_namespaces": ["*"]});
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
