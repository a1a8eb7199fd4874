//! The namespace allow-list (issue 14, item 8), against the real binaries: none of them
//! starts without an explicit allow-list (the error names the flag and the env var), and
//! none accepts a system namespace, whether listed, watched, or its own pod namespace.
//! What an object in a system namespace gets (`NamespaceNotAllowed`) is proven by
//! `app_controller::disallowed_target_namespace_is_refused` and the unit tables in
//! controller-kit; this file proves the start-up side, which no unit test can: that every
//! binary's `main` really validates before doing anything.

use std::{process::Stdio, time::Duration};

use e2e::process::binary_path;

const BINARIES: [&str; 6] = [
    "app-controller",
    "agent",
    "backup-engine",
    "restore-engine",
    "upgrade-engine",
    "runbook-engine",
];

/// Runs `binary` with `args` and `env` (nothing inherited that could set the allow-list),
/// expecting it to exit on its own with a failure; returns its stderr.
async fn refused_start(binary: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::new(binary_path(binary));
    cmd.args(args)
        .env_remove("VWS_ALLOWED_NAMESPACES")
        .env_remove("POD_NAMESPACE")
        .env_remove("VWS_WATCH_NAMESPACE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(20), cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    anyhow::ensure!(
        !out.status.success(),
        "{binary} {args:?} started (exit {:?}); stderr: {stderr}",
        out.status
    );
    Ok(stderr)
}

/// (args, env, a fragment of the start-up error)
type Case = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[tokio::test]
async fn no_binary_starts_without_an_allow_list_or_with_a_system_namespace() -> anyhow::Result<()> {
    for binary in BINARIES {
        // Port 0: should a binary wrongly get that far, it takes no fixed port. The agent's
        // own required flag, so that clap gets past it to the allow-list.
        let mut base = vec!["--admin-addr", "127.0.0.1:0"];
        if binary == "agent" {
            base.extend(["--cluster-name", "tenant-namespaces"]);
        }
        let stderr = refused_start(binary, &base, &[]).await?;
        assert!(
            stderr.contains("--allowed-namespaces") && stderr.contains("VWS_ALLOWED_NAMESPACES"),
            "{binary} without an allow-list: {stderr}"
        );

        let cases: [Case; 4] = [
            (
                &["--allowed-namespaces", "team-a,kube-system"],
                &[],
                "\"kube-system\" is a system namespace",
            ),
            (
                &["--allowed-namespaces", "*", "--watch-namespace", "flux-system"],
                &[],
                "\"flux-system\" is a system namespace",
            ),
            (
                &[],
                &[("VWS_ALLOWED_NAMESPACES", "vworkspace-system")],
                "\"vworkspace-system\" is a system namespace",
            ),
            (
                &["--allowed-namespaces", "ops,team-a"],
                &[("POD_NAMESPACE", "ops")],
                "\"ops\" is a system namespace",
            ),
        ];
        for (args, env, want) in cases {
            let mut all = args.to_vec();
            all.extend(&base);
            let stderr = refused_start(binary, &all, env).await?;
            assert!(stderr.contains(want), "{binary} {args:?} {env:?}: {stderr}");
        }
    }
    Ok(())
}
