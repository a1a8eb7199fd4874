//! Every request the process's Kubernetes client sends, counted by verb and resource
//! (`api_requests_total`).
//!
//! [`Metrics::api_write`](crate::Metrics::api_write) counts only the writes a controller
//! reports itself; reads and the writes made inside libraries (helmengine's applies) are
//! invisible there. Counting at the client's HTTP layer sees all of them, which is what a
//! "calls per reconcile" figure needs (`bench-app`). The verb and resource come from the
//! request line alone, as the API server's own `apiserver_request_total` classifies them.

use http::{Method, Request, header::CONTENT_TYPE};

/// The Kubernetes verb of a request, as in audit logs.
pub fn verb<B>(request: &Request<B>) -> &'static str {
    let path = request.uri().path();
    match *request.method() {
        Method::GET if is_watch(request.uri().query()) => "watch",
        Method::GET if names_collection(path) => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::DELETE if names_collection(path) => "deletecollection",
        Method::DELETE => "delete",
        Method::PATCH if is_apply(request) => "apply",
        Method::PATCH => "patch",
        _ => "other",
    }
}

/// The resource a request is about (`helmreleases`, `applicationinstances/status`), or
/// `discovery` for API discovery paths.
pub fn resource(path: &str) -> String {
    let segments = rest_segments(path);
    let resource: Vec<&str> = match segments.as_slice() {
        ["namespaces", _, rest @ ..] if !rest.is_empty() => rest.to_vec(),
        other => other.to_vec(),
    };
    match resource.as_slice() {
        [] => "discovery".to_owned(),
        [plural] | [plural, _] => (*plural).to_owned(),
        [plural, _, subresource, ..] => format!("{plural}/{subresource}"),
    }
}

/// The segments after `/api/v1` or `/apis/<group>/<version>`.
fn rest_segments(path: &str) -> Vec<&str> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["api", _version, rest @ ..] => rest.to_vec(),
        ["apis", _group, _version, rest @ ..] => rest.to_vec(),
        _ => Vec::new(),
    }
}

/// A path that names a collection (`.../helmreleases`), not one object.
fn names_collection(path: &str) -> bool {
    match rest_segments(path).as_slice() {
        ["namespaces", _, rest @ ..] if !rest.is_empty() => rest.len() == 1,
        [_] => true,
        _ => false,
    }
}

fn is_watch(query: Option<&str>) -> bool {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .any(|pair| pair == "watch=true" || pair == "watch=1")
}

fn is_apply<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/apply-patch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, uri: &str, content_type: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        builder.body(()).unwrap_or_default()
    }

    #[test]
    fn verbs_and_resources_from_the_request_line() {
        let hr = "/apis/helm.toolkit.fluxcd.io/v2/namespaces/team-a/helmreleases";
        let cases = [
            (Method::GET, format!("{hr}/wiki"), None, "get", "helmreleases"),
            (Method::GET, format!("{hr}?limit=500"), None, "list", "helmreleases"),
            (
                Method::GET,
                format!("{hr}?watch=true&resourceVersion=1"),
                None,
                "watch",
                "helmreleases",
            ),
            (
                Method::GET,
                "/apis/helm.toolkit.fluxcd.io/v2/helmreleases?watch=1".to_owned(),
                None,
                "watch",
                "helmreleases",
            ),
            (
                Method::PATCH,
                format!("{hr}/wiki?fieldManager=x&force=true"),
                Some("application/apply-patch+yaml"),
                "apply",
                "helmreleases",
            ),
            (
                Method::PATCH,
                "/apis/vworkspace.io/v1alpha1/namespaces/a/applicationinstances/wiki/status".to_owned(),
                Some("application/merge-patch+json"),
                "patch",
                "applicationinstances/status",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/events".to_owned(),
                None,
                "create",
                "events",
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a".to_owned(),
                None,
                "update",
                "namespaces",
            ),
            (Method::GET, "/api/v1/namespaces".to_owned(), None, "list", "namespaces"),
            (Method::DELETE, format!("{hr}/wiki"), None, "delete", "helmreleases"),
            (Method::DELETE, hr.to_owned(), None, "deletecollection", "helmreleases"),
            (
                Method::GET,
                "/apis/source.toolkit.fluxcd.io/v1".to_owned(),
                None,
                "get",
                "discovery",
            ),
        ];
        for (method, uri, content_type, want_verb, want_resource) in cases {
            let req = request(method, &uri, content_type);
            assert_eq!(verb(&req), want_verb, "{uri}");
            assert_eq!(resource(req.uri().path()), want_resource, "{uri}");
        }
    }
}
