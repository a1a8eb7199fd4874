//! Tests on the generated CRDs: structural schemas, free-form values, CEL rules,
//! and every documented example (valid ones pass the schema's CEL rules and
//! round-trip through the Rust types; invalid ones fail with the expected message).

use std::path::{Path, PathBuf};

use api::{ApplicationInstance, Operation};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

fn schema_of(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    serde_json::to_value(version.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

/// Every schema node must be typed, or explicitly free-form (the API server's structural rule).
fn assert_structural(node: &Value, path: &str) {
    let obj = node.as_object().unwrap_or_else(|| panic!("{path}: not an object"));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    assert!(
        obj.contains_key("type") || preserve,
        "{path}: schema node without type: {node}"
    );
    for forbidden in ["$ref", "oneOf", "anyOf", "allOf"] {
        assert!(!obj.contains_key(forbidden), "{path}: non-structural `{forbidden}`");
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            assert_structural(child, &format!("{path}.{name}"));
        }
    }
    if let Some(items) = obj.get("items") {
        assert_structural(items, &format!("{path}[]"));
    }
    if let Some(additional) = obj.get("additionalProperties").filter(|a| a.is_object()) {
        assert_structural(additional, &format!("{path}{{}}"));
    }
}

fn rules(node: &Value, out: &mut Vec<(String, String)>) {
    if let Some(list) = node.get("x-kubernetes-validations").and_then(Value::as_array) {
        for r in list {
            out.push((
                r["rule"].as_str().unwrap().to_string(),
                r["message"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    for key in ["properties", "additionalProperties"] {
        if let Some(map) = node.get(key).and_then(Value::as_object) {
            map.values().for_each(|child| rules(child, out));
        }
    }
    if let Some(items) = node.get("items") {
        rules(items, out);
    }
}

#[test]
fn schemas_are_structural() {
    for crd in api::all_crds() {
        assert_structural(&schema_of(&crd), &crd.spec.names.kind);
    }
}

#[test]
fn group_version_constants_match_the_crds() {
    use kube::Resource;
    assert_eq!(api::API_VERSION, format!("{}/{}", api::GROUP, api::VERSION));
    assert_eq!(api::ApplicationInstance::api_version(&()), api::API_VERSION);
    assert_eq!(api::Operation::api_version(&()), api::API_VERSION);
    for crd in api::all_crds() {
        assert_eq!(crd.spec.group, api::GROUP);
        assert_eq!(crd.spec.versions[0].name, api::VERSION);
    }
}

#[test]
fn crds_have_group_version_scope_status_and_names() {
    for crd in api::all_crds() {
        assert_eq!(crd.spec.group, "vworkspace.io");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.versions.len(), 1);
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.served && v.storage);
        assert!(
            v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "status subresource"
        );
        assert!(
            !v.additional_printer_columns.as_deref().unwrap_or_default().is_empty(),
            "printer columns"
        );
        assert!(
            !crd.spec.names.short_names.as_deref().unwrap_or_default().is_empty(),
            "short names"
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["vworkspace".to_string()][..])
        );
    }
}

#[test]
fn values_and_free_form_payloads_preserve_unknown_fields() {
    let ai = schema_of(&ApplicationInstance::crd());
    assert_eq!(
        ai.pointer("/properties/spec/properties/values/x-kubernetes-preserve-unknown-fields"),
        Some(&Value::Bool(true))
    );
    assert_eq!(
        ai.pointer("/properties/spec/properties/values/type"),
        Some(&Value::from("object"))
    );
    let op = schema_of(&Operation::crd());
    for p in [
        "/properties/spec/properties/upgrade/properties/valuesPatch",
        "/properties/spec/properties/runbook/properties/job",
    ] {
        assert_eq!(
            op.pointer(&format!("{p}/x-kubernetes-preserve-unknown-fields")),
            Some(&Value::Bool(true)),
            "{p}"
        );
    }
}

#[test]
fn conditions_are_a_list_map_keyed_by_type() {
    for crd in api::all_crds() {
        let s = schema_of(&crd);
        let c = s
            .pointer("/properties/status/properties/conditions")
            .expect("status.conditions");
        assert_eq!(c["x-kubernetes-list-type"], "map");
        assert_eq!(c["x-kubernetes-list-map-keys"], serde_json::json!(["type"]));
    }
}

#[test]
fn cel_rules_are_present() {
    let mut ai = Vec::new();
    rules(&schema_of(&ApplicationInstance::crd()), &mut ai);
    let mut op = Vec::new();
    rules(&schema_of(&Operation::crd()), &mut op);
    let has = |list: &[(String, String)], msg: &str| list.iter().any(|(_, m)| m.contains(msg));
    assert!(has(&ai, "exactly one of chart.repository or chart.sourceRef"));
    assert!(has(&ai, "metadata.name must be a DNS-1123 label"));
    assert!(has(&op, "Operation spec is immutable"));
    assert!(op.iter().any(|(r, _)| r == "self == oldSelf"));
    for t in ["restore", "upgrade", "rollback", "runbook"] {
        assert!(has(&op, &format!("spec.{t} must be set when type")), "{t}");
    }
    assert!(has(&op, "spec.deadline must be later than spec.notBefore"));
}

#[test]
fn operation_fields_are_selectable() {
    let crd = Operation::crd();
    let fields: Vec<String> = crd.spec.versions[0]
        .selectable_fields
        .iter()
        .flatten()
        .map(|f| f.json_path.clone())
        .collect();
    assert_eq!(fields, [".spec.type", ".spec.applicationRef.name"]);
}

#[test]
fn generated_yaml_is_deterministic() {
    let a: Vec<String> = api::all_crds()
        .iter()
        .map(|c| serde_saphyr::to_string(c).unwrap())
        .collect();
    let b: Vec<String> = api::all_crds()
        .iter()
        .map(|c| serde_saphyr::to_string(c).unwrap())
        .collect();
    assert_eq!(a, b);
}

fn examples(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/examples")
        .join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

fn load(path: &Path) -> (String, Value) {
    let text = std::fs::read_to_string(path).unwrap();
    let value: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (text, value)
}

fn crd_for(value: &Value) -> CustomResourceDefinition {
    match value["kind"].as_str() {
        Some("ApplicationInstance") => ApplicationInstance::crd(),
        Some("Operation") => Operation::crd(),
        other => panic!("unexpected kind {other:?}"),
    }
}

/// Deserialize into the Rust type and back: unknown or misspelled fields would be lost.
fn assert_round_trips(path: &Path, value: &Value) {
    let back = match value["kind"].as_str() {
        Some("ApplicationInstance") => {
            serde_json::to_value(serde_json::from_value::<ApplicationInstance>(value.clone()).unwrap())
        }
        _ => serde_json::to_value(serde_json::from_value::<Operation>(value.clone()).unwrap()),
    }
    .unwrap();
    assert_eq!(
        &back["spec"],
        &value["spec"],
        "{}: spec does not round-trip through the Rust type",
        path.display()
    );
}

#[test]
fn valid_examples_round_trip_and_pass_cel() {
    for path in examples("valid") {
        let (_, value) = load(&path);
        assert_round_trips(&path, &value);
        let schema = schema_of(&crd_for(&value));
        if let Err(errors) = kube::core::cel::Validator::new().validate(&schema, &value, None) {
            panic!("{}: CEL rejected a valid example: {errors:?}", path.display());
        }
    }
}

#[test]
fn invalid_examples_fail_with_expected_message() {
    for path in examples("invalid") {
        let (text, value) = load(&path);
        let expect = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect:"))
            .expect("`# expect:` line")
            .trim();
        let schema = schema_of(&crd_for(&value));
        // Every invalid example is refused by a CEL rule, so the offline validator sees it too
        // (e2e/tests/crds.rs checks the same files against the real API server).
        let messages = format!(
            "{:?}",
            kube::core::cel::Validator::new().validate(&schema, &value, None)
        );
        assert!(
            messages.contains(expect),
            "{}: expected a refusal containing {expect:?}, got {messages}",
            path.display()
        );
    }
}
