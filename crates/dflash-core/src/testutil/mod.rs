//! Test helpers: tiny synthetic models written in the real formats (GGUF files and
//! Hugging Face folders), a tiny byte-level BPE vocabulary, and a seeded generator.
//! Used by the tests of every crate; small enough to build everywhere.

use crate::config::{Arch, ModelConfig, MoeConfig, Rope, RopeStyle};
use crate::formats::ggml::{quantize, GgmlType};
use std::collections::BTreeMap;

mod gguf;
mod hf;
pub use gguf::*;
pub use hf::*;

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

/// A ChatML template that renders tools and tool calls in the Hermes format (as Qwen's
/// do, in fewer words; the tools by name only, to fit the tiny models' context): tools
/// in the system turn, an assistant's calls as
/// `<tool_call>` blocks with the arguments as JSON, a tool's answer as
/// `<tool_response>` in a user turn.
pub const HERMES_TOOLS_TEMPLATE: &str = "{%- if tools %}<|im_start|>system\nTools:\n{%- for tool in tools %} {{ tool.function.name }}{%- endfor %}\nCall one as <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call><|im_end|>\n{% endif %}{%- for message in messages %}{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant{%- for call in message.tool_calls %}\n<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

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
    // groups of 32 and of 16 (Q6_K's repacking).
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
            let p = PackedMatrix::from_quant(&m)
                .unwrap_or_else(|| panic!("q{} groups of {group} pack", format.bits()));
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
            // Every tile height (1 to 8 rows), and passes of several tiles.
            for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64] {
                let x = QuantizedRows::new(&rng.vec(n * cols, 3.0), n, cols, format, group);
                let scalar = quant_matmul(&m, &x, Kernel::Scalar);
                for &k in &kernels {
                    let packed = p.matmul_with(k, &x);
                    assert_eq!(packed.len(), scalar.len());
                    all += scalar.len();
                    bad += bit_mismatches(&packed, &scalar);
                }
            }
        }
    }
    (bad, all, kernels.iter().map(|k| k.name()).collect())
}

/// Output values of this host's unpacked CPU kernels (`quant_matmul`'s row kernels: what
/// matrices that do not pack run, K-quant models' in the browser among them; each kernel
/// this host runs, forced in turn: AVX2, AVX-VNNI and AVX-512 VNNI natively, SIMD128 in
/// wasm) whose bits differ from the scalar definition's, how many were compared, and the
/// kernels compared: Q4 and Q8 in groups of 32, Q8 in groups of 16 (Q6_K's), 1 to 300
/// rows, 1 to 48 groups, against 1 to 17 activation rows.
pub fn unpacked_kernel_mismatches() -> (usize, usize, Vec<&'static str>) {
    use crate::cpu::quant_matmul::{quant_matmul, Kernel, QuantizedRows};
    use crate::quant::{QFormat, QuantMatrix};
    use crate::synthetic::MatrixShape;
    use crate::synthetic_weights::{HostTensors, TensorMaker};
    let kernels: Vec<Kernel> = Kernel::available()
        .into_iter()
        .filter(|&k| k != Kernel::Scalar)
        .collect();
    let mut rng = Rng(23);
    let (mut bad, mut all) = (0, 0);
    for (format, group) in [(QFormat::Q4, 32), (QFormat::Q8, 32), (QFormat::Q8, 16)] {
        for (rows, cols) in [(1, 32), (7, 96), (300, 576), (5, 1536)] {
            let m = match (format, group) {
                (QFormat::Q4, _) => {
                    QuantMatrix::quantize_q4(&rng.vec(rows * cols, 0.5), rows, cols)
                }
                (_, 32) => QuantMatrix::quantize_q8(&rng.vec(rows * cols, 0.5), rows, cols),
                _ => {
                    let parts = 1;
                    let shape = MatrixShape {
                        rows,
                        cols,
                        format,
                        group,
                        parts,
                    };
                    HostTensors(Rng(rows as u64))
                        .matrix("q8/16", &shape)
                        .expect("q8")
                }
            };
            for n in [1, 2, 3, 4, 5, 8, 9, 17] {
                let x = QuantizedRows::new(&rng.vec(n * cols, 3.0), n, cols, format, group);
                let scalar = quant_matmul(&m, &x, Kernel::Scalar);
                for &k in &kernels {
                    let fast = quant_matmul(&m, &x, k);
                    all += scalar.len();
                    bad += bit_mismatches(&fast, &scalar);
                }
            }
        }
    }
    (bad, all, kernels.iter().map(|k| k.name()).collect())
}

/// Values whose bits differ (a length difference counts as all of the longer's tail).
pub fn bit_mismatches(a: &[f32], b: &[f32]) -> usize {
    let differ = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    differ + a.len().abs_diff(b.len())
}

/// Panics unless every kernel `DFLASH_REQUIRE_KERNELS` names (comma-separated: what CI
/// knows its host runs) is among `ran`: a kernel test must not pass because detection
/// left a kernel out.
pub fn require_kernels(ran: &[&str]) {
    let Ok(required) = std::env::var("DFLASH_REQUIRE_KERNELS") else {
        return;
    };
    for k in required.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        assert!(
            ran.contains(&k),
            "{k} is required (DFLASH_REQUIRE_KERNELS) but did not run: {ran:?}"
        );
    }
}

/// The grammars the constrained-decoding tests run: a JSON schema bounded so that a
/// random model ends it, a regex, a Lark grammar, and any JSON object.
pub fn grammar_specs() -> Vec<crate::grammar::GrammarSpec> {
    use crate::grammar::GrammarSpec;
    vec![
        GrammarSpec::JsonSchema {
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 6},
                    "n": {"type": "integer", "minimum": 0, "maximum": 999},
                    "ok": {"type": "boolean"}
                },
                "required": ["name", "n", "ok"],
                "additionalProperties": false
            }),
            strict: true,
        },
        GrammarSpec::Regex("(ab|cd|the)+ [0-9]{2,4}".into()),
        GrammarSpec::Lark("start: \"[\" item (\", \" item)* \"]\"\nitem: /[a-z]{1,3}/".into()),
        GrammarSpec::JsonObject,
    ]
}

/// Greedy and two seeded samplers (top-p, top-k): what lossless tests run.
pub fn lossless_samplings() -> Vec<crate::sampling::SamplingParams> {
    use crate::sampling::SamplingParams;
    vec![
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 11,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 20,
            seed: 12,
            ..Default::default()
        },
    ]
}
