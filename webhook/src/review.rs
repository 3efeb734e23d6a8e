//! AdmissionReview in and out: the request as decisions see it, and the response written with a
//! small fixed struct in the `apiVersion` the caller used.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

pub use crate::mutation::Outcome;
use crate::mutation::{Decision, Observation};
use crate::pod::{Pod, PodMetadata};

/// `admission.k8s.io/v1`.
pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
/// `admission.k8s.io/v1beta1`, still answered in kind.
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

/// The AdmissionReview envelope, only what is read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview<'a> {
    #[serde(borrow, default, deserialize_with = "crate::pod::opt_cow")]
    pub api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::pod::opt_cow")]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub request: Option<AdmissionRequest<'a>>,
}

/// `request.kind` / `request.resource`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionKind<'a> {
    #[serde(borrow, default)]
    pub group: Cow<'a, str>,
    #[serde(borrow, default)]
    pub version: Cow<'a, str>,
    #[serde(borrow, default)]
    pub kind: Cow<'a, str>,
}

/// `request` of an AdmissionReview: what [`crate::decide::decide`] reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    #[serde(borrow, default)]
    pub uid: Cow<'a, str>,
    #[serde(borrow, default)]
    pub kind: Option<GroupVersionKind<'a>>,
    #[serde(borrow, default, deserialize_with = "crate::pod::opt_cow")]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::pod::opt_cow")]
    pub operation: Option<Cow<'a, str>>,
    /// `None` when absent or `null` (DELETE, CONNECT).
    #[serde(borrow, default)]
    pub object: Option<Pod<'a>>,
    /// The pod before an UPDATE (metadata only); `None` for CREATE.
    #[serde(borrow, default)]
    pub old_object: Option<PodMetadata<'a>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// Why a body is refused before any review is read: answered with HTTP 400, not an
/// AdmissionReview.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Empty body.
    #[error("request body is empty; expected an AdmissionReview JSON object")]
    Empty,
    /// Not JSON (syntax error, truncated).
    #[error("request body is not JSON: {0}")]
    NotJson(String),
}

/// A finished review: the response body and what it said.
#[derive(Debug, Clone)]
pub struct Reviewed {
    pub outcome: Outcome,
    /// For logs: the request's `uid` (empty when the review had none), the key that ties a log
    /// line to the API server's audit log and to the answer.
    pub uid: String,
    /// The response AdmissionReview, JSON.
    pub body: Vec<u8>,
    /// For logs: `<namespace>/<name>` of the pod when known.
    pub pod: Option<String>,
    /// For logs: the denial or invalid message.
    pub message: Option<String>,
    /// What the decision observed, for the server to count.
    pub observations: Vec<Observation>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'a str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
}

#[derive(Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

/// Write the response AdmissionReview for `decision`.
///
/// # Errors
/// Only if `serde_json` cannot serialise the patch, which holds plain strings and objects.
pub fn encode_response(
    api_version: &str,
    uid: &str,
    decision: &Decision,
) -> Result<Vec<u8>, serde_json::Error> {
    let (allowed, patch, warnings, status) = match decision {
        Decision::Allow {
            patch, warnings, ..
        } => {
            let patch = if patch.is_empty() {
                None
            } else {
                // Sized once: a 44-container KAI pod's patch is ~23 KB, its base64 ~31 KB.
                let mut json = Vec::with_capacity(1024 + 512 * patch.len());
                serde_json::to_writer(&mut json, patch)?;
                Some(BASE64.encode(json))
            };
            (true, patch, warnings.as_slice(), None)
        }
        Decision::Deny { message } => (
            false,
            None,
            &[][..],
            Some(StatusOut {
                status: "Failure",
                code: 403,
                reason: "Forbidden",
                message,
            }),
        ),
        Decision::Invalid { message } => (
            false,
            None,
            &[][..],
            Some(StatusOut {
                status: "Failure",
                code: 400,
                reason: "BadRequest",
                message,
            }),
        ),
    };
    let out = ReviewOut {
        api_version,
        kind: "AdmissionReview",
        response: ResponseOut {
            uid,
            allowed,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings,
            status,
        },
    };
    let extra = out.response.patch.as_ref().map_or(0, String::len)
        + out.response.warnings.iter().map(String::len).sum::<usize>();
    let mut body = Vec::with_capacity(256 + extra);
    serde_json::to_writer(&mut body, &out)?;
    Ok(body)
}

/// Just enough of a review to answer one whose object did not parse: the version and the uid.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LenientReview<'a> {
    #[serde(borrow, default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(default)]
    request: Option<LenientRequest<'a>>,
}

#[derive(Deserialize)]
struct LenientRequest<'a> {
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
    #[serde(default, rename = "object")]
    _object: Option<IgnoredAny>,
}

/// The apiVersion to answer in: the one asked when it is one we speak, else v1.
fn answer_version(asked: Option<&str>) -> &str {
    match asked {
        Some(v @ (API_VERSION_V1 | API_VERSION_V1BETA1)) => v,
        _ => API_VERSION_V1,
    }
}

/// Parse `body`, check the envelope and run `decide`, returning the response to send.
///
/// A body that is not JSON is a [`BodyError`] (HTTP 400). Everything else gets an AdmissionReview:
/// an envelope without a usable request is answered `invalid` in v1 (or the version asked).
///
/// # Errors
/// [`BodyError`] when the body is empty or not JSON.
pub fn review_with<F>(body: &[u8], decide: F) -> Result<Reviewed, BodyError>
where
    F: FnOnce(&AdmissionRequest<'_>) -> Decision,
{
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(BodyError::Empty);
    }
    let review: AdmissionReview<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) if e.is_syntax() || e.is_eof() || e.is_io() => {
            return Err(BodyError::NotJson(e.to_string()));
        }
        Err(e) => {
            // JSON, but some field has the wrong shape: answer with what can still be read.
            let (version, uid) = match serde_json::from_slice::<LenientReview<'_>>(body) {
                Ok(l) => (
                    l.api_version,
                    l.request.and_then(|r| r.uid).unwrap_or_default(),
                ),
                Err(_) => (None, Cow::Borrowed("")),
            };
            let message = format!("invalid AdmissionReview: {e}");
            return finish(
                answer_version(version.as_deref()),
                &uid,
                Decision::Invalid { message },
                None,
            );
        }
    };
    let version = answer_version(review.api_version.as_deref());
    let envelope_problem = match (review.api_version.as_deref(), review.kind.as_deref()) {
        (Some(API_VERSION_V1 | API_VERSION_V1BETA1), Some("AdmissionReview")) => None,
        (v, Some("AdmissionReview")) => Some(format!(
            "invalid AdmissionReview: apiVersion {:?} is not one of: {API_VERSION_V1}, {API_VERSION_V1BETA1}",
            v.unwrap_or("")
        )),
        (_, k) => Some(format!(
            "invalid AdmissionReview: kind {:?} is not AdmissionReview",
            k.unwrap_or("")
        )),
    };
    let uid = review.request.as_ref().map_or("", |r| r.uid.as_ref());
    if let Some(message) = envelope_problem {
        return finish(version, uid, Decision::Invalid { message }, None);
    }
    let Some(request) = review.request.as_ref() else {
        let message = "invalid AdmissionReview: no request".to_owned();
        return finish(version, "", Decision::Invalid { message }, None);
    };
    if request.uid.is_empty() {
        let message = "invalid AdmissionReview: request.uid is missing".to_owned();
        return finish(version, "", Decision::Invalid { message }, None);
    }
    let decision = decide(request);
    // Named only for the log line a denial gets; allowed pods cost no formatting.
    let pod = match decision {
        Decision::Deny { .. } => request
            .object
            .as_ref()
            .map(|p| p.display_name(request.namespace.as_deref())),
        _ => None,
    };
    finish(version, &request.uid, decision, pod)
}

fn finish(
    version: &str,
    uid: &str,
    decision: Decision,
    pod: Option<String>,
) -> Result<Reviewed, BodyError> {
    let outcome = decision.outcome();
    let body = match encode_response(version, uid, &decision) {
        Ok(body) => body,
        // Unreachable in practice (plain strings); still answer rather than fail the request.
        Err(e) => {
            let fallback = Decision::Invalid {
                message: format!("could not encode the response: {e}"),
            };
            encode_response(version, uid, &fallback).unwrap_or_default()
        }
    };
    let (message, observations) = match decision {
        Decision::Deny { message } | Decision::Invalid { message } => (Some(message), Vec::new()),
        Decision::Allow { observations, .. } => (None, observations),
    };
    Ok(Reviewed {
        outcome,
        uid: uid.to_owned(),
        body,
        pod,
        message,
        observations,
    })
}
