//! The `/mutate` handler, by phase: the request's headers checked, its body received (size limit,
//! deadline, body budget), a review slot taken, the review run (on the blocking pool for a large
//! body) and the answer counted, logged and sent. A request refused before any review gets a plain
//! text answer with its HTTP status.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::SemaphorePermit;
use tracing::{debug, warn};

use crate::policy::admission::Reviewed;
use crate::policy::mutation::Outcome;
use crate::policy::settings::ServerSettings;
use crate::shell::metrics::Metrics;
use crate::shell::server::body::{BodyFailure, read_body};
use crate::shell::server::state::AppState;
use crate::wire::review::BodyError;

/// The admission router: `POST /mutate`.
pub fn admission_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .with_state(state)
}

fn plain(code: StatusCode, message: String) -> Response {
    (
        code,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message + "\n",
    )
        .into_response()
}

/// Whether the Content-Type is `application/json` (parameters such as `charset` allowed).
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight().dec();
    }
}

/// Bodies from this size on are reviewed on the blocking pool, off the runtime's workers, so a
/// large review never delays the handshakes and small reviews of other clients.
const BLOCKING_REVIEW_BYTES: usize = 256 * 1024;

/// A request refused before any review: its status and the plain-text reason.
struct Refusal {
    code: StatusCode,
    message: String,
}

impl Refusal {
    fn new(code: StatusCode, message: String) -> Self {
        Self { code, message }
    }
}

async fn mutate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let start = Instant::now();
    state.metrics.in_flight().inc();
    let _in_flight = InFlight(&state.metrics);
    let server = &state.settings.server;
    let deadline = tokio::time::Instant::now() + server.request_timeout();
    let refuse = |r: Refusal| refused(&state.metrics, start, r);
    // The body first, with no review slot held: stalled bodies never hold the slots that
    // complete reviews need.
    let (body, _room) = match receive(&state, request, deadline).await {
        Ok(b) => b,
        Err(r) => return refuse(r),
    };
    // The semaphore is never closed, so acquiring only waits.
    let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, state.limiter.acquire()).await else {
        return refuse(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no review slot free within {} s (server.maxConcurrentRequests = {})",
                server.request_timeout().as_secs(),
                server.max_concurrent_requests
            ),
        ));
    };
    let body_len = body.len();
    match run_review(&state, body).await {
        Err(r) => refuse(r),
        Ok(Err(e)) => refuse(Refusal::new(StatusCode::BAD_REQUEST, e.to_string())),
        Ok(Ok(reviewed)) => answered(&state, start, body_len, reviewed),
    }
}

/// Count and log a refused request, and answer it in plain text.
fn refused(metrics: &Metrics, start: Instant, refusal: Refusal) -> Response {
    let Refusal { code, message } = refusal;
    metrics.observe_http_error(code.as_u16());
    // The access log of a request refused before any review (no uid read yet).
    debug!(
        code = code.as_u16(),
        reason = message.as_str(),
        elapsed_us = start.elapsed().as_micros() as u64,
        "admission request refused"
    );
    plain(code, message)
}

/// The `Content-Length` the client declared, once the headers pass: JSON, and not declared over
/// `server.bodyLimitBytes`.
fn check_headers(headers: &HeaderMap, server: &ServerSettings) -> Result<Option<u64>, Refusal> {
    if !is_json(headers.get(header::CONTENT_TYPE)) {
        let got = headers
            .get(header::CONTENT_TYPE)
            .map_or("none".to_owned(), |v| format!("{v:?}"));
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("Content-Type must be application/json (got {got})"),
        ));
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > server.body_limit_bytes as u64) {
        return Err(too_large(server));
    }
    Ok(declared)
}

fn too_large(server: &ServerSettings) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body exceeds the limit of {} bytes (server.bodyLimitBytes)",
            server.body_limit_bytes
        ),
    )
}

/// The headers checked and the body read before `deadline`, with the room it holds in the body
/// budget (given back when dropped).
async fn receive<'s>(
    state: &'s AppState,
    request: Request,
    deadline: tokio::time::Instant,
) -> Result<(Vec<u8>, Option<SemaphorePermit<'s>>), Refusal> {
    let server = &state.settings.server;
    let declared = check_headers(request.headers(), server)?;
    let seconds = server.request_timeout().as_secs();
    let read = read_body(
        request.into_body(),
        declared,
        server.body_limit_bytes,
        &state.body_budget,
        deadline,
    )
    .await;
    read.map_err(|failure| match failure {
        BodyFailure::TooLarge => too_large(server),
        BodyFailure::Read(e) => Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        ),
        BodyFailure::TimedOut => Refusal::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("request body not received within {seconds} s (server.requestTimeoutSeconds)"),
        ),
        BodyFailure::NoRoom => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no room for the request body within {seconds} s: bodies in memory are at server.bodyMemoryBytes"
            ),
        ),
    })
}

/// Review `body`: on the blocking pool from [`BLOCKING_REVIEW_BYTES`] on, else here.
async fn run_review(
    state: &Arc<AppState>,
    body: Vec<u8>,
) -> Result<Result<Reviewed, BodyError>, Refusal> {
    if body.len() < BLOCKING_REVIEW_BYTES {
        return Ok(state.review(&body));
    }
    let worker = Arc::clone(state);
    tokio::task::spawn_blocking(move || worker.review(&body))
        .await
        .map_err(|e| {
            warn!(error = %e, "review task failed");
            Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the review failed; see the webhook's log".to_owned(),
            )
        })
}

/// Count and log an answered review, and send its AdmissionReview.
fn answered(state: &AppState, start: Instant, body_len: usize, reviewed: Reviewed) -> Response {
    state
        .metrics
        .observe_review(reviewed.outcome, start.elapsed());
    state.kai_metrics.observe(&reviewed.observations);
    let uid = reviewed.uid.as_str();
    match reviewed.outcome {
        Outcome::Denied => warn!(
            uid,
            pod = reviewed.pod.as_deref().unwrap_or(""),
            reason = reviewed.message.as_deref().unwrap_or(""),
            "admission denied"
        ),
        Outcome::Invalid => warn!(
            uid,
            reason = reviewed.message.as_deref().unwrap_or(""),
            "invalid admission review"
        ),
        Outcome::Allowed | Outcome::Patched => {}
    }
    // The access log: one line per answered review, at debug level.
    debug!(
        uid,
        outcome = reviewed.outcome.as_str(),
        request_bytes = body_len,
        response_bytes = reviewed.body.len(),
        elapsed_us = start.elapsed().as_micros() as u64,
        "admission review"
    );
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        Body::from(reviewed.body),
    )
        .into_response()
}
