//! GGUF files of test models: their metadata, the file itself, and a file split into
//! parts as llama.cpp's gguf-split writes them.

use super::*;
use crate::config::{Arch, ModelConfig};
use crate::formats::ggml::GgmlType;
use crate::formats::gguf::{writer, Value};
use std::collections::BTreeMap;

/// GGUF metadata of a tiny model: hyper-parameters, the tiny vocabulary, ChatML template.
pub fn gguf_metadata(c: &ModelConfig) -> Vec<(String, Value)> {
    let a = arch_name(c.arch);
    let voc = tiny_vocab();
    let u = |v: usize| Value::U32(v as u32);
    let mut moe = Vec::new();
    if let Some(hy) = &c.hybrid {
        moe.extend([
            (format!("{a}.ssm.conv_kernel"), u(hy.conv_kernel)),
            (format!("{a}.ssm.state_size"), u(hy.key_head_dim)),
            (format!("{a}.ssm.group_count"), u(hy.key_heads)),
            (format!("{a}.ssm.time_step_rank"), u(hy.value_heads)),
            (format!("{a}.ssm.inner_size"), u(hy.value_dim())),
        ]);
    }
    if let Some(m) = &c.moe {
        moe.extend([
            (format!("{a}.expert_count"), u(m.num_experts)),
            (format!("{a}.expert_used_count"), u(m.experts_per_token)),
            (
                format!("{a}.expert_feed_forward_length"),
                u(m.expert_intermediate_size),
            ),
            (
                format!("{a}.expert_weights_norm"),
                Value::Bool(m.norm_topk_prob),
            ),
        ]);
    }
    moe.into_iter()
        .chain([
            ("general.architecture".into(), Value::String(a.into())),
            (format!("{a}.block_count"), u(c.num_layers)),
            (format!("{a}.context_length"), u(c.max_position_embeddings)),
            (format!("{a}.embedding_length"), u(c.hidden_size)),
            (format!("{a}.feed_forward_length"), u(c.intermediate_size)),
            (format!("{a}.attention.head_count"), u(c.num_heads)),
            (format!("{a}.attention.head_count_kv"), u(c.num_kv_heads)),
            (format!("{a}.attention.key_length"), u(c.head_dim)),
            (format!("{a}.rope.freq_base"), Value::F32(c.rope.theta)),
            (format!("{a}.rope.dimension_count"), u(c.rope.dim)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(c.rms_norm_eps),
            ),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(
                    voc.tokens
                        .iter()
                        .map(|t| Value::String(t.clone()))
                        .collect(),
                ),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(voc.types.iter().map(|&t| Value::I32(t)).collect()),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::Array(
                    voc.merges
                        .iter()
                        .map(|t| Value::String(t.clone()))
                        .collect(),
                ),
            ),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(voc.bos)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(voc.eos)),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
            (
                "tokenizer.chat_template".into(),
                Value::String(CHATML_TEMPLATE.into()),
            ),
        ])
        .collect()
}

/// Writes a tiny model as a GGUF file: 2-D weights in `matrix_type`, 1-D in F32.
pub fn write_gguf(
    c: &ModelConfig,
    w: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    matrix_type: GgmlType,
) -> Vec<u8> {
    let mut tensors = Vec::new();
    for (name, (shape, vals)) in w {
        let mut vals = vals.clone();
        if c.arch == Arch::Llama
            && (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight"))
        {
            let heads = if name.ends_with("attn_q.weight") {
                c.num_heads
            } else {
                c.num_kv_heads
            };
            vals = permute_qk(&vals, shape[0], shape[1], heads);
        }
        if let Some(hy) = &c.hybrid {
            vals = qwen35_to_gguf(hy, name, shape, vals);
        }
        // Tensors whose rows are no whole number of blocks stay F32, as llama.cpp keeps
        // them (the convolution's taps).
        let t = if shape.len() >= 2 && shape[shape.len() - 1].is_multiple_of(32) {
            matrix_type
        } else {
            GgmlType::F32
        };
        tensors.push(writer::TensorData {
            name: name.clone(),
            dims: shape.iter().rev().map(|&d| d as u64).collect(),
            dtype: t,
            bytes: encode_ggml(t, &vals),
        });
    }
    writer::write(&gguf_metadata(c), &tensors)
}

/// A tensor by GGUF name as Hugging Face writes it: an expert stack
/// (`blk.N.ffn_*_exps.weight`, `[experts, rows, cols]`) as one tensor per expert.
pub(super) fn hf_tensors(
    gguf: &str,
    shape: &[usize],
    v: &[f32],
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    if gguf.ends_with(".ssm_conv1d.weight") {
        // Hugging Face keeps the convolution as [channels, 1, kernel].
        let shape = vec![shape[0], 1, shape[1]];
        return vec![(hf_name(gguf), shape, v.to_vec())];
    }
    let Some(rest) = gguf
        .strip_suffix("_exps.weight")
        .and_then(|r| r.strip_prefix("blk."))
    else {
        return vec![(hf_name(gguf), shape.to_vec(), v.to_vec())];
    };
    let (i, what) = rest.split_once(".ffn_").unwrap();
    let per = shape[1] * shape[2];
    (0..shape[0])
        .map(|e| {
            let name = format!("model.layers.{i}.mlp.experts.{e}.{what}_proj.weight");
            (
                name,
                shape[1..].to_vec(),
                v[e * per..(e + 1) * per].to_vec(),
            )
        })
        .collect()
}

/// What llama.cpp's converter does to a Qwen3.5 tensor (Hugging Face's values): the
/// zero-centred norms as 1 + w (not the linear layers' gated norm), A_log as
/// -exp(A_log), the value heads from grouped by key head to tiled order (rows of the
/// v part of qkv, of z, b, a, of the convolution's v channels; dt and A; out's columns).
fn qwen35_to_gguf(
    hy: &crate::config::HybridConfig,
    name: &str,
    shape: &[usize],
    v: Vec<f32>,
) -> Vec<f32> {
    let (nk, nv, dv) = (hy.key_heads, hy.value_heads, hy.value_head_dim);
    let r = nv / nk;
    // Grouped head g * r + j goes to tiled position j * nk + g.
    let tiled = |h: usize| (h % r) * nk + h / r;
    let cols = shape.get(1).copied().unwrap_or(1);
    // Rows [first, first + nv * per) as value heads of `per` rows each.
    let reorder_rows = |v: &mut Vec<f32>, first: usize, per: usize| {
        let old = v.clone();
        for h in 0..nv {
            let (src, dst) = (first + h * per, first + tiled(h) * per);
            v[dst * cols..(dst + per) * cols].copy_from_slice(&old[src * cols..(src + per) * cols]);
        }
    };
    let mut v = v;
    let what = name.split_once('.').map_or(name, |x| x.1);
    let what = what.split_once('.').map_or(what, |x| x.1);
    match what {
        "attn_norm.weight" | "ffn_norm.weight" | "attn_q_norm.weight" | "attn_k_norm.weight" => {
            v.iter_mut().for_each(|x| *x += 1.0)
        }
        _ if name == "output_norm.weight" => v.iter_mut().for_each(|x| *x += 1.0),
        "attn_qkv.weight" | "ssm_conv1d.weight" => reorder_rows(&mut v, 2 * hy.key_dim(), dv),
        "attn_gate.weight" => reorder_rows(&mut v, 0, dv),
        "ssm_beta.weight" | "ssm_alpha.weight" | "ssm_dt.bias" => reorder_rows(&mut v, 0, 1),
        "ssm_a" => {
            reorder_rows(&mut v, 0, 1);
            v.iter_mut().for_each(|x| *x = -x.exp());
        }
        "ssm_out.weight" => {
            let old = v.clone();
            for row in 0..shape[0] {
                for h in 0..nv {
                    let (src, dst) = (row * cols + h * dv, row * cols + tiled(h) * dv);
                    v[dst..dst + dv].copy_from_slice(&old[src..src + dv]);
                }
            }
        }
        _ => {}
    }
    v
}

fn hf_name(gguf: &str) -> String {
    use crate::weights::Naming;
    match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        _ => {
            let rest = gguf.strip_prefix("blk.").unwrap();
            let (i, what) = rest.split_once('.').unwrap();
            Naming::HuggingFace.layer(i.parse().unwrap(), what)
        }
    }
}

/// `file` split as llama.cpp's `gguf-split` does: `parts` GGUF files, the tensors in
/// file order in contiguous runs, the first part with all the metadata and each with
/// `split.no`, `split.count` and `split.tensors.count`.
pub fn split_gguf(file: &[u8], parts: usize) -> Vec<Vec<u8>> {
    let h = crate::formats::gguf::parse_header(file, file.len() as u64).unwrap();
    let mut tensors: Vec<_> = h.tensors.iter().collect();
    tensors.sort_by_key(|t| t.offset);
    let per_part = tensors.len().div_ceil(parts);
    let split_keys = |no: usize| {
        vec![
            ("split.no".to_string(), Value::U16(no as u16)),
            ("split.count".to_string(), Value::U16(parts as u16)),
            (
                "split.tensors.count".to_string(),
                Value::I32(h.tensors.len() as i32),
            ),
        ]
    };
    (0..parts)
        .map(|no| {
            let mut meta = if no == 0 {
                h.metadata
                    .iter()
                    .filter(|(k, _)| k.as_str() != "general.alignment")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            } else {
                Vec::new()
            };
            meta.extend(split_keys(no));
            let data = tensors
                .iter()
                .skip(no * per_part)
                .take(per_part)
                .map(|t| writer::TensorData {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    dtype: t.dtype,
                    bytes: file[t.offset as usize..(t.offset + t.n_bytes) as usize].to_vec(),
                })
                .collect::<Vec<_>>();
            writer::write(&meta, &data)
        })
        .collect()
}
