//! A drafter's first weights: copied from the target's layers (`--init-from-target`)
//! or from an earlier drafter (`--init-from`).

use crate::draft_model::DraftParams;
use crate::TrainError;
use candle_core::Tensor;
use dflash_core::config::RopeStyle;
use dflash_core::drafter::DrafterConfig;
use std::collections::BTreeMap;
use std::path::Path;

/// `--init-from-target` copies layers: the drafter must have the target's widths and
/// at most its layers.
fn check_target_widths(
    t: &dflash_core::config::ModelConfig,
    c: &DrafterConfig,
) -> Result<(), TrainError> {
    let widths = |h, nh, nkv, hd, ff| (h, nh, nkv, hd, ff);
    let target = widths(
        t.hidden_size,
        t.num_heads,
        t.num_kv_heads,
        t.head_dim,
        t.intermediate_size,
    );
    let drafter = widths(
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
    );
    if target != drafter || c.num_layers > t.num_layers {
        return Err(TrainError::Usage(
            "--init-from-target needs the drafter to have the target's widths".into(),
        ));
    }
    Ok(())
}

/// A Q or K projection's rows in the neox order the drafter rotates in: interleaved
/// (ggml) pairs (2i, 2i+1) go to (i, i + hd/2), per head.
fn neox_rows(
    t: &dflash_core::config::ModelConfig,
    m: &dflash_core::quant::QuantMatrix,
    heads: usize,
) -> Vec<f32> {
    let x = m.dequantize();
    if t.rope.style != RopeStyle::Interleaved || t.rope.dim != t.head_dim {
        return x;
    }
    let (hd, cols) = (t.head_dim, m.cols);
    let mut out = vec![0f32; x.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for (dst, src) in [(i, 2 * i), (hd / 2 + i, 2 * i + 1)] {
                let (d, s) = ((h * hd + dst) * cols, (h * hd + src) * cols);
                out[d..d + cols].copy_from_slice(&x[s..s + cols]);
            }
        }
    }
    out
}

/// Starts the drafter's layers as copies of the target's top layers (Q/K rows put in
/// the neox order the drafter rotates in), `fc` as the identity on the last tap and
/// `norm` as the target's final norm, instead of random matrices.
pub fn init_from_target(
    p: &DraftParams,
    w: &dflash_core::weights::ModelWeights,
    c: &DrafterConfig,
) -> Result<(), TrainError> {
    let t = &w.config;
    check_target_widths(t, c)?;
    let dev = p.vars["norm.weight"].device().clone();
    let set = |name: &str, v: Vec<f32>| -> Result<(), TrainError> {
        let var = &p.vars[name];
        var.set(&Tensor::from_vec(v, var.shape(), &dev)?)?;
        Ok(())
    };
    let neox = |m: &dflash_core::quant::QuantMatrix, heads: usize| neox_rows(t, m, heads);
    let first = t.num_layers - c.num_layers;
    for i in 0..c.num_layers {
        let l = &w.layers[first + i];
        let n = |x: &str| format!("layers.{i}.{x}");
        let (Some(at), Some((gate, up, down))) = (l.attention(), l.ffn.dense()) else {
            return Err(TrainError::Usage(
                "--init-from-target needs a target of attention layers with dense feed-forwards"
                    .into(),
            ));
        };
        set(&n("self_attn.q_proj.weight"), neox(&at.wq, t.num_heads))?;
        set(&n("self_attn.k_proj.weight"), neox(&at.wk, t.num_kv_heads))?;
        set(&n("self_attn.v_proj.weight"), at.wv.dequantize())?;
        set(&n("self_attn.o_proj.weight"), at.wo.dequantize())?;
        set(&n("mlp.gate_proj.weight"), gate.dequantize())?;
        set(&n("mlp.up_proj.weight"), up.dequantize())?;
        set(&n("mlp.down_proj.weight"), down.dequantize())?;
        set(&n("input_layernorm.weight"), l.attn_norm.clone())?;
        set(&n("post_attention_layernorm.weight"), l.ffn_norm.clone())?;
        if let (Some(q), Some(k)) = (&at.q_norm, &at.k_norm) {
            set(&n("self_attn.q_norm.weight"), q.clone())?;
            set(&n("self_attn.k_norm.weight"), k.clone())?;
        }
    }
    let h = c.hidden_size;
    let taps = c.n_taps();
    let mut fc = vec![0f32; h * taps * h];
    for r in 0..h {
        fc[r * taps * h + (taps - 1) * h + r] = 1.0;
    }
    set("fc.weight", fc)?;
    set("norm.weight", w.norm.clone())?;
    Ok(())
}

/// Starts a run's parameters from the exported drafter in `dir` (config.json +
/// model.safetensors), which must have the same layers, taps and mask token.
pub fn init_from_drafter(p: &DraftParams, dir: &Path, c: &DrafterConfig) -> Result<(), TrainError> {
    let text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| TrainError::Io(format!("{}: {e}", dir.display())))?;
    let other = DrafterConfig::from_json(&text)?;
    if (
        other.num_layers,
        &other.target_layer_ids,
        other.mask_token_id,
        other.hidden_size,
    ) != (
        c.num_layers,
        &c.target_layer_ids,
        c.mask_token_id,
        c.hidden_size,
    ) {
        return Err(TrainError::Usage(format!(
            "--init-from {}: {} layers, taps {:?}, mask {}; this run: {} layers, taps {:?}, mask {}",
            dir.display(), other.num_layers, other.target_layer_ids, other.mask_token_id, c.num_layers, c.target_layer_ids, c.mask_token_id
        )));
    }
    let t = candle_core::safetensors::load(
        dir.join("model.safetensors"),
        p.vars["norm.weight"].device(),
    )
    .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.display())))?;
    let t: BTreeMap<String, Tensor> = t.into_iter().collect();
    let n = p
        .take_from(&t)
        .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    if n != t.len() {
        return Err(TrainError::Checkpoint(format!(
            "--init-from {}: {} of its {} tensors are not this drafter's",
            dir.display(),
            t.len() - n,
            t.len()
        )));
    }
    Ok(())
}
