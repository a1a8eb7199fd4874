//! Pod Security for Runbook Jobs: the pod template of a Runbook's Job must pass the
//! Kubernetes Pod Security Standard `restricted`
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>), runs as the
//! dedicated ServiceAccount [`SERVICE_ACCOUNT`] and gets no API token. Whoever can create an
//! Operation (Odoo through the agent, the push-token holder, a kubectl user with create
//! rights on Operations in one namespace) must not get a privileged or host-reaching pod
//! out of it.
//!
//! [`restrict`] works on the template as arbitrary JSON (the CRD field is free-form), so it
//! never panics and accepts any UTF-8; each value is checked against what is allowed
//! (an allow-list), never against a list of known-bad values:
//!
//! - a field that is **absent** (or `null`) gets the restricted-compliant default, so an
//!   ordinary runbook without any `securityContext` just works: pod `runAsNonRoot: true`,
//!   `runAsUser: 65532` ([`DEFAULT_RUN_AS_USER`]) and `seccompProfile: RuntimeDefault`;
//!   every container `allowPrivilegeEscalation: false` and `capabilities.drop: [ALL]`;
//! - a field **set** to a value `restricted` does not allow is refused with
//!   [`Error::InvalidSpec`] naming the exact JSON path and the value, e.g.
//!   `runbook.job.template.spec.containers[0].securityContext.privileged: true is not allowed (Pod Security "restricted")`;
//! - `serviceAccountName` / `serviceAccount` other than [`SERVICE_ACCOUNT`] and
//!   `automountServiceAccountToken: true` are refused, as are projected
//!   `serviceAccountToken` and `podCertificate` sources (an API credential by another
//!   door); the pod always gets `serviceAccountName: vworkspace-runbook` and
//!   `automountServiceAccountToken: false`.
//!
//! The rules, for `containers`, `initContainers` and `ephemeralContainers` alike (Pod
//! Security Admission as of Kubernetes 1.36, without its version pinning and without the
//! relaxations for Windows pods and user-namespaced pods: a runbook is a Linux pod):
//!
//! | Rule | Fields | Allowed |
//! |---|---|---|
//! | Host namespaces | `hostNetwork`, `hostPID`, `hostIPC` | absent, `false` |
//! | HostProcess | `securityContext.windowsOptions.hostProcess` (pod, containers) | absent, `false` |
//! | Privileged | containers' `securityContext.privileged` | absent, `false` |
//! | Capabilities | containers' `securityContext.capabilities.add[*]` | `NET_BIND_SERVICE` |
//! | | containers' `securityContext.capabilities.drop` | a list holding `ALL` (default `[ALL]`) |
//! | Volume types | `volumes[*]` | `configMap`, `csi`, `downwardAPI`, `emptyDir`, `ephemeral`, `persistentVolumeClaim`, `projected`, `secret` (so no `hostPath`) |
//! | Host ports | containers' `ports[*].hostPort` | absent, `0` |
//! | Probe and lifecycle hosts | containers' `{liveness,readiness,startup}Probe.{httpGet,tcpSocket}.host`, `lifecycle.{postStart,preStop}.{httpGet,tcpSocket}.host` | absent, `""` |
//! | AppArmor | `securityContext.appArmorProfile.type` (pod, containers) | `RuntimeDefault`, `Localhost` |
//! | | annotation `container.apparmor.security.beta.kubernetes.io/*` | `runtime/default`, `localhost/*`, `""` |
//! | SELinux | `securityContext.seLinuxOptions.type` (pod, containers) | absent, `""`, `container_t`, `container_init_t`, `container_kvm_t`, `container_engine_t` |
//! | | `securityContext.seLinuxOptions.user`, `.role` | absent, `""` |
//! | /proc mount | containers' `securityContext.procMount` | absent, `Default` |
//! | Seccomp | `securityContext.seccompProfile.type` (pod, containers) | `RuntimeDefault`, `Localhost` (pod default `RuntimeDefault`) |
//! | | annotations `seccomp.security.alpha.kubernetes.io/pod`, `container.seccomp.security.alpha.kubernetes.io/*` | `runtime/default`, `docker/default`, `localhost/*` |
//! | Sysctls | `securityContext.sysctls[*].name` | the baseline safe set, [`SAFE_SYSCTLS`] |
//! | Privilege escalation | containers' `securityContext.allowPrivilegeEscalation` | `false` (default `false`) |
//! | Non-root | `securityContext.runAsNonRoot` (pod, containers) | `true` (pod default `true`) |
//! | Non-root user | `securityContext.runAsUser` (pod, containers) | a positive integer (pod default 65532) |
//! | OS | `os.name` | absent, `linux` |
//!
//! A non-empty `ephemeralContainers` that passes these rules is refused all the same: the
//! API server allows none in a pod template, and would refuse the Job on every attempt.
//!
//! Left alone on purpose, because they are not a Pod Security matter: `nodeName`,
//! `nodeSelector`, `affinity`, `tolerations` and `priorityClassName` (scheduling, which
//! the cluster governs with its own admission, e.g. taints and quotas), `runAsGroup`,
//! `fsGroup` and `supplementalGroups` (`restricted` allows group 0), `hostUsers`,
//! `readOnlyRootFilesystem`, resources and images.

use serde_json::{Map, Value, json};

use crate::Error;

/// The ServiceAccount every runbook pod runs as ([`api::RUNBOOK_SERVICE_ACCOUNT`]).
pub const SERVICE_ACCOUNT: &str = api::RUNBOOK_SERVICE_ACCOUNT;

/// The pod's `runAsUser` when the template sets none: with `runAsNonRoot: true` and no
/// user, the kubelet refuses to start an image whose user is root or a name (most
/// images), so an ordinary runbook would never run. 65532 is the conventional `nonroot`
/// user (distroless), the one the operator's own pods run as.
pub const DEFAULT_RUN_AS_USER: i64 = 65532;

/// Volume types `restricted` allows.
pub const ALLOWED_VOLUME_TYPES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Projected volume sources a runbook may use: none of them is an API credential
/// (`serviceAccountToken` and `podCertificate` are).
pub const ALLOWED_PROJECTED_SOURCES: [&str; 4] = ["configMap", "downwardAPI", "secret", "clusterTrustBundle"];

/// The sysctls `restricted` allows (baseline's safe set, Kubernetes 1.32 and later).
pub const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// SELinux types `restricted` allows (besides none and `""`).
pub const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";
/// Longest value shown in a refusal (longer ones are cut, on a character boundary).
const SHOWN_MAX_CHARS: usize = 80;

/// Checks the pod template `template` (found at `path`, e.g. `runbook.job.template`)
/// against Pod Security `restricted`, fills in the compliant defaults of absent fields and
/// sets the runbook identity (see the module documentation). The first violation found is
/// returned as [`Error::InvalidSpec`] naming its path.
pub fn restrict(template: &mut Map<String, Value>, path: &str) -> Result<(), Error> {
    let meta_path = field(path, "metadata");
    if let Some(meta) = object(template, "metadata", &meta_path)?
        && let Some(annotations) = object(meta, "annotations", &field(&meta_path, "annotations"))?
    {
        check_annotations(annotations, &field(&meta_path, "annotations"))?;
    }
    let spec_path = field(path, "spec");
    let pod = object_entry(template, "spec", &spec_path)?;
    restrict_pod(pod, &spec_path)
}

fn restrict_pod(pod: &mut Map<String, Value>, path: &str) -> Result<(), Error> {
    for name in ["serviceAccountName", "serviceAccount"] {
        match present(pod, name) {
            None => {}
            Some(Value::String(account)) if account.is_empty() || account == SERVICE_ACCOUNT => {}
            Some(other) => {
                return Err(refused(
                    &field(path, name),
                    other,
                    &format!("runbook pods run as the ServiceAccount {SERVICE_ACCOUNT}, which has no rights"),
                ));
            }
        }
    }
    if let Some(automount) = present(pod, "automountServiceAccountToken")
        && automount != &Value::Bool(false)
    {
        return Err(refused(
            &field(path, "automountServiceAccountToken"),
            automount,
            "runbook pods get no Kubernetes API token",
        ));
    }
    for name in ["hostNetwork", "hostPID", "hostIPC"] {
        allow(pod, name, path, is_false, None)?;
    }
    let os_path = field(path, "os");
    if let Some(os) = object(pod, "os", &os_path)?
        && let Some(name) = present(os, "name")
        && name != "linux"
    {
        return Err(refused(
            &field(&os_path, "name"),
            name,
            "runbooks run Linux pods (Pod Security \"restricted\" needs their security context)",
        ));
    }

    let context_path = field(path, "securityContext");
    {
        let context = object_entry(pod, "securityContext", &context_path)?;
        check_context(context, &context_path)?;
        let sysctls_path = field(&context_path, "sysctls");
        for (index, sysctl) in list(context, "sysctls", &sysctls_path)?
            .into_iter()
            .flatten()
            .enumerate()
        {
            let item_path = at(&sysctls_path, index);
            let Some(sysctl) = sysctl.as_object() else {
                return Err(not_object(&item_path));
            };
            let name = sysctl.get("name").unwrap_or(&Value::Null);
            if !name.as_str().is_some_and(|n| SAFE_SYSCTLS.contains(&n)) {
                return Err(restricted(
                    &field(&item_path, "name"),
                    name,
                    Some(&format!(
                        "only the safe sysctls may be set: {}",
                        SAFE_SYSCTLS.join(", ")
                    )),
                ));
            }
        }
        default(context, "runAsNonRoot", json!(true));
        default(context, "runAsUser", json!(DEFAULT_RUN_AS_USER));
        default(context, "seccompProfile", json!({"type": "RuntimeDefault"}));
    }

    let volumes_path = field(path, "volumes");
    for (index, volume) in list(pod, "volumes", &volumes_path)?.into_iter().flatten().enumerate() {
        check_volume(volume, &at(&volumes_path, index))?;
    }

    for name in CONTAINER_LISTS {
        let list_path = field(path, name);
        let Some(containers) = pod.get_mut(name).filter(|c| !c.is_null()) else {
            continue;
        };
        let Some(containers) = containers.as_array_mut() else {
            return Err(not_list(&list_path));
        };
        for (index, container) in containers.iter_mut().enumerate() {
            let container_path = at(&list_path, index);
            let Some(container) = container.as_object_mut() else {
                return Err(not_object(&container_path));
            };
            restrict_container(container, &container_path)?;
        }
    }

    // Checked like the others above (a non-compliant one is named as such), but the API
    // server refuses any ephemeral container in a pod template: say so now, rather than
    // have every attempt to create the Job fail.
    let ephemeral_path = field(path, "ephemeralContainers");
    if list(pod, "ephemeralContainers", &ephemeral_path)?.is_some_and(|c| !c.is_empty()) {
        return Err(Error::InvalidSpec(format!(
            "{ephemeral_path}: not allowed in a pod template (ephemeral containers are only added to running pods)"
        )));
    }

    pod.insert("serviceAccountName".into(), json!(SERVICE_ACCOUNT));
    pod.insert("automountServiceAccountToken".into(), json!(false));
    Ok(())
}

fn restrict_container(container: &mut Map<String, Value>, path: &str) -> Result<(), Error> {
    let ports_path = field(path, "ports");
    for (index, port) in list(container, "ports", &ports_path)?.into_iter().flatten().enumerate() {
        let port_path = at(&ports_path, index);
        let Some(port) = port.as_object() else {
            return Err(not_object(&port_path));
        };
        allow(port, "hostPort", &port_path, |v| v.as_i64() == Some(0), None)?;
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let probe_path = field(path, probe);
        if let Some(probe) = object(container, probe, &probe_path)? {
            check_handler_hosts(probe, &probe_path)?;
        }
    }
    let lifecycle_path = field(path, "lifecycle");
    if let Some(lifecycle) = object(container, "lifecycle", &lifecycle_path)? {
        for hook in ["postStart", "preStop"] {
            let hook_path = field(&lifecycle_path, hook);
            if let Some(hook) = object(lifecycle, hook, &hook_path)? {
                check_handler_hosts(hook, &hook_path)?;
            }
        }
    }

    let context_path = field(path, "securityContext");
    let context = object_entry(container, "securityContext", &context_path)?;
    check_context(context, &context_path)?;
    allow(context, "privileged", &context_path, is_false, None)?;
    allow(
        context,
        "procMount",
        &context_path,
        |v| v == "Default",
        Some("use Default"),
    )?;
    allow(context, "allowPrivilegeEscalation", &context_path, is_false, None)?;
    default(context, "allowPrivilegeEscalation", json!(false));

    let capabilities_path = field(&context_path, "capabilities");
    let capabilities = object_entry(context, "capabilities", &capabilities_path)?;
    let add_path = field(&capabilities_path, "add");
    for (index, capability) in list(capabilities, "add", &add_path)?.into_iter().flatten().enumerate() {
        if capability != "NET_BIND_SERVICE" {
            return Err(restricted(
                &at(&add_path, index),
                capability,
                Some("only NET_BIND_SERVICE may be added"),
            ));
        }
    }
    let drop_path = field(&capabilities_path, "drop");
    if let Some(drop) = list(capabilities, "drop", &drop_path)?
        && !drop.iter().any(|c| c == "ALL")
    {
        return Err(restricted(
            &drop_path,
            &Value::Array(drop.clone()),
            Some("the list must include ALL"),
        ));
    }
    default(capabilities, "drop", json!(["ALL"]));
    Ok(())
}

/// The fields a pod and a container security context share.
fn check_context(context: &Map<String, Value>, path: &str) -> Result<(), Error> {
    allow(context, "runAsNonRoot", path, |v| v == &Value::Bool(true), None)?;
    allow(
        context,
        "runAsUser",
        path,
        |v| v.as_i64().is_some_and(|uid| uid > 0) || v.as_u64().is_some_and(|uid| uid > 0),
        Some("runbooks run as a non-root user"),
    )?;
    for (name, hint) in [
        ("seccompProfile", "use RuntimeDefault or Localhost"),
        ("appArmorProfile", "use RuntimeDefault or Localhost"),
    ] {
        let profile_path = field(path, name);
        if let Some(profile) = object(context, name, &profile_path)? {
            // `type` is required in a profile: an absent one is refused, not defaulted.
            let type_ = profile.get("type").unwrap_or(&Value::Null);
            if type_ != "RuntimeDefault" && type_ != "Localhost" {
                return Err(restricted(&field(&profile_path, "type"), type_, Some(hint)));
            }
        }
    }
    let selinux_path = field(path, "seLinuxOptions");
    if let Some(selinux) = object(context, "seLinuxOptions", &selinux_path)? {
        allow(
            selinux,
            "type",
            &selinux_path,
            |v| v == "" || v.as_str().is_some_and(|t| SELINUX_TYPES.contains(&t)),
            Some(&format!("allowed types: {}", SELINUX_TYPES.join(", "))),
        )?;
        allow(selinux, "user", &selinux_path, |v| v == "", None)?;
        allow(selinux, "role", &selinux_path, |v| v == "", None)?;
    }
    let windows_path = field(path, "windowsOptions");
    if let Some(windows) = object(context, "windowsOptions", &windows_path)? {
        allow(windows, "hostProcess", &windows_path, is_false, None)?;
    }
    Ok(())
}

/// `host` of the `httpGet` and `tcpSocket` handlers of a probe or lifecycle hook: a pod
/// must not make the kubelet connect to another host.
fn check_handler_hosts(handlers: &Map<String, Value>, path: &str) -> Result<(), Error> {
    for handler in ["httpGet", "tcpSocket"] {
        let handler_path = field(path, handler);
        if let Some(handler) = object(handlers, handler, &handler_path)? {
            allow(handler, "host", &handler_path, |v| v == "", None)?;
        }
    }
    Ok(())
}

fn check_volume(volume: &Value, path: &str) -> Result<(), Error> {
    let Some(volume) = volume.as_object() else {
        return Err(not_object(path));
    };
    // A volume without a source is an emptyDir (the API server's default).
    for (type_, source) in volume.iter().filter(|(key, value)| *key != "name" && !value.is_null()) {
        let source_path = field(path, type_);
        if !ALLOWED_VOLUME_TYPES.contains(&type_.as_str()) {
            return Err(restricted(
                &source_path,
                source,
                Some(&format!("allowed volume types: {}", ALLOWED_VOLUME_TYPES.join(", "))),
            ));
        }
        if type_ == "projected" {
            let Some(projected) = source.as_object() else {
                return Err(not_object(&source_path));
            };
            let sources_path = field(&source_path, "sources");
            for (index, item) in list(projected, "sources", &sources_path)?
                .into_iter()
                .flatten()
                .enumerate()
            {
                let item_path = at(&sources_path, index);
                let Some(item) = item.as_object() else {
                    return Err(not_object(&item_path));
                };
                if let Some((kind, value)) = item
                    .iter()
                    .find(|(kind, value)| !value.is_null() && !ALLOWED_PROJECTED_SOURCES.contains(&kind.as_str()))
                {
                    return Err(refused(
                        &field(&item_path, kind),
                        value,
                        &format!(
                            "runbook pods get no Kubernetes API credentials (allowed projected sources: {})",
                            ALLOWED_PROJECTED_SOURCES.join(", ")
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_annotations(annotations: &Map<String, Value>, path: &str) -> Result<(), Error> {
    for (name, value) in annotations {
        let text = value.as_str();
        let allowed = if name.starts_with(APPARMOR_ANNOTATION_PREFIX) {
            text.is_some_and(|t| t.is_empty() || t == "runtime/default" || t.starts_with("localhost/"))
        } else if name == SECCOMP_POD_ANNOTATION || name.starts_with(SECCOMP_CONTAINER_ANNOTATION_PREFIX) {
            text.is_some_and(|t| t == "runtime/default" || t == "docker/default" || t.starts_with("localhost/"))
        } else {
            true
        };
        if !allowed {
            return Err(restricted(
                &field(path, name),
                value,
                Some("use runtime/default or localhost/<profile>"),
            ));
        }
    }
    Ok(())
}

// --- JSON access: `null` reads as absent; wrong shapes are refused, never unwrapped ---

/// `map[key]` unless absent or `null`.
fn present<'m>(map: &'m Map<String, Value>, key: &str) -> Option<&'m Value> {
    map.get(key).filter(|v| !v.is_null())
}

/// `map[key]` as an object; `None` when absent or `null`.
fn object<'m>(map: &'m Map<String, Value>, key: &str, path: &str) -> Result<Option<&'m Map<String, Value>>, Error> {
    match present(map, key) {
        None => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object)),
        Some(_) => Err(not_object(path)),
    }
}

/// `map[key]` as a list; `None` when absent or `null`.
fn list<'m>(map: &'m Map<String, Value>, key: &str, path: &str) -> Result<Option<&'m Vec<Value>>, Error> {
    match present(map, key) {
        None => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(_) => Err(not_list(path)),
    }
}

/// `map[key]` as an object, created when absent or `null`.
fn object_entry<'m>(
    map: &'m mut Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'m mut Map<String, Value>, Error> {
    let value = map.entry(key).or_insert(Value::Null);
    if value.is_null() {
        *value = json!({});
    }
    value.as_object_mut().ok_or_else(|| not_object(path))
}

/// Sets `map[key]` to `value` when absent or `null`.
fn default(map: &mut Map<String, Value>, key: &str, value: Value) {
    let slot = map.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = value;
    }
}

/// Refuses `map[key]` (at `parent.key`) unless it is absent, `null` or accepted by `ok`.
fn allow(
    map: &Map<String, Value>,
    key: &str,
    parent: &str,
    ok: impl Fn(&Value) -> bool,
    hint: Option<&str>,
) -> Result<(), Error> {
    match present(map, key) {
        Some(value) if !ok(value) => Err(restricted(&field(parent, key), value, hint)),
        _ => Ok(()),
    }
}

fn is_false(value: &Value) -> bool {
    value == &Value::Bool(false)
}

// --- paths and messages ---

/// `parent.key`, or `parent["key"]` (JSON-quoted) when the key is not a plain identifier.
fn field(parent: &str, key: &str) -> String {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        format!("{parent}.{key}")
    } else {
        format!("{parent}[{}]", Value::from(key))
    }
}

fn at(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

/// `value` as compact JSON, cut to [`SHOWN_MAX_CHARS`] characters.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= SHOWN_MAX_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(SHOWN_MAX_CHARS).collect();
    cut.push('…');
    cut
}

/// A value Pod Security `restricted` does not allow.
fn restricted(path: &str, value: &Value, hint: Option<&str>) -> Error {
    let mut message = format!("{path}: {} is not allowed (Pod Security \"restricted\")", shown(value));
    if let Some(hint) = hint {
        message.push_str("; ");
        message.push_str(hint);
    }
    Error::InvalidSpec(message)
}

/// A value refused for the runbook identity rather than a Pod Security rule.
fn refused(path: &str, value: &Value, why: &str) -> Error {
    Error::InvalidSpec(format!("{path}: {} is not allowed; {why}", shown(value)))
}

fn not_object(path: &str) -> Error {
    Error::InvalidSpec(format!("{path}: must be an object"))
}

fn not_list(path: &str) -> Error {
    Error::InvalidSpec(format!("{path}: must be a list"))
}

#[cfg(test)]
mod tests;
