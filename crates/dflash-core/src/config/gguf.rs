//! A model's hyper-parameters from GGUF metadata (llama.cpp's keys), the hybrid and
//! mixture-of-experts fields included.

use super::*;
use crate::error::{Error, Result};
use crate::formats::gguf::GgufHeader;

impl ModelConfig {
    pub fn from_gguf(h: &GgufHeader) -> Result<Self> {
        let arch_s = h
            .get_str("general.architecture")
            .ok_or_else(|| Error::BadMetadata("general.architecture missing".into()))?;
        let arch = Arch::parse(arch_s)?;
        let key = |k: &str| format!("{arch_s}.{k}");
        let req = |k: &str| -> Result<u64> {
            h.get_u64(&key(k))
                .ok_or_else(|| Error::BadMetadata(format!("{} missing or not an integer", key(k))))
        };
        let hidden = req("embedding_length")? as usize;
        let heads = req("attention.head_count")? as usize;
        let kv_heads = h
            .get_u64(&key("attention.head_count_kv"))
            .unwrap_or(heads as u64) as usize;
        if heads == 0 {
            return Err(Error::BadConfig("zero attention heads".into()));
        }
        let head_dim = h
            .get_u64(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(hidden / heads);
        let vocab = match h.get_u64(&key("vocab_size")) {
            Some(v) => v as usize,
            None => h
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .unwrap_or(0),
        };
        let tie = h.tensor("output.weight").is_none();
        let cfg = ModelConfig {
            arch,
            hidden_size: hidden,
            intermediate_size: req("feed_forward_length")? as usize,
            num_layers: req("block_count")? as usize,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            vocab_size: vocab,
            rms_norm_eps: h
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            // The loader adds the factors of `rope_freqs.weight` where the file has them.
            rope: Rope::plain(
                h.get_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
                if arch == Arch::Llama {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::Neox
                },
                h.get_u64(&key("rope.dimension_count"))
                    .map(|v| v as usize)
                    .unwrap_or(head_dim),
            ),
            max_position_embeddings: h.get_u64(&key("context_length")).unwrap_or(4096) as usize,
            qkv_bias: h.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: h.tensor("blk.0.attn_q_norm.weight").is_some(),
            tie_word_embeddings: tie,
            moe: None,
            hybrid: None,
        };
        let cfg = ModelConfig {
            moe: moe_from_gguf(h, arch_s, cfg.num_layers)?,
            hybrid: hybrid_from_gguf(h, arch, arch_s, cfg.num_layers)?,
            // Qwen3.5's first layers are linear: the per-head norms are the arch's.
            qk_norm: cfg.qk_norm || arch.is_hybrid(),
            ..cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The linear layers of a GGUF file (llama.cpp's `qwen35` / `qwen35moe`): sizes from
/// the `ssm.*` metadata (conv_kernel, state_size = key head dim, group_count = key
/// heads, time_step_rank = value heads, inner_size = value dim), the linear layers from
/// their `ssm_a` tensors, the value heads in the converter's tiled order.
fn hybrid_from_gguf(
    h: &GgufHeader,
    arch: Arch,
    arch_s: &str,
    num_layers: usize,
) -> Result<Option<HybridConfig>> {
    if !arch.is_hybrid() {
        return Ok(None);
    }
    let req = |k: &str| {
        let key = format!("{arch_s}.ssm.{k}");
        h.get_u64(&key)
            .map(|v| v as usize)
            .ok_or_else(|| Error::BadMetadata(format!("{key} missing or not an integer")))
    };
    let value_heads = req("time_step_rank")?;
    let inner = req("inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(Error::BadMetadata(format!(
            "{arch_s}.ssm.inner_size {inner} over {value_heads} value heads"
        )));
    }
    Ok(Some(HybridConfig {
        linear_layers: (0..num_layers)
            .map(|i| h.tensor(&format!("blk.{i}.ssm_a")).is_some())
            .collect(),
        conv_kernel: req("conv_kernel")?,
        key_heads: req("group_count")?,
        value_heads,
        key_head_dim: req("state_size")?,
        value_head_dim: inner / value_heads,
        tiled_value_heads: true,
    }))
}

/// The experts of a GGUF file (llama.cpp's `qwen3moe`): counts from the metadata, the
/// sparse layers from the router tensors (`blk.N.ffn_gate_inp.weight`). llama.cpp
/// renormalises the top-k weights of qwen3moe unless `expert_weights_norm` says not to.
fn moe_from_gguf(h: &GgufHeader, arch: &str, num_layers: usize) -> Result<Option<MoeConfig>> {
    let key = |k: &str| format!("{arch}.{k}");
    let Some(num_experts) = h.get_u64(&key("expert_count")) else {
        return Ok(None);
    };
    let req = |k: &str| {
        h.get_u64(&key(k))
            .map(|v| v as usize)
            .ok_or_else(|| Error::BadMetadata(format!("{} missing or not an integer", key(k))))
    };
    Ok(Some(MoeConfig {
        num_experts: num_experts as usize,
        experts_per_token: req("expert_used_count")?,
        expert_intermediate_size: req("expert_feed_forward_length")?,
        shared_expert_intermediate_size: h
            .get_u64(&key("expert_shared_feed_forward_length"))
            .map(|v| v as usize),
        norm_topk_prob: h
            .get(&key("expert_weights_norm"))
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
        sparse_layers: (0..num_layers)
            .map(|i| h.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_some())
            .collect(),
    }))
}
