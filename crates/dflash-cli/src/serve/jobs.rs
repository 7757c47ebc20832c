//! The queue between the connections and the engine: a job, what it sends back, a
//! request's place (the bound on requests queued or running; a client that leaves takes
//! its job out of the queue, or interrupts it while it runs), and the engine's loop.

use super::Shared;
use dflash_core::generate::{Interrupt, Piece, SpelledLogprob};
use dflash_core::tools::ToolCall;
use dflash_engine::device::NativeHost;
use dflash_engine::errors::{error_code, http_status};
use dflash_engine::request::Request;
use dflash_engine::{Answer, Engine};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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

/// Why a request found no place.
pub(super) enum Refused {
    /// Every place is taken (429).
    Full,
    /// The server is stopping (503).
    Closed,
}

#[derive(Default)]
struct Places {
    /// Each request queued or running, by id: its interrupt.
    open: HashMap<u64, Interrupt>,
    /// The jobs waiting for the engine, in order.
    waiting: VecDeque<(u64, Job)>,
    next: u64,
    /// Stopping: no new place is given.
    closed: bool,
}

/// The requests queued or running: at most `limit` (the running one and `--queue`
/// waiting), the waiting ones' jobs in order for the engine.
pub(super) struct Queue {
    limit: usize,
    places: Mutex<Places>,
    ready: Condvar,
}

impl Queue {
    pub(super) fn new(limit: usize) -> Self {
        Queue {
            limit,
            places: Mutex::new(Places::default()),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Places> {
        // Each step under the lock leaves the places whole, even if a panic followed.
        self.places.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops giving places (the server is stopping); the requests in flight go on.
    pub(super) fn close(&self) {
        self.lock().closed = true;
    }

    /// Interrupts every request running and drops every one waiting (their answers end
    /// with 503): a stop past its deadline.
    pub(super) fn interrupt_all(&self) {
        let mut p = self.lock();
        p.closed = true;
        p.waiting.clear();
        for i in p.open.values() {
            i.set();
        }
    }

    /// Requests queued or running.
    pub(super) fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// The next job, waiting for one; None once `stopped` says so and none is waiting.
    fn next_job(
        &self,
        stopped: impl Fn() -> bool,
        metrics: &super::metrics::Metrics,
    ) -> Option<Job> {
        let mut p = self.lock();
        loop {
            if let Some((_, job)) = p.waiting.pop_front() {
                metrics.queue_depth.set(p.waiting.len() as i64);
                return Some(job);
            }
            if stopped() {
                return None;
            }
            p = match self.ready.wait_timeout(p, Duration::from_millis(100)) {
                Ok((p, _)) => p,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// A request's place: taken with its job queued, given back when its answer ends or its
/// client leaves, which takes the job out of the queue or interrupts it while it runs.
pub(super) struct Place {
    shared: Arc<Shared>,
    id: u64,
    finished: bool,
}

impl Place {
    /// Queues `job` in a new place, or says why there is none.
    pub(super) fn take(shared: &Arc<Shared>, job: Job) -> Result<Place, Refused> {
        let q = &shared.queue;
        let mut p = q.lock();
        if p.closed {
            return Err(Refused::Closed);
        }
        if p.open.len() >= q.limit {
            return Err(Refused::Full);
        }
        let id = p.next;
        p.next += 1;
        p.open.insert(id, job.interrupt.clone());
        p.waiting.push_back((id, job));
        shared.metrics.in_flight.inc();
        shared.metrics.queue_depth.set(p.waiting.len() as i64);
        q.ready.notify_one();
        Ok(Place {
            shared: shared.clone(),
            id,
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
        let m = &self.shared.metrics;
        let mut p = self.shared.queue.lock();
        let interrupt = p.open.remove(&self.id);
        p.waiting.retain(|(id, _)| *id != self.id);
        m.queue_depth.set(p.waiting.len() as i64);
        m.in_flight.dec();
        if !self.finished {
            if let Some(i) = interrupt {
                i.set();
            }
            m.hangups.inc();
        }
    }
}

/// Runs the queued jobs one at a time until the server has stopped.
pub(super) fn serve_jobs(engine: &mut Engine, shared: &Shared) {
    let host = NativeHost::default();
    while let Some(job) = shared.queue.next_job(|| shared.stopped(), &shared.metrics) {
        // A job interrupted between the queue and here (a stop past its deadline).
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
