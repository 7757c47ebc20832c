//! `dflash serve`: an OpenAI-compatible HTTP server over one loaded model (and DFlash
//! drafter): `/v1/chat/completions` and `/v1/completions` (streamed as server-sent
//! events or whole, with usage), `/v1/models` and `/health`.
//!
//! The transport only: requests are parsed, run and shaped by the engine
//! (`dflash_engine`), which runs one sequence at a time, on the main thread (the GPU
//! engine is not `Send`). Each connection has a thread that parses its request and
//! queues a job; the queue is bounded and a request past it is answered 503 at once. A
//! client that disconnects interrupts its job within a token (or a DFlash step).
//!
//! # The transport in detail
//!
//! An OpenAI-compatible server over one model and drafter (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`, `/health`). It is the transport only: the request is
//! parsed, run and shaped by `dflash-engine` (`Request::from_body`,
//! `Engine::answer_blocking`, `response::Reply`), as in the browser. The engine (not
//! `Send` on the GPU; built by `Engine::on_device`, so without `--device` it is the CPU
//! engine where the only adapter is a software one) runs on the main thread and answers
//! jobs one at a time from a bounded `sync_channel` (`--queue`; a full queue is 503 at
//! once). The acceptor thread gives each connection a thread (at most 64; a `Drop` guard
//! counts them) that reads one HTTP/1.1 request (`serve/http.rs`: `Connection: close`,
//! Content-Length bodies only, 16 KiB heads, the whole request within
//! `--client-timeout`), parses it with `dflash_engine::request` (the browser's parser
//! too) and relays the job's events as one JSON answer or as server-sent events. The
//! connection checks every 200 ms whether its client left and then sets the job's
//! `Interrupt`; a panic in the engine fails only its request (500, code `Panic`; the
//! conversation's kept rows are forgotten).
//!
//! How an interrupt ends generation: `dflash_core::generate`'s module docs
//! (`crates/dflash-core/src/generate.rs`); the error codes and HTTP statuses:
//! `dflash_engine::errors` (`crates/dflash-engine/src/errors.rs`).

mod answering;
mod http;
mod jobs;

use crate::device_args::DeviceArgs;
use crate::{load, CliError};
use answering::Answering;
use dflash_core::drafter::{load_drafter_dir, DrafterPrecision};
use dflash_core::generate::Interrupt;
use dflash_engine::request::{Endpoint, Request};
use dflash_engine::response::Reply;
use dflash_engine::Engine;
use http::{client_gone, read_request, write_error, write_json};
use jobs::{serve_jobs, Counters, Job};
use serde_json::{json, Value};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A .gguf file or a Hugging Face model folder.
    #[arg(long)]
    model: PathBuf,
    /// A DFlash drafter folder (z-lab format): requests decode speculatively unless they
    /// say `"dflash": false`.
    #[arg(long)]
    drafter: Option<PathBuf>,
    /// The address to listen on (only this machine by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[command(flatten)]
    device: DeviceArgs,
    /// Context length (KV capacity) of every request.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Requests waiting behind the running one; past this a request gets 503.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds a request may take to arrive (in all, however slowly it trickles in),
    /// and a client may leave its answer unread, before the connection is dropped.
    #[arg(long, default_value_t = 30.0)]
    client_timeout: f64,
}

/// Connections handled at once (each has a thread); past this a connection gets 503.
const MAX_CONNECTIONS: usize = 64;

struct Shared {
    model_id: String,
    counters: Counters,
    queue: SyncSender<Job>,
    max_body: usize,
    client_timeout: Duration,
    drafter: bool,
}

pub fn run(a: ServeArgs) -> Result<(), CliError> {
    if !(a.client_timeout > 0.0 && a.client_timeout <= 86_400.0) {
        return Err(CliError::Usage(
            "--client-timeout takes seconds in (0, 86400]".into(),
        ));
    }
    let mut engine = load_engine(&a)?;
    let listener = TcpListener::bind((a.host.as_str(), a.port))
        .map_err(|e| CliError::Usage(format!("cannot listen on {}:{}: {e}", a.host, a.port)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let (queue, jobs) = mpsc::sync_channel(a.queue);
    let shared = Arc::new(Shared {
        model_id: model_id(&a.model),
        counters: Counters::default(),
        queue,
        max_body: a.max_body,
        client_timeout: Duration::from_secs_f64(a.client_timeout),
        drafter: a.drafter.is_some(),
    });
    let _ = writeln!(
        std::io::stderr(),
        "dflash serve: {} on {} listening on http://{addr}",
        shared.model_id,
        engine.device
    );
    let acceptor = shared.clone();
    std::thread::spawn(move || accept(listener, acceptor));
    serve_jobs(&mut engine, jobs, &shared.counters);
    Ok(())
}
/// The model's name in `/v1/models` and the answers: the file's stem or the folder's name.
fn model_id(path: &std::path::Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// A connection counted open until its thread ends, however it ends.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.counters.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accept(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming().flatten() {
        let open = shared.counters.connections.fetch_add(1, Ordering::SeqCst);
        let guard = Open(shared.clone());
        let refuse = |stream: &TcpStream, why: &str| {
            shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
            let _ = write_error(stream, 503, "Busy", why);
            http::linger(stream);
        };
        if open >= MAX_CONNECTIONS {
            drop(guard);
            refuse(&stream, "too many connections");
            continue;
        }
        let spare = stream.try_clone();
        let spawned = std::thread::Builder::new().spawn(move || {
            let s = guard.0.clone();
            handle(&stream, &s);
            drop(guard);
        });
        if spawned.is_err() {
            if let Ok(stream) = spare {
                refuse(
                    &stream,
                    "the server cannot start a thread for this connection",
                );
            }
        }
    }
}

fn handle(stream: &TcpStream, s: &Shared) {
    // A client that stops taking its answer is dropped (and its request interrupted).
    let _ = stream.set_write_timeout(Some(s.client_timeout));
    let req = match read_request(stream, s.max_body, s.client_timeout) {
        Ok(r) => r,
        Err(e) => {
            let _ = write_error(stream, e.status, "BadRequest", &e.message);
            http::linger(stream);
            return;
        }
    };
    let _ = match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/health") => write_json(stream, 200, &health(s)),
        ("GET", "/v1/models") => write_json(
            stream,
            200,
            &json!({"object": "list", "data": [{"id": s.model_id, "object": "model", "created": 0, "owned_by": "dflash"}]}),
        ),
        ("POST", "/v1/chat/completions") => complete(stream, s, &req.body, Endpoint::Chat),
        ("POST", "/v1/completions") => complete(stream, s, &req.body, Endpoint::Completion),
        (_, "/health" | "/v1/models" | "/v1/chat/completions" | "/v1/completions") => write_error(
            stream,
            405,
            "BadRequest",
            &format!("{} is not allowed on {}", req.method, req.path),
        ),
        _ => write_error(stream, 404, "NotFound", &format!("no route {}", req.path)),
    };
}

fn health(s: &Shared) -> Value {
    let c = &s.counters;
    json!({
        "status": "ok",
        "model": s.model_id,
        "drafter": s.drafter,
        "requests": {
            "served": c.served.load(Ordering::Relaxed),
            "interrupted": c.interrupted.load(Ordering::Relaxed),
            "rejected": c.rejected.load(Ordering::Relaxed),
            "failed": c.failed.load(Ordering::Relaxed),
        }
    })
}

/// Parses a (chat) completion request, queues it and answers it, streamed or whole.
fn complete(
    stream: &TcpStream,
    s: &Shared,
    body: &[u8],
    endpoint: Endpoint,
) -> std::io::Result<()> {
    let request = match Request::from_body(body, endpoint) {
        Ok(r) => r,
        Err(e) => return write_error(stream, 400, "BadRequest", &e.to_string()),
    };
    let (events, rx) = mpsc::channel();
    let interrupt = Interrupt::default();
    let id = format!("{}-dflash-{:x}", Reply::id_prefix(endpoint), rand_id());
    let reply = Reply::new(&request, id, unix_time(), s.model_id.clone());
    let streams = request.streams();
    let job = Job {
        request,
        interrupt: interrupt.clone(),
        events,
    };
    match s.queue.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            s.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return write_error(
                stream,
                503,
                "Busy",
                "the request queue is full (--queue); try again later",
            );
        }
        Err(TrySendError::Disconnected(_)) => {
            return write_error(stream, 503, "Busy", "the engine has stopped")
        }
    }
    let answer = Answering {
        stream,
        rx: &rx,
        interrupt: &interrupt,
        reply,
    };
    let outcome = if streams {
        answer.streamed()
    } else {
        answer.whole()
    };
    if outcome.is_err() || client_gone(stream) {
        interrupt.set();
    }
    outcome
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

/// The engine of `serve`'s arguments.
fn load_engine(a: &ServeArgs) -> Result<Engine, CliError> {
    let (m, _) = load(&a.model)?;
    let drafter = match &a.drafter {
        Some(p) => Some(load_drafter_dir(p, DrafterPrecision::default())?),
        None => None,
    };
    let mut note = |n: &str| {
        let _ = writeln!(std::io::stderr(), "note: {n}");
    };
    Ok(Engine::on_device(
        m,
        drafter.as_ref(),
        a.device.choice(),
        &a.device.gpu_options(),
        a.context,
        &mut note,
    )?)
}
