//! Test helpers: tiny synthetic models written in the real formats (GGUF files and
//! Hugging Face folders), a tiny byte-level BPE vocabulary, and a seeded generator.
//! Used by the tests of every crate; small enough to build everywhere.

use crate::config::{Arch, ModelConfig, MoeConfig, Rope, RopeStyle};
use crate::formats::ggml::{quantize, GgmlType};
use crate::formats::gguf::{writer, Value};
use crate::formats::hf::write_safetensors;
use safetensors::Dtype;
use std::collections::BTreeMap;

#[cfg(not(target_arch = "wasm32"))]
pub use crate::drafter::random::write_dir;
pub use crate::drafter::random::{write_dflash2_drafter, write_drafter, DFlash2Spec, DrafterSpec};
pub use crate::rng::Rng;

/// GPT-2's byte-to-unicode table: the visible characters byte-level BPE uses.
pub fn byte_to_unicode() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        table[*b as usize] = char::from_u32(c).unwrap();
    }
    table
}

pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A tiny byte-level BPE vocabulary: 256 byte tokens, a few merges, three specials.
pub struct TinyVocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub eos: u32,
    pub bos: u32,
}

pub fn tiny_vocab() -> TinyVocab {
    let b2u = byte_to_unicode();
    let mut tokens: Vec<String> = (0..256).map(|b| b2u[b].to_string()).collect();
    let sp = b2u[b' ' as usize];
    let merges = [
        ("h", "e"),
        (&*format!("{sp}"), "t"),
        (&*format!("{sp}t"), "he"),
        ("i", "n"),
        ("o", "r"),
        ("e", "r"),
        (&*format!("{sp}"), "a"),
        ("l", "l"),
    ];
    let mut merge_strs = Vec::new();
    for (a, b) in merges {
        tokens.push(format!("{a}{b}"));
        merge_strs.push(format!("{a} {b}"));
    }
    let mut types = vec![1; tokens.len()];
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.into());
        types.push(3);
    }
    // Pad to a multiple of 8 with unused tokens so the vocabulary has a round size.
    while !tokens.len().is_multiple_of(8) {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(5);
    }
    let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap() as u32;
    let bos = tokens.iter().position(|t| t == "<|endoftext|>").unwrap() as u32;
    TinyVocab {
        tokens,
        types,
        merges: merge_strs,
        eos,
        bos,
    }
}

pub fn tiny_config(arch: Arch) -> ModelConfig {
    ModelConfig {
        arch,
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 3,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        vocab_size: tiny_vocab().tokens.len(),
        rms_norm_eps: 1e-5,
        rope: Rope::plain(
            10000.0,
            if arch == Arch::Llama {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Neox
            },
            16,
        ),
        max_position_embeddings: 256,
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: arch.has_qk_norm(),
        tie_word_embeddings: false,
        moe: arch.has_experts().then(|| MoeConfig {
            num_experts: 8,
            experts_per_token: 3,
            expert_intermediate_size: 32,
            norm_topk_prob: true,
            shared_expert_intermediate_size: None,
            // The middle layer dense (`mlp_only_layers = [1]`).
            sparse_layers: vec![true, false, true],
        }),
        hybrid: arch.is_hybrid().then(|| crate::config::HybridConfig {
            linear_layers: vec![true, false, true],
            conv_kernel: 4,
            key_heads: 2,
            value_heads: 4,
            key_head_dim: 16,
            value_head_dim: 16,
            tiled_value_heads: false,
        }),
    }
}

/// Random f32 weights by GGUF short name (`token_embd.weight`, `blk.0.attn_q.weight`, ...),
/// as (row-major shape, values). Q/K are in Hugging Face order (not permuted).
pub fn random_weights(c: &ModelConfig, seed: u64) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut rng = Rng(seed);
    let mut w = BTreeMap::new();
    let (h, q, kv, ff, v) = (
        c.hidden_size,
        c.q_dim(),
        c.kv_dim(),
        c.intermediate_size,
        c.vocab_size,
    );
    let mut put = |name: String, shape: Vec<usize>, scale: f32, offset: f32, rng: &mut Rng| {
        let n = shape.iter().product();
        let vals = rng.vec(n, scale).into_iter().map(|x| x + offset).collect();
        w.insert(name, (shape, vals));
    };
    put("token_embd.weight".into(), vec![v, h], 1.0, 0.0, &mut rng);
    put("output_norm.weight".into(), vec![h], 0.2, 1.0, &mut rng);
    if !c.tie_word_embeddings {
        put("output.weight".into(), vec![v, h], 0.2, 0.0, &mut rng);
    }
    for i in 0..c.num_layers {
        let s = |x: usize| 1.0 / (x as f32).sqrt();
        put(
            format!("blk.{i}.attn_norm.weight"),
            vec![h],
            0.2,
            1.0,
            &mut rng,
        );
        put(
            format!("blk.{i}.ffn_norm.weight"),
            vec![h],
            0.2,
            1.0,
            &mut rng,
        );
        match c.hybrid.as_ref().filter(|hy| hy.is_linear(i)) {
            Some(hy) => {
                // Hugging Face's values (A_log, grouped value heads) under llama.cpp's
                // names; write_gguf converts them as its converter does.
                let (cd, vd, nv, k) = (
                    hy.conv_dim(),
                    hy.value_dim(),
                    hy.value_heads,
                    hy.conv_kernel,
                );
                put(
                    format!("blk.{i}.attn_qkv.weight"),
                    vec![cd, h],
                    2.0 * s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.attn_gate.weight"),
                    vec![vd, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ssm_beta.weight"),
                    vec![nv, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ssm_alpha.weight"),
                    vec![nv, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ssm_conv1d.weight"),
                    vec![cd, k],
                    0.5,
                    0.0,
                    &mut rng,
                );
                put(format!("blk.{i}.ssm_dt.bias"), vec![nv], 0.5, 0.0, &mut rng);
                put(format!("blk.{i}.ssm_a"), vec![nv], 0.5, 1.0, &mut rng);
                put(
                    format!("blk.{i}.ssm_norm.weight"),
                    vec![hy.value_head_dim],
                    0.2,
                    1.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ssm_out.weight"),
                    vec![h, vd],
                    s(vd),
                    0.0,
                    &mut rng,
                );
            }
            None => {
                put(
                    format!("blk.{i}.attn_q.weight"),
                    // With an output gate each head's query rows, then its gate rows.
                    vec![q * (1 + c.arch.has_attention_gate() as usize), h],
                    2.0 * s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.attn_k.weight"),
                    vec![kv, h],
                    2.0 * s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.attn_v.weight"),
                    vec![kv, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.attn_output.weight"),
                    vec![h, q],
                    s(q),
                    0.0,
                    &mut rng,
                );
            }
        }
        match c.moe.as_ref().filter(|m| m.is_sparse(i)) {
            Some(m) => {
                let (e, eff) = (m.num_experts, m.expert_intermediate_size);
                put(
                    format!("blk.{i}.ffn_gate_inp.weight"),
                    vec![e, h],
                    2.0 * s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ffn_gate_exps.weight"),
                    vec![e, eff, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ffn_up_exps.weight"),
                    vec![e, eff, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ffn_down_exps.weight"),
                    vec![e, h, eff],
                    s(eff),
                    0.0,
                    &mut rng,
                );
            }
            None => {
                put(
                    format!("blk.{i}.ffn_gate.weight"),
                    vec![ff, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ffn_up.weight"),
                    vec![ff, h],
                    s(h),
                    0.0,
                    &mut rng,
                );
                put(
                    format!("blk.{i}.ffn_down.weight"),
                    vec![h, ff],
                    s(ff),
                    0.0,
                    &mut rng,
                );
            }
        }
        if c.qkv_bias {
            put(format!("blk.{i}.attn_q.bias"), vec![q], 0.3, 0.0, &mut rng);
            put(format!("blk.{i}.attn_k.bias"), vec![kv], 0.3, 0.0, &mut rng);
            put(format!("blk.{i}.attn_v.bias"), vec![kv], 0.3, 0.0, &mut rng);
        }
        if c.qk_norm && !c.hybrid.as_ref().is_some_and(|hy| hy.is_linear(i)) {
            put(
                format!("blk.{i}.attn_q_norm.weight"),
                vec![c.head_dim],
                0.2,
                1.0,
                &mut rng,
            );
            put(
                format!("blk.{i}.attn_k_norm.weight"),
                vec![c.head_dim],
                0.2,
                1.0,
                &mut rng,
            );
        }
    }
    w
}

/// The row permutation llama.cpp's converter applies to Q/K of llama models so that
/// interleaved RoPE equals Hugging Face's rotate-half RoPE.
pub fn permute_qk(x: &[f32], rows: usize, cols: usize, n_heads: usize) -> Vec<f32> {
    let hd = rows / n_heads;
    let mut out = vec![0f32; x.len()];
    for h in 0..n_heads {
        for i in 0..hd / 2 {
            for (dst, src) in [(2 * i, i), (2 * i + 1, i + hd / 2)] {
                let (d, s) = (h * hd + dst, h * hd + src);
                out[d * cols..(d + 1) * cols].copy_from_slice(&x[s * cols..(s + 1) * cols]);
            }
        }
    }
    out
}

fn encode_ggml(t: GgmlType, x: &[f32]) -> Vec<u8> {
    match t {
        GgmlType::F32 => quantize::f32s(x),
        GgmlType::F16 => quantize::f16s(x),
        GgmlType::Q8_0 => quantize::q8_0(x),
        GgmlType::Q4_0 => quantize::q4_0(x),
        GgmlType::Q4_1 => quantize::q4_1(x),
        other => panic!("test helper cannot write {other:?}"),
    }
}

/// llama.cpp's name of an architecture.
fn arch_name(a: Arch) -> &'static str {
    match a {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
        Arch::Qwen3 => "qwen3",
        Arch::Qwen3Moe => "qwen3moe",
        Arch::Qwen35 => "qwen35",
        Arch::Qwen35Moe => "qwen35moe",
    }
}

/// transformers' class of an architecture.
fn hf_class(a: Arch) -> &'static str {
    match a {
        Arch::Llama => "LlamaForCausalLM",
        Arch::Qwen2 => "Qwen2ForCausalLM",
        Arch::Qwen3 => "Qwen3ForCausalLM",
        Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
        Arch::Qwen35 => "Qwen3_5ForCausalLM",
        Arch::Qwen35Moe => "Qwen3_5MoeForCausalLM",
    }
}

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
fn hf_tensors(gguf: &str, shape: &[usize], v: &[f32]) -> Vec<(String, Vec<usize>, Vec<f32>)> {
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

/// A Qwen3-shaped tiny target with enough layers for the default tap formula.
pub fn tiny_drafter_target() -> ModelConfig {
    ModelConfig {
        num_layers: 6,
        ..tiny_config(Arch::Qwen3)
    }
}

/// A real model of scripts/fetch-models.sh in the cache (`$DFLASH_CACHE`, else
/// `~/.cache/dflash`), for the tests that use one: `None` (the test skips) when it is
/// missing, a panic when DFLASH_REQUIRE_MODELS=1 (CI) requires it.
pub fn cached_model(file: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let cache = std::env::var("DFLASH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/dflash")
        });
    let p = cache.join("models").join(file);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("DFLASH_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!("{} is missing: run scripts/fetch-models.sh", p.display());
    }
    eprintln!(
        "skipping: {} not found (run scripts/fetch-models.sh)",
        p.display()
    );
    None
}

/// z-lab's reference fixtures (`fixtures/zlab/`, written by
/// `scripts/make_zlab_fixtures.py`): the folder, its cases, their JSON and token ids.
#[cfg(not(target_arch = "wasm32"))]
pub mod zlab {
    use serde_json::Value;
    use std::path::{Path, PathBuf};

    pub fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/zlab")
    }

    /// Every case folder (one with a `reference.json`), sorted.
    pub fn cases() -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(root())
            .expect("fixtures/zlab")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("reference.json").exists())
            .collect();
        v.sort();
        assert!(!v.is_empty(), "no fixtures in fixtures/zlab");
        v
    }

    pub fn json(p: &Path) -> Value {
        serde_json::from_str(&std::fs::read_to_string(p).expect("a fixture file")).expect("JSON")
    }

    /// A JSON array of token ids.
    pub fn ids(v: &Value) -> Vec<u32> {
        v.as_array()
            .expect("an array of ids")
            .iter()
            .map(|x| x.as_u64().expect("an id") as u32)
            .collect()
    }
}

/// Output values of this host's packed CPU kernels (`cpu::packed`: each of AVX-VNNI,
/// AVX-512 VNNI at 256 and 512 bits this CPU runs, forced in turn; SIMD128 in wasm) whose
/// bits differ from the scalar definition's (and packed words, scales and mins that do
/// not come back unchanged), and how many were compared: random Q4 and Q8 matrices of 1
/// to 300 rows (partial last blocks) and 1 to 48 groups (a tail past the 8
/// accumulators), against 1 to 64 activation rows (partial passes of 4 and 8).
pub fn packed_kernel_mismatches() -> (usize, usize, Vec<&'static str>) {
    use crate::cpu::packed::{packed_kernel, PackedMatrix};
    use crate::cpu::quant_matmul::{quant_matmul, Kernel, QuantizedRows};
    use crate::quant::{QFormat, QuantMatrix};
    let kernels: Vec<Kernel> = Kernel::available()
        .into_iter()
        .filter(|&k| packed_kernel(k))
        .collect();
    let mut rng = Rng(17);
    let (mut bad, mut all) = (0, 0);
    use crate::synthetic::MatrixShape;
    use crate::synthetic_weights::{HostTensors, TensorMaker};
    // Rows past and short of a block (padding rows), one group to 96 per row; Q8 in
    // groups of 32 and of 16 (Q6_K's repacking, packed natively only).
    let shapes = [(1, 32), (8, 96), (13, 576), (300, 576), (9, 1536)];
    for (format, group) in [(QFormat::Q4, 32), (QFormat::Q8, 32), (QFormat::Q8, 16)] {
        for (rows, cols) in shapes {
            let w = rng.vec(rows * cols, 0.5);
            let m = match (format, group) {
                (QFormat::Q4, _) => QuantMatrix::quantize_q4(&w, rows, cols),
                (_, 32) => QuantMatrix::quantize_q8(&w, rows, cols),
                _ => {
                    let shape = MatrixShape {
                        rows,
                        cols,
                        format,
                        group,
                        parts: 1,
                    };
                    HostTensors(Rng(rows as u64))
                        .matrix("q8/16", &shape)
                        .expect("q8")
                }
            };
            let Some(p) = PackedMatrix::from_quant(&m) else {
                assert!(
                    group == 16 && cfg!(target_arch = "wasm32"),
                    "q{} groups of {group} pack",
                    format.bits()
                );
                continue;
            };
            // The rows come back as they went in (embedding lookups, draft heads).
            let ids: Vec<u32> = (0..rows as u32).collect();
            let back = p.quant_rows(&ids);
            all += m.qs.len() + m.scales.len() + m.mins.len();
            bad += (back.qs.iter().zip(&m.qs).filter(|(a, b)| a != b).count())
                + (back
                    .scales
                    .iter()
                    .zip(&m.scales)
                    .filter(|(a, b)| a != b)
                    .count())
                + (back
                    .mins
                    .iter()
                    .zip(&m.mins)
                    .filter(|(a, b)| a != b)
                    .count());
            for n in [1, 2, 3, 5, 9, 16, 17, 64] {
                let x = QuantizedRows::new(&rng.vec(n * cols, 3.0), n, cols, format, group);
                let scalar = quant_matmul(&m, &x, Kernel::Scalar);
                for &k in &kernels {
                    let packed = p.matmul_with(k, &x);
                    assert_eq!(packed.len(), scalar.len());
                    all += scalar.len();
                    bad += packed
                        .iter()
                        .zip(&scalar)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                }
            }
        }
    }
    (bad, all, kernels.iter().map(|k| k.name()).collect())
}
