//! Schema helpers for fields schemars cannot describe the way the API server
//! needs them (free-form objects, conditions as a list-map).

use schemars::{Schema, SchemaGenerator, json_schema};

/// Go/Flux duration syntax, e.g. `30s`, `5m`, `1h30m`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";
/// RFC 1123 label: namespaces, release-safe names.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// RFC 1123 subdomain: object names.
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A free-form JSON object kept as is (`x-kubernetes-preserve-unknown-fields`).
/// A bare `serde_json::Value` would have no `type`, which the API server rejects.
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A free-form JSON object that server-side apply treats as one value
/// (`x-kubernetes-map-type: atomic`): whoever applies it owns all of it, and an apply
/// replaces it whole, so keys dropped by the applier disappear. Used for Helm values,
/// which are one document (ADR 0004).
pub fn atomic_free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-map-type": "atomic",
    })
}

/// `metav1.Condition` list, keyed by `type` so server-side apply merges per condition.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 16,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "description": "A metav1.Condition.",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {"type": "string", "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "message": {"type": "string", "maxLength": 32768}
            }
        }
    })
}
