//! `dflash serve`: an OpenAI-compatible HTTP server over one loaded model (and DFlash
//! drafter): `/v1/chat/completions` and `/v1/completions` (streamed as server-sent
//! events or whole, with usage), `/v1/models` and `/health`.
//!
//! The engine runs one sequence at a time, on the main thread (the GPU engine is not
//! `Send`). Each connection has a thread that parses its request with the browser
//! package's parser (`dflash_web::request`) and queues a job; the queue is bounded and a
//! request past it is answered 503 at once. A client that disconnects interrupts its
//! job within a token (or a DFlash step).

mod http;

use crate::generate::{block_policy, gpu_target, open_device, DeviceArgs};
use crate::{load, CliError, Device};
use dflash_core::chat::ChatTemplate;
use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterPrecision};
use dflash_core::generate::{
    CpuGeneration, CpuSession, GenerateRequest, GenerateResult, Interrupt,
};
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{DFlashCpu, DraftState, SpeculativeGeneration, StepCostPrior};
use dflash_core::tokenizer::TextTokenizer;
use dflash_gpu::speculative::Speculative;
use dflash_gpu::GpuModel;
use dflash_web::request::{finish_reason, usage, BlockArg, ChatRequest};
use http::{client_gone, read_request, write_error, write_event, write_json};
use serde_json::{json, Value};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// What a job sends back to its connection.
enum Event {
    Piece(String),
    Done(Value),
    Failed(u16, String, String),
}

/// A generation request waiting for the engine.
struct Job {
    request: ChatRequest,
    /// For `/v1/completions`: the raw prompt, not the chat template.
    raw_prompt: Option<String>,
    interrupt: Interrupt,
    events: Sender<Event>,
}

/// Figures `/health` reports.
#[derive(Default)]
struct Counters {
    served: AtomicU64,
    interrupted: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    connections: AtomicUsize,
}

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
    let mut engine = Engine::load(&a)?;
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
    engine.serve(jobs, &shared);
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
        ("POST", "/v1/chat/completions") => complete(stream, s, &req.body, false),
        ("POST", "/v1/completions") => complete(stream, s, &req.body, true),
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
fn complete(stream: &TcpStream, s: &Shared, body: &[u8], raw: bool) -> std::io::Result<()> {
    let (request, raw_prompt, stream_it) = match parse(body, raw) {
        Ok(p) => p,
        Err(e) => return write_error(stream, 400, "BadRequest", &e),
    };
    let (events, rx) = mpsc::channel();
    let interrupt = Interrupt::default();
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let job = Job {
        request,
        raw_prompt,
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
    let reply = Reply {
        id: format!(
            "{}-dflash-{:x}",
            if raw { "cmpl" } else { "chatcmpl" },
            rand_id()
        ),
        created: unix_time(),
        model: s.model_id.clone(),
        raw,
        include_usage,
    };
    let outcome = if stream_it {
        reply.stream(stream, &rx, &interrupt)
    } else {
        reply.whole(stream, &rx, &interrupt)
    };
    if outcome.is_err() || client_gone(stream) {
        interrupt.set();
    }
    outcome
}

/// The request, the raw prompt of `/v1/completions`, and whether to stream.
fn parse(body: &[u8], raw: bool) -> Result<(ChatRequest, Option<String>, bool), String> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Some(obj) = v.as_object_mut() else {
        return Err("the body must be a JSON object".into());
    };
    let raw_prompt = if raw {
        let prompt = match obj.remove("prompt") {
            Some(Value::String(p)) => p,
            Some(_) => return Err("`prompt` must be a string".into()),
            None => return Err("`prompt` is required".into()),
        };
        // The rest of the fields are the chat request's; the message only passes its checks.
        obj.insert("messages".into(), json!([{"role": "user", "content": ""}]));
        Some(prompt)
    } else {
        None
    };
    let stream_it = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let r = ChatRequest::from_json(v).map_err(|e| e.to_string())?;
    r.validate().map_err(|e| e.to_string())?;
    Ok((r, raw_prompt, stream_it))
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

/// The answer's envelope: OpenAI's chat.completion (or text_completion) objects.
struct Reply {
    id: String,
    created: u64,
    model: String,
    raw: bool,
    /// `stream_options.include_usage`: a last chunk with no choices and the usage.
    include_usage: bool,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.raw, chunk) {
            (true, _) => "text_completion",
            (false, false) => "chat.completion",
            (false, true) => "chat.completion.chunk",
        }
    }

    fn choice(&self, text: Option<&str>, finish: Value, chunk: bool) -> Value {
        match (self.raw, chunk) {
            (true, _) => {
                json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null})
            }
            (false, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text.unwrap_or("")}, "finish_reason": finish})
            }
            (false, true) => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
        }
    }

    fn envelope(&self, choice: Value, chunk: bool) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": [choice]})
    }

    /// Waits for the next event, checking every 200 ms (whether or not events come)
    /// that the client is still there, and interrupting the job when it is not.
    fn next(
        stream: &TcpStream,
        rx: &Receiver<Event>,
        interrupt: &Interrupt,
        checked: &mut Instant,
    ) -> Option<Event> {
        const EVERY: Duration = Duration::from_millis(200);
        loop {
            if checked.elapsed() >= EVERY {
                *checked = Instant::now();
                if client_gone(stream) {
                    interrupt.set();
                }
            }
            match rx.recv_timeout(EVERY) {
                Ok(e) => return Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn whole(
        &self,
        stream: &TcpStream,
        rx: &Receiver<Event>,
        interrupt: &Interrupt,
    ) -> std::io::Result<()> {
        let mut text = String::new();
        let mut checked = Instant::now();
        while let Some(e) = Self::next(stream, rx, interrupt, &mut checked) {
            match e {
                Event::Piece(p) => text.push_str(&p),
                Event::Done(d) => {
                    let mut v = self.envelope(
                        self.choice(Some(&text), d["finish_reason"].clone(), false),
                        false,
                    );
                    v["usage"] = d["usage"].clone();
                    return write_json(stream, 200, &v);
                }
                Event::Failed(status, code, message) => {
                    return write_error(stream, status, &code, &message)
                }
            }
        }
        write_error(stream, 500, "Internal", "the engine dropped the request")
    }

    fn stream(
        &self,
        stream: &TcpStream,
        rx: &Receiver<Event>,
        interrupt: &Interrupt,
    ) -> std::io::Result<()> {
        // Errors before the first piece keep their status; after it they end the stream.
        let mut checked = Instant::now();
        let first = match Self::next(stream, rx, interrupt, &mut checked) {
            Some(Event::Failed(status, code, message)) => {
                return write_error(stream, status, &code, &message)
            }
            Some(e) => e,
            None => return write_error(stream, 500, "Internal", "the engine dropped the request"),
        };
        http::start_events(stream)?;
        if !self.raw {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
            write_event(stream, &self.envelope(role, true).to_string())?;
        }
        let mut event = Some(first);
        while let Some(e) = event {
            match e {
                Event::Piece(p) => write_event(
                    stream,
                    &self
                        .envelope(self.choice(Some(&p), Value::Null, true), true)
                        .to_string(),
                )?,
                Event::Done(d) => {
                    let mut v =
                        self.envelope(self.choice(None, d["finish_reason"].clone(), true), true);
                    v["usage"] = d["usage"].clone();
                    write_event(stream, &v.to_string())?;
                    if self.include_usage {
                        let mut u = self.envelope(Value::Null, true);
                        u["choices"] = json!([]);
                        u["usage"] = d["usage"].clone();
                        write_event(stream, &u.to_string())?;
                    }
                    return write_event(stream, "[DONE]");
                }
                Event::Failed(_, code, message) => {
                    return write_event(stream, &http::error_body(500, &code, &message).to_string())
                }
            }
            event = Self::next(stream, rx, interrupt, &mut checked);
        }
        Ok(())
    }
}

/// The loaded model on its device, answering jobs one at a time.
struct Engine {
    runner: Runner,
    tokenizer: TextTokenizer,
    chat_template: Option<ChatTemplate>,
    context: usize,
    device: String,
    /// Auto mode's step costs: the device's prior at the first `auto` request, then as
    /// each auto request's steps refined them (no request waits on a measurement).
    costs: Option<Vec<f64>>,
}

enum Runner {
    Cpu {
        target: CpuModel,
        drafter: Option<CpuDrafter>,
        /// The KV rows and drafter context kept for the next request (multi-turn reuse).
        session: CpuSession,
        draft: DraftState,
    },
    Gpu(GpuModel),
    Spec(Box<Speculative>),
}

impl Engine {
    fn load(a: &ServeArgs) -> Result<Self, CliError> {
        let (m, _) = load(&a.model)?;
        let context = a.context.min(m.config().max_position_embeddings);
        let drafter = match &a.drafter {
            Some(p) => Some(load_drafter_dir(p, DrafterPrecision::default())?),
            None => None,
        };
        if let Some(d) = &drafter {
            d.config.validate_against(m.config())?;
        }
        let (runner, device) = match open_device(a.device.device, &a.device.gpu_options())? {
            Some(ctx) => {
                let name = ctx.summary.name.clone();
                let g = gpu_target(ctx, &m, drafter.as_ref(), context)?;
                match &drafter {
                    Some(w) => (Runner::Spec(Box::new(Speculative::new(g, w)?)), name),
                    None => (Runner::Gpu(g), name),
                }
            }
            None => {
                let kernels = a
                    .device
                    .device
                    .and_then(Device::cpu_kernels)
                    .unwrap_or(CpuKernels::Quantized);
                let drafter = drafter
                    .as_ref()
                    .map(|w| CpuDrafter::with_kernels(w, kernels));
                let target = CpuModel::from_weights(m.weights, kernels);
                (
                    Runner::Cpu {
                        target,
                        drafter,
                        session: CpuSession::default(),
                        draft: DraftState::default(),
                    },
                    kernels.device_name().to_string(),
                )
            }
        };
        Ok(Engine {
            runner,
            tokenizer: m.tokenizer,
            chat_template: m.chat_template,
            context,
            device,
            costs: None,
        })
    }

    fn serve(&mut self, jobs: Receiver<Job>, s: &Shared) {
        for job in jobs {
            if job.interrupt.is_set() {
                s.counters.interrupted.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let events = job.events.clone();
            let mut on_text = |t: &str| {
                let _ = events.send(Event::Piece(t.to_string()));
            };
            // A panic in the engine fails its request, not the server.
            let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.answer(&job, &mut on_text)
            }));
            let failed = |status, code: &str, message: String| {
                s.counters.failed.fetch_add(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Failed(status, code.into(), message));
            };
            match answered {
                Ok(Ok(done)) => {
                    let counter = if done["finish_reason"] == "abort" {
                        &s.counters.interrupted
                    } else {
                        &s.counters.served
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let _ = job.events.send(Event::Done(done));
                }
                Ok(Err(e)) => {
                    let (status, code) = error_status(&e);
                    failed(status, code, e.to_string());
                }
                Err(panic) => {
                    // Whatever the engine held may be half written: nothing is reused.
                    self.forget_conversation();
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

    /// Forgets the KV rows and drafter context kept for the next request.
    fn forget_conversation(&mut self) {
        match &mut self.runner {
            Runner::Cpu { session, draft, .. } => {
                session.reset();
                *draft = DraftState::default();
            }
            Runner::Gpu(m) => m.forget_cached(),
            Runner::Spec(s) => s.target.forget_cached(),
        }
    }

    /// The engine's request for a job: the chat template (or the raw prompt), the
    /// sampling parameters and the token budget.
    fn request(&self, job: &Job) -> Result<GenerateRequest, CliError> {
        let seed = unix_time() ^ rand_id();
        let mut g = match &job.raw_prompt {
            None => job.request.to_generate(
                &self.tokenizer,
                self.chat_template.as_ref(),
                self.context,
                seed,
            )?,
            Some(p) => {
                let r = &job.request;
                let prompt_ids = self.tokenizer.encode(p, true)?;
                let sampling = SamplingParams {
                    penalized_from: prompt_ids.len(),
                    ..r.sampling(seed)?
                };
                let g = GenerateRequest {
                    prompt_ids,
                    max_new_tokens: r
                        .max_tokens
                        .unwrap_or(dflash_web::request::DEFAULT_MAX_TOKENS),
                    sampling,
                    stop_strings: r.stop_strings(),
                    context: self.context,
                    interrupt: Default::default(),
                };
                if g.prompt_ids.is_empty() {
                    return Err(dflash_core::Error::EmptyPrompt.into());
                }
                dflash_core::generate::token_budget(
                    g.prompt_ids.len(),
                    g.max_new_tokens,
                    self.context,
                )?;
                g
            }
        };
        g.interrupt = job.interrupt.clone();
        Ok(g)
    }

    /// Runs one job: `{finish_reason, usage}`.
    fn answer(&mut self, job: &Job, on_text: &mut dyn FnMut(&str)) -> Result<Value, CliError> {
        let g = self.request(job)?;
        let t0 = Instant::now();
        let clock = move || t0.elapsed().as_secs_f64();
        let dflash = job.request.dflash != Some(false);
        let block = match &job.request.block {
            Some(BlockArg::Rows(n)) => n.to_string(),
            Some(BlockArg::Named(s)) => s.clone(),
            None => "auto".into(),
        };
        let (r, spec): (GenerateResult, _) = match &mut self.runner {
            Runner::Cpu {
                target,
                drafter: Some(d),
                session,
                draft,
            } if dflash => {
                let prior = || StepCostPrior::CpuEngine.costs(d.config.block_size);
                let costs = (block == "auto").then(|| self.costs.get_or_insert_with(prior).clone());
                let policy = block_policy(&block, d.config.block_size, costs)?;
                let mut p = DFlashCpu::resume(d, target, std::mem::take(draft))?;
                // The drafter's context goes back whether or not the request succeeds
                // (its rows and the session's stay consistent on every error).
                let run = (|| {
                    let mut run = SpeculativeGeneration::start(
                        session,
                        target,
                        &mut p,
                        &self.tokenizer,
                        &g,
                        &policy,
                        &clock,
                        on_text,
                    )?;
                    while !run.step(&clock)? {}
                    Ok::<_, CliError>(run.finish(&clock))
                })();
                *draft = p.into_state();
                let sr = run?;
                if let Some(c) = &sr.step_costs {
                    self.costs = Some(c.clone());
                }
                let stats = usage(&sr.result, Some((&sr, &block)));
                (sr.result, Some(stats))
            }
            Runner::Cpu {
                target, session, ..
            } => {
                let mut run =
                    CpuGeneration::start(session, target, &self.tokenizer, &g, &clock, on_text)?;
                while !run.step()? {}
                (run.finish(&clock), None)
            }
            Runner::Spec(spec) if dflash => {
                let a = &spec.target.ctx.summary;
                let prior = StepCostPrior::for_adapter(&a.device_type, &a.name);
                let max = spec.max_block();
                let costs = (block == "auto")
                    .then(|| self.costs.get_or_insert_with(|| prior.costs(max)).clone());
                let policy = block_policy(&block, max, costs)?;
                let sr = spec.generate(&self.tokenizer, &g, &policy, &clock, on_text)?;
                if let Some(c) = &sr.step_costs {
                    self.costs = Some(c.clone());
                }
                let stats = usage(&sr.result, Some((&sr, &block)));
                (sr.result, Some(stats))
            }
            Runner::Spec(spec) => (
                spec.target.generate(&self.tokenizer, &g, &clock, on_text)?,
                None,
            ),
            Runner::Gpu(model) => (model.generate(&self.tokenizer, &g, &clock, on_text)?, None),
        };
        let usage = spec.unwrap_or_else(|| usage(&r, None));
        Ok(json!({"finish_reason": finish_reason(&r), "usage": usage}))
    }
}

/// The HTTP status and error code of an engine error: the request's fault (400) or the
/// server's (500).
fn error_status(e: &CliError) -> (u16, &'static str) {
    use dflash_core::Error as E;
    match e {
        CliError::Usage(_) => (400, "BadRequest"),
        CliError::Core(E::BadRequest(_) | E::EmptyPrompt | E::BadSampling(_)) => {
            (400, "BadRequest")
        }
        CliError::Core(E::ContextOverflow { .. }) => (400, "ContextOverflow"),
        CliError::Core(E::ChatTemplate(_)) => (400, "ChatTemplate"),
        CliError::Core(E::LimitExceeded { .. }) => (400, "LimitExceeded"),
        CliError::Gpu(dflash_gpu::GpuError::Unsupported(_)) => (400, "Unsupported"),
        _ => (500, "Internal"),
    }
}
