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
