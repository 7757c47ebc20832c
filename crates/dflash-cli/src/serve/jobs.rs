//! The queue between the connections and the engine: a job, what it sends back, the
//! figures `/health` reports, and the engine's loop over the jobs.

use dflash_core::generate::{Interrupt, Piece, SpelledLogprob};
use dflash_core::tools::ToolCall;
use dflash_engine::device::NativeHost;
use dflash_engine::errors::{error_code, http_status};
use dflash_engine::request::Request;
use dflash_engine::{Answer, Engine};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};

/// What a job sends back to its connection.
pub(super) enum Event {
    /// A text piece: its text, its token ids, whether its last token was an accepted
    /// draft, its tokens' log-probabilities (where asked for) and the tool calls it
    /// completed.
    Piece(String, Vec<u32>, bool, Vec<SpelledLogprob>, Vec<ToolCall>),
    Done(Box<Answer>),
    Failed(u16, String, String),
}

/// A generation request waiting for the engine.
pub(super) struct Job {
    pub(super) request: Request,
    pub(super) interrupt: Interrupt,
    pub(super) events: Sender<Event>,
}

/// Figures `/health` reports.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) served: AtomicU64,
    pub(super) interrupted: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) connections: AtomicUsize,
}

/// Runs the queued jobs one at a time, to the end of the queue.
pub(super) fn serve_jobs(engine: &mut Engine, jobs: Receiver<Job>, counters: &Counters) {
    let host = NativeHost::default();
    for job in jobs {
        if job.interrupt.is_set() {
            counters.interrupted.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let events = job.events.clone();
        let mut on_piece = |p: Piece<'_>| {
            let piece = Event::Piece(
                p.text.into(),
                p.ids.to_vec(),
                p.drafted,
                p.logprobs.to_vec(),
                p.tool_calls.to_vec(),
            );
            let _ = events.send(piece);
        };
        // A panic in the engine fails its request, not the server.
        let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.answer_blocking(&job.request, &job.interrupt, &host, &mut on_piece)
        }));
        let failed = |status, code: &str, message: String| {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(status, code.into(), message));
        };
        match answered {
            Ok(Ok(done)) => {
                let counter = if done.finish_reason() == "abort" {
                    &counters.interrupted
                } else {
                    &counters.served
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Done(Box::new(done)));
            }
            Ok(Err(e)) => {
                let code = error_code(&e);
                failed(http_status(code), code, e.to_string());
            }
            Err(panic) => {
                // Whatever the engine held may be half written: nothing is reused.
                engine.runner.forget_conversation();
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|m| m.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                failed(500, "Panic", format!("the engine panicked: {what}"));
            }
        }
    }
}
