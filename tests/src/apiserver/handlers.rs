//! Request routing and the verbs: get, list, watch, create, update, patch, delete,
//! deletecollection, plus discovery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use serde_json::{Value, json};

use super::Shared;
use super::defaults;
use super::discovery;
use super::faults::{RequestRecord, Verb};
use super::patch::{self, PatchKind};
use super::resources::{self, ResourceType};
use super::selector::{Filter, parse_field_selector, parse_label_selector};
use super::status::{ApiError, json_response};
use super::store::{ListPage, Preconditions, WatchFrom, meta_str};
use super::watch::{self, Projection, WatchOptions};

/// A discovery or health path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DiscoveryPath {
    CoreVersions,
    CoreResources(String),
    Groups,
    Group(String),
    GroupResources(String, String),
    Version,
    Health,
}

/// A path naming a resource (collection, object or subresource).
#[derive(Debug, Clone)]
pub(crate) struct ResourcePath {
    pub rt: &'static ResourceType,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Where a request goes.
#[derive(Debug, Clone)]
pub(crate) enum Route {
    Discovery(DiscoveryPath),
    Resource(ResourcePath),
    NotFound,
}

fn resource_path(group: &str, version: &str, rest: &[&str]) -> Route {
    let found = |plural: &str| resources::lookup(group, version, plural);
    let owned = |s: Option<&&str>| s.map(|s| (*s).to_string());
    // `namespaces/{ns}/{plural}/...` names a namespaced resource; `namespaces/{name}/status` is the
    // namespace's own subresource.
    if rest.len() >= 3
        && rest[0] == "namespaces"
        && let Some(rt) = found(rest[2])
    {
        if !rt.namespaced || rest.len() > 5 {
            return Route::NotFound;
        }
        return Route::Resource(ResourcePath {
            rt,
            namespace: Some(rest[1].to_string()),
            name: owned(rest.get(3)),
            subresource: owned(rest.get(4)),
        });
    }
    let Some(rt) = rest.first().and_then(|p| found(p)) else {
        return Route::NotFound;
    };
    if rest.len() > 3 || (rt.namespaced && rest.len() > 1) {
        return Route::NotFound;
    }
    Route::Resource(ResourcePath {
        rt,
        namespace: None,
        name: owned(rest.get(1)),
        subresource: owned(rest.get(2)),
    })
}

/// Parses a request path.
pub(crate) fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Discovery(DiscoveryPath::Version),
        ["healthz" | "livez" | "readyz"] => Route::Discovery(DiscoveryPath::Health),
        ["api"] => Route::Discovery(DiscoveryPath::CoreVersions),
        ["api", v] => Route::Discovery(DiscoveryPath::CoreResources((*v).to_string())),
        ["api", v, rest @ ..] => resource_path("", v, rest),
        ["apis"] => Route::Discovery(DiscoveryPath::Groups),
        ["apis", g] => Route::Discovery(DiscoveryPath::Group((*g).to_string())),
        ["apis", g, v] => Route::Discovery(DiscoveryPath::GroupResources(
            (*g).to_string(),
            (*v).to_string(),
        )),
        ["apis", g, v, rest @ ..] => resource_path(g, v, rest),
        _ => Route::NotFound,
    }
}

fn query_flag(query: Option<&str>, key: &str) -> bool {
    query.is_some_and(|q| {
        q.split('&').any(|kv| {
            kv.split_once('=')
                .is_some_and(|(k, v)| k == key && (v == "true" || v == "1"))
        })
    })
}

/// The verb and resource of a request, for fault rules and the request log.
pub(crate) fn classify(method: &Method, uri: &Uri) -> (Verb, Route) {
    let r = route(uri.path());
    let verb = match &r {
        Route::Resource(p) => match (method.as_str(), p.name.is_some()) {
            ("GET", true) => Verb::Get,
            ("GET", false) if query_flag(uri.query(), "watch") => Verb::Watch,
            ("GET", false) => Verb::List,
            ("POST", _) => Verb::Create,
            ("PUT", _) => Verb::Update,
            ("PATCH", _) => Verb::Patch,
            ("DELETE", true) => Verb::Delete,
            ("DELETE", false) => Verb::DeleteCollection,
            _ => Verb::Get,
        },
        _ => Verb::Discovery,
    };
    (verb, r)
}

pub(crate) fn record(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> RequestRecord {
    let (verb, r) = classify(method, uri);
    let (resource, namespace, name, subresource) = match r {
        Route::Resource(p) => (
            Some(p.rt.plural.to_string()),
            p.namespace,
            p.name,
            p.subresource,
        ),
        _ => (None, None, None, None),
    };
    RequestRecord {
        method: method.clone(),
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        verb,
        resource,
        subresource,
        namespace,
        name,
        content_type: headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body,
        fault: None,
    }
}

fn ok_json(value: &Value) -> Response {
    json_response(StatusCode::OK, value.to_string())
}

fn object_response(code: StatusCode, bytes: Bytes) -> Response {
    json_response(code, bytes)
}

fn projection(headers: &HeaderMap) -> Projection {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if accept.contains("as=PartialObjectMetadata") {
        Projection::Metadata
    } else {
        Projection::Full
    }
}

/// Every request lands here (the router's fallback).
pub(crate) async fn dispatch(
    State(server): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    server.log(record(&method, &uri, &headers, body.clone()));
    let query: HashMap<String, String> = Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|Query(q)| q.into_iter().collect())
        .unwrap_or_default();
    match route(uri.path()) {
        Route::Discovery(d) => discovery_response(&server, &d, &headers),
        Route::NotFound => ApiError::path_not_found().into_response(),
        Route::Resource(p) => {
            let result = match (method.clone(), p.name.is_some()) {
                (Method::GET, true) => get(&server, &p, &headers),
                (Method::GET, false)
                    if query.get("watch").is_some_and(|w| w == "true" || w == "1") =>
                {
                    watch(&server, &p, &query, &headers)
                }
                (Method::GET, false) => list(&server, &p, &query, &headers),
                (Method::POST, false) => create(&server, &p, &query, &body),
                (Method::POST, true) if p.subresource.as_deref() == Some("binding") => {
                    bind(&server, &p, &body)
                }
                (Method::PUT, true) => update(&server, &p, &body),
                (Method::PATCH, true) => patch_object(&server, &p, &query, &headers, &body),
                (Method::DELETE, true) => delete(&server, &p, &body),
                (Method::DELETE, false) => delete_collection(&server, &p, &query),
                _ => Err(ApiError::method_not_allowed(method.as_str())),
            };
            result.unwrap_or_else(IntoResponse::into_response)
        }
    }
}

fn discovery_response(server: &Shared, d: &DiscoveryPath, headers: &HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let aggregated = |core: bool| {
        let mut resp = ok_json(&discovery::aggregated(core));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(discovery::AGGREGATED_CONTENT_TYPE),
        );
        resp
    };
    match d {
        DiscoveryPath::Version => ok_json(&discovery::version()),
        DiscoveryPath::Health => {
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
        DiscoveryPath::CoreVersions if discovery::wants_aggregated(accept) => aggregated(true),
        DiscoveryPath::CoreVersions => ok_json(&discovery::core_versions(&server.addr.to_string())),
        DiscoveryPath::Groups if discovery::wants_aggregated(accept) => aggregated(false),
        DiscoveryPath::Groups => ok_json(&discovery::group_list()),
        DiscoveryPath::CoreResources(v) => discovery::resource_list("", v).map_or_else(
            || ApiError::path_not_found().into_response(),
            |l| ok_json(&l),
        ),
        DiscoveryPath::Group(g) => discovery::group(g).map_or_else(
            || ApiError::path_not_found().into_response(),
            |l| ok_json(&l),
        ),
        DiscoveryPath::GroupResources(g, v) => discovery::resource_list(g, v).map_or_else(
            || ApiError::path_not_found().into_response(),
            |l| ok_json(&l),
        ),
    }
}

fn require_namespace_scope(p: &ResourcePath) -> Result<(), ApiError> {
    // A namespaced object is addressed inside its namespace; a cluster-scoped one never is.
    if p.rt.namespaced && p.namespace.is_none() && p.name.is_some() {
        return Err(ApiError::path_not_found());
    }
    Ok(())
}

fn check_subresource(p: &ResourcePath) -> Result<bool, ApiError> {
    match p.subresource.as_deref() {
        None => Ok(false),
        Some("status") if p.rt.status_subresource => Ok(true),
        Some(_) => Err(ApiError::path_not_found()),
    }
}

fn ns(p: &ResourcePath) -> &str {
    p.namespace.as_deref().unwrap_or_default()
}

fn get(server: &Shared, p: &ResourcePath, headers: &HeaderMap) -> Result<Response, ApiError> {
    require_namespace_scope(p)?;
    check_subresource(p)?;
    let name = p.name.as_deref().unwrap_or_default();
    let obj = server
        .store()
        .get(p.rt, ns(p), name)
        .ok_or_else(|| ApiError::not_found(p.rt, name))?;
    Ok(object_response(
        StatusCode::OK,
        projection(headers).render(&obj),
    ))
}

fn filter(p: &ResourcePath, query: &HashMap<String, String>) -> Result<Filter, ApiError> {
    Ok(Filter {
        namespace: p.namespace.clone(),
        labels: parse_label_selector(query.get("labelSelector").map_or("", String::as_str))?,
        fields: parse_field_selector(p.rt, query.get("fieldSelector").map_or("", String::as_str))?,
    })
}

fn list_options_invalid(message: &str) -> ApiError {
    ApiError::unprocessable(format!(
        "ListOptions.meta.k8s.io \"\" is invalid: {message}"
    ))
}

fn list(
    server: &Shared,
    p: &ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    if p.subresource.is_some() {
        return Err(ApiError::path_not_found());
    }
    let filter = filter(p, query)?;
    let options = ListQuery::parse(query)?;
    let mut store = server.store();
    if let Some(rv) = options.rv.filter(|r| *r != "0") {
        check_list_rv(rv, options.rv_match, store.current_rv())?;
    }
    let page = store.list_page(p.rt, &filter, options.limit, options.continue_token)?;
    drop(store);
    Ok(json_response(StatusCode::OK, list_body(p, headers, &page)))
}

/// A list's query parameters, checked against each other as the real API server does.
struct ListQuery<'q> {
    limit: Option<usize>,
    continue_token: Option<&'q str>,
    rv: Option<&'q str>,
    rv_match: Option<&'q str>,
}

impl<'q> ListQuery<'q> {
    fn parse(query: &'q HashMap<String, String>) -> Result<Self, ApiError> {
        let limit = match query.get("limit") {
            Some(l) => Some(
                l.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?,
            ),
            None => None,
        };
        let non_empty = |key: &str| query.get(key).map(String::as_str).filter(|v| !v.is_empty());
        let continue_token = non_empty("continue");
        let rv = non_empty("resourceVersion");
        let rv_match = non_empty("resourceVersionMatch");
        if rv_match.is_some() && rv.is_none() {
            return Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if continue_token.is_some() && rv.is_some_and(|r| r != "0") {
            return Err(list_options_invalid(
                "resourceVersion: Forbidden: specifying resource version is not allowed when using continue",
            ));
        }
        if let Some(m) = rv_match
            && m != "NotOlderThan"
            && m != "Exact"
        {
            return Err(list_options_invalid(&format!(
                "resourceVersionMatch: Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
        Ok(Self {
            limit,
            continue_token,
            rv,
            rv_match,
        })
    }
}

/// A list at resourceVersion `rv` (not `0`) against the store's `current` one: too large is a
/// 504 with `ResourceVersionTooLarge`; an exact read of an older state is treated as compacted.
fn check_list_rv(rv: &str, rv_match: Option<&str>, current: u64) -> Result<(), ApiError> {
    let wanted: u64 = rv.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {rv:?}: must be an unsigned integer"
        ))
    })?;
    if wanted > current {
        return Err(ApiError {
            code: 504,
            reason: "Timeout",
            message: format!("Too large resource version: {wanted}, current: {current}"),
            details: Some(
                json!({ "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }], "retryAfterSeconds": 1 }),
            ),
        });
    }
    if rv_match.is_some_and(|m| m == "Exact") && wanted != current {
        // Only the newest state is kept; an exact read of an older one is treated as compacted.
        return Err(ApiError::expired(format!(
            "too old resource version: {wanted} ({current})"
        )));
    }
    Ok(())
}

/// The list object of `page`: kind and apiVersion of the projection asked for, the list
/// metadata, the items rendered one by one.
fn list_body(p: &ResourcePath, headers: &HeaderMap, page: &ListPage) -> Vec<u8> {
    let proj = projection(headers);
    let (kind, api_version) = match proj {
        Projection::Full => (p.rt.list_kind(), p.rt.api_version()),
        Projection::Metadata => (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        ),
    };
    let mut metadata = json!({ "resourceVersion": page.rv.to_string() });
    if let Some(c) = &page.continue_token {
        metadata["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        metadata["remainingItemCount"] = json!(n);
    }
    let head = format!(
        "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{metadata},\"items\":["
    );
    let rendered: Vec<Bytes> = page.items.iter().map(|o| proj.render(o)).collect();
    let size = head.len() + rendered.iter().map(|b| b.len() + 1).sum::<usize>() + 2;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    for (i, b) in rendered.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b);
    }
    body.extend_from_slice(b"]}");
    body
}

fn watch(
    server: &Arc<Shared>,
    p: &ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    if p.subresource.is_some() {
        return Err(ApiError::path_not_found());
    }
    let filter = filter(p, query)?;
    let flag = |k: &str| query.get(k).is_some_and(|v| v == "true" || v == "1");
    let bookmarks = flag("allowWatchBookmarks");
    let send_initial_events = flag("sendInitialEvents");
    let rv = query.get("resourceVersion").map_or("", String::as_str);
    let rv_match = query.get("resourceVersionMatch").map_or("", String::as_str);
    if send_initial_events {
        if rv_match != "NotOlderThan" {
            return Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(list_options_invalid(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
    } else if !rv_match.is_empty() {
        return Err(list_options_invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let from = if send_initial_events || rv.is_empty() || rv == "0" {
        WatchFrom::Current
    } else {
        WatchFrom::After(rv.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "invalid resource version {rv:?}: must be an unsigned integer"
            ))
        })?)
    };
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds: {t:?}"))
        })?)),
        None => None,
    };
    let started = server.store().watch(p.rt, from, &filter);
    let body = match started {
        Ok(start) => {
            server.watch_registered();
            watch::stream(
                p.rt,
                start,
                WatchOptions {
                    filter,
                    bookmarks,
                    send_initial_events,
                    timeout,
                    bookmark_interval: server.bookmark_interval,
                    projection: projection(headers),
                },
            )
        }
        Err(e) => watch::error_stream(&e),
    };
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    Ok(v)
}

/// Checks the body's kind/apiVersion and namespace against the URL, filling them when absent.
fn check_identity(p: &ResourcePath, obj: &mut Value) -> Result<(), ApiError> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && kind != p.rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            p.rt.kind
        )));
    }
    let expected_api_version = p.rt.api_version();
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != expected_api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({expected_api_version})"
        )));
    }
    let body_ns = meta_str(obj, "namespace").unwrap_or_default().to_string();
    let meta = obj
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})));
    let Some(Value::Object(meta)) = meta else {
        return Err(ApiError::bad_request("metadata is not an object"));
    };
    if p.rt.namespaced {
        let url_ns = p.namespace.as_deref().unwrap_or_default();
        if !body_ns.is_empty() && body_ns != url_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta.insert("namespace".into(), json!(url_ns));
    } else {
        meta.remove("namespace");
    }
    Ok(())
}

fn reject_dry_run(query: &HashMap<String, String>) -> Result<(), ApiError> {
    if query.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the hami-tests apiserver",
        ));
    }
    Ok(())
}

fn create(
    server: &Shared,
    p: &ResourcePath,
    query: &HashMap<String, String>,
    body: &[u8],
) -> Result<Response, ApiError> {
    if p.subresource.is_some() {
        return Err(ApiError::method_not_allowed("POST"));
    }
    if p.rt.namespaced && p.namespace.is_none() {
        return Err(ApiError::path_not_found());
    }
    reject_dry_run(query)?;
    let mut obj = parse_body(body)?;
    check_identity(p, &mut obj)?;
    if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    defaults::on_create(p.rt, &mut obj)?;
    let stored = server.store().create(p.rt, obj)?;
    Ok(object_response(StatusCode::CREATED, stored.bytes.clone()))
}

/// `POST pods/{name}/binding`: the one way to set `spec.nodeName` after creation (what the
/// scheduler does). 201 with a Success Status; 409 when the pod is already bound.
fn bind(server: &Shared, p: &ResourcePath, body: &[u8]) -> Result<Response, ApiError> {
    require_namespace_scope(p)?;
    if p.rt.kind != "Pod" {
        return Err(ApiError::path_not_found());
    }
    let name = p.name.as_deref().unwrap_or_default();
    let binding = parse_body(body)?;
    let target = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                p.rt,
                name,
                "target.name",
                "Required value: a Binding names its node",
            )
        })?
        .to_owned();
    server.store().update(p.rt, ns(p), name, |old| {
        if let Some(node) = old
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                p.rt,
                name,
                &format!("pod {name} is already assigned to node \"{node}\""),
            ));
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!(target);
        Ok(new)
    })?;
    Ok(object_response(
        StatusCode::CREATED,
        serde_json::to_vec(&json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201
        }))
        .unwrap_or_default()
        .into(),
    ))
}

/// As the real API server: a pod's `spec.nodeName` never changes by update or patch (only
/// through `binding`).
fn check_pod_update(p: &ResourcePath, old: &Value, new: &Value) -> Result<(), ApiError> {
    if p.rt.kind != "Pod" {
        return Ok(());
    }
    let node = |v: &Value| {
        v.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    if node(old) != node(new) {
        return Err(ApiError::invalid(
            p.rt,
            p.name.as_deref().unwrap_or_default(),
            "spec",
            "Forbidden: pod updates may not change spec.nodeName (a pod is bound through its binding subresource)",
        ));
    }
    Ok(())
}

/// For resources with a status subresource: the main resource keeps the old status, the
/// subresource keeps the old spec.
fn restrict_to_subresource(p: &ResourcePath, status: bool, old: &Value, new: &mut Value) {
    if !p.rt.status_subresource {
        return;
    }
    let keep = if status { "spec" } else { "status" };
    if let Some(o) = new.as_object_mut() {
        match old.get(keep) {
            Some(v) => o.insert(keep.to_string(), v.clone()),
            None => o.remove(keep),
        };
    }
}

fn update(server: &Shared, p: &ResourcePath, body: &[u8]) -> Result<Response, ApiError> {
    require_namespace_scope(p)?;
    let status = check_subresource(p)?;
    let name = p.name.as_deref().unwrap_or_default();
    let mut obj = parse_body(body)?;
    check_identity(p, &mut obj)?;
    if let Some(body_name) = meta_str(&obj, "name")
        && body_name != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    defaults::on_update(p.rt, &mut obj)?;
    let stored = server.store().update(p.rt, ns(p), name, |old| {
        let mut new = obj;
        restrict_to_subresource(p, status, old, &mut new);
        check_pod_update(p, old, &new)?;
        Ok(new)
    })?;
    Ok(object_response(StatusCode::OK, stored.bytes.clone()))
}

fn patch_object(
    server: &Shared,
    p: &ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    require_namespace_scope(p)?;
    let status = check_subresource(p)?;
    reject_dry_run(query)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind =
        PatchKind::from_content_type(ct).ok_or_else(|| ApiError::unsupported_media_type(ct))?;
    let name = p.name.as_deref().unwrap_or_default();
    if kind == PatchKind::Apply {
        if query.get("fieldManager").is_none_or(String::is_empty) {
            return Err(ApiError::bad_request(
                "PATCH requests with apply patch type require fieldManager",
            ));
        }
        let exists = server.store().get(p.rt, ns(p), name).is_some();
        if !exists && !status {
            // Server-side apply of an absent object creates it.
            let mut obj: Value = serde_yaml_ng::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
            check_identity(p, &mut obj)?;
            if meta_str(&obj, "name").is_some_and(|n| n != name) {
                return Err(ApiError::bad_request(format!(
                    "the name of the object does not match the name on the URL ({name})"
                )));
            }
            defaults::on_create(p.rt, &mut obj)?;
            let stored = server.store().create(p.rt, obj)?;
            return Ok(object_response(StatusCode::CREATED, stored.bytes.clone()));
        }
    }
    let stored = server.store().update(p.rt, ns(p), name, |old| {
        let mut new = old.clone();
        // A patch that sets metadata.resourceVersion is conditional on it (checked by the store).
        patch::apply(kind, &mut new, body)?;
        restrict_to_subresource(p, status, old, &mut new);
        check_pod_update(p, old, &new)?;
        defaults::on_update(p.rt, &mut new)?;
        Ok(new)
    })?;
    Ok(object_response(StatusCode::OK, stored.bytes.clone()))
}

fn delete_options(body: &[u8]) -> Result<Preconditions, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Preconditions::default());
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
    let pre = v.get("preconditions");
    let field = |k: &str| {
        pre.and_then(|p| p.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(Preconditions {
        uid: field("uid"),
        resource_version: field("resourceVersion"),
    })
}

fn delete(server: &Shared, p: &ResourcePath, body: &[u8]) -> Result<Response, ApiError> {
    require_namespace_scope(p)?;
    if p.subresource.is_some() {
        return Err(ApiError::method_not_allowed("DELETE"));
    }
    let pre = delete_options(body)?;
    let name = p.name.as_deref().unwrap_or_default();
    let (obj, gone) = server.store().delete(p.rt, ns(p), name, &pre)?;
    if p.rt.delete_returns_object || !gone {
        return Ok(object_response(StatusCode::OK, obj.bytes.clone()));
    }
    let mut details = json!({
        "name": name,
        "kind": p.rt.plural,
        "uid": meta_str(&obj.value, "uid").unwrap_or_default(),
    });
    if !p.rt.group.is_empty() {
        details["group"] = json!(p.rt.group);
    }
    Ok(ok_json(&json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })))
}

fn delete_collection(
    server: &Shared,
    p: &ResourcePath,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    if p.subresource.is_some() {
        return Err(ApiError::method_not_allowed("DELETE"));
    }
    let filter = filter(p, query)?;
    let mut store = server.store();
    let (_, items) = store.list(p.rt, &filter);
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        let namespace = meta_str(&item.value, "namespace")
            .unwrap_or_default()
            .to_string();
        let name = meta_str(&item.value, "name")
            .unwrap_or_default()
            .to_string();
        match store.delete(p.rt, &namespace, &name, &Preconditions::default()) {
            Ok((obj, _)) => deleted.push(obj.value.clone()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = store.current_rv();
    drop(store);
    Ok(ok_json(&json!({
        "kind": p.rt.list_kind(),
        "apiVersion": p.rt.api_version(),
        "metadata": { "resourceVersion": rv.to_string() },
        "items": deleted,
    })))
}
