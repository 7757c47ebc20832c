//! Hugging Face folders of test models: a tiny tokenizer.json and the folder.

use super::gguf::hf_tensors;
use super::*;
use crate::config::ModelConfig;
use crate::formats::ggml::quantize;
use crate::formats::hf::write_safetensors;
use safetensors::Dtype;
use std::collections::BTreeMap;

/// The `tokenizer.json` of the tiny vocabulary.
pub fn tiny_tokenizer_json() -> String {
    let voc = tiny_vocab();
    let vocab: serde_json::Map<String, serde_json::Value> = voc
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), serde_json::json!(i)))
        .collect();
    let added: Vec<serde_json::Value> = voc
        .tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| voc.types[*i] == 3)
        .map(|(i, t)| serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let merges: Vec<serde_json::Value> = voc.merges.iter().map(|m| serde_json::json!(m)).collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
    .to_string()
}

/// The files of a tiny Hugging Face model folder. Weights in `dtype` (F32, F16 or
/// BF16), split over `shards` safetensors files (with an index when more than one).
pub fn write_hf(
    c: &ModelConfig,
    w: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    dtype: Dtype,
    shards: usize,
) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let model_type = arch_name(c.arch);
    let voc = tiny_vocab();
    let mut config = serde_json::json!({
        "architectures": [hf_class(c.arch)],
        "model_type": model_type,
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope.theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "eos_token_id": voc.eos, "bos_token_id": voc.bos,
    });
    if let Some(hy) = &c.hybrid {
        let types: Vec<&str> = (0..c.num_layers)
            .map(|i| match hy.is_linear(i) {
                true => "linear_attention",
                false => "full_attention",
            })
            .collect();
        let fields = serde_json::json!({
            "layer_types": types, "linear_conv_kernel_dim": hy.conv_kernel,
            "linear_num_key_heads": hy.key_heads, "linear_num_value_heads": hy.value_heads,
            "linear_key_head_dim": hy.key_head_dim, "linear_value_head_dim": hy.value_head_dim,
            "partial_rotary_factor": c.rope.dim as f64 / c.head_dim as f64,
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
    }
    if let Some(m) = &c.moe {
        let dense: Vec<usize> = (0..c.num_layers).filter(|&i| !m.is_sparse(i)).collect();
        let fields = serde_json::json!({
            "num_experts": m.num_experts, "num_experts_per_tok": m.experts_per_token,
            "moe_intermediate_size": m.expert_intermediate_size,
            "norm_topk_prob": m.norm_topk_prob, "decoder_sparse_step": 1,
            "mlp_only_layers": dense,
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
    }
    files.insert("config.json".into(), config.to_string().into_bytes());
    files.insert("tokenizer.json".into(), tiny_tokenizer_json().into_bytes());
    let tok_cfg = serde_json::json!({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": false, "chat_template": CHATML_TEMPLATE});
    files.insert(
        "tokenizer_config.json".into(),
        tok_cfg.to_string().into_bytes(),
    );
    files.insert(
        "generation_config.json".into(),
        serde_json::json!({"eos_token_id": [voc.eos]})
            .to_string()
            .into_bytes(),
    );
    let enc = |x: &[f32]| -> Vec<u8> {
        match dtype {
            Dtype::F32 => quantize::f32s(x),
            Dtype::F16 => quantize::f16s(x),
            Dtype::BF16 => x
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            d => panic!("test helper cannot write {d:?}"),
        }
    };
    let all: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = w
        .iter()
        .flat_map(|(n, (s, v))| hf_tensors(n, s, v))
        .map(|(n, s, v)| (n, dtype, s, enc(&v)))
        .collect();
    if shards <= 1 {
        files.insert("model.safetensors".into(), write_safetensors(&all));
    } else {
        let mut map = serde_json::Map::new();
        for k in 0..shards {
            let fname = format!("model-{:05}-of-{:05}.safetensors", k + 1, shards);
            let part: Vec<_> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| i % shards == k)
                .map(|(_, t)| t.clone())
                .collect();
            for t in &part {
                map.insert(t.0.clone(), serde_json::json!(fname));
            }
            files.insert(fname, write_safetensors(&part));
        }
        files.insert(
            "model.safetensors.index.json".into(),
            serde_json::json!({"metadata": {}, "weight_map": map})
                .to_string()
                .into_bytes(),
        );
    }
    files
}
