//! Fault injection: fail the next N matching requests (HTTP error or dropped connection) and add
//! latency; plus the request log tests use to see what a component sent.

use std::time::Duration;

use bytes::Bytes;

/// The verb of a request, as the apiserver's RBAC and audit name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
    /// Discovery, `/version`, health endpoints.
    Discovery,
}

/// Which requests a fault or latency rule applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatch {
    verb: Option<Verb>,
    resource: Option<String>,
}

impl RequestMatch {
    /// Every request.
    pub fn any() -> Self {
        Self::default()
    }

    /// Requests with this verb on this resource (plural, e.g. `pods`; subresources count as their
    /// resource).
    pub fn new(verb: Verb, resource: &str) -> Self {
        Self {
            verb: Some(verb),
            resource: Some(resource.to_string()),
        }
    }

    /// Requests with this verb on any resource.
    pub fn verb(verb: Verb) -> Self {
        Self {
            verb: Some(verb),
            resource: None,
        }
    }

    /// Requests of any verb on this resource.
    pub fn resource(resource: &str) -> Self {
        Self {
            verb: None,
            resource: Some(resource.to_string()),
        }
    }

    pub(crate) fn matches(&self, verb: Verb, resource: Option<&str>) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| Some(r) == resource)
    }
}

/// What an injected fault does to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status and a `metav1.Status` body (500 InternalError, 503, 429, ...).
    /// Note: kube's client retries 429, 503 and 504 by itself (up to 15 times).
    Status(u16),
    /// Read the request, then close the connection without answering.
    DropConnection,
}

#[derive(Debug, Clone)]
struct FaultRule {
    matcher: RequestMatch,
    remaining: usize,
    fault: Fault,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: http::Method,
    /// URL path.
    pub path: String,
    /// Raw query string.
    pub query: Option<String>,
    /// The verb.
    pub verb: Verb,
    /// Resource plural (`pods`), if the path names one.
    pub resource: Option<String>,
    /// Subresource (`status`), if any.
    pub subresource: Option<String>,
    /// Namespace, if the path names one.
    pub namespace: Option<String>,
    /// Object name, if the path names one.
    pub name: Option<String>,
    /// `Content-Type` of the request.
    pub content_type: Option<String>,
    /// Request body (empty for faulted requests, which are not read).
    pub body: Bytes,
    /// The fault injected into this request, if any.
    pub fault: Option<Fault>,
}

/// How many requests the log keeps (oldest dropped first).
pub(crate) const REQUEST_LOG_LIMIT: usize = 10_000;

/// Fault and latency rules of one server.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Vec<FaultRule>,
    latency: Vec<(RequestMatch, Duration)>,
}

impl Faults {
    pub fn fail_next(&mut self, matcher: RequestMatch, count: usize, fault: Fault) {
        if count > 0 {
            self.rules.push(FaultRule {
                matcher,
                remaining: count,
                fault,
            });
        }
    }

    pub fn add_latency(&mut self, matcher: RequestMatch, delay: Duration) {
        self.latency.push((matcher, delay));
    }

    pub fn clear(&mut self) {
        self.rules.clear();
        self.latency.clear();
    }

    pub fn pending(&self) -> usize {
        self.rules.iter().map(|r| r.remaining).sum()
    }

    /// The fault for this request, consuming one use of the first matching rule.
    pub fn take(&mut self, verb: Verb, resource: Option<&str>) -> Option<Fault> {
        let rule = self
            .rules
            .iter_mut()
            .find(|r| r.remaining > 0 && r.matcher.matches(verb, resource))?;
        rule.remaining -= 1;
        let fault = rule.fault;
        self.rules.retain(|r| r.remaining > 0);
        Some(fault)
    }

    /// Total added latency for this request.
    pub fn latency(&self, verb: Verb, resource: Option<&str>) -> Duration {
        self.latency
            .iter()
            .filter(|(m, _)| m.matches(verb, resource))
            .map(|(_, d)| *d)
            .sum()
    }
}
