//! The wasm-bindgen surface the Web Worker drives: a `Loader` that opens WebGPU (or the
//! quantized CPU engine where there is no GPU adapter or only a software one) and takes
//! the model file chunk by chunk (each tensor goes to the GPU, or into the CPU engine's
//! 4/8-bit weights, as it completes; the bytes are hashed as they pass), then an
//! `Engine` that answers chat requests, streaming text pieces through a callback.
//! Everything else is the shared engine.

use dflash_core::cpu::quant_matmul::{self, Kernel};
use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{CpuDrafter, DraftVocab, DrafterPrecision, DrafterWeights};
use dflash_core::formats::gguf_weights_stream::{HostSink, StreamedWeights, WeightStream};
use dflash_core::generate::Interrupt;
use dflash_engine::errors::error_code;
use dflash_engine::request::{request_fields as engine_request_fields, Request};
use dflash_engine::response::Reply;
use dflash_engine::{Engine as Core, Host, Runner};
use dflash_gpu::{GpuContext, GpuError, GpuModelOptions, GpuOptions, StreamLoader};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

/// An error for JS: `Error` with `name` "DFlashError" and the engine's `code`.
fn to_js(e: &GpuError) -> JsValue {
    js_error(error_code(e), &e.to_string())
}

fn js_error(code: &str, message: &str) -> JsValue {
    let err = js_sys::Error::new(message);
    err.set_name("DFlashError");
    let _ = js_sys::Reflect::set(&err, &"code".into(), &code.into());
    err.into()
}

fn core_err(e: dflash_core::Error) -> JsValue {
    to_js(&GpuError::Core(e))
}

fn gpu_err(e: GpuError) -> JsValue {
    to_js(&e)
}

fn to_js_value(v: &serde_json::Value) -> JsValue {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .unwrap_or(JsValue::NULL)
}

use serde::Serialize;

/// The last panic's message and place. A panic aborts the wasm instance with a trap
/// (`RuntimeError: unreachable`) that says nothing of its cause: the worker reads this
/// after catching the trap (`takePanic`) and hands it to the caller as code `Panic`.
static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

/// Installs the panic hook when the module is instantiated.
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        let msg = match info.location() {
            Some(l) => format!("{what} (at {}:{})", l.file(), l.line()),
            None => what,
        };
        console_error(&format!("dflash-web panicked: {msg}"));
        if let Ok(mut g) = LAST_PANIC.lock() {
            *g = Some(msg);
        }
    }));
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hex sha256 of a whole file (the drafter's files: checked against the hash the
/// page pinned and the one stored with a cached copy, as the model's are).
#[wasm_bindgen(js_name = sha256Hex)]
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The message of the panic that trapped the instance, once (null if none happened).
#[wasm_bindgen(js_name = takePanic)]
pub fn take_panic() -> Option<String> {
    LAST_PANIC.lock().ok().and_then(|mut g| g.take())
}

/// TEST ONLY: panics with `message` after yielding to the event loop once, so that the
/// trap comes from a running future, as a bug in a chat request's would.
#[cfg(feature = "test-hooks")]
#[wasm_bindgen(js_name = __testTrap)]
pub async fn test_trap(message: String) -> Result<(), JsValue> {
    yield_to_worker().await?;
    panic!("{message}");
}

/// TEST ONLY: this build's packed CPU kernel (wasm SIMD128) against the scalar
/// definition on random matrices (`testutil::packed_kernel_mismatches`): `[values whose
/// bits differ, values compared]`.
#[cfg(feature = "test-hooks")]
#[wasm_bindgen(js_name = __testPackedKernel)]
pub fn test_packed_kernel() -> Vec<u32> {
    let (bad, all, _) = dflash_core::testutil::packed_kernel_mismatches();
    vec![bad as u32, all as u32]
}

/// The request parsed and checked as `Engine::chat` does before it runs.
fn parse_request(request: JsValue) -> Result<Request, JsValue> {
    let v: serde_json::Value = serde_wasm_bindgen::from_value(request)
        .map_err(|e| js_error("BadRequest", &format!("bad request: {e}")))?;
    Request::chat(v).map_err(core_err)
}

/// Every field a chat request may have (`index.d.ts` declares exactly these).
#[wasm_bindgen(js_name = requestFields)]
pub fn request_fields() -> Vec<String> {
    engine_request_fields().map(String::from).collect()
}

/// Checks a chat request without a model (fields, types, sampling parameters): throws
/// the `{ code: 'BadRequest', message }` error the engine would.
#[wasm_bindgen(js_name = validateRequest)]
pub fn validate_request(request: JsValue) -> Result<(), JsValue> {
    parse_request(request).map(|_| ())
}

/// Where the model goes while it loads.
enum Target {
    Gpu {
        ctx: Rc<GpuContext>,
        model: StreamLoader,
        /// Every buffer of the load (weights, KV cache, activations) is made inside this
        /// out-of-memory error scope: the browser reports a failed allocation only
        /// through a scope (or as an uncaptured error), never at the call.
        oom: dflash_gpu::context::OomScope,
    },
    Cpu(WeightStream<HostSink>),
}

/// A named model shape's sizes without a device: `{ layers, hidden_size, vocab_size,
/// weight_bytes, drafter_weight_bytes }` (the weights as the loader repacks a Q4_K_M
/// GGUF), for the catalogue's checks; `BadRequest` for an unknown name.
#[wasm_bindgen(js_name = shapeInfo)]
pub fn shape_info(shape: &str) -> Result<JsValue, JsValue> {
    let s = named_shape(shape)?;
    Ok(to_js_value(&serde_json::json!({
        "layers": s.config.num_layers, "hidden_size": s.config.hidden_size,
        "vocab_size": s.config.vocab_size, "weight_bytes": s.target_weight_bytes(),
        "drafter_weight_bytes": s.drafter_weight_bytes(),
    })))
}

fn named_shape(shape: &str) -> Result<dflash_core::synthetic::SyntheticSpec, JsValue> {
    dflash_core::synthetic::spec(shape).ok_or_else(|| {
        js_error(
            "BadRequest",
            &format!(
                "no model shape {shape:?} (known: {})",
                dflash_core::synthetic::NAMES.join(", ")
            ),
        )
    })
}

/// The memory plan of a model of the named shape (`dflash_core::synthetic::NAMES`:
/// "qwen3-8b", "llama-3.1-8b", ...; the catalogue's models name theirs) on this browser's
/// WebGPU adapter at `context` tokens, with its z-lab drafter when `dflash` (drafting
/// among `draft_vocab` ids, whose rows of the head it gathers, where given): `{ weights,
/// kv_cache, activations, total }` in bytes. Code `LimitsExceeded`, naming the limit,
/// where a buffer would not fit the adapter; `OutOfMemory` past `budget` bytes;
/// `NoWebGPU` without a device. Nothing is allocated and nothing downloaded: the worker
/// asks before it fetches a catalogue model.
#[wasm_bindgen(js_name = planShape)]
pub async fn plan_shape(
    shape: String,
    context: u32,
    dflash: bool,
    budget: Option<f64>,
    draft_vocab: Option<u32>,
) -> Result<JsValue, JsValue> {
    use dflash_gpu::synthetic::{plan, Planned};
    let mut spec = named_shape(&shape)?;
    let vocab = spec.config.vocab_size;
    match draft_vocab.map(|n| n as usize) {
        Some(n) if n == 0 || n > vocab => {
            return Err(js_error(
                "BadRequest",
                &format!("a draft vocabulary of {n} ids for a vocabulary of {vocab}"),
            ))
        }
        n => spec.draft_vocab = n.filter(|_| dflash),
    }
    let ctx = GpuContext::new_async(&GpuOptions::default())
        .await
        .map_err(gpu_err)?;
    let what = if dflash {
        Planned::DFlash
    } else {
        Planned::Plain
    };
    let p = plan(
        &ctx,
        &spec,
        context as usize,
        what,
        budget.map(|b| b as u64),
    )
    .map_err(gpu_err)?
    .total();
    Ok(to_js_value(&serde_json::json!({
        "weights": p.weights, "kv_cache": p.kv_cache, "activations": p.activations,
        "total": p.weights + p.kv_cache + p.activations,
    })))
}

/// Loads a model (GGUF) and optionally a DFlash drafter into WebGPU or the CPU engine.
#[wasm_bindgen]
pub struct Loader {
    target: Target,
    sha: Sha256,
    /// The sha256 of each finished part of a split model.
    part_shas: Vec<String>,
    drafter: Option<DrafterWeights>,
}

#[wasm_bindgen]
impl Loader {
    /// A loader for a GGUF file of `total` bytes on `engine`: `"gpu"` opens the WebGPU
    /// device (code `NoWebGPU` when there is none), `"cpu"` the quantized CPU engine,
    /// `"auto"` (or nothing) WebGPU where a device opens and is not a CPU device, else the
    /// CPU engine. (The worker asks for `"cpu"` when the browser's adapter is a software
    /// fallback.) On the GPU, `context` (tokens, default 2048) lets the loader check,
    /// as soon as the header has arrived, that every buffer of the model fits the
    /// adapter's limits (code `LimitsExceeded`, naming the limit), before the weights
    /// download.
    pub async fn open(
        total: f64,
        engine: Option<String>,
        context: Option<u32>,
    ) -> Result<Loader, JsValue> {
        let context = context.unwrap_or(2048) as usize;
        let target = match engine.as_deref().unwrap_or("auto") {
            "cpu" => cpu_target(total),
            "gpu" => gpu_target(total, context).await.map_err(gpu_err)?,
            "auto" => match gpu_target(total, context).await {
                Ok(Target::Gpu { ctx, .. }) if ctx.summary.device_type == "Cpu" => {
                    cpu_target(total)
                }
                Ok(t) => t,
                Err(_) => cpu_target(total),
            },
            other => {
                return Err(js_error(
                    "BadRequest",
                    &format!("engine must be \"auto\", \"gpu\" or \"cpu\", not {other:?}"),
                ))
            }
        };
        Ok(Loader {
            target,
            sha: Sha256::new(),
            part_shas: Vec::new(),
            drafter: None,
        })
    }

    /// The next bytes of the model file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsValue> {
        self.sha.update(chunk);
        match &mut self.target {
            Target::Gpu { model, .. } => model.push(chunk).map_err(gpu_err),
            Target::Cpu(model) => model.push(chunk).map_err(core_err),
        }
    }

    /// Ends the current part of a model split in several GGUF files (llama.cpp's
    /// `gguf-split`; all of the part must have arrived) and starts the next, of `total`
    /// bytes. Read the finished part's `sha256()` first: it starts again for the new one.
    #[wasm_bindgen(js_name = nextPart)]
    pub fn next_part(&mut self, total: f64) -> Result<(), JsValue> {
        match &mut self.target {
            Target::Gpu { model, .. } => model.next_part(total as u64).map_err(gpu_err)?,
            Target::Cpu(model) => model.next_part(total as u64).map_err(core_err)?,
        }
        self.part_shas.push(self.sha256());
        self.sha = Sha256::new();
        Ok(())
    }

    /// Parts of the model (`split.count`: 1 for a file in one piece) once the first
    /// part's header has arrived, else null.
    pub fn parts(&self) -> Option<u32> {
        match &self.target {
            Target::Gpu { model, .. } => model.parts(),
            Target::Cpu(model) => model.parts(),
        }
        .map(|n| n as u32)
    }

    /// Bytes received so far, over every part.
    pub fn received(&self) -> f64 {
        match &self.target {
            Target::Gpu { model, .. } => model.received() as f64,
            Target::Cpu(model) => model.received() as f64,
        }
    }

    /// Hex sha256 of the bytes of the current part received so far.
    pub fn sha256(&self) -> String {
        hex(&self.sha.clone().finalize())
    }

    /// The adapter and its limits (null on the CPU engine).
    pub fn adapter(&self) -> JsValue {
        match &self.target {
            Target::Gpu { ctx, .. } => to_js_value(&adapter_json(ctx)),
            Target::Cpu(_) => JsValue::NULL,
        }
    }

    /// A z-lab DFlash drafter: its config.json text and model.safetensors bytes (drafters
    /// are small; they are parsed whole). Checked against the target at `finish`.
    #[wasm_bindgen(js_name = setDrafter)]
    pub fn set_drafter(&mut self, config_json: &str, safetensors: &[u8]) -> Result<(), JsValue> {
        self.drafter = Some(
            DrafterWeights::load(
                config_json,
                vec![("model.safetensors", safetensors)],
                DrafterPrecision::default(),
            )
            .map_err(core_err)?,
        );
        Ok(())
    }

    /// The drafter's draft vocabulary (its draft_vocab.json text): greedy drafts among
    /// these ids of the lm_head. After `setDrafter`; checked against its vocabulary.
    #[wasm_bindgen(js_name = setDraftVocab)]
    pub fn set_draft_vocab(&mut self, json: &str) -> Result<(), JsValue> {
        let Some(d) = self.drafter.as_mut() else {
            return Err(core_err(dflash_core::Error::BadConfig(
                "a draft vocabulary before its drafter".into(),
            )));
        };
        d.draft_vocab = Some(DraftVocab::from_json(json, d.config.vocab_size).map_err(core_err)?);
        Ok(())
    }

    /// Checks the whole file arrived, builds the model for a context of `context` tokens
    /// (and the drafter, validated against it). An allocation the GPU refused during the
    /// load is code `OutOfMemory`.
    pub async fn finish(self, context: u32) -> Result<Engine, JsValue> {
        let mut part_shas = self.part_shas.clone();
        part_shas.push(self.sha256());
        let drafter = self.drafter.as_ref();
        let loaded = match self.target {
            Target::Gpu { ctx, model, oom } => {
                build_on_gpu(ctx, model, oom, drafter, context).await?
            }
            Target::Cpu(model) => build_on_cpu(model, drafter, context)?,
        };
        let info = engine_info(&loaded, drafter, part_shas);
        Ok(Engine {
            inner: Rc::new(RefCell::new(Some(loaded.engine))),
            info,
            interrupt: Interrupt::default(),
        })
    }
}

/// A finished load: the model as the engine runs it, and the engine's own fields of
/// `Engine::info` (`engine`, `adapter`, and `cpu` on the CPU engine).
struct Loaded {
    engine: Core,
    fields: serde_json::Value,
}

/// Builds the GPU model for `context` tokens from its finished load, inside DFlash's
/// runner when there is a drafter. The load's out-of-memory scope closes before the
/// build's own error is looked at: a refused allocation explains whatever failed after
/// it, so it is reported first; then a lost device.
async fn build_on_gpu(
    ctx: Rc<GpuContext>,
    model: StreamLoader,
    oom: dflash_gpu::context::OomScope,
    drafter: Option<&DrafterWeights>,
    context: u32,
) -> Result<Loaded, JsValue> {
    let built = model
        .finish(&GpuModelOptions {
            context: context as usize,
            taps: drafter
                .map(|d| d.config.target_layer_ids.clone())
                .unwrap_or_default(),
            ..Default::default()
        })
        .and_then(|m| {
            let context = m.model.context;
            let runner = Runner::gpu(m.model, drafter)?;
            let name = ctx.summary.name.clone();
            Ok(Core::new(
                runner,
                m.tokenizer,
                m.chat_template,
                context,
                name,
            ))
        });
    oom.close("loading the model").await.map_err(gpu_err)?;
    let engine = built.map_err(gpu_err)?;
    ctx.check_lost().map_err(gpu_err)?;
    let fields = serde_json::json!({"engine": "gpu", "adapter": adapter_json(&ctx)});
    Ok(Loaded { engine, fields })
}

/// Builds the quantized CPU engine from its finished load, for `context` tokens or the
/// model's own limit where that is less, with the drafter (validated against the model).
fn build_on_cpu(
    model: WeightStream<HostSink>,
    drafter: Option<&DrafterWeights>,
    context: u32,
) -> Result<Loaded, JsValue> {
    let (
        StreamedWeights {
            weights,
            tokenizer,
            chat_template,
        },
        _,
    ) = model.finish().map_err(core_err)?;
    let context = (context as usize).min(weights.config.max_position_embeddings);
    if let Some(w) = drafter {
        w.config
            .validate_against(&weights.config)
            .map_err(core_err)?;
    }
    let target = CpuModel::from_weights(weights, CpuKernels::Quantized);
    let drafter = drafter.map(|w| CpuDrafter::with_kernels(w, CpuKernels::Quantized));
    let fields = serde_json::json!({
        "engine": "cpu", "adapter": null,
        "cpu": {"kernel": Kernel::detect().name(), "threads": quant_matmul::threads()},
    });
    let runner = Runner::cpu(target, drafter);
    let name = CpuKernels::Quantized.device_name().to_string();
    let engine = Core::new(runner, tokenizer, chat_template, context, name);
    Ok(Loaded { engine, fields })
}

/// `Engine::info`: the context, the drafter's shape, the model file's sha256 (of each
/// part, `part_shas`, for a split model), then the engine's own fields.
fn engine_info(
    loaded: &Loaded,
    drafter: Option<&DrafterWeights>,
    part_shas: Vec<String>,
) -> serde_json::Value {
    let drafter = drafter.map(|d| &d.config);
    let mut info = serde_json::json!({
        "context": loaded.engine.context,
        "drafter": drafter.map(|d| serde_json::json!({
            "block_size": d.block_size, "layers": d.num_layers, "target_layer_ids": d.target_layer_ids,
        })),
        // A split model: its first part's, and every part's in `part_sha256`.
        "sha256": part_shas[0],
        "parts": part_shas.len(),
        "part_sha256": part_shas,
    });
    if let (Some(i), Some(e)) = (info.as_object_mut(), loaded.fields.as_object()) {
        i.extend(e.clone());
    }
    info
}

/// Lets the worker's event loop run (messages such as an interrupt) and resumes at once:
/// a message to ourselves through a `MessageChannel` (a zero-delay `setTimeout` is
/// clamped to 4 ms once nested).
async fn yield_to_worker() -> Result<(), JsValue> {
    use js_sys::{Array, Function, Promise, Reflect};
    let global = js_sys::global();
    let ctor: Function = Reflect::get(&global, &"MessageChannel".into())?.dyn_into()?;
    let channel = Reflect::construct(&ctor, &Array::new())?;
    let (rx, tx) = (
        Reflect::get(&channel, &"port1".into())?,
        Reflect::get(&channel, &"port2".into())?,
    );
    let arrived = Promise::new(&mut |resolve, _| {
        let _ = Reflect::set(&rx, &"onmessage".into(), &resolve);
    });
    let post: Function = Reflect::get(&tx, &"postMessage".into())?.dyn_into()?;
    post.call1(&tx, &JsValue::NULL)?;
    wasm_bindgen_futures::JsFuture::from(arrived).await?;
    Ok(())
}

fn cpu_target(total: f64) -> Target {
    Target::Cpu(WeightStream::new(HostSink, total as u64))
}

async fn gpu_target(total: f64, context: usize) -> Result<Target, GpuError> {
    let ctx = Rc::new(GpuContext::new_async(&GpuOptions::default()).await?);
    Ok(Target::Gpu {
        oom: ctx.oom_scope(),
        model: StreamLoader::with_context(ctx.clone(), total as u64, context),
        ctx,
    })
}

fn adapter_json(ctx: &GpuContext) -> serde_json::Value {
    let s = &ctx.summary;
    // Browsers may hide the adapter's name (privacy): say what kind it is instead.
    let name = if s.name.is_empty() {
        format!("{} adapter", s.device_type)
    } else {
        s.name.clone()
    };
    serde_json::json!({
        "name": name, "backend": s.backend, "device_type": s.device_type, "driver": s.driver,
        "shader_f16": s.shader_f16, "kv_cache_f16": ctx.f16,
        "max_storage_buffer_binding_size": s.max_storage_buffer_binding_size,
        "max_buffer_size": s.max_buffer_size,
    })
}

/// A loaded model (and drafter) answering chat requests one at a time.
#[wasm_bindgen]
pub struct Engine {
    inner: Rc<RefCell<Option<Core>>>,
    info: serde_json::Value,
    /// The running request's interrupt switch (outside `inner`, which the request holds).
    interrupt: Interrupt,
}

#[wasm_bindgen]
impl Engine {
    /// Adapter, context, drafter and the model file's sha256.
    pub fn info(&self) -> JsValue {
        to_js_value(&self.info)
    }

    /// Answers an OpenAI-style chat request in OpenAI's shape, named by `envelope`
    /// (`{ id, created, model }`): resolves to the whole `chat.completion`; with
    /// `on_chunk`, streams its `chat.completion.chunk`s as they are generated (the role,
    /// each piece with `dflash.drafted`, the finish with the usage, and include_usage's).
    pub fn chat(
        &self,
        request: JsValue,
        envelope: JsValue,
        on_chunk: Option<js_sys::Function>,
    ) -> js_sys::Promise {
        let inner = self.inner.clone();
        let interrupt = self.interrupt.clone();
        wasm_bindgen_futures::future_to_promise(answer(
            inner, interrupt, request, envelope, on_chunk,
        ))
    }

    /// TEST ONLY: destroys the engine's GPU device (`GPUDevice.destroy()`, what a driver
    /// reset does): later requests fail with code `DeviceLost`. Nothing on the CPU engine.
    #[cfg(feature = "test-hooks")]
    #[wasm_bindgen(js_name = __testLoseDevice)]
    pub fn test_lose_device(&self) -> Result<(), JsValue> {
        let g = self
            .inner
            .try_borrow()
            .map_err(|_| js_error("Busy", "the engine is answering a request"))?;
        if let Some(ctx) = g.as_ref().and_then(|e| e.runner.gpu_context()) {
            ctx.destroy_device();
        }
        Ok(())
    }

    /// Forgets the conversation: the next request prefills its whole prompt instead of
    /// keeping the KV rows its longest common prefix with the last one shares.
    #[wasm_bindgen(js_name = resetChat)]
    pub fn reset_chat(&self) -> Result<(), JsValue> {
        let mut g = self
            .inner
            .try_borrow_mut()
            .map_err(|_| js_error("Busy", "the engine is answering a request"))?;
        if let Some(e) = g.as_mut() {
            e.runner.forget_conversation();
        }
        Ok(())
    }

    /// Ends the running request before its next token (it resolves with what it has,
    /// `finish_reason: "abort"`); the engine stays usable. The GPU engine yields to the
    /// worker between steps, the CPU engine between tokens of plain decoding and between
    /// DFlash steps, so this takes effect within one step.
    pub fn interrupt(&self) {
        self.interrupt.set();
    }

    /// Frees the model (GPU buffers or CPU weights); later requests fail with code
    /// `Unloaded`.
    pub fn unload(&self) -> Result<(), JsValue> {
        let mut g = self
            .inner
            .try_borrow_mut()
            .map_err(|_| js_error("Busy", "the engine is answering a request"))?;
        *g = None;
        Ok(())
    }
}

/// The browser worker as the engine's host: its clock, `Math.random` seeds, and a yield
/// to the worker's event loop between steps (where an interrupt arrives).
struct Worker;

impl Host for Worker {
    fn now_s(&self) -> f64 {
        js_sys::Date::now() / 1000.0
    }

    fn random_seed(&self) -> u64 {
        (js_sys::Math::random() * 9007199254740992.0) as u64
    }

    async fn pause(&self) -> Result<(), GpuError> {
        yield_to_worker().await.map_err(|e| {
            dflash_core::Error::Internal(format!("yielding to the worker failed: {e:?}")).into()
        })
    }
}

/// `Engine::chat`'s request, run to its end: the engine stays borrowed throughout (a
/// request meanwhile is `Busy`; the borrow is how the engine answers one at a time).
#[allow(
    clippy::await_holding_refcell_ref,
    reason = "the borrow held across the run is the engine's busy state"
)]
async fn answer(
    inner: Rc<RefCell<Option<Core>>>,
    interrupt: Interrupt,
    request: JsValue,
    envelope: JsValue,
    on_chunk: Option<js_sys::Function>,
) -> Result<JsValue, JsValue> {
    let req = parse_request(request)?;
    let reply = parse_envelope(&req, envelope)?;
    let mut guard = inner
        .try_borrow_mut()
        .map_err(|_| js_error("Busy", "the engine is answering another request"))?;
    let engine = guard
        .as_mut()
        .ok_or_else(|| js_error("Unloaded", "the engine was unloaded"))?;
    let emit = |chunk: &serde_json::Value| {
        if let Some(f) = &on_chunk {
            let _ = f.call1(&JsValue::NULL, &to_js_value(chunk));
        }
    };
    if let Some(first) = reply.first_chunk() {
        emit(&first);
    }
    interrupt.clear();
    let a = engine
        .answer(&req, &interrupt, &Worker, &mut |s, drafted| {
            emit(&reply.piece_chunk(s, drafted))
        })
        .await
        .map_err(|e| to_js(&e))?;
    reply.last_chunks(&a).iter().for_each(emit);
    Ok(to_js_value(&reply.whole(&a.result.text, &a)))
}

/// The answer's envelope: `{ id, created, model }` as the package names the request.
fn parse_envelope(req: &Request, envelope: JsValue) -> Result<Reply, JsValue> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: String,
        created: u64,
        model: String,
    }
    let e: Envelope = serde_wasm_bindgen::from_value(envelope)
        .map_err(|e| js_error("BadRequest", &format!("bad envelope: {e}")))?;
    Ok(Reply::new(req, e.id, e.created, e.model))
}
