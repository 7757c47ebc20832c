//! Named model shapes without a model: their sizes (`shapeInfo`) and their memory plan
//! on this browser's adapter (`planShape`), for the catalogue's checks before a download.

use super::js::*;
use dflash_gpu::{GpuContext, GpuOptions};
use wasm_bindgen::prelude::*;

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

pub(super) fn named_shape(shape: &str) -> Result<dflash_core::synthetic::SyntheticSpec, JsValue> {
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

/// What a wasm32 memory can hold at most (4 GiB) less room for the engine's own
/// buffers: the budget of `benchSynthetic` when the caller names none.
const WASM_WEIGHT_BUDGET: f64 = 3.5 * (1u64 << 30) as f64;

/// The DFlash speed of a named shape's synthetic pair on this worker's CPU engine (wasm
/// SIMD, the worker's threads): `options` as `dflash_engine::synthetic_bench::
/// SyntheticBench` in camelCase (`{ shape, layers?, acceptProfile, blocks: ["8", "auto"],
/// prompts?, promptTokens?, maxNewTokens?, seed?, memoryBudget? }`). The weights are
/// checked against `memoryBudget` (at most what a wasm32 memory holds) before anything
/// is allocated: `OutOfMemory` past it, `BadRequest` for a bad option. Returns the
/// report: plain tok/s, and per block tok/s, speedup, tau and `lossless`.
#[wasm_bindgen(js_name = benchSynthetic)]
pub fn bench_synthetic(options: JsValue) -> Result<JsValue, JsValue> {
    use dflash_engine::synthetic_bench::SyntheticBench;
    // Through JSON, so that an unknown (misspelt) option is refused, not ignored.
    let bad =
        |e: &dyn std::fmt::Display| js_error("BadRequest", &format!("benchSynthetic options: {e}"));
    let v: serde_json::Value = serde_wasm_bindgen::from_value(options).map_err(|e| bad(&e))?;
    let mut bench: SyntheticBench = serde_json::from_value(v).map_err(|e| bad(&e))?;
    let budget = bench.memory_budget.unwrap_or(WASM_WEIGHT_BUDGET);
    bench.memory_budget = Some(budget.min(WASM_WEIGHT_BUDGET));
    let clock = || js_sys::Date::now() / 1000.0;
    let report = bench.run(&clock).map_err(gpu_err)?;
    Ok(to_js_value(&report))
}
