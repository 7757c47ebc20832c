//! `dflash serve`: an OpenAI-compatible HTTP server over one loaded model (and DFlash
//! drafter): `/v1/chat/completions` and `/v1/completions` (streamed as server-sent
//! events or whole, with usage), `/v1/models`, `/health` and `/metrics` (Prometheus).
//!
//! The transport only: requests are parsed, run and shaped by the engine
//! (`dflash_engine`: `Request::from_body`, `Engine::answer_blocking`, `response::Reply`),
//! as in the browser. The engine (not `Send` on the GPU; `Engine::on_device`, so without
//! `--device` the CPU engine where the only adapter is a software one) runs one request
//! at a time on the main thread, taking jobs from a queue (`serve/jobs.rs`). HTTP is
//! hyper's HTTP/1.1 on a tokio runtime beside it (`serve/listener.rs`: keep-alive,
//! chunked bodies, header and stall timeouts, a bound on connections, the drain on
//! SIGTERM) with axum's routes (`serve/routes.rs`: the API key, CORS, body limits, the
//! queue's 429, metrics by route and status).
//!
//! A request takes a place (`jobs::Place`): the running one and `--queue` waiting; past
//! that, 429 with `Retry-After`. The answer (`serve/answering.rs`) holds the place; when
//! the client leaves, hyper drops the answer (a half-closed connection counts as left), and
//! the place's drop takes the job out of the queue or, while it runs, sets its
//! `Interrupt`: the engine stops within a token (or a DFlash step). A panic in the engine fails only
//! its request (500, code `Panic`; the conversation's kept rows are forgotten).
//!
//! How an interrupt ends generation: `dflash_core::generate`'s module docs
//! (`crates/dflash-core/src/generate.rs`); the error codes and HTTP statuses:
//! `dflash_engine::errors` (`crates/dflash-engine/src/errors.rs`).

mod answering;
mod jobs;
mod listener;
mod metrics;
mod routes;

use crate::device_args::DeviceArgs;
use crate::{load, CliError};
use dflash_core::drafter::{load_drafter_dir, DrafterPrecision};
use dflash_engine::Engine;
use jobs::{serve_jobs, Queue};
use metrics::Metrics;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Requests waiting behind the running one; past this a request gets 429 with
    /// `Retry-After`.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Largest request body in bytes (413 past it).
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds a request's head may take to arrive (and a kept-alive connection may stay
    /// idle), its body too, and a write may wait for a client that reads nothing; past
    /// them the server answers 408 or drops the connection (and its request).
    #[arg(long, default_value_t = 30.0)]
    client_timeout: f64,
    /// Requires `Authorization: Bearer <key>` on `/v1/*` (401 without it); `/health` and
    /// `/metrics` stay open.
    #[arg(long, env = "DFLASH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// An origin whose web pages may call the API (CORS), e.g. `https://app.example`;
    /// repeat for several, `*` for any. None by default.
    #[arg(long)]
    cors_origin: Vec<String>,
    /// Connections open at once; past this a connection gets 503 and is closed.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Seconds the requests in flight have to finish after SIGTERM (or Ctrl-C) before
    /// they are interrupted.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
}

/// What the connections share with each other and the engine.
struct Shared {
    model_id: String,
    drafter: bool,
    queue: Queue,
    metrics: Metrics,
    max_body: usize,
    client_timeout: Duration,
    api_key: Option<String>,
    draining: AtomicBool,
    stopped: AtomicBool,
}

impl Shared {
    fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.queue.close();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

/// Marks the server stopped when dropped.
struct Stopped(Arc<Shared>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
    }
}

/// Seconds in (0, one day], or a usage error naming the flag.
fn seconds(flag: &str, s: f64) -> Result<Duration, CliError> {
    match s > 0.0 && s <= 86_400.0 {
        true => Ok(Duration::from_secs_f64(s)),
        false => Err(CliError::Usage(format!(
            "{flag} takes seconds in (0, 86400]"
        ))),
    }
}

fn check_args(a: &ServeArgs) -> Result<(), CliError> {
    if a.max_connections == 0 || a.max_connections > 1 << 16 {
        return Err(CliError::Usage("--max-connections takes 1 to 65536".into()));
    }
    if a.queue > 1 << 16 {
        return Err(CliError::Usage("--queue takes at most 65536".into()));
    }
    if a.api_key
        .as_ref()
        .is_some_and(|k| k.trim().is_empty() || k.trim() != k)
    {
        return Err(CliError::Usage(
            "--api-key is empty or has spaces around it".into(),
        ));
    }
    if let Some(o) = a
        .cors_origin
        .iter()
        .find(|o| axum::http::HeaderValue::from_str(o).is_err())
    {
        return Err(CliError::Usage(format!(
            "--cors-origin {o:?} is not an origin"
        )));
    }
    Ok(())
}

pub fn run(a: ServeArgs) -> Result<(), CliError> {
    let client_timeout = seconds("--client-timeout", a.client_timeout)?;
    let shutdown_timeout = seconds("--shutdown-timeout", a.shutdown_timeout)?;
    check_args(&a)?;
    let mut engine = load_engine(&a)?;
    let listener = std::net::TcpListener::bind((a.host.as_str(), a.port))
        .and_then(|l| l.set_nonblocking(true).map(|_| l))
        .map_err(|e| CliError::Usage(format!("cannot listen on {}:{}: {e}", a.host, a.port)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage(format!("cannot start the server's runtime: {e}")))?;
    let shared = Arc::new(Shared {
        model_id: model_id(&a.model),
        drafter: a.drafter.is_some(),
        queue: Queue::new(a.queue + 1),
        metrics: Metrics::new(),
        max_body: a.max_body,
        client_timeout,
        api_key: a.api_key.clone(),
        draining: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
    });
    let app = routes::router(shared.clone(), &a.cors_origin);
    let s = shared.clone();
    let server = runtime.spawn(async move {
        // However the server's task ends (a panic too), the engine's loop ends after it.
        let _stop = Stopped(s.clone());
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => listener::serve(l, app, s, a.max_connections, shutdown_timeout).await,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "dflash serve: {e}");
            }
        }
    });
    let _ = writeln!(
        std::io::stderr(),
        "dflash serve: {} on {} listening on http://{addr}",
        shared.model_id,
        engine.device
    );
    serve_jobs(&mut engine, &shared);
    let _ = runtime.block_on(server);
    let _ = writeln!(std::io::stderr(), "dflash serve: stopped");
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
