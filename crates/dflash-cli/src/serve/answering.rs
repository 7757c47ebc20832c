//! One job's answer: the engine's events written as one JSON answer or as server-sent
//! events. The answer holds the request's `Place`: when the client leaves, hyper drops
//! the answer (its future, or its body mid-stream) and the place's drop interrupts the
//! generation.

use super::jobs::{Event, Place};
use super::routes::{error, error_body};
use super::Shared;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dflash_core::generate::Piece;
use dflash_engine::response::Reply;
use dflash_engine::Answer;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

pub(super) struct Answering {
    pub(super) rx: UnboundedReceiver<Event>,
    pub(super) place: Place,
    pub(super) reply: Reply,
    pub(super) shared: Arc<Shared>,
    /// When the request arrived (for the time to its first token).
    pub(super) since: Instant,
    pub(super) first_seen: bool,
}

impl Answering {
    /// The next event, with the figures it brings.
    async fn next(&mut self) -> Option<Event> {
        let e = self.rx.recv().await;
        let m = &self.shared.metrics;
        match &e {
            Some(Event::Piece(..)) if !self.first_seen => {
                self.first_seen = true;
                m.time_to_first_token
                    .observe(self.since.elapsed().as_secs_f64());
            }
            Some(Event::Done(a)) => {
                self.place.finish();
                m.answered(a);
                match a.finish_reason() {
                    "abort" => m.hangups.inc(),
                    _ => m.served.inc(),
                };
            }
            Some(Event::Failed(..)) => {
                self.place.finish();
                m.failed.inc();
            }
            // Dropped from the queue by a stop past its deadline.
            None => {
                self.place.finish();
                m.rejected.inc();
            }
            _ => {}
        }
        e
    }

    pub(super) async fn whole(mut self) -> Response {
        let mut text = String::new();
        loop {
            match self.next().await {
                Some(Event::Piece(p, ..)) => text.push_str(&p),
                Some(Event::Done(a)) => return Json(self.reply.whole(&text, &a)).into_response(),
                Some(Event::Failed(status, code, message)) => {
                    return error(status_code(status), &code, &message)
                }
                None => return dropped(),
            }
        }
    }

    pub(super) async fn streamed(mut self) -> Response {
        // Errors before the first piece keep their status; after it they end the stream.
        let first = match self.next().await {
            Some(Event::Failed(status, code, message)) => {
                return error(status_code(status), &code, &message)
            }
            Some(e) => e,
            None => return dropped(),
        };
        let mut head = String::new();
        if let Some(c) = self.reply.first_chunk() {
            push_event(&mut head, &c.to_string());
        }
        let frames = futures_util::stream::unfold(
            (self, Some((head, first)), false),
            |(mut a, pending, ended)| async move {
                if ended {
                    return None;
                }
                let (mut frame, event) = match pending {
                    Some(p) => p,
                    None => (String::new(), a.next().await?),
                };
                let ended = a.frame(&mut frame, event);
                let bytes: Result<Bytes, Infallible> = Ok(Bytes::from(frame));
                Some((bytes, (a, None, ended)))
            },
        );
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(frames),
        )
            .into_response()
    }

    /// An event's server-sent events; whether it ended the answer.
    fn frame(&self, out: &mut String, event: Event) -> bool {
        match event {
            Event::Piece(text, ids, drafted, logprobs, calls) => {
                let piece = Piece {
                    text: &text,
                    ids: &ids,
                    drafted,
                    logprobs: &logprobs,
                    tool_calls: &calls,
                };
                push_event(out, &self.reply.piece_chunk(&piece).to_string());
                false
            }
            Event::Done(a) => {
                self.last_events(out, &a);
                true
            }
            Event::Failed(_, code, message) => {
                push_event(out, &error_body(500, &code, &message).to_string());
                true
            }
        }
    }

    fn last_events(&self, out: &mut String, a: &Answer) {
        for c in self.reply.last_chunks(a) {
            push_event(out, &c.to_string());
        }
        push_event(out, "[DONE]");
    }
}

fn push_event(out: &mut String, data: &str) {
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// A request the stop dropped before it ran: the client may retry elsewhere or later.
fn dropped() -> Response {
    let message = "the server stopped before this request ran";
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "Busy", message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    r
}
