//! Table tests of the Pod Security `restricted` check for Runbook pods.

use super::*;

const PATH: &str = "runbook.job.template";

/// `restrict` on a template, returning the template after it.
fn run(template: Value) -> Result<Value, Error> {
    let Value::Object(mut template) = template else {
        panic!("test templates are objects");
    };
    restrict(&mut template, PATH).map(|()| Value::Object(template))
}

/// A template whose pod spec is `{"containers": [{"name": "c"}]}` plus `fields`.
fn pod(fields: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "c"}]});
    if let (Some(spec), Value::Object(fields)) = (spec.as_object_mut(), fields) {
        spec.extend(fields);
    }
    json!({"spec": spec})
}

/// A template with one container `{"name": "c"}` plus `fields`.
fn container(fields: Value) -> Value {
    let mut c = json!({"name": "c"});
    if let (Some(c), Value::Object(fields)) = (c.as_object_mut(), fields) {
        c.extend(fields);
    }
    json!({"spec": {"containers": [c]}})
}

/// A template with one container whose securityContext is `context`.
fn context(context: Value) -> Value {
    container(json!({"securityContext": context}))
}

/// A template whose pod securityContext is `context`.
fn pod_context(context: Value) -> Value {
    pod(json!({"securityContext": context}))
}

fn annotated(name: &str, value: Value) -> Value {
    let mut template = pod(json!({}));
    template["metadata"] = json!({"annotations": {name: value}});
    template
}

fn restricted_msg(path: &str, value: &str) -> String {
    format!("{path}: {value} is not allowed (Pod Security \"restricted\")")
}

#[test]
fn absent_fields_get_the_restricted_defaults() {
    let template = json!({"spec": {
        "initContainers": [{"name": "i"}],
        "containers": [{"name": "c", "image": "busybox:1.36"}, {"name": "d", "securityContext": null}],
        "ephemeralContainers": [],
    }});
    let container_defaults = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
    });
    let expected = json!({"spec": {
        "serviceAccountName": "vworkspace-runbook",
        "automountServiceAccountToken": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [{"name": "i", "securityContext": container_defaults}],
        "containers": [
            {"name": "c", "image": "busybox:1.36", "securityContext": container_defaults},
            {"name": "d", "securityContext": container_defaults},
        ],
        "ephemeralContainers": [],
    }});
    let restricted = run(template).expect("compliant");
    assert_eq!(restricted, expected);
    // The output passes again, unchanged.
    assert_eq!(run(restricted.clone()).expect("still compliant"), restricted);
}

#[test]
fn null_fields_count_as_absent() {
    let template = pod(json!({
        "securityContext": {"runAsNonRoot": null, "runAsUser": null, "seccompProfile": null, "sysctls": null},
        "serviceAccountName": null,
        "automountServiceAccountToken": null,
        "hostPID": null,
        "volumes": null,
        "initContainers": null,
        "containers": [{"name": "c", "securityContext": {
            "allowPrivilegeEscalation": null,
            "privileged": null,
            "capabilities": {"add": null, "drop": null},
        }}],
    }));
    let out = run(template).expect("compliant");
    let spec = &out["spec"];
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(spec["securityContext"]["runAsUser"], 65532);
    assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(spec["serviceAccountName"], "vworkspace-runbook");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let c = &spec["containers"][0]["securityContext"];
    assert_eq!(c["allowPrivilegeEscalation"], false);
    assert_eq!(c["capabilities"]["drop"], json!(["ALL"]));
}

/// Every allowed value is accepted and kept as given (never overwritten by a default).
#[test]
fn compliant_values_are_accepted_and_kept() {
    let cases: Vec<(&str, Value, &str, Value)> = vec![
        (
            "pod runAsNonRoot",
            pod_context(json!({"runAsNonRoot": true})),
            "/spec/securityContext/runAsNonRoot",
            json!(true),
        ),
        (
            "pod runAsUser",
            pod_context(json!({"runAsUser": 1000})),
            "/spec/securityContext/runAsUser",
            json!(1000),
        ),
        (
            "pod seccomp Localhost",
            pod_context(json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}})),
            "/spec/securityContext/seccompProfile/type",
            json!("Localhost"),
        ),
        (
            "pod apparmor",
            pod_context(json!({"appArmorProfile": {"type": "RuntimeDefault"}})),
            "/spec/securityContext/appArmorProfile/type",
            json!("RuntimeDefault"),
        ),
        (
            "pod selinux type and level",
            pod_context(json!({"seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"}})),
            "/spec/securityContext/seLinuxOptions/level",
            json!("s0:c1,c2"),
        ),
        (
            "pod selinux empty",
            pod_context(json!({"seLinuxOptions": {"type": "", "user": "", "role": ""}})),
            "/spec/securityContext/seLinuxOptions/user",
            json!(""),
        ),
        (
            "pod hostProcess false",
            pod_context(json!({"windowsOptions": {"hostProcess": false}})),
            "/spec/securityContext/windowsOptions/hostProcess",
            json!(false),
        ),
        (
            "pod groups left alone",
            pod_context(json!({"runAsGroup": 0, "fsGroup": 0, "supplementalGroups": [0]})),
            "/spec/securityContext/runAsGroup",
            json!(0),
        ),
        (
            "safe sysctls",
            pod_context(
                json!({"sysctls": SAFE_SYSCTLS.iter().map(|n| json!({"name": n, "value": "1"})).collect::<Vec<_>>()}),
            ),
            "/spec/securityContext/sysctls/11/name",
            json!("net.ipv4.tcp_wmem"),
        ),
        (
            "hostNetwork false",
            pod(json!({"hostNetwork": false})),
            "/spec/hostNetwork",
            json!(false),
        ),
        (
            "hostPID false",
            pod(json!({"hostPID": false})),
            "/spec/hostPID",
            json!(false),
        ),
        (
            "hostIPC false",
            pod(json!({"hostIPC": false})),
            "/spec/hostIPC",
            json!(false),
        ),
        (
            "os linux",
            pod(json!({"os": {"name": "linux"}})),
            "/spec/os/name",
            json!("linux"),
        ),
        (
            "our ServiceAccount",
            pod(json!({"serviceAccountName": "vworkspace-runbook", "serviceAccount": "vworkspace-runbook"})),
            "/spec/serviceAccount",
            json!("vworkspace-runbook"),
        ),
        (
            "empty ServiceAccount",
            pod(json!({"serviceAccountName": ""})),
            "/spec/serviceAccountName",
            json!("vworkspace-runbook"),
        ),
        (
            "automount false",
            pod(json!({"automountServiceAccountToken": false})),
            "/spec/automountServiceAccountToken",
            json!(false),
        ),
        (
            "scheduling left alone",
            pod(json!({"nodeName": "n1", "nodeSelector": {"disk": "ssd"}, "tolerations": [{"operator": "Exists"}]})),
            "/spec/nodeName",
            json!("n1"),
        ),
        (
            "hostUsers left alone",
            pod(json!({"hostUsers": false})),
            "/spec/hostUsers",
            json!(false),
        ),
        (
            "privileged false",
            context(json!({"privileged": false})),
            "/spec/containers/0/securityContext/privileged",
            json!(false),
        ),
        (
            "allowPrivilegeEscalation false",
            context(json!({"allowPrivilegeEscalation": false})),
            "/spec/containers/0/securityContext/allowPrivilegeEscalation",
            json!(false),
        ),
        (
            "add NET_BIND_SERVICE",
            context(json!({"capabilities": {"add": ["NET_BIND_SERVICE"]}})),
            "/spec/containers/0/securityContext/capabilities/add/0",
            json!("NET_BIND_SERVICE"),
        ),
        (
            "drop ALL and more",
            context(json!({"capabilities": {"drop": ["NET_RAW", "ALL"]}})),
            "/spec/containers/0/securityContext/capabilities/drop",
            json!(["NET_RAW", "ALL"]),
        ),
        (
            "procMount Default",
            context(json!({"procMount": "Default"})),
            "/spec/containers/0/securityContext/procMount",
            json!("Default"),
        ),
        (
            "container runAsNonRoot",
            context(json!({"runAsNonRoot": true})),
            "/spec/containers/0/securityContext/runAsNonRoot",
            json!(true),
        ),
        (
            "container runAsUser",
            context(json!({"runAsUser": 4242})),
            "/spec/containers/0/securityContext/runAsUser",
            json!(4242),
        ),
        (
            "container seccomp",
            context(json!({"seccompProfile": {"type": "RuntimeDefault"}})),
            "/spec/containers/0/securityContext/seccompProfile/type",
            json!("RuntimeDefault"),
        ),
        (
            "container apparmor Localhost",
            context(json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-x"}})),
            "/spec/containers/0/securityContext/appArmorProfile/type",
            json!("Localhost"),
        ),
        (
            "container selinux engine",
            context(json!({"seLinuxOptions": {"type": "container_engine_t"}})),
            "/spec/containers/0/securityContext/seLinuxOptions/type",
            json!("container_engine_t"),
        ),
        (
            "readOnlyRootFilesystem left alone",
            context(json!({"readOnlyRootFilesystem": false})),
            "/spec/containers/0/securityContext/readOnlyRootFilesystem",
            json!(false),
        ),
        (
            "hostPort 0",
            container(json!({"ports": [{"containerPort": 80, "hostPort": 0}]})),
            "/spec/containers/0/ports/0/hostPort",
            json!(0),
        ),
        (
            "port without hostPort",
            container(json!({"ports": [{"containerPort": 80}]})),
            "/spec/containers/0/ports/0/containerPort",
            json!(80),
        ),
        (
            "probe without host",
            container(json!({"livenessProbe": {"httpGet": {"port": 8080, "host": ""}, "tcpSocket": {"port": 1}}})),
            "/spec/containers/0/livenessProbe/httpGet/host",
            json!(""),
        ),
        (
            "lifecycle exec",
            container(json!({"lifecycle": {"preStop": {"exec": {"command": ["true"]}}}})),
            "/spec/containers/0/lifecycle/preStop/exec/command/0",
            json!("true"),
        ),
        (
            "apparmor annotation runtime",
            annotated(
                "container.apparmor.security.beta.kubernetes.io/c",
                json!("runtime/default"),
            ),
            "/metadata/annotations/container.apparmor.security.beta.kubernetes.io~1c",
            json!("runtime/default"),
        ),
        (
            "apparmor annotation localhost",
            annotated(
                "container.apparmor.security.beta.kubernetes.io/c",
                json!("localhost/k8s-x"),
            ),
            "/metadata/annotations/container.apparmor.security.beta.kubernetes.io~1c",
            json!("localhost/k8s-x"),
        ),
        (
            "seccomp annotation",
            annotated("seccomp.security.alpha.kubernetes.io/pod", json!("runtime/default")),
            "/metadata/annotations/seccomp.security.alpha.kubernetes.io~1pod",
            json!("runtime/default"),
        ),
        (
            "other annotation",
            annotated("example.com/anything", json!("unconfined")),
            "/metadata/annotations/example.com~1anything",
            json!("unconfined"),
        ),
    ];
    for (name, template, pointer, kept) in cases {
        let out = run(template).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(out.pointer(pointer), Some(&kept), "{name}: {out}");
        assert_eq!(out["spec"]["serviceAccountName"], "vworkspace-runbook", "{name}");
        assert_eq!(out["spec"]["automountServiceAccountToken"], false, "{name}");
    }
}

#[test]
fn every_allowed_volume_type_is_accepted() {
    let volumes: Vec<Value> = ALLOWED_VOLUME_TYPES
        .iter()
        .map(|type_| json!({"name": type_.to_ascii_lowercase(), *type_: {}}))
        .chain([
            json!({"name": "bare"}),
            json!({"name": "nulls", "hostPath": null, "emptyDir": {}}),
            json!({"name": "proj", "projected": {"sources": [
                {"configMap": {"name": "a"}},
                {"secret": {"name": "b"}},
                {"downwardAPI": {"items": []}},
                {"clusterTrustBundle": {"path": "ca.pem", "signerName": "x/y"}},
                {"serviceAccountToken": null, "secret": {"name": "c"}},
            ]}}),
            json!({"name": "proj-empty", "projected": {}}),
        ])
        .collect();
    let out = run(pod(json!({"volumes": volumes.clone()}))).expect("compliant");
    assert_eq!(out["spec"]["volumes"], Value::Array(volumes));
}

/// One row per rule: the value refused, and the message naming its path.
#[test]
fn refusals_name_the_path() {
    let spec = "runbook.job.template.spec";
    let c0 = "runbook.job.template.spec.containers[0]";
    let sc = "runbook.job.template.spec.containers[0].securityContext";
    let psc = "runbook.job.template.spec.securityContext";
    let account = "runbook pods run as the ServiceAccount vworkspace-runbook, which has no rights";
    let credentials = "runbook pods get no Kubernetes API credentials (allowed projected sources: configMap, downwardAPI, secret, clusterTrustBundle)";
    let volume_types = "; allowed volume types: configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret";
    let cases: Vec<(&str, Value, String)> = vec![
        // Identity.
        (
            "serviceAccountName",
            pod(json!({"serviceAccountName": "admin"})),
            format!("{spec}.serviceAccountName: \"admin\" is not allowed; {account}"),
        ),
        (
            "serviceAccount",
            pod(json!({"serviceAccount": "default"})),
            format!("{spec}.serviceAccount: \"default\" is not allowed; {account}"),
        ),
        (
            "serviceAccountName not a string",
            pod(json!({"serviceAccountName": 1})),
            format!("{spec}.serviceAccountName: 1 is not allowed; {account}"),
        ),
        (
            "automount",
            pod(json!({"automountServiceAccountToken": true})),
            format!(
                "{spec}.automountServiceAccountToken: true is not allowed; runbook pods get no Kubernetes API token"
            ),
        ),
        (
            "projected token",
            pod(
                json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}),
            ),
            format!(
                "{spec}.volumes[0].projected.sources[0].serviceAccountToken: {{\"path\":\"token\"}} is not allowed; {credentials}"
            ),
        ),
        (
            "projected podCertificate",
            pod(
                json!({"volumes": [{"name": "t", "projected": {"sources": [{"configMap": {"name": "a"}}, {"podCertificate": {"signerName": "x/y"}}]}}]}),
            ),
            format!(
                "{spec}.volumes[0].projected.sources[1].podCertificate: {{\"signerName\":\"x/y\"}} is not allowed; {credentials}"
            ),
        ),
        // Host namespaces.
        (
            "hostNetwork",
            pod(json!({"hostNetwork": true})),
            restricted_msg(&format!("{spec}.hostNetwork"), "true"),
        ),
        (
            "hostPID",
            pod(json!({"hostPID": true})),
            restricted_msg(&format!("{spec}.hostPID"), "true"),
        ),
        (
            "hostIPC",
            pod(json!({"hostIPC": true})),
            restricted_msg(&format!("{spec}.hostIPC"), "true"),
        ),
        (
            "hostPID as a string",
            pod(json!({"hostPID": "true"})),
            restricted_msg(&format!("{spec}.hostPID"), "\"true\""),
        ),
        (
            "os windows",
            pod(json!({"os": {"name": "windows"}})),
            format!(
                "{spec}.os.name: \"windows\" is not allowed; runbooks run Linux pods (Pod Security \"restricted\" needs their security context)"
            ),
        ),
        // HostProcess.
        (
            "pod hostProcess",
            pod_context(json!({"windowsOptions": {"hostProcess": true}})),
            restricted_msg(&format!("{psc}.windowsOptions.hostProcess"), "true"),
        ),
        (
            "container hostProcess",
            context(json!({"windowsOptions": {"hostProcess": true}})),
            restricted_msg(&format!("{sc}.windowsOptions.hostProcess"), "true"),
        ),
        // Privileged.
        (
            "privileged",
            context(json!({"privileged": true})),
            format!("{sc}.privileged: true is not allowed (Pod Security \"restricted\")"),
        ),
        (
            "privileged init container",
            json!({"spec": {"containers": [{"name": "c"}], "initContainers": [{"name": "i"}, {"name": "j", "securityContext": {"privileged": true}}]}}),
            restricted_msg(
                "runbook.job.template.spec.initContainers[1].securityContext.privileged",
                "true",
            ),
        ),
        (
            "privileged ephemeral container",
            json!({"spec": {"containers": [{"name": "c"}], "ephemeralContainers": [{"name": "e", "securityContext": {"privileged": true}}]}}),
            restricted_msg(
                "runbook.job.template.spec.ephemeralContainers[0].securityContext.privileged",
                "true",
            ),
        ),
        (
            "privileged second container",
            json!({"spec": {"containers": [{"name": "c"}, {"name": "d", "securityContext": {"privileged": true}}]}}),
            restricted_msg(
                "runbook.job.template.spec.containers[1].securityContext.privileged",
                "true",
            ),
        ),
        // Capabilities.
        (
            "add SYS_ADMIN",
            context(json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
            format!(
                "{}; only NET_BIND_SERVICE may be added",
                restricted_msg(&format!("{sc}.capabilities.add[0]"), "\"SYS_ADMIN\"")
            ),
        ),
        (
            "add a baseline capability",
            context(json!({"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"]}})),
            format!(
                "{}; only NET_BIND_SERVICE may be added",
                restricted_msg(&format!("{sc}.capabilities.add[1]"), "\"CHOWN\"")
            ),
        ),
        (
            "add lower case",
            context(json!({"capabilities": {"add": ["net_bind_service"]}})),
            format!(
                "{}; only NET_BIND_SERVICE may be added",
                restricted_msg(&format!("{sc}.capabilities.add[0]"), "\"net_bind_service\"")
            ),
        ),
        (
            "drop without ALL",
            context(json!({"capabilities": {"drop": ["NET_RAW"]}})),
            format!(
                "{}; the list must include ALL",
                restricted_msg(&format!("{sc}.capabilities.drop"), "[\"NET_RAW\"]")
            ),
        ),
        (
            "drop empty",
            context(json!({"capabilities": {"drop": []}})),
            format!(
                "{}; the list must include ALL",
                restricted_msg(&format!("{sc}.capabilities.drop"), "[]")
            ),
        ),
        // Volumes.
        (
            "hostPath",
            pod(json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})),
            format!(
                "{}{volume_types}",
                restricted_msg(&format!("{spec}.volumes[0].hostPath"), "{\"path\":\"/\"}")
            ),
        ),
        (
            "nfs",
            pod(
                json!({"volumes": [{"name": "ok", "emptyDir": {}}, {"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]}),
            ),
            format!(
                "{}{volume_types}",
                restricted_msg(
                    &format!("{spec}.volumes[1].nfs"),
                    "{\"path\":\"/\",\"server\":\"10.0.0.1\"}"
                )
            ),
        ),
        (
            "gitRepo",
            pod(json!({"volumes": [{"name": "g", "gitRepo": {"repository": "x"}}]})),
            format!(
                "{}{volume_types}",
                restricted_msg(&format!("{spec}.volumes[0].gitRepo"), "{\"repository\":\"x\"}")
            ),
        ),
        (
            "unknown volume type",
            pod(json!({"volumes": [{"name": "u", "image": {"reference": "x"}}]})),
            format!(
                "{}{volume_types}",
                restricted_msg(&format!("{spec}.volumes[0].image"), "{\"reference\":\"x\"}")
            ),
        ),
        // Host ports.
        (
            "hostPort",
            container(json!({"ports": [{"containerPort": 80, "hostPort": 80}]})),
            restricted_msg(&format!("{c0}.ports[0].hostPort"), "80"),
        ),
        // Probe and lifecycle hosts.
        (
            "liveness httpGet host",
            container(json!({"livenessProbe": {"httpGet": {"port": 80, "host": "169.254.169.254"}}})),
            restricted_msg(&format!("{c0}.livenessProbe.httpGet.host"), "\"169.254.169.254\""),
        ),
        (
            "startup tcpSocket host",
            container(json!({"startupProbe": {"tcpSocket": {"port": 22, "host": "10.0.0.1"}}})),
            restricted_msg(&format!("{c0}.startupProbe.tcpSocket.host"), "\"10.0.0.1\""),
        ),
        (
            "preStop httpGet host",
            container(json!({"lifecycle": {"preStop": {"httpGet": {"port": 80, "host": "kube-apiserver"}}}})),
            restricted_msg(&format!("{c0}.lifecycle.preStop.httpGet.host"), "\"kube-apiserver\""),
        ),
        // AppArmor.
        (
            "pod apparmor unconfined",
            pod_context(json!({"appArmorProfile": {"type": "Unconfined"}})),
            format!(
                "{}; use RuntimeDefault or Localhost",
                restricted_msg(&format!("{psc}.appArmorProfile.type"), "\"Unconfined\"")
            ),
        ),
        (
            "container apparmor unconfined",
            context(json!({"appArmorProfile": {"type": "Unconfined"}})),
            format!(
                "{}; use RuntimeDefault or Localhost",
                restricted_msg(&format!("{sc}.appArmorProfile.type"), "\"Unconfined\"")
            ),
        ),
        (
            "apparmor annotation",
            annotated("container.apparmor.security.beta.kubernetes.io/c", json!("unconfined")),
            format!(
                "{}; use runtime/default or localhost/<profile>",
                restricted_msg(
                    "runbook.job.template.metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/c\"]",
                    "\"unconfined\""
                )
            ),
        ),
        // SELinux.
        (
            "selinux type",
            pod_context(json!({"seLinuxOptions": {"type": "spc_t"}})),
            format!(
                "{}; allowed types: container_t, container_init_t, container_kvm_t, container_engine_t",
                restricted_msg(&format!("{psc}.seLinuxOptions.type"), "\"spc_t\"")
            ),
        ),
        (
            "selinux user",
            context(json!({"seLinuxOptions": {"user": "system_u"}})),
            restricted_msg(&format!("{sc}.seLinuxOptions.user"), "\"system_u\""),
        ),
        (
            "selinux role",
            context(json!({"seLinuxOptions": {"role": "sysadm_r"}})),
            restricted_msg(&format!("{sc}.seLinuxOptions.role"), "\"sysadm_r\""),
        ),
        // /proc mount.
        (
            "procMount",
            context(json!({"procMount": "Unmasked"})),
            format!(
                "{}; use Default",
                restricted_msg(&format!("{sc}.procMount"), "\"Unmasked\"")
            ),
        ),
        // Seccomp.
        (
            "pod seccomp unconfined",
            pod_context(json!({"seccompProfile": {"type": "Unconfined"}})),
            format!(
                "{}; use RuntimeDefault or Localhost",
                restricted_msg(&format!("{psc}.seccompProfile.type"), "\"Unconfined\"")
            ),
        ),
        (
            "container seccomp unconfined",
            context(json!({"seccompProfile": {"type": "Unconfined"}})),
            format!(
                "{}; use RuntimeDefault or Localhost",
                restricted_msg(&format!("{sc}.seccompProfile.type"), "\"Unconfined\"")
            ),
        ),
        (
            "seccomp without type",
            pod_context(json!({"seccompProfile": {}})),
            format!(
                "{}; use RuntimeDefault or Localhost",
                restricted_msg(&format!("{psc}.seccompProfile.type"), "null")
            ),
        ),
        (
            "seccomp annotation",
            annotated("container.seccomp.security.alpha.kubernetes.io/c", json!("unconfined")),
            format!(
                "{}; use runtime/default or localhost/<profile>",
                restricted_msg(
                    "runbook.job.template.metadata.annotations[\"container.seccomp.security.alpha.kubernetes.io/c\"]",
                    "\"unconfined\""
                )
            ),
        ),
        // Sysctls.
        (
            "unsafe sysctl",
            pod_context(
                json!({"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}]}),
            ),
            format!(
                "{}; only the safe sysctls may be set: {}",
                restricted_msg(&format!("{psc}.sysctls[1].name"), "\"kernel.msgmax\""),
                SAFE_SYSCTLS.join(", ")
            ),
        ),
        // Privilege escalation.
        (
            "allowPrivilegeEscalation",
            context(json!({"allowPrivilegeEscalation": true})),
            restricted_msg(&format!("{sc}.allowPrivilegeEscalation"), "true"),
        ),
        // Non-root.
        (
            "pod runAsNonRoot false",
            pod_context(json!({"runAsNonRoot": false})),
            restricted_msg(&format!("{psc}.runAsNonRoot"), "false"),
        ),
        (
            "container runAsNonRoot false",
            context(json!({"runAsNonRoot": false})),
            restricted_msg(&format!("{sc}.runAsNonRoot"), "false"),
        ),
        // Non-root user.
        (
            "pod runAsUser 0",
            pod_context(json!({"runAsUser": 0})),
            format!(
                "{}; runbooks run as a non-root user",
                restricted_msg(&format!("{psc}.runAsUser"), "0")
            ),
        ),
        (
            "container runAsUser 0",
            context(json!({"runAsUser": 0})),
            format!(
                "{}; runbooks run as a non-root user",
                restricted_msg(&format!("{sc}.runAsUser"), "0")
            ),
        ),
        (
            "runAsUser 0.0",
            context(json!({"runAsUser": 0.0})),
            format!(
                "{}; runbooks run as a non-root user",
                restricted_msg(&format!("{sc}.runAsUser"), "0.0")
            ),
        ),
        (
            "runAsUser negative",
            context(json!({"runAsUser": -1})),
            format!(
                "{}; runbooks run as a non-root user",
                restricted_msg(&format!("{sc}.runAsUser"), "-1")
            ),
        ),
        (
            "runAsUser string",
            context(json!({"runAsUser": "1000"})),
            format!(
                "{}; runbooks run as a non-root user",
                restricted_msg(&format!("{sc}.runAsUser"), "\"1000\"")
            ),
        ),
        // Shapes.
        (
            "pod securityContext not an object",
            pod(json!({"securityContext": []})),
            format!("{psc}: must be an object"),
        ),
        (
            "container securityContext not an object",
            context(json!("privileged")),
            format!("{sc}: must be an object"),
        ),
        (
            "capabilities not an object",
            context(json!({"capabilities": ["ALL"]})),
            format!("{sc}.capabilities: must be an object"),
        ),
        (
            "add not a list",
            context(json!({"capabilities": {"add": "SYS_ADMIN"}})),
            format!("{sc}.capabilities.add: must be a list"),
        ),
        (
            "volumes not a list",
            pod(json!({"volumes": {"hostPath": {}}})),
            format!("{spec}.volumes: must be a list"),
        ),
        (
            "volume not an object",
            pod(json!({"volumes": ["hostPath"]})),
            format!("{spec}.volumes[0]: must be an object"),
        ),
        (
            "compliant ephemeral container",
            pod(json!({"ephemeralContainers": [{"name": "e"}]})),
            format!(
                "{spec}.ephemeralContainers: not allowed in a pod template (ephemeral containers are only added to running pods)"
            ),
        ),
        (
            "ephemeralContainers not a list",
            pod(json!({"ephemeralContainers": {}})),
            format!("{spec}.ephemeralContainers: must be a list"),
        ),
        (
            "sysctl not an object",
            pod_context(json!({"sysctls": ["kernel.msgmax"]})),
            format!("{psc}.sysctls[0]: must be an object"),
        ),
        (
            "metadata not an object",
            json!({"metadata": 1, "spec": {"containers": [{"name": "c"}]}}),
            "runbook.job.template.metadata: must be an object".to_owned(),
        ),
        (
            "spec not an object",
            json!({"spec": "x"}),
            "runbook.job.template.spec: must be an object".to_owned(),
        ),
    ];
    for (name, template, message) in cases {
        assert_eq!(run(template), Err(Error::InvalidSpec(message)), "{name}");
    }
}

#[test]
fn paths_quote_keys_that_are_not_identifiers_and_long_values_are_cut() {
    let long = "x".repeat(200);
    let out = run(pod(json!({"volumes": [{"name": "v", "hôte/path": {"p": long}}]})));
    let Err(Error::InvalidSpec(message)) = out else {
        panic!("{out:?}");
    };
    assert!(
        message.starts_with("runbook.job.template.spec.volumes[0][\"hôte/path\"]: {\"p\":\"xxx"),
        "{message}"
    );
    assert!(message.contains("x… is not allowed"), "{message}");
    assert_eq!(field("a", "b_1"), "a.b_1");
    assert_eq!(field("a", ""), "a[\"\"]");
    assert_eq!(field("a", "q\"\n"), "a[\"q\\\"\\n\"]");
    // Multi-byte characters are never split.
    let emoji = Value::from("é".repeat(100));
    assert_eq!(shown(&emoji).chars().count(), SHOWN_MAX_CHARS + 1);
}

/// Arbitrary JSON in every field this module reads: an answer, never a panic.
#[test]
fn arbitrary_json_never_panics() {
    let odd = [
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(u64::MAX),
        json!("é\u{0}🦀"),
        json!([]),
        json!([null, 1, "x", {}]),
        json!({}),
        json!({"type": {}, "add": [[]], "drop": {}, "name": [], "host": 1}),
    ];
    let pointers = [
        "/metadata",
        "/metadata/annotations",
        "/spec/securityContext",
        "/spec/securityContext/sysctls",
        "/spec/securityContext/seccompProfile",
        "/spec/securityContext/seLinuxOptions",
        "/spec/serviceAccountName",
        "/spec/os",
        "/spec/volumes",
        "/spec/containers",
        "/spec/containers/0",
        "/spec/containers/0/securityContext",
        "/spec/containers/0/securityContext/capabilities",
        "/spec/containers/0/ports",
        "/spec/containers/0/livenessProbe",
        "/spec/containers/0/lifecycle",
        "/spec/initContainers",
    ];
    for pointer in pointers {
        for value in &odd {
            let mut template = json!({"spec": {"containers": [{"name": "c", "securityContext": {}}], "securityContext": {}}, "metadata": {}});
            if let Some(slot) = template.pointer_mut(pointer) {
                *slot = value.clone();
            } else if let Some((parent, key)) = pointer.rsplit_once('/')
                && let Some(Value::Object(parent)) = template.pointer_mut(parent)
            {
                parent.insert(key.to_owned(), value.clone());
            }
            // Either outcome is fine; a success must pass again unchanged.
            if let Ok(out) = run(template) {
                assert_eq!(run(out.clone()).as_ref(), Ok(&out), "{pointer} = {value}");
            }
        }
    }
}
