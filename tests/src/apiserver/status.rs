//! Errors as the apiserver writes them: a `metav1.Status` body with `reason` and `code`.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::resources::ResourceType;

/// A failed API call, rendered as `metav1.Status`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

fn details(rt: &ResourceType, name: &str, kind: &str) -> Value {
    let mut d = json!({ "name": name, "kind": kind });
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self {
            details: Some(details(rt, name, rt.plural)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", rt.qualified_plural()),
            )
        }
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self {
            details: Some(details(rt, name, rt.plural)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", rt.qualified_plural()),
            )
        }
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(rt, name, rt.plural)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    rt.qualified_plural()
                ),
            )
        }
    }

    /// The object was modified since the client read it (stale `resourceVersion`).
    pub fn modified(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid with one field cause, as `errors.NewInvalid` renders it.
    pub fn invalid(rt: &ResourceType, name: &str, field: &str, detail: &str) -> Self {
        let mut d = details(rt, name, rt.kind);
        d["causes"] = json!([{ "reason": "FieldValueInvalid", "message": detail, "field": field }]);
        Self {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {field}: {detail}", rt.kind),
            )
        }
    }

    /// 422 without causes, as the apiserver answers a JSON patch that fails to apply.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 410 with reason `Expired`: a resourceVersion or continue token older than the kept history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The status a fault rule injects.
    pub fn injected(code: u16) -> Self {
        let reason = match code {
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        Self::new(code, reason, format!("injected fault: HTTP {code}"))
    }

    /// The `metav1.Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A JSON response with the given status.
pub(crate) fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut resp = Response::new(body.into());
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = json_response(code, self.to_status().to_string());
        if self.code == 429 {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
