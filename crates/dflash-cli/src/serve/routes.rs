//! The routes (axum): `/v1/chat/completions`, `/v1/completions` and `/v1/models` behind
//! the API key where there is one; `/health` and `/metrics` open. Every response is
//! counted by route and status, errors are OpenAI's error object, CORS answers for the
//! `--cors-origin`s, and a panic in a handler is a 500, not a lost connection.

use super::answering::Answering;
use super::jobs::{Job, Place, Refused};
use super::Shared;
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dflash_engine::request::{Endpoint, Request};
use dflash_engine::response::Reply;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

pub(super) fn router(shared: Arc<Shared>, cors_origins: &[String]) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route_layer(middleware::from_fn_with_state(shared.clone(), authorize));
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .layer(CatchPanicLayer::custom(|_| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Panic",
                "the server panicked",
            )
        }))
        .layer(middleware::from_fn_with_state(shared.clone(), count))
        .with_state(shared);
    match cors(cors_origins) {
        Some(c) => app.layer(c),
        None => app,
    }
}

/// CORS for the given origins (`*`: any), or None for none.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            // Any the page sends (OpenAI's clients add their own `x-stainless-*`).
            .allow_headers(AllowHeaders::mirror_request())
            .max_age(Duration::from_secs(600)),
    )
}

/// OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`.
pub(super) fn error_body(status: u16, code: &str, message: &str) -> Value {
    let kind = match status {
        401 => "authentication_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        503 => "server_busy",
        _ => "server_error",
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

pub(super) fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(error_body(status.as_u16(), code, message))).into_response()
}

/// A refusal the client may retry after a second: 429 (queue full) or 503 (stopping).
fn busy(s: &Shared, status: StatusCode, message: &str) -> Response {
    s.metrics.rejected.inc();
    let mut r = error(status, "Busy", message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

async fn count(State(s): State<Arc<Shared>>, req: HttpRequest, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let r = next.run(req).await;
    let labels = super::metrics::Response {
        route,
        status: r.status().as_u16(),
    };
    s.metrics.responses.get_or_create(&labels).inc();
    r
}

/// With `--api-key`: `Authorization: Bearer <key>`, or 401.
async fn authorize(State(s): State<Arc<Shared>>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_secret(g.trim().as_bytes(), key.as_bytes())) {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "this server takes an API key: send `Authorization: Bearer <key>`",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

/// Equality in a time that does not depend on where the keys differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

async fn not_found(req: HttpRequest) -> Response {
    let path = req.uri().path().to_string();
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("no route {path}"),
    )
}

async fn not_allowed(req: HttpRequest) -> Response {
    let message = format!("{} is not allowed on {}", req.method(), req.uri().path());
    error(StatusCode::METHOD_NOT_ALLOWED, "BadRequest", &message)
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    let stopping = s.draining();
    let v = json!({
        "status": if stopping { "stopping" } else { "ok" },
        "model": s.model_id,
        "drafter": s.drafter,
        "requests": s.metrics.requests(),
    });
    let status = match stopping {
        true => StatusCode::SERVICE_UNAVAILABLE,
        false => StatusCode::OK,
    };
    (status, Json(v)).into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, kind)], s.metrics.text()).into_response()
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    Json(json!({"object": "list", "data": [{"id": s.model_id, "object": "model", "created": 0, "owned_by": "dflash"}]}))
        .into_response()
}

async fn chat(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    complete(s, &headers, body, Endpoint::Chat).await
}

async fn completion(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    complete(s, &headers, body, Endpoint::Completion).await
}

/// Reads a (chat) completion request, queues it and answers it, streamed or whole.
async fn complete(s: Arc<Shared>, headers: &HeaderMap, body: Body, endpoint: Endpoint) -> Response {
    let since = Instant::now();
    if s.draining() {
        return busy(
            &s,
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is stopping",
        );
    }
    let bytes = match read_body(&s, headers, body).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let request = match Request::from_body(&bytes, endpoint) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let id = format!("{}-dflash-{:x}", Reply::id_prefix(endpoint), rand_id());
    let reply = Reply::new(&request, id, unix_time(), s.model_id.clone());
    let streams = request.streams();
    let job = Job {
        request,
        interrupt: Default::default(),
        events,
    };
    let place = match Place::take(&s, job) {
        Ok(p) => p,
        Err(Refused::Full) => {
            let message = "the server is busy: every place in its queue is taken (--queue); retry";
            return busy(&s, StatusCode::TOO_MANY_REQUESTS, message);
        }
        Err(Refused::Closed) => {
            return busy(
                &s,
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is stopping",
            )
        }
    };
    let answer = Answering {
        rx,
        place,
        reply,
        shared: s,
        since,
        first_seen: false,
    };
    match streams {
        true => answer.streamed().await,
        false => answer.whole().await,
    }
}

/// Bytes past `--max-body` read and dropped before a 413, so that a client still
/// sending its body reads the refusal rather than a reset connection.
const DISCARD_BYTES: usize = 16 << 20;

/// The whole body (by Content-Length or chunked) within `--client-timeout`: 413 past
/// `--max-body`, 408 late, 400 broken.
async fn read_body(s: &Shared, headers: &HeaderMap, mut body: Body) -> Result<Bytes, Response> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let max = s.max_body;
    let too_large = |n: String| {
        let message =
            format!("the body is {n} bytes, over the server's limit of {max} (--max-body)");
        error(StatusCode::PAYLOAD_TOO_LARGE, "BadRequest", &message)
    };
    // Too large to be worth reading, or the client waits to be told (100-continue).
    if declared.is_some_and(|n| {
        n > max + DISCARD_BYTES || (n > max && headers.contains_key(header::EXPECT))
    }) {
        return Err(too_large(declared.unwrap_or(0).to_string()));
    }
    let read = async {
        let mut bytes = Vec::new();
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("reading the body: {e}"),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen += data.len();
            if seen <= max {
                bytes.extend_from_slice(&data);
            } else if seen > max + DISCARD_BYTES {
                break;
            }
        }
        match seen > max {
            true => Err(too_large(format!("at least {seen}"))),
            false => Ok(Bytes::from(bytes)),
        }
    };
    match tokio::time::timeout(s.client_timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            "BadRequest",
            "the request body did not arrive in time (--client-timeout)",
        )),
    }
}

fn rand_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) ^ (unix_time() << 20)
}

fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
