//! The queue between the connections and the engine: a job, what it sends back, a
//! request's place (the bound on requests queued or running, and the interrupt of a
//! request whose client left), and the engine's loop over the jobs.

use super::Shared;
use dflash_core::generate::{Interrupt, Piece, SpelledLogprob};
use dflash_core::tools::ToolCall;
use dflash_engine::device::NativeHost;
use dflash_engine::errors::{error_code, http_status};
use dflash_engine::request::Request;
use dflash_engine::{Answer, Engine};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

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
    pub(super) events: UnboundedSender<Event>,
}

/// The requests queued or running, each by its interrupt; at most `limit` (the running
/// one and `--queue` waiting).
pub(super) struct Places {
    limit: usize,
    open: Mutex<HashMap<u64, Interrupt>>,
    next: AtomicU64,
}

impl Places {
    pub(super) fn new(limit: usize) -> Self {
        Places {
            limit,
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    /// Interrupts every request queued or running (a stop past its deadline).
    pub(super) fn interrupt_all(&self) {
        for i in self.lock().values() {
            i.set();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Interrupt>> {
        // A panic while the map was held leaves it whole (each step is one insert or remove).
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A request's place: taken when it is queued, given back when its answer ends or its
/// client leaves, which interrupts its generation (the engine skips it if still queued).
pub(super) struct Place {
    shared: Arc<Shared>,
    id: u64,
    pub(super) interrupt: Interrupt,
    finished: bool,
}

impl Place {
    /// A place, or None when every place is taken.
    pub(super) fn take(shared: &Arc<Shared>) -> Option<Place> {
        let places = &shared.places;
        let mut open = places.lock();
        if open.len() >= places.limit {
            return None;
        }
        let id = places.next.fetch_add(1, Ordering::Relaxed);
        let interrupt = Interrupt::default();
        open.insert(id, interrupt.clone());
        shared.metrics.in_flight.inc();
        Some(Place {
            shared: shared.clone(),
            id,
            interrupt,
            finished: false,
        })
    }

    /// The answer has ended (whole, failed or interrupted by the engine): giving the
    /// place back interrupts nothing.
    pub(super) fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.shared.places.lock().remove(&self.id);
        self.shared.metrics.in_flight.dec();
        if !self.finished {
            self.interrupt.set();
            self.shared.metrics.hangups.inc();
        }
    }
}

/// Runs the queued jobs one at a time until the server has stopped.
pub(super) fn serve_jobs(engine: &mut Engine, jobs: Receiver<Job>, shared: &Shared) {
    let host = NativeHost::default();
    loop {
        let job = match jobs.recv_timeout(Duration::from_millis(100)) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) if !shared.stopped() => continue,
            Err(_) => return,
        };
        shared.metrics.queue_depth.dec();
        // A job whose client left while it waited.
        if !job.interrupt.is_set() {
            run_job(engine, &host, job);
        }
    }
}

/// Runs one job, sending its pieces and its end to its connection.
fn run_job(engine: &mut Engine, host: &NativeHost, job: Job) {
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
        engine.answer_blocking(&job.request, &job.interrupt, host, &mut on_piece)
    }));
    let end = match answered {
        Ok(Ok(done)) => Event::Done(Box::new(done)),
        Ok(Err(e)) => {
            let code = error_code(&e);
            Event::Failed(http_status(code), code.into(), e.to_string())
        }
        Err(panic) => {
            // Whatever the engine held may be half written: nothing is reused.
            engine.runner.forget_conversation();
            let what = panic
                .downcast_ref::<&str>()
                .map(|m| m.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Event::Failed(500, "Panic".into(), format!("the engine panicked: {what}"))
        }
    };
    let _ = job.events.send(end);
}
