//! One admission review end to end, pure: the body read ([`crate::wire::review::read`]), the
//! request decided (the closure: [`crate::policy::decide::decide`] with the settings and a basis),
//! the answer written ([`crate::wire::review::encode_response`]).

use crate::policy::mutation::{Decision, Observation, Outcome};
use crate::wire::review::{AdmissionRequest, Answer, BodyError, Read, encode_response, read};

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
    match read(body)? {
        Read::Invalid {
            version,
            uid,
            message,
        } => Ok(finish(version, &uid, Decision::Invalid { message }, None)),
        Read::Request { version, request } => {
            let decision = decide(&request);
            // Named only for the log line a denial gets; allowed pods cost no formatting.
            let pod = match decision {
                Decision::Deny { .. } => request
                    .object
                    .as_ref()
                    .map(|p| p.display_name(request.namespace.as_deref())),
                _ => None,
            };
            Ok(finish(version, &request.uid, decision, pod))
        }
    }
}

/// The response to `decision`, and what the shell logs and counts of it.
fn finish(version: &str, uid: &str, decision: Decision, pod: Option<String>) -> Reviewed {
    let outcome = decision.outcome();
    let body = match encode_response(version, uid, decision.answer()) {
        Ok(body) => body,
        // Unreachable in practice (plain strings); still answer rather than fail the request.
        Err(e) => {
            let message = format!("could not encode the response: {e}");
            encode_response(version, uid, Answer::Invalid { message: &message }).unwrap_or_default()
        }
    };
    let (message, observations) = match decision {
        Decision::Deny { message } | Decision::Invalid { message } => (Some(message), Vec::new()),
        Decision::Allow { observations, .. } => (None, observations),
    };
    Reviewed {
        outcome,
        uid: uid.to_owned(),
        body,
        pod,
        message,
        observations,
    }
}
