//! Model hyper-parameters of the supported decoder architectures, read from GGUF
//! metadata or a Hugging Face `config.json`.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

mod gguf;
mod hf;
pub use hf::{HfRope, HfRopeParameters, HfRopeScaling};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with a mixture-of-experts feed-forward (`ModelConfig::moe`).
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    /// Qwen3.5's text model: Gated DeltaNet layers between gated full-attention ones
    /// (`ModelConfig::hybrid`), zero-centred RMSNorm weights (stored as `1 + w` once
    /// loaded), an output gate on attention.
    #[serde(rename = "qwen3_5")]
    Qwen35,
    /// Qwen3.5's hybrid layers with a mixture of experts (and a shared expert) in every
    /// layer.
    #[serde(rename = "qwen3_5_moe")]
    Qwen35Moe,
}

impl Arch {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "llama" | "LlamaForCausalLM" => Arch::Llama,
            "qwen2" | "Qwen2ForCausalLM" => Arch::Qwen2,
            "qwen3" | "Qwen3ForCausalLM" => Arch::Qwen3,
            "qwen3moe" | "qwen3_moe" | "Qwen3MoeForCausalLM" => Arch::Qwen3Moe,
            "qwen3_5"
            | "qwen3_5_text"
            | "qwen35"
            | "Qwen3_5ForCausalLM"
            | "Qwen3_5ForConditionalGeneration" => Arch::Qwen35,
            "qwen3_5_moe"
            | "qwen3_5_moe_text"
            | "qwen35moe"
            | "Qwen3_5MoeForCausalLM"
            | "Qwen3_5MoeForConditionalGeneration" => Arch::Qwen35Moe,
            other => return Err(Error::UnsupportedArchitecture(other.into())),
        })
    }

    /// The name `config.json`'s `model_type` gives it.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen35 => "qwen3_5_text",
            Arch::Qwen35Moe => "qwen3_5_moe_text",
        }
    }

    /// Per-head RMSNorm of q and k (Qwen3's attention).
    pub fn has_qk_norm(self) -> bool {
        matches!(
            self,
            Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe
        )
    }

    /// Experts in the feed-forward (`ModelConfig::moe`).
    pub fn has_experts(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Qwen35Moe)
    }

    /// Qwen3.5's hybrid layers (`ModelConfig::hybrid`).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }

    /// Attention's output multiplied by `sigmoid(gate)`, the gate computed by q_proj
    /// beside each head's query (Qwen3.5).
    pub fn has_attention_gate(self) -> bool {
        self.is_hybrid()
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): ggml's "normal" rope, used by llama GGUF files whose Q/K rows
    /// were permuted by the converter.
    Interleaved,
    /// Pairs (i, i + d/2): `rotate_half` of Hugging Face, ggml's NEOX rope.
    Neox,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope: Rope,
    pub max_position_embeddings: usize,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    /// The mixture-of-experts feed-forward of a sparse model (None: every layer dense).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
    /// The Gated DeltaNet layers of a hybrid model (None: every layer attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridConfig>,
}

/// The linear-attention layers of a hybrid model as transformers' `Qwen3_5GatedDeltaNet`
/// defines them: q, k, v projected together and passed through a depthwise causal
/// convolution of `conv_kernel` taps and SiLU; per value head a `key_head_dim x
/// value_head_dim` state, decayed by `exp(g)` and updated by the delta rule with
/// strength `beta`; the read-out RMS-normalised and gated by `silu(z)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HybridConfig {
    /// Per layer: Gated DeltaNet (`linear_attention`), else full attention.
    pub linear_layers: Vec<bool>,
    pub conv_kernel: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    /// The value heads in llama.cpp's tiled order (head h reads key head h mod
    /// key_heads; its converter reorders them so); else grouped by key head as
    /// transformers keeps them (head h reads key head h / (value_heads / key_heads)).
    #[serde(default)]
    pub tiled_value_heads: bool,
}

impl HybridConfig {
    /// The key head value head `h` reads.
    pub fn key_head_of(&self, h: usize) -> usize {
        match self.tiled_value_heads {
            true => h % self.key_heads,
            false => h / (self.value_heads / self.key_heads),
        }
    }
    pub fn is_linear(&self, layer: usize) -> bool {
        self.linear_layers.get(layer).copied().unwrap_or(false)
    }
    pub fn key_dim(&self) -> usize {
        self.key_heads * self.key_head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }
    /// Channels of the convolution: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Floats of one layer's recurrent state (all value heads).
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_head_dim * self.value_head_dim
    }

    fn validate(&self, num_layers: usize) -> Result<()> {
        let bad = |m: String| Err(Error::BadConfig(m));
        if self.linear_layers.len() != num_layers {
            return bad(format!(
                "layer_types has {} entries for num_hidden_layers {}",
                self.linear_layers.len(),
                num_layers
            ));
        }
        if [
            self.conv_kernel,
            self.key_heads,
            self.key_head_dim,
            self.value_head_dim,
        ]
        .contains(&0)
            || self.value_heads == 0
            || !self.value_heads.is_multiple_of(self.key_heads)
        {
            return bad(format!(
                "linear attention: {} value heads over {} key heads, head dims {}/{}, kernel {}",
                self.value_heads,
                self.key_heads,
                self.key_head_dim,
                self.value_head_dim,
                self.conv_kernel
            ));
        }
        crate::check_limit!("linear_num_value_heads", self.value_heads, MAX_HEADS);
        crate::check_limit!("linear_key_head_dim", self.key_head_dim, MAX_HEAD_DIM);
        crate::check_limit!("linear_value_head_dim", self.value_head_dim, MAX_HEAD_DIM);
        crate::check_limit!("linear_conv_kernel_dim", self.conv_kernel, MAX_HEAD_DIM);
        Ok(())
    }
}

/// A mixture-of-experts feed-forward as transformers' `Qwen3MoeSparseMoeBlock` defines
/// it: a router (`[num_experts, hidden]`) scores every expert, the softmax of the scores
/// picks the `experts_per_token` most probable (ties to the lower index), their
/// probabilities (renormalised to sum 1 when `norm_topk_prob`) weigh the experts'
/// SwiGLU outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    /// Each expert's intermediate size (`moe_intermediate_size`).
    pub expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    /// A shared expert beside the routed ones (Qwen3.5-MoE), of this intermediate size,
    /// its output weighed by `sigmoid(shared_expert_gate x)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_intermediate_size: Option<usize>,
    /// Per layer: sparse (the mixture) or dense (`intermediate_size`), as
    /// `decoder_sparse_step` and `mlp_only_layers` (or a GGUF's router tensors) say.
    pub sparse_layers: Vec<bool>,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }

    fn validate(&self, num_layers: usize) -> Result<()> {
        let bad = |m: String| Err(Error::BadConfig(m));
        if self.num_experts == 0 || self.expert_intermediate_size == 0 {
            return bad("num_experts and moe_intermediate_size must be positive".into());
        }
        if self.experts_per_token == 0 || self.experts_per_token > self.num_experts {
            return bad(format!(
                "num_experts_per_tok {} must be in 1..=num_experts ({})",
                self.experts_per_token, self.num_experts
            ));
        }
        if self.sparse_layers.len() != num_layers {
            return bad(format!(
                "{} sparse-layer flags for num_hidden_layers {}",
                self.sparse_layers.len(),
                num_layers
            ));
        }
        crate::check_limit!("num_experts", self.num_experts, MAX_EXPERTS);
        crate::check_limit!(
            "num_experts_per_tok",
            self.experts_per_token,
            MAX_EXPERTS_PER_TOKEN
        );
        crate::check_limit!(
            "moe_intermediate_size",
            self.expert_intermediate_size,
            MAX_INTERMEDIATE_SIZE
        );
        Ok(())
    }
}

/// The RoPE settings of a target or a drafter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    pub theta: f32,
    pub style: RopeStyle,
    /// Number of rotated dimensions per head (usually `head_dim`).
    pub dim: usize,
    pub scaling: RopeScaling,
}

/// How the frequencies of RoPE are scaled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    None,
    /// transformers' llama3 scaling, with the parameters of `rope_scaling`.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Per-frequency divisors as a file gives them (GGUF's `rope_freqs.weight`),
    /// `dim / 2` values.
    Factors(Vec<f32>),
}

impl Rope {
    /// Unscaled RoPE over `dim` dimensions.
    pub fn plain(theta: f32, style: RopeStyle, dim: usize) -> Self {
        Rope {
            theta,
            style,
            dim,
            scaling: RopeScaling::None,
        }
    }

    /// The per-frequency divisors: `dim / 2` values, or none without scaling.
    pub fn freq_factors(&self) -> Vec<f32> {
        match &self.scaling {
            RopeScaling::None => vec![],
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: old_ctx,
            } => {
                let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
                (0..self.dim / 2)
                    .map(|i| {
                        let freq = crate::math::pow64(
                            self.theta as f64,
                            -2.0 * i as f64 / self.dim as f64,
                        );
                        let wavelen = 2.0 * std::f64::consts::PI / freq;
                        let scaled = if wavelen < high_wavelen {
                            freq
                        } else if wavelen > low_wavelen {
                            freq / factor
                        } else {
                            let smooth = (old_ctx / wavelen - low) / (high - low);
                            (1.0 - smooth) * freq / factor + smooth * freq
                        };
                        (freq / scaled) as f32
                    })
                    .collect()
            }
            RopeScaling::Factors(f) => f.clone(),
        }
    }

    /// Inverse frequencies, `dim / 2` values: `theta^(-2i/d) / factor_i`.
    pub fn inv_freq(&self) -> Vec<f32> {
        let factors = self.freq_factors();
        (0..self.dim / 2)
            .map(|i| {
                let f = crate::math::pow64(self.theta as f64, -2.0 * i as f64 / self.dim as f64);
                let ff = factors.get(i).copied().unwrap_or(1.0) as f64;
                (f / ff) as f32
            })
            .collect()
    }

    /// The scaling's own checks (the theta and the dimensions are the caller's).
    fn check_scaling(&self) -> std::result::Result<(), String> {
        match &self.scaling {
            RopeScaling::None => Ok(()),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                ..
            } => {
                if !(high_freq_factor > low_freq_factor) || !(*factor > 0.0) {
                    return Err(
                        "llama3 rope_scaling needs high_freq_factor > low_freq_factor, factor > 0"
                            .into(),
                    );
                }
                Ok(())
            }
            RopeScaling::Factors(f) if f.len() != self.dim / 2 => Err(format!(
                "{} rope frequency factors for rope_dim {}",
                f.len(),
                self.dim
            )),
            RopeScaling::Factors(_) => Ok(()),
        }
    }
}

impl ModelConfig {
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        self.rope.inv_freq()
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::BadConfig(m));
        if self.hidden_size == 0
            || self.num_layers == 0
            || self.vocab_size == 0
            || self.intermediate_size == 0
        {
            return bad("zero-sized model dimension".into());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "{} heads cannot share {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
            || self.rope.dim > self.head_dim
            || !self.rope.dim.is_multiple_of(2)
        {
            return bad(format!(
                "head_dim {} / rope_dim {}",
                self.head_dim, self.rope.dim
            ));
        }
        if !(self.rms_norm_eps > 0.0) || !(self.rope.theta > 0.0) {
            return bad("rms_norm_eps and rope_theta must be positive".into());
        }
        self.rope.check_scaling().map_err(Error::BadConfig)?;
        match (&self.moe, self.arch) {
            (Some(m), a) if a.has_experts() => m.validate(self.num_layers)?,
            (None, a) if a.has_experts() => {
                return bad(format!("a {} model without experts", a.model_type()))
            }
            (Some(_), _) => return bad(format!("experts in a {:?} model", self.arch)),
            (None, _) => {}
        }
        match (&self.hybrid, self.arch) {
            (Some(h), a) if a.is_hybrid() => h.validate(self.num_layers)?,
            (None, a) if a.is_hybrid() => {
                return bad(format!("a {} model without layer_types", a.model_type()))
            }
            (Some(_), _) => return bad(format!("linear attention in a {:?} model", self.arch)),
            (None, _) => {}
        }
        // Guards against configs that would make us allocate absurd memory.
        crate::check_limit!("hidden_size", self.hidden_size, MAX_HIDDEN_SIZE);
        crate::check_limit!(
            "intermediate_size",
            self.intermediate_size,
            MAX_INTERMEDIATE_SIZE
        );
        crate::check_limit!("num_layers", self.num_layers, MAX_LAYERS);
        crate::check_limit!("num_heads", self.num_heads, MAX_HEADS);
        crate::check_limit!("head_dim", self.head_dim, MAX_HEAD_DIM);
        crate::check_limit!("vocab_size", self.vocab_size, MAX_VOCAB_SIZE);
        crate::check_limit!(
            "max_position_embeddings",
            self.max_position_embeddings,
            MAX_CONTEXT_TOKENS
        );
        Ok(())
    }
}
