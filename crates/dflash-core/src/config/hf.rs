//! A model's hyper-parameters from a Hugging Face `config.json`: the file's schema as
//! written (transformers 4 and 5 field names) and its reading into `ModelConfig`.

use super::*;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

impl ModelConfig {
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
