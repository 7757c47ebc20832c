//! `Loader`: opens WebGPU (or the quantized CPU engine where there is no GPU adapter or
//! only a software one) and takes the model file chunk by chunk (each tensor goes to the
//! GPU, or into the CPU engine's 4/8-bit weights, as it completes; the bytes are hashed
//! as they pass), then builds the engine.

use super::engine::Engine;
use super::js::*;
use dflash_core::cpu::quant_matmul::{self, Kernel};
use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{CpuDrafter, DraftVocab, DrafterPrecision, DrafterWeights};
use dflash_core::formats::gguf_weights_stream::{HostSink, StreamedWeights, WeightStream};
use dflash_core::generate::Interrupt;
use dflash_engine::{Engine as Core, Runner};
use dflash_gpu::{GpuContext, GpuError, GpuModelOptions, GpuOptions, StreamLoader};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

/// Where the model goes while it loads.
pub(super) enum Target {
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
pub(super) struct Loaded {
    engine: Core,
    fields: serde_json::Value,
}

/// Builds the GPU model for `context` tokens from its finished load, inside DFlash's
/// runner when there is a drafter. The load's out-of-memory scope closes before the
/// build's own error is looked at: a refused allocation explains whatever failed after
/// it, so it is reported first; then a lost device.
pub(super) async fn build_on_gpu(
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
pub(super) fn build_on_cpu(
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
pub(super) fn engine_info(
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

pub(super) fn cpu_target(total: f64) -> Target {
    Target::Cpu(WeightStream::new(HostSink, total as u64))
}

pub(super) async fn gpu_target(total: f64, context: usize) -> Result<Target, GpuError> {
    let ctx = Rc::new(GpuContext::new_async(&GpuOptions::default()).await?);
    Ok(Target::Gpu {
        oom: ctx.oom_scope(),
        model: StreamLoader::with_context(ctx.clone(), total as u64, context),
        ctx,
    })
}

pub(super) fn adapter_json(ctx: &GpuContext) -> serde_json::Value {
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
