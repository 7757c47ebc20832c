//! Named shapes of real models for benchmarks without weights (`dflash bench
//! --synthetic NAME`): the target's hyper-parameters, the weight format of every matrix
//! as a Q4_K_M GGUF stores it (after our repacking), and a drafter of the z-lab shape for
//! that target. The weights themselves are random and made on the device.

use crate::config::{Arch, ModelConfig, Rope, RopeStyle};
use crate::drafter::{DrafterConfig, DrafterPrecision, LayerKind};
use crate::quant::QFormat;

/// Every named shape (`test-tiny` is a small shape for tests).
pub const NAMES: &[&str] = &[
    "smollm2-135m",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "llama-3.1-8b",
    "qwen2.5-32b",
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b",
    "qwen3-coder-30b-a3b",
    "qwen3.5-9b",
    "test-moe-tiny",
    "test-hybrid-tiny",
    "test-tiny",
];

/// A named target shape and its drafter.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub name: String,
    pub config: ModelConfig,
    pub drafter: DrafterConfig,
    /// The drafter drafts among the first N token ids (a draft vocabulary: the lm_head's
    /// N rows gathered beside the whole head); None: among all of them.
    pub draft_vocab: Option<usize>,
    /// The drafter's matrices: 4-bit groups (what a drafter folder loads as by default,
    /// `DrafterPrecision::default()`) or 8-bit (`dflash bench --drafter-precision q8`).
    pub drafter_format: QFormat,
}

/// One weight matrix of a synthetic model: `[rows, cols]` in format `format` with groups
/// of `group` along `cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixShape {
    pub rows: usize,
    pub cols: usize,
    pub format: QFormat,
    pub group: usize,
    /// Matrices of equal rows stacked in this one (a mixture's experts; 1 otherwise),
    /// never split between buffers.
    pub parts: usize,
}

impl MatrixShape {
    /// Bytes on the GPU: values, one f16 scale and one f16 min per group.
    pub fn n_bytes(&self) -> u64 {
        let n = (self.rows * self.cols) as u64;
        n * self.format.bits() as u64 / 8 + 4 * n / self.group as u64
    }
}

/// The matrices of one target layer. In a sparse layer gate, up and down are every
/// expert's stacked (`parts` = the experts) and `router` is set. In a linear-attention
/// layer wq, wk, wv and wo are its input projection of q/k/v, of z, of [b; a], and its
/// output projection; with attention's output gate wq holds the gates' rows too.
#[derive(Debug, Clone, Copy)]
pub struct LayerShapes {
    pub wq: MatrixShape,
    pub wk: MatrixShape,
    pub wv: MatrixShape,
    pub wo: MatrixShape,
    pub w_gate: MatrixShape,
    pub w_up: MatrixShape,
    pub w_down: MatrixShape,
    pub router: Option<MatrixShape>,
}

impl LayerShapes {
    pub fn all(&self) -> Vec<MatrixShape> {
        let mut v = vec![
            self.wq,
            self.wk,
            self.wv,
            self.wo,
            self.w_gate,
            self.w_up,
            self.w_down,
        ];
        v.extend(self.router);
        v
    }
}

/// A ggml type of a Q4_K_M file, as our loader repacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ggml {
    Q4K,
    Q6K,
}

/// llama.cpp's `use_more_bits`: the layers where Q4_K_M keeps attn_v and ffn_down in
/// Q6_K (the first and last eighth, and every third layer between).
fn use_more_bits(i: usize, n: usize) -> bool {
    let lo = n / 8;
    i < lo || i >= 7 * n / 8 || (i - lo) % 3 == 2
}

/// The repacked format of a Q4_K_M tensor with `cols` columns: Q4_K -> q4 (groups of
/// 32), Q6_K -> q8 (groups of 16); a row that is not a whole number of 256-element
/// super-blocks falls back as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0: q8, groups of
/// 32).
fn shape(rows: usize, cols: usize, t: Ggml) -> MatrixShape {
    let (format, group) = match (t, cols.is_multiple_of(256)) {
        (Ggml::Q4K, true) => (QFormat::Q4, 32),
        (Ggml::Q6K, true) => (QFormat::Q8, 16),
        (_, false) => (QFormat::Q8, 32),
    };
    MatrixShape {
        rows,
        cols,
        format,
        group,
        parts: 1,
    }
}

impl SyntheticSpec {
    /// The embedding `[vocab, hidden]`: Q6_K when it is also the output (tied), else Q4_K.
    pub fn embed(&self) -> MatrixShape {
        let c = &self.config;
        let t = if c.tie_word_embeddings {
            Ggml::Q6K
        } else {
            Ggml::Q4K
        };
        shape(c.vocab_size, c.hidden_size, t)
    }

    /// The untied output matrix (Q6_K in Q4_K_M), None when tied.
    pub fn lm_head(&self) -> Option<MatrixShape> {
        let c = &self.config;
        (!c.tie_word_embeddings).then(|| shape(c.vocab_size, c.hidden_size, Ggml::Q6K))
    }

    /// Layer `i`'s matrices: Q4_K, except attn_v and ffn_down in Q6_K on the layers of
    /// `use_more_bits`.
    pub fn layer(&self, i: usize) -> LayerShapes {
        let c = &self.config;
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let more = if use_more_bits(i, c.num_layers) {
            Ggml::Q6K
        } else {
            Ggml::Q4K
        };
        let mut l = LayerShapes {
            wq: shape(q, h, Ggml::Q4K),
            wk: shape(kv, h, Ggml::Q4K),
            wv: shape(kv, h, more),
            wo: shape(h, q, Ggml::Q4K),
            w_gate: shape(ff, h, Ggml::Q4K),
            w_up: shape(ff, h, Ggml::Q4K),
            w_down: shape(h, ff, more),
            router: None,
        };
        if c.arch.has_attention_gate() {
            // q_proj's rows hold each head's query and output gate.
            l.wq = shape(2 * q, h, Ggml::Q4K);
        }
        if let Some(hy) = c.hybrid.as_ref().filter(|hy| hy.is_linear(i)) {
            let nv = hy.value_heads;
            l.wq = shape(hy.conv_dim(), h, Ggml::Q4K);
            l.wk = shape(hy.value_dim(), h, Ggml::Q4K);
            l.wv = MatrixShape {
                format: QFormat::Q8,
                group: 32,
                ..shape(2 * nv, h, Ggml::Q4K)
            };
            l.wo = shape(h, hy.value_dim(), more);
        }
        if let Some(m) = c.moe.as_ref().filter(|m| m.is_sparse(i)) {
            // The router is F32 in the GGUF (q8 once repacked); each projection's
            // experts one 3-D tensor, typed as the dense projection would be.
            let (e, eff) = (m.num_experts, m.expert_intermediate_size);
            let stack = |rows, cols, t| MatrixShape {
                parts: e,
                ..shape(e * rows, cols, t)
            };
            l.router = Some(MatrixShape {
                rows: e,
                cols: h,
                format: QFormat::Q8,
                group: 32,
                parts: 1,
            });
            l.w_gate = stack(eff, h, Ggml::Q4K);
            l.w_up = stack(eff, h, Ggml::Q4K);
            l.w_down = stack(h, eff, more);
        }
        l
    }

    /// Every matrix of the target (embedding, output, layers).
    pub fn target_matrices(&self) -> Vec<MatrixShape> {
        let mut v = vec![self.embed()];
        v.extend(self.lm_head());
        for i in 0..self.config.num_layers {
            v.extend(self.layer(i).all());
        }
        v
    }

    /// Bytes of the target's weights on the GPU (matrices, norms, biases, a linear
    /// layer's convolution and per-head vectors).
    pub fn target_weight_bytes(&self) -> u64 {
        let c = &self.config;
        let attention = if c.qkv_bias {
            c.q_dim() + 2 * c.kv_dim()
        } else {
            0
        } + if c.qk_norm { 2 * c.head_dim } else { 0 };
        let mixer = |i: usize| match c.hybrid.as_ref().filter(|hy| hy.is_linear(i)) {
            Some(hy) => hy.conv_dim() * hy.conv_kernel + 2 * hy.value_heads + hy.value_head_dim,
            None => attention,
        };
        let vectors = c.hidden_size
            + (0..c.num_layers)
                .map(|i| 2 * c.hidden_size + mixer(i))
                .sum::<usize>();
        self.target_matrices()
            .iter()
            .map(MatrixShape::n_bytes)
            .sum::<u64>()
            + 4 * vectors as u64
    }

    /// The drafter's matrices as the bench loads a bf16 z-lab checkpoint: q8 (or the
    /// spec's `drafter_format`), groups of 32. `fc` first, then per layer q, k, v, o,
    /// gate, up, down.
    pub fn drafter_matrices(&self) -> Vec<MatrixShape> {
        let d = &self.drafter;
        let m = |rows, cols| MatrixShape {
            rows,
            cols,
            format: self.drafter_format,
            group: 32,
            parts: 1,
        };
        let (h, q, kv, ff) = (d.hidden_size, d.q_dim(), d.kv_dim(), d.intermediate_size);
        let mut v = vec![m(h, d.n_taps() * h)];
        for _ in 0..d.num_layers {
            v.extend([
                m(q, h),
                m(kv, h),
                m(kv, h),
                m(h, q),
                m(ff, h),
                m(ff, h),
                m(h, ff),
            ]);
        }
        v
    }

    /// Bytes of the drafter's weights on the GPU: matrices and norms, each layer's
    /// `[wk; wv]` again (the context pass's stacked copy), and the rows of its draft
    /// vocabulary's head.
    pub fn drafter_weight_bytes(&self) -> u64 {
        let d = &self.drafter;
        let vectors = 2 * d.hidden_size + d.num_layers * (2 * d.hidden_size + 2 * d.head_dim);
        let matrices = self.drafter_matrices();
        // fc, then per layer q, k, v, o, gate, up, down.
        let context_kv: u64 = matrices[1..]
            .chunks(7)
            .map(|l| l[1].n_bytes() + l[2].n_bytes())
            .sum();
        matrices.iter().map(MatrixShape::n_bytes).sum::<u64>()
            + context_kv
            + 4 * vectors as u64
            + self.draft_vocab.map_or(0, |n| self.draft_head_bytes(n))
    }

    /// Bytes of the output head's rows that a draft vocabulary of `ids` ids gathers, and
    /// of the ids themselves.
    pub fn draft_head_bytes(&self, ids: usize) -> u64 {
        let head = self.lm_head().unwrap_or_else(|| self.embed());
        MatrixShape { rows: ids, ..head }.n_bytes() + 4 * ids as u64
    }
}

/// Hyper-parameters of a target, as its Hugging Face config states them.
struct Target {
    arch: Arch,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    eps: f32,
    theta: f32,
    max_pos: usize,
    tied: bool,
    /// llama3 rope scaling (factor, low, high, original context).
    llama3: Option<(f64, f64, f64, f64)>,
    /// A mixture of experts in every layer: (experts, experts per token, expert
    /// intermediate size).
    moe: Option<(usize, usize, usize)>,
    /// Gated DeltaNet layers, all but every `full_every`-th: (full_every, key heads,
    /// value heads, head dim).
    linear: Option<(usize, usize, usize, usize)>,
}

/// The drafter for a target: layers, mask token id.
struct Drafter {
    layers: usize,
    mask: u32,
}

fn named(name: &str) -> Option<(&'static str, Target, Drafter)> {
    let name = *NAMES.iter().find(|&&n| n == name)?;
    let qwen3 = |hidden, intermediate, layers, heads, kv_heads, tied| Target {
        arch: Arch::Qwen3,
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads,
        head_dim: 128,
        vocab: 151936,
        eps: 1e-6,
        theta: 1e6,
        max_pos: 40960,
        tied,
        llama3: None,
        moe: None,
        linear: None,
    };
    // The small Qwen2.5 models: 2 KV heads, tied embeddings, 32k positions.
    let qwen2 = |hidden, intermediate, layers, heads, head_dim| Target {
        arch: Arch::Qwen2,
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads: 2,
        head_dim,
        vocab: 151936,
        eps: 1e-6,
        theta: 1e6,
        max_pos: 32768,
        tied: true,
        llama3: None,
        moe: None,
        linear: None,
    };
    // Qwen3 drafters' mask token: `<|MASK|>`-style id past the Qwen3 specials (z-lab).
    let qwen_mask = 151669;
    let (t, d) = match name {
        // SmolLM2-135M(-Instruct); the drafter is the shape of the committed
        // drafters/smollm2-135m-instruct-dflash-b16 (3 layers, mask 16).
        "smollm2-135m" => (
            Target {
                arch: Arch::Llama,
                hidden: 576,
                intermediate: 1536,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                vocab: 49152,
                eps: 1e-5,
                theta: 100000.0,
                max_pos: 8192,
                tied: true,
                llama3: None,
                moe: None,
                linear: None,
            },
            Drafter {
                layers: 3,
                mask: 16,
            },
        ),
        "qwen3-0.6b" => (
            qwen3(1024, 3072, 28, 16, 8, true),
            Drafter {
                layers: 1,
                mask: qwen_mask,
            },
        ),
        "qwen3-4b" => (
            qwen3(2560, 9728, 36, 32, 8, true),
            Drafter {
                layers: 5,
                mask: qwen_mask,
            },
        ),
        "qwen3-8b" => (
            qwen3(4096, 12288, 36, 32, 8, false),
            Drafter {
                layers: 5,
                mask: qwen_mask,
            },
        ),
        // Llama-3.1-8B(-Instruct); the drafter's mask is the first reserved special
        // token, <|reserved_special_token_0|>.
        "llama-3.1-8b" => (
            Target {
                arch: Arch::Llama,
                hidden: 4096,
                intermediate: 14336,
                layers: 32,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                vocab: 128256,
                eps: 1e-5,
                theta: 500000.0,
                max_pos: 131072,
                tied: false,
                llama3: Some((8.0, 1.0, 4.0, 8192.0)),
                moe: None,
                linear: None,
            },
            Drafter {
                layers: 5,
                mask: 128002,
            },
        ),
        "qwen2.5-32b" => (
            Target {
                arch: Arch::Qwen2,
                hidden: 5120,
                intermediate: 27648,
                layers: 64,
                heads: 40,
                kv_heads: 8,
                head_dim: 128,
                vocab: 152064,
                eps: 1e-6,
                theta: 1e6,
                max_pos: 32768,
                tied: false,
                llama3: None,
                moe: None,
                linear: None,
            },
            Drafter {
                layers: 5,
                mask: qwen_mask,
            },
        ),
        // Qwen2.5-Coder-0.5B / 1.5B(-Instruct): no published drafter; a 3-layer one of
        // the z-lab shape.
        "qwen2.5-coder-0.5b" => (
            qwen2(896, 4864, 24, 14, 64),
            Drafter {
                layers: 3,
                mask: qwen_mask,
            },
        ),
        "qwen2.5-coder-1.5b" => (
            qwen2(1536, 8960, 28, 12, 128),
            Drafter {
                layers: 3,
                mask: qwen_mask,
            },
        ),
        // Qwen3-Coder-30B-A3B(-Instruct) (Qwen3-30B-A3B's shape): 128 experts, 8 per
        // token, every layer sparse; a 5-layer drafter of the z-lab shape (assumed:
        // the 8B drafters' depth).
        "qwen3-coder-30b-a3b" => (
            Target {
                arch: Arch::Qwen3Moe,
                moe: Some((128, 8, 768)),
                max_pos: 262144,
                ..qwen3(2048, 6144, 48, 32, 4, false)
            },
            Drafter {
                layers: 5,
                mask: qwen_mask,
            },
        ),
        // Qwen3.5-9B's text model (transformers' Qwen3_5TextConfig defaults, which are
        // its shape): 32 layers, every 4th gated full attention (16/4 heads of 256,
        // partial RoPE 1/4), the others Gated DeltaNet (16 key heads, 32 value heads of
        // 128); a 5-layer drafter of the z-lab shape (assumed).
        "qwen3.5-9b" => (
            Target {
                arch: Arch::Qwen35,
                head_dim: 256,
                vocab: 248320,
                max_pos: 262144,
                linear: Some((4, 16, 32, 128)),
                ..qwen3(4096, 12288, 32, 16, 4, false)
            },
            // The mask id: assumed (a reserved special token past Qwen3.5's).
            Drafter {
                layers: 5,
                mask: 248077,
            },
        ),
        // Small enough for tests on a CPU device; Q4_K-sized rows so both formats run.
        "test-tiny" => (
            tiny_target(None),
            Drafter {
                layers: 1,
                mask: 511,
            },
        ),
        "test-moe-tiny" => (
            tiny_target(Some((16, 4, 256))),
            Drafter {
                layers: 1,
                mask: 511,
            },
        ),
        "test-hybrid-tiny" => (
            Target {
                arch: Arch::Qwen35,
                linear: Some((2, 2, 4, 64)),
                ..tiny_target(None)
            },
            Drafter {
                layers: 1,
                mask: 511,
            },
        ),
        _ => return None,
    };
    Some((name, t, d))
}

/// The test shapes' target (a mixture of `moe` experts where given).
fn tiny_target(moe: Option<(usize, usize, usize)>) -> Target {
    Target {
        arch: if moe.is_some() {
            Arch::Qwen3Moe
        } else {
            Arch::Qwen3
        },
        hidden: 256,
        intermediate: 512,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 512,
        eps: 1e-6,
        theta: 1e6,
        max_pos: 4096,
        tied: false,
        llama3: None,
        moe,
        linear: None,
    }
}

/// The named shape, or None for an unknown name (see [`NAMES`]).
/// `n` random token ids below `vocab`: a synthetic model's prompt (the benches', natively
/// and in the browser).
pub fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = crate::rng::Rng(seed ^ 0x1D5_1D5);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

pub fn spec(name: &str) -> Option<SyntheticSpec> {
    let (name, t, d) = named(name)?;
    let mut json = serde_json::json!({
        "model_type": t.arch.model_type(),
        "hidden_size": t.hidden,
        "intermediate_size": t.intermediate,
        "num_hidden_layers": t.layers,
        "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads,
        "head_dim": t.head_dim,
        "vocab_size": t.vocab,
        "rms_norm_eps": t.eps,
        "rope_theta": t.theta,
        "max_position_embeddings": t.max_pos,
        "tie_word_embeddings": t.tied,
    });
    if let Some((experts, k, ff)) = t.moe {
        json["num_experts"] = experts.into();
        json["num_experts_per_tok"] = k.into();
        json["moe_intermediate_size"] = ff.into();
        json["norm_topk_prob"] = true.into();
    }
    if let Some((every, key_heads, value_heads, dim)) = t.linear {
        json["full_attention_interval"] = every.into();
        json["linear_conv_kernel_dim"] = 4.into();
        json["linear_num_key_heads"] = key_heads.into();
        json["linear_num_value_heads"] = value_heads.into();
        json["linear_key_head_dim"] = dim.into();
        json["linear_value_head_dim"] = dim.into();
        json["partial_rotary_factor"] = 0.25.into();
    }
    if let Some((factor, low, high, orig)) = t.llama3 {
        json["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": orig,
        });
    }
    // Through the config parser, as a checkpoint's config.json would be read.
    let mut config = ModelConfig::from_hf_json(&json.to_string()).expect("a valid named shape");
    if t.arch == Arch::Llama {
        // As a GGUF file of a llama model is read (the converter permutes Q/K).
        config.rope.style = RopeStyle::Interleaved;
    }
    let drafter = DrafterConfig {
        hidden_size: config.hidden_size,
        intermediate_size: config.intermediate_size,
        num_layers: d.layers,
        num_heads: config.num_heads,
        num_kv_heads: config.num_kv_heads,
        head_dim: config.head_dim,
        rms_norm_eps: config.rms_norm_eps,
        // The target's theta and scaling, NEOX pairs over whole heads.
        rope: Rope {
            style: RopeStyle::Neox,
            dim: config.head_dim,
            ..config.rope.clone()
        },
        vocab_size: config.vocab_size,
        layer_kinds: vec![LayerKind::Full; d.layers],
        sliding_window: 0,
        is_causal: None,
        input_embedding_scale: 1.0,
        output_multiplier: 1.0,
        final_logit_softcapping: None,
        num_target_layers: config.num_layers,
        block_size: 16,
        mask_token_id: d.mask,
        target_layer_ids: DrafterConfig::default_target_layer_ids(d.layers, config.num_layers),
        architecture: "DFlashDraftModel".into(),
        dflash2: None,
    };
    Some(SyntheticSpec {
        name: name.into(),
        config,
        drafter,
        draft_vocab: None,
        drafter_format: DrafterPrecision::default().matrix_format(),
    })
}

impl SyntheticSpec {
    /// The shape with only its first `n` layers (the drafter tapping them as z-lab's
    /// rule places taps over `n`): a model too large for the device whose per-layer
    /// costs (a verify pass against one row) are what is measured. None when `n` is 0 or
    /// more than the layers.
    pub fn first_layers(&self, n: usize) -> Option<Self> {
        let mut s = self.clone();
        if n == 0 || n > s.config.num_layers {
            return None;
        }
        s.config.num_layers = n;
        if let Some(m) = s.config.moe.as_mut() {
            m.sparse_layers.truncate(n);
        }
        if let Some(h) = s.config.hybrid.as_mut() {
            h.linear_layers.truncate(n);
        }
        s.drafter.num_target_layers = n;
        // The default spread runs from layer 1 to n - 3: below 4 layers it leaves the
        // range, so each tap is kept within the n layers (a cost measurement: which
        // layer a tap reads does not change what it costs).
        s.drafter.target_layer_ids =
            DrafterConfig::default_target_layer_ids(s.drafter.num_layers, n)
                .into_iter()
                .map(|i| i.min(n - 1))
                .collect();
        s.name = format!("{} (first {n} layers)", s.name);
        Some(s)
    }

    /// A target and its drafter read from their `config.json` texts, each checked and
    /// the drafter against the target, their weights in the formats of a Q4_K_M GGUF as
    /// the loader repacks it (what `dflash plan` sizes published pairs by).
    pub fn from_configs(name: &str, target_json: &str, drafter_json: &str) -> crate::Result<Self> {
        let config = ModelConfig::from_hf_json(target_json)?;
        config.validate()?;
        let drafter = DrafterConfig::from_json(drafter_json)?;
        drafter.validate_against(&config)?;
        Ok(SyntheticSpec {
            name: name.into(),
            config,
            drafter,
            draft_vocab: None,
            drafter_format: DrafterPrecision::default().matrix_format(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_is_valid_and_sized_like_its_gguf() {
        for &n in NAMES {
            let s = spec(n).unwrap();
            s.config.validate().unwrap();
            s.drafter.validate_against(&s.config).unwrap();
            for m in s.target_matrices().iter().chain(&s.drafter_matrices()) {
                assert!(m.cols.is_multiple_of(m.group), "{n}: {m:?}");
            }
        }
        assert!(spec("gpt-5").is_none());
        // Weights in GB: the Q4_K_M files' sizes (about 5.0, 4.9, 19.9 GB) grown by repacking:
        // Q4_K's 4.5 bits per weight become q4/32's 5 (an f16 scale and min per 32),
        // Q6_K's 6.56 q8/16's 10.
        let gb = |n: &str| spec(n).unwrap().target_weight_bytes() as f64 / 1e9;
        for (n, lo, hi) in [
            ("smollm2-135m", 0.1, 0.2),
            ("qwen3-8b", 5.5, 6.5),
            ("llama-3.1-8b", 5.5, 6.5),
            ("qwen2.5-32b", 22.0, 25.0),
            // Qwen3-30B-A3B's Q4_K_M file: about 18.6 GB.
            ("qwen3-coder-30b-a3b", 20.0, 24.0),
            // Qwen3.5-9B (248k vocabulary, untied): about 5.7 GB in Q4_K_M.
            ("qwen3.5-9b", 6.0, 8.0),
        ] {
            assert!((lo..hi).contains(&gb(n)), "{n}: {} GB", gb(n));
        }
        let q8 = spec("qwen3-8b").unwrap();
        assert_eq!(q8.drafter.target_layer_ids, [1, 9, 17, 25, 33]);
        assert_eq!(q8.drafter.num_layers, 5);
        assert_eq!(
            spec("smollm2-135m").unwrap().drafter.target_layer_ids,
            [1, 14, 27]
        );
        let l = spec("llama-3.1-8b").unwrap();
        assert_eq!(l.config.rope.freq_factors().len(), 64);
        assert!(spec("qwen2.5-32b").unwrap().config.qkv_bias);
        assert!(spec("qwen3-4b").unwrap().config.qk_norm);
        assert!(spec("qwen3-4b").unwrap().lm_head().is_none());
        let moe = spec("qwen3-coder-30b-a3b").unwrap();
        let m = moe.config.moe.as_ref().unwrap();
        assert_eq!((m.num_experts, m.experts_per_token), (128, 8));
        assert!(m.sparse_layers.iter().all(|&s| s));
        let l0 = moe.layer(0);
        assert_eq!((l0.w_gate.rows, l0.w_gate.parts), (128 * 768, 128));
        assert_eq!(l0.router.map(|r| r.rows), Some(128));
        let two = moe.first_layers(2).unwrap();
        assert_eq!(
            (two.config.num_layers, two.drafter.num_target_layers),
            (2, 2)
        );
        two.config.validate().unwrap();
        two.drafter.validate_against(&two.config).unwrap();
        assert!(moe.first_layers(0).is_none() && moe.first_layers(49).is_none());
        // Every shape cut to 1, 2 or 3 layers still has a drafter that fits its target
        // (the spread's range is below 0 there: a drafter tapping layer 1 of 1 was refused).
        for n in NAMES {
            for cut in (1..=3).filter_map(|layers| spec(n).unwrap().first_layers(layers)) {
                cut.drafter.validate_against(&cut.config).unwrap();
            }
        }
        let hy = spec("qwen3.5-9b").unwrap();
        let h = hy.config.hybrid.as_ref().unwrap();
        assert_eq!(h.linear_layers.iter().filter(|&&l| l).count(), 24);
        assert!(!h.is_linear(3) && h.is_linear(0));
        assert_eq!(hy.config.rope.dim, 64);
        // Layer 0 is linear (q/k/v before the convolution), 3 gated attention.
        assert_eq!(hy.layer(0).wq.rows, 2 * 16 * 128 + 32 * 128);
        assert_eq!(hy.layer(3).wq.rows, 2 * 16 * 256);
    }

    #[test]
    fn q4_k_m_keeps_more_bits_where_llama_cpp_does() {
        let s = spec("qwen3-8b").unwrap();
        let more: Vec<usize> = (0..36)
            .filter(|&i| s.layer(i).wv.format == QFormat::Q8)
            .collect();
        assert_eq!(
            more,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
        );
        assert_eq!(s.layer(4).w_gate.format, QFormat::Q4);
        assert_eq!(s.lm_head().unwrap().group, 16);
        // 576 columns are not whole Q4_K super-blocks: Q5_0 / Q8_0, q8 with groups of 32.
        let sm = spec("smollm2-135m").unwrap();
        assert_eq!(sm.layer(4).wq.format, QFormat::Q8);
        assert_eq!(sm.layer(4).w_down.format, QFormat::Q4);
    }
}
