//! Model hyper-parameters of the supported decoder architectures, read from GGUF
//! metadata or a Hugging Face `config.json`.

use crate::error::{Error, Result};
use crate::formats::gguf::GgufHeader;
use serde::{Deserialize, Serialize};

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
                        let freq = (self.theta as f64).powf(-2.0 * i as f64 / self.dim as f64);
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
                let f = (self.theta as f64).powf(-2.0 * i as f64 / self.dim as f64);
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

    /// From a Hugging Face `config.json` (a multimodal checkpoint's `text_config`: the
    /// vision tower is not loaded).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::BadConfig(format!("config.json: {e}")))?;
        let mut v = match v.get("text_config") {
            Some(t) if t.is_object() => {
                let mut t = t.clone();
                // Fields a multimodal config keeps at its top level.
                for key in ["tie_word_embeddings", "architectures"] {
                    if let (Some(x), None) = (v.get(key), t.get(key)) {
                        t[key] = x.clone();
                    }
                }
                t
            }
            _ => v,
        };
        if let Some(o) = v.as_object_mut() {
            o.remove("text_config");
        }
        let c: HfConfig =
            serde_json::from_value(v).map_err(|e| Error::BadConfig(format!("config.json: {e}")))?;
        let arch_name = c
            .model_type
            .clone()
            .or_else(|| c.architectures.as_ref().and_then(|a| a.first().cloned()))
            .ok_or_else(|| {
                Error::BadConfig("config.json has neither model_type nor architectures".into())
            })?;
        let arch = Arch::parse(&arch_name)?;
        let heads = c.num_attention_heads;
        if heads == 0 {
            return Err(Error::BadConfig("zero attention heads".into()));
        }
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / heads);
        let rope_dim = (head_dim as f64 * c.rope.rotary_fraction()) as usize;
        let rope = c.rope.settings(rope_dim)?;
        let cfg = ModelConfig {
            arch,
            hidden_size: c.hidden_size,
            intermediate_size: match (c.intermediate_size, &c.moe) {
                (Some(i), _) => i,
                (None, m) if arch.has_experts() => m
                    .shared_expert_intermediate_size
                    .or(m.moe_intermediate_size)
                    .unwrap_or(0),
                (None, _) => {
                    return Err(Error::BadConfig(
                        "config.json: missing field `intermediate_size`".into(),
                    ))
                }
            },
            num_layers: c.num_hidden_layers,
            num_heads: heads,
            num_kv_heads: c.num_key_value_heads.unwrap_or(heads),
            head_dim,
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope,
            max_position_embeddings: c.max_position_embeddings.unwrap_or(4096),
            qkv_bias: c.attention_bias.unwrap_or(arch == Arch::Qwen2),
            qk_norm: arch.has_qk_norm(),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            moe: c.moe.settings(arch, c.num_hidden_layers)?,
            hybrid: c.linear.settings(arch, c.num_hidden_layers)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The RoPE fields of a Hugging Face `config.json` as written, shared by the target's
/// and the drafter's schema: transformers 4's top-level `rope_theta` / `rope_scaling`,
/// transformers 5's `rope_parameters`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HfRope {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    /// Written as `null` when absent, as transformers writes it.
    pub rope_scaling: Option<HfRopeScaling>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<HfRopeParameters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HfRopeScaling {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<f64>,
}

/// Transformers 5's `rope_parameters`: the theta beside the scaling fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HfRopeParameters {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    #[serde(flatten)]
    pub scaling: HfRopeScaling,
}

impl HfRope {
    /// The written form of `rope` (NEOX pairing; `Factors` have no config.json form and
    /// are left out).
    pub fn from_settings(rope: &Rope) -> Self {
        let rope_scaling = match &rope.scaling {
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => Some(HfRopeScaling {
                rope_type: Some("llama3".into()),
                factor: Some(*factor),
                low_freq_factor: Some(*low_freq_factor),
                high_freq_factor: Some(*high_freq_factor),
                original_max_position_embeddings: Some(*original_max_position_embeddings),
                ..HfRopeScaling::default()
            }),
            RopeScaling::None | RopeScaling::Factors(_) => None,
        };
        HfRope {
            rope_theta: Some(rope.theta),
            rope_scaling,
            ..HfRope::default()
        }
    }

    /// The fraction of each head that RoPE rotates (`partial_rotary_factor`), 1 when absent.
    pub fn rotary_fraction(&self) -> f64 {
        self.partial_rotary_factor
            .or(self
                .rope_parameters
                .as_ref()
                .and_then(|r| r.partial_rotary_factor))
            .unwrap_or(1.0)
    }

    /// The settings over `dim` rotated dimensions (NEOX pairing). Either way of writing
    /// RoPE is read; both with different values is an error rather than a guess.
    pub fn settings(&self, dim: usize) -> Result<Rope> {
        let rp = self.rope_parameters.as_ref();
        let theta = match (self.rope_theta, rp.and_then(|r| r.rope_theta)) {
            (Some(a), Some(b)) if a != b => {
                return Err(Error::BadConfig(format!(
                    "rope_theta {a} at the top level but {b} in rope_parameters"
                )))
            }
            (a, b) => a.or(b).unwrap_or(10000.0),
        };
        if self.rope_scaling.is_some()
            && rp.is_some_and(|r| {
                r.scaling
                    .rope_type
                    .as_deref()
                    .is_some_and(|t| t != "default")
            })
        {
            return Err(Error::BadConfig(
                "both rope_scaling and a scaled rope_parameters".into(),
            ));
        }
        let mut rope = Rope::plain(theta, RopeStyle::Neox, dim);
        if let Some(rs) = self.rope_scaling.as_ref().or(rp.map(|r| &r.scaling)) {
            let kind = rs
                .rope_type
                .as_deref()
                .or(rs.kind.as_deref())
                .unwrap_or("default");
            match kind {
                "default" => {}
                "llama3" => {
                    let need = |v: Option<f64>, n: &str| {
                        v.ok_or_else(|| Error::BadConfig(format!("llama3 rope_scaling needs {n}")))
                    };
                    rope.scaling = RopeScaling::Llama3 {
                        factor: need(rs.factor, "factor")?,
                        low_freq_factor: need(rs.low_freq_factor, "low_freq_factor")?,
                        high_freq_factor: need(rs.high_freq_factor, "high_freq_factor")?,
                        original_max_position_embeddings: need(
                            rs.original_max_position_embeddings,
                            "original_max_position_embeddings",
                        )?,
                    };
                    rope.check_scaling().map_err(Error::BadConfig)?;
                }
                other => {
                    return Err(Error::BadConfig(format!(
                        "rope_scaling type {other:?} is not supported"
                    )))
                }
            }
        }
        Ok(rope)
    }
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    hidden_size: usize,
    /// Absent where every layer is a mixture (Qwen3.5-MoE).
    intermediate_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f32>,
    #[serde(flatten)]
    rope: HfRope,
    max_position_embeddings: Option<usize>,
    attention_bias: Option<bool>,
    tie_word_embeddings: Option<bool>,
    #[serde(flatten)]
    moe: HfMoe,
    #[serde(flatten)]
    linear: HfLinear,
}

/// The linear-attention fields of a Hugging Face `config.json` (qwen3_5).
#[derive(Debug, Default, Deserialize)]
struct HfLinear {
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
}

impl HfLinear {
    fn settings(&self, arch: Arch, num_layers: usize) -> Result<Option<HybridConfig>> {
        if !arch.is_hybrid() {
            return Ok(None);
        }
        let need = |v: Option<usize>, n: &str| {
            v.ok_or_else(|| Error::BadConfig(format!("a qwen3_5 config.json needs {n}")))
        };
        let linear_layers = match &self.layer_types {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "linear_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(Error::BadConfig(format!("layer_types: unknown {other:?}"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => {
                let every = self.full_attention_interval.unwrap_or(4).max(1);
                (0..num_layers).map(|i| (i + 1) % every != 0).collect()
            }
        };
        Ok(Some(HybridConfig {
            linear_layers,
            conv_kernel: need(self.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
            key_heads: need(self.linear_num_key_heads, "linear_num_key_heads")?,
            value_heads: need(self.linear_num_value_heads, "linear_num_value_heads")?,
            key_head_dim: need(self.linear_key_head_dim, "linear_key_head_dim")?,
            value_head_dim: need(self.linear_value_head_dim, "linear_value_head_dim")?,
            tiled_value_heads: false,
        }))
    }
}

/// The mixture-of-experts fields of a Hugging Face `config.json` (qwen3_moe).
#[derive(Debug, Default, Deserialize)]
struct HfMoe {
    /// transformers 4 writes `num_experts`, 5 `num_local_experts`.
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    shared_expert_intermediate_size: Option<usize>,
}

impl HfMoe {
    fn settings(&self, arch: Arch, num_layers: usize) -> Result<Option<MoeConfig>> {
        if !arch.has_experts() {
            return Ok(None);
        }
        let need = |v: Option<usize>, n: &str| {
            v.ok_or_else(|| {
                Error::BadConfig(format!("a {} config.json needs {n}", arch.model_type()))
            })
        };
        let num_experts = need(self.num_experts.or(self.num_local_experts), "num_experts")?;
        let step = self.decoder_sparse_step.unwrap_or(1);
        if step == 0 {
            return Err(Error::BadConfig("decoder_sparse_step 0".into()));
        }
        let dense = self.mlp_only_layers.clone().unwrap_or_default();
        if let Some(&l) = dense.iter().find(|&&l| l >= num_layers) {
            return Err(Error::BadConfig(format!(
                "mlp_only_layers names layer {l} of {num_layers}"
            )));
        }
        Ok(Some(MoeConfig {
            num_experts,
            experts_per_token: need(self.num_experts_per_tok, "num_experts_per_tok")?,
            expert_intermediate_size: need(self.moe_intermediate_size, "moe_intermediate_size")?,
            // Qwen3.5-MoE's router always renormalises (no field in its config).
            norm_topk_prob: self.norm_topk_prob.unwrap_or(arch == Arch::Qwen35Moe),
            shared_expert_intermediate_size: self.shared_expert_intermediate_size,
            sparse_layers: (0..num_layers)
                .map(|i| !dense.contains(&i) && (i + 1) % step == 0)
                .collect(),
        }))
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
