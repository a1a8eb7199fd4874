//! The real node (`hack/node.sh`) does what a node does: containers really run, a
//! Service routes to them through kube-proxy, cluster DNS answers, a PVC on the default
//! StorageClass keeps its bytes across pods, and a chart installed by Flux serves.
//! Placement is explicit: without [`placement`] a pod still lands on the kwok node.

use std::time::Duration;

use e2e::{
    TestContext, eventually,
    flux::{self, helm_release, local_helm_repository, wait_helm_release_ready},
    real_node::{
        KWOK_NODE, REAL_NODE, http_get, image, placement, pod_log, require_real_node, restricted_container_security,
        wait_pod_phase,
    },
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Service};
use kube::{Api, api::DeleteParams};
use serde_json::{Value, json};

const POD_TIMEOUT: Duration = Duration::from_secs(90);

/// A pod of `image` running `script` in `sh -c`, placed on the real node unless `kwok`.
fn shell_pod(name: &str, image: &str, script: &str, on_real_node: bool, extra_spec: Value) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main",
            "image": image,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "securityContext": restricted_container_security(),
        }],
    });
    if on_real_node {
        merge(&mut spec, placement());
    }
    merge(&mut spec, extra_spec);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// A container really runs on the real node (its output comes back through the kubelet),
/// and a pod that does not ask for the real node still lands on the kwok node.
#[tokio::test]
async fn a_pod_really_runs_on_the_real_node_and_kwok_stays_the_default() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("node-pod").await?;
    let busybox = image("registry.invalid/vworkspace/busybox")?;
    let script = "echo ran as $(id -u) on $(cat /proc/sys/kernel/hostname)";
    ctx.apply_yaml(&serde_saphyr::to_string(&shell_pod(
        "real",
        &busybox,
        script,
        true,
        json!({}),
    ))?)
    .await?;
    ctx.apply_yaml(&serde_saphyr::to_string(&shell_pod(
        "fake",
        &busybox,
        script,
        false,
        json!({}),
    ))?)
    .await?;

    let real = wait_pod_phase(&ctx, "real", "Succeeded", POD_TIMEOUT).await?;
    assert_eq!(node_of(&real), Some(REAL_NODE));
    let log = pod_log(&ctx, "real").await?;
    assert_eq!(log.trim(), "ran as 65532 on real");

    // kwok completes nothing that is not owned by a Job: the bare pod is bound and Running
    // there, and no container of it ever ran.
    let fake = wait_pod_phase(&ctx, "fake", "Running", POD_TIMEOUT).await?;
    assert_eq!(node_of(&fake), Some(KWOK_NODE));
    Ok(())
}

/// A Service's ClusterIP answers from the cluster's netns and from a pod (kube-proxy), and
/// cluster DNS resolves the Service's name to it (CoreDNS).
#[tokio::test]
async fn services_and_cluster_dns_work_on_the_real_node() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("node-svc").await?;
    let demo = image("registry.invalid/vworkspace/demo")?;
    let busybox = image("registry.invalid/vworkspace/busybox")?;
    let mut server_spec = json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "httpd",
            "image": demo,
            "imagePullPolicy": "Never",
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
            "securityContext": restricted_container_security(),
            "volumeMounts": [{"name": "www", "mountPath": "/www", "readOnly": true}],
        }],
        "volumes": [{"name": "www", "configMap": {
            "name": "page", "items": [{"key": "greeting", "path": "index.html"}]}}],
    });
    merge(&mut server_spec, placement());
    let manifests = json!([
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "page"},
         "data": {"greeting": "hello through a Service"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "labels": {"app": "server"}},
         "spec": server_spec},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    ]);
    for doc in manifests.as_array().into_iter().flatten() {
        ctx.apply_yaml(&serde_saphyr::to_string(doc)?).await?;
    }
    let service = ctx.api::<Service>().get("web").await?;
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).unwrap_or_default();

    // From the test's own netns, through kube-proxy's rules there.
    let url = format!("http://{cluster_ip}/");
    let body = eventually(&ctx, "the Service's ClusterIP answers", POD_TIMEOUT, || http_get(&url)).await?;
    assert_eq!(body.trim(), "hello through a Service");

    // From a pod: the name resolves through CoreDNS, and the ClusterIP answers.
    let fqdn = format!("web.{}.svc.cluster.local", ctx.namespace);
    let script =
        format!("nslookup {fqdn} && printf 'GET / HTTP/1.0\\r\\nHost: web\\r\\n\\r\\n' | nc -w 5 {cluster_ip} 80");
    ctx.apply_yaml(&serde_saphyr::to_string(&shell_pod(
        "client",
        &busybox,
        &script,
        true,
        json!({}),
    ))?)
    .await?;
    wait_pod_phase(&ctx, "client", "Succeeded", POD_TIMEOUT).await?;
    let log = pod_log(&ctx, "client").await?;
    assert!(
        log.contains(&format!("Address: {cluster_ip}")),
        "nslookup did not resolve {fqdn} to {cluster_ip}:\n{log}"
    );
    assert!(
        log.contains("hello through a Service"),
        "no answer through the Service from a pod:\n{log}"
    );
    Ok(())
}

/// A PVC without a class gets the default StorageClass (local-path): its volume holds
/// what one pod wrote, byte for byte, for the next pod; deleting the PVC deletes the PV.
#[tokio::test]
async fn a_volume_holds_data_across_pods() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("node-pvc").await?;
    let busybox = image("registry.invalid/vworkspace/busybox")?;
    ctx.apply_yaml(&serde_saphyr::to_string(&json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
    }))?)
    .await?;
    let volume = json!({
        "securityContext": {"fsGroup": 65532},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    });
    let mount = |mut pod: Value| {
        pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
        pod
    };
    let writer = mount(shell_pod(
        "writer",
        &busybox,
        "head -c 1048576 /dev/urandom > /data/blob && sha256sum /data/blob",
        true,
        volume.clone(),
    ));
    ctx.apply_yaml(&serde_saphyr::to_string(&writer)?).await?;
    wait_pod_phase(&ctx, "writer", "Succeeded", POD_TIMEOUT).await?;
    let written = pod_log(&ctx, "writer").await?;
    let reader = mount(shell_pod("reader", &busybox, "sha256sum /data/blob", true, volume));
    ctx.apply_yaml(&serde_saphyr::to_string(&reader)?).await?;
    wait_pod_phase(&ctx, "reader", "Succeeded", POD_TIMEOUT).await?;
    let read = pod_log(&ctx, "reader").await?;
    assert!(written.len() > 64, "the writer printed no checksum: {written:?}");
    assert_eq!(read, written, "the volume did not keep the bytes");

    let pvc = ctx.api::<PersistentVolumeClaim>().get("data").await?;
    let spec = pvc.spec.unwrap_or_default();
    assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
    let pv_name = spec.volume_name.unwrap_or_default();
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let pv = pvs.get(&pv_name).await?;
    assert!(
        pv.spec.and_then(|s| s.node_affinity).is_some(),
        "a local-path volume is bound to its node"
    );

    for pod in ["writer", "reader"] {
        ctx.api::<Pod>().delete(pod, &DeleteParams::default()).await?;
    }
    ctx.api::<PersistentVolumeClaim>()
        .delete("data", &DeleteParams::default())
        .await?;
    eventually(
        &ctx,
        "the PV deleted with its claim (reclaimPolicy Delete)",
        POD_TIMEOUT,
        || {
            let pvs = pvs.clone();
            let pv_name = pv_name.clone();
            async move {
                Ok(match pvs.get_opt(&pv_name).await? {
                    None => Ok(()),
                    Some(pv) => Err(format!("PV phase {:?}", pv.status.and_then(|s| s.phase))),
                })
            }
        },
    )
    .await?;
    Ok(())
}

/// Flux installs a chart whose pods run on the real node; the release's Service answers
/// with the greeting from the values (helm-controller waited for real readiness).
#[tokio::test]
async fn a_chart_installed_by_flux_serves_from_the_real_node() -> anyhow::Result<()> {
    require_real_node()?;
    let ctx = TestContext::new("node-flux").await?;
    flux::grant_release(&ctx.client, &ctx.namespace).await?;
    ctx.apply_yaml(&serde_saphyr::to_string(&local_helm_repository("local"))?)
        .await?;
    let mut values = placement();
    merge(&mut values, json!({"greeting": "hello from a real pod"}));
    ctx.apply_yaml(&serde_saphyr::to_string(&helm_release(
        "demo", "local", "demo-app", "0.1.0", values,
    ))?)
    .await?;
    wait_helm_release_ready(&ctx, "demo", Duration::from_secs(180)).await?;

    let pods = ctx.api::<Pod>().list(&Default::default()).await?;
    let server = pods
        .items
        .iter()
        .find(|p| {
            p.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get("app.kubernetes.io/component").map(String::as_str) == Some("server"))
        })
        .map(|p| {
            (
                node_of(p).map(str::to_owned),
                p.status.as_ref().and_then(|s| s.phase.clone()),
            )
        });
    assert_eq!(server, Some((Some(REAL_NODE.to_string()), Some("Running".to_string()))));

    let services = ctx.api::<Service>().list(&Default::default()).await?;
    let ip = services
        .items
        .iter()
        .find_map(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.clone()))
        .unwrap_or_default();
    let url = format!("http://{ip}/");
    let body = eventually(&ctx, "the release's Service answers", POD_TIMEOUT, || http_get(&url)).await?;
    assert_eq!(body.trim(), "hello from a real pod");
    Ok(())
}
