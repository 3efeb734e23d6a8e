//! AdmissionReview in and out: the request as decisions see it ([`read`]), and the response
//! written with a small fixed struct in the `apiVersion` the caller used ([`encode_response`]).
//! What is decided in between is [`crate::policy`]'s ([`crate::policy::admission`] joins the two).

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::wire::patch::PatchOp;
use crate::wire::pod::{Pod, PodMetadata};

/// `admission.k8s.io/v1`.
pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
/// `admission.k8s.io/v1beta1`, still answered in kind.
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

/// The AdmissionReview envelope, only what is read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview<'a> {
    #[serde(borrow, default, deserialize_with = "crate::wire::pod::opt_cow")]
    pub api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::wire::pod::opt_cow")]
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

/// `request` of an AdmissionReview: what `policy::decide::decide` reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    #[serde(borrow, default)]
    pub uid: Cow<'a, str>,
    #[serde(borrow, default)]
    pub kind: Option<GroupVersionKind<'a>>,
    #[serde(borrow, default, deserialize_with = "crate::wire::pod::opt_cow")]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "crate::wire::pod::opt_cow")]
    pub operation: Option<Cow<'a, str>>,
    /// `None` when absent or `null` (DELETE, CONNECT).
    #[serde(borrow, default)]
    pub object: Option<Pod<'a>>,
    /// The pod before an UPDATE (metadata only); `None` for CREATE.
    #[serde(borrow, default)]
    pub old_object: Option<PodMetadata<'a>>,
    /// Who sent the request (the API server authenticated it).
    #[serde(borrow, default)]
    pub user_info: Option<UserInfo<'a>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// `request.userInfo`: only the username is read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UserInfo<'a> {
    #[serde(borrow, default, deserialize_with = "crate::wire::pod::opt_cow")]
    pub username: Option<Cow<'a, str>>,
}

impl AdmissionRequest<'_> {
    /// `request.userInfo.username`, if the review carries one.
    #[must_use]
    pub fn username(&self) -> Option<&str> {
        self.user_info.as_ref()?.username.as_deref()
    }
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

/// What the response says, as the AdmissionReview carries it.
#[derive(Debug, Clone, Copy)]
pub enum Answer<'d> {
    /// Allowed, with `patch` applied (empty: unchanged) and `warnings` shown to the user.
    Allow {
        patch: &'d [PatchOp],
        warnings: &'d [String],
    },
    /// Refused by policy (HTTP 403 in the status).
    Deny { message: &'d str },
    /// The request itself is unusable (HTTP 400 in the status).
    Invalid { message: &'d str },
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

/// Write the response AdmissionReview saying `answer`.
///
/// # Errors
/// Only if `serde_json` cannot serialise the patch, which holds plain strings and objects.
pub fn encode_response(
    api_version: &str,
    uid: &str,
    answer: Answer<'_>,
) -> Result<Vec<u8>, serde_json::Error> {
    let (allowed, patch, warnings, status) = match answer {
        Answer::Allow { patch, warnings } => {
            let patch = if patch.is_empty() {
                None
            } else {
                // Sized once: a 44-container KAI pod's patch is ~23 KB, its base64 ~31 KB.
                let mut json = Vec::with_capacity(1024 + 512 * patch.len());
                serde_json::to_writer(&mut json, patch)?;
                Some(BASE64.encode(json))
            };
            (true, patch, warnings, None)
        }
        Answer::Deny { message } => (
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
        Answer::Invalid { message } => (
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

/// A body read: the request to decide, or why the review is answered `invalid` unread.
// Made once per review and moved once: boxing the request would cost an allocation per review.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Read<'a> {
    /// A usable request (envelope checked, `uid` present), answered in `version`.
    Request {
        version: &'static str,
        request: AdmissionRequest<'a>,
    },
    /// The envelope is unusable: answer `invalid` with `message`, in `version`, to `uid` (empty
    /// when unknown).
    Invalid {
        version: &'static str,
        uid: Cow<'a, str>,
        message: String,
    },
}

/// The apiVersion to answer in: the one asked when it is one we speak, else v1.
fn answer_version(asked: Option<&str>) -> &'static str {
    match asked {
        Some(API_VERSION_V1BETA1) => API_VERSION_V1BETA1,
        _ => API_VERSION_V1,
    }
}

/// Parse `body` and check the envelope.
///
/// A body that is not JSON is a [`BodyError`] (HTTP 400). Everything else gets an AdmissionReview:
/// an envelope without a usable request is [`Read::Invalid`], answered in v1 (or the version asked).
///
/// # Errors
/// [`BodyError`] when the body is empty or not JSON.
pub fn read(body: &[u8]) -> Result<Read<'_>, BodyError> {
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
            return Ok(Read::Invalid {
                version: answer_version(version.as_deref()),
                uid,
                message: format!("invalid AdmissionReview: {e}"),
            });
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
    let invalid = |message: String| Read::Invalid {
        version,
        uid: Cow::Borrowed(""),
        message,
    };
    match (envelope_problem, review.request) {
        (Some(message), request) => Ok(Read::Invalid {
            version,
            uid: request.map(|r| r.uid).unwrap_or_default(),
            message,
        }),
        (None, None) => Ok(invalid("invalid AdmissionReview: no request".to_owned())),
        (None, Some(request)) if request.uid.is_empty() => Ok(invalid(
            "invalid AdmissionReview: request.uid is missing".to_owned(),
        )),
        (None, Some(request)) => Ok(Read::Request { version, request }),
    }
}
