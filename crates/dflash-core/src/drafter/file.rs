//! The z-lab drafter's `config.json` as written, one schema for the parser, the trainer's
//! exporter and the test helpers: [`DrafterFile`] (the Hugging Face fields of a Qwen3
//! config, the DFlash fields at the top level or in `dflash_config`), checked into a
//! [`DrafterConfig`] by one `TryFrom`, written back from one by `From`.
//!
//! Reading keeps every variant in use: `block_size`, `mask_token_id`, `target_layer_ids`
//! and DFlash2's fields in `dflash_config` or at the top level (`dflash_config` first,
//! `num_target_layers` the top level first), RoPE as `rope_theta` / `rope_scaling` or
//! `rope_parameters`, absent optional fields at their defaults, unknown fields ignored.

use super::config::{DFlash2Config, DrafterConfig, LayerKind};
use crate::config::HfRope;
use crate::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value as Json;

pub use crate::limits::MAX_BLOCK_SIZE;

/// The DFlash fields, as they appear in `dflash_config` or at the top level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DFlashFields {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask_token_id: Option<u32>,
    /// The mask token's text in the target's tokenizer (older SGLang builds resolve the
    /// mask by this string and ignore `mask_token_id`; newer ones check the two agree).
    /// Written by the export; not read here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask_token: Option<String>,
    /// None (or null): the default taps, [`DrafterConfig::default_target_layer_ids`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_layer_ids: Option<Vec<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_target_layers: Option<usize>,
    /// DFlash2: a present `conv_kernel_size` marks a DFlash2 drafter as its architecture does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conv_kernel_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conv_group_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector_rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector_top_k: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_embedding_scale: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_multiplier: Option<f32>,
    /// None: absent; Some(None): written as `null` (no soft-capping either way).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub final_logit_softcapping: Option<Option<f32>>,
}

/// A drafter's `config.json`. Optional fields are left out when None, except
/// `sliding_window` and `rope_scaling`, which transformers writes as `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrafterFile {
    /// The string entries of `architectures` (anything else there is ignored).
    #[serde(default, deserialize_with = "strings")]
    pub architectures: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// None: `hidden_size / num_attention_heads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_dropout: Option<f64>,
    /// None: 1e-6.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rms_norm_eps: Option<f32>,
    #[serde(flatten)]
    pub rope: HfRope,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    pub vocab_size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_cache: Option<bool>,
    /// transformers' Qwen3Config keeps `sliding_window` only when this is true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    /// The window of sliding layers (read only with `use_sliding_window: true`).
    pub sliding_window: Option<usize>,
    /// Without `layer_types`: layers from this index on slide (where there is a window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// "full_attention" / "sliding_attention" per layer; None: by `max_window_layers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Causal attention inside the block on every layer (true) or none (false); None:
    /// sliding layers causal, full layers not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_causal: Option<bool>,
    /// Draft tokens per step for vLLM, which reads it as `num_speculative_tokens` when the
    /// command line gives none (the export writes `block_size - 1`). Not read here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_predict: Option<usize>,
    /// The draft vocabulary's size in its `d2t` form (`draft_vocab.safetensors`: `d2t`
    /// and the drafter's own `lm_head.weight` rows, which vLLM reads); checked against
    /// `d2t` where that file is loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_vocab_size: Option<usize>,
    /// The DFlash fields written at the top level (older files).
    #[serde(flatten)]
    pub top: DFlashFields,
    /// Present (even as `null`) marks a drafter whatever `architectures` says.
    #[serde(
        default,
        deserialize_with = "present_or_empty",
        skip_serializing_if = "Option::is_none"
    )]
    pub dflash_config: Option<DFlashFields>,
}

/// A present field, `null` included, as `Some`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A present `dflash_config`, `null` read as an empty one.
fn present_or_empty<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<DFlashFields>, D::Error> {
    Option::<DFlashFields>::deserialize(d).map(|f| Some(f.unwrap_or_default()))
}

/// The string entries of an array; anything that is not an array reads as none.
fn strings<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    Ok(match Json::deserialize(d)? {
        Json::Array(a) => a
            .into_iter()
            .filter_map(|x| match x {
                Json::String(s) => Some(s),
                _ => None,
            })
            .collect(),
        _ => vec![],
    })
}

/// `v` with every object's keys in sorted order (the files we write keep the order
/// whatever order serde_json's maps keep: llguidance turns on its `preserve_order`).
fn sorted(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(o) => {
            let mut pairs: Vec<_> = o.into_iter().map(|(k, x)| (k, sorted(x))).collect();
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(pairs.into_iter().collect())
        }
        serde_json::Value::Array(a) => a.into_iter().map(sorted).collect(),
        x => x,
    }
}

impl DrafterFile {
    /// Parses config.json text (the file's checks come with `DrafterConfig::try_from`).
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::NotADrafter(format!("config.json: {e}")))
    }

    /// The file as pretty JSON, keys sorted, floats written as `serde_json::Value` writes
    /// them (an f32 widened to f64), the text the trainer has always written.
    pub fn to_json_pretty(&self) -> String {
        let v = serde_json::to_value(self).expect("a drafter file is plain JSON");
        serde_json::to_string_pretty(&sorted(v)).expect("a drafter file is plain JSON")
    }

    /// A DFlash field: `dflash_config` first, then the top level.
    fn dflash<T: Clone>(&self, f: impl Fn(&DFlashFields) -> &Option<T>) -> Option<T> {
        self.dflash_config
            .as_ref()
            .and_then(|d| f(d).clone())
            .or_else(|| f(&self.top).clone())
    }
}

fn not_a_drafter<T>(m: impl Into<String>) -> Result<T> {
    Err(Error::NotADrafter(m.into()))
}

impl TryFrom<DrafterFile> for DrafterConfig {
    type Error = Error;

    /// All the checks of a drafter's config on its own (`validate_against` checks it
    /// against a target): every rejection a typed `NotADrafter` (`BadConfig` for RoPE).
    fn try_from(f: DrafterFile) -> Result<Self> {
        let architecture = drafter_architecture(&f)?;
        let BlockFields {
            block_size,
            mask_token_id,
            num_target_layers,
        } = block_fields(&f)?;
        let layers = f.num_hidden_layers;
        // Before anything is sized by them (the default taps, the layer kinds): a huge
        // count aborted on its allocation (found by dflash-fuzz).
        crate::check_limit!("num_hidden_layers", layers, MAX_LAYERS);
        crate::check_limit!("num_target_layers", num_target_layers, MAX_LAYERS);
        let target_layer_ids = f
            .dflash(|d| &d.target_layer_ids)
            .unwrap_or_else(|| DrafterConfig::default_target_layer_ids(layers, num_target_layers));
        // As transformers' Qwen3Config reads them: the window only with
        // `use_sliding_window`; without `layer_types`, layers from `max_window_layers` on
        // slide where there is a window.
        let window = f
            .sliding_window
            .filter(|_| f.use_sliding_window == Some(true));
        let layer_kinds = layer_kinds(&f, window)?;
        check_plain_layers(&f)?;
        let heads = f.num_attention_heads;
        let head_dim = checked_sizes(&f, block_size, target_layer_ids.len())?;
        // The drafter rotates whole heads in NEOX pairs; `partial_rotary_factor` is not read.
        let rope = f.rope.settings(head_dim)?;
        let dflash2 =
            if architecture == "DFlash2DraftModel" || f.dflash(|d| &d.conv_kernel_size).is_some() {
                Some(dflash2_fields(&f, block_size)?)
            } else {
                None
            };
        let scales = draft_scales(&f)?;
        let cfg = DrafterConfig {
            dflash2,
            input_embedding_scale: scales.0,
            output_multiplier: scales.1,
            final_logit_softcapping: scales.2,
            is_causal: f.is_causal,
            hidden_size: f.hidden_size,
            intermediate_size: f.intermediate_size,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: f.num_key_value_heads.unwrap_or(heads),
            head_dim,
            rms_norm_eps: f.rms_norm_eps.unwrap_or(1e-6),
            rope,
            vocab_size: f.vocab_size,
            sliding_window: window.unwrap_or(0),
            layer_kinds,
            num_target_layers,
            block_size,
            mask_token_id,
            target_layer_ids,
            architecture,
        };
        check_attention(&cfg)?;
        Ok(cfg)
    }
}

/// The file's DFlash architecture (`DFlashDraftModel` when only `dflash_config` marks it
/// a drafter), or why it is not a drafter.
fn drafter_architecture(f: &DrafterFile) -> Result<String> {
    let architecture = f
        .architectures
        .iter()
        .find(|a| a.starts_with("DFlash"))
        .cloned();
    if architecture.is_none() && f.dflash_config.is_none() {
        return not_a_drafter("config.json names no DFlash architecture and has no dflash_config");
    }
    Ok(architecture.unwrap_or_else(|| "DFlashDraftModel".into()))
}

/// The DFlash fields every drafter must have.
struct BlockFields {
    block_size: usize,
    mask_token_id: u32,
    num_target_layers: usize,
}

/// `block_size`, `mask_token_id` and `num_target_layers`, in that order, each required;
/// `num_target_layers` read from the top level first.
fn block_fields(f: &DrafterFile) -> Result<BlockFields> {
    let block_size = f.dflash(|d| &d.block_size).ok_or_else(|| {
        Error::NotADrafter("block_size missing (top level or dflash_config)".into())
    })?;
    let mask_token_id = f
        .dflash(|d| &d.mask_token_id)
        .ok_or_else(|| Error::NotADrafter("dflash_config.mask_token_id missing".into()))?;
    let num_target_layers = f
        .top
        .num_target_layers
        .or_else(|| f.dflash_config.as_ref()?.num_target_layers)
        .ok_or_else(|| Error::NotADrafter("num_target_layers missing".into()))?;
    Ok(BlockFields {
        block_size,
        mask_token_id,
        num_target_layers,
    })
}

/// Each layer's kind, from `layer_types` or else by `max_window_layers` (28 when absent)
/// where there is a `window`; one per layer.
fn layer_kinds(f: &DrafterFile, window: Option<usize>) -> Result<Vec<LayerKind>> {
    let layers = f.num_hidden_layers;
    let layer_kinds = match &f.layer_types {
        Some(t) => t
            .iter()
            .map(|k| match k.as_str() {
                "full_attention" => Ok(LayerKind::Full),
                "sliding_attention" => Ok(LayerKind::Sliding),
                other => not_a_drafter(format!("layer type {other:?}")),
            })
            .collect::<Result<Vec<_>>>()?,
        None => (0..layers)
            .map(|i| match window {
                Some(_) if i >= f.max_window_layers.unwrap_or(28) => LayerKind::Sliding,
                _ => LayerKind::Full,
            })
            .collect(),
    };
    if layer_kinds.len() != layers {
        return not_a_drafter(format!(
            "{} layer_types for {layers} layers",
            layer_kinds.len()
        ));
    }
    Ok(layer_kinds)
}

/// The drafter's layers have no attention biases and a SiLU MLP.
fn check_plain_layers(f: &DrafterFile) -> Result<()> {
    if f.attention_bias == Some(true) {
        return not_a_drafter("attention_bias: true (the drafter's projections have no biases)");
    }
    if let Some(act) = f.hidden_act.as_deref().filter(|&a| a != "silu") {
        return not_a_drafter(format!("hidden_act {act:?} (the drafter's MLP is SiLU)"));
    }
    Ok(())
}

/// The head size (`head_dim`, else `hidden_size / num_attention_heads`) once every size
/// is checked non-zero and within its limit (against absurd allocations).
fn checked_sizes(f: &DrafterFile, block_size: usize, n_taps: usize) -> Result<usize> {
    let heads = f.num_attention_heads;
    if heads == 0 || f.hidden_size == 0 || block_size == 0 || n_taps == 0 {
        return not_a_drafter("zero-sized drafter dimension");
    }
    let head_dim = f.head_dim.unwrap_or(f.hidden_size / heads);
    if head_dim == 0 || f.intermediate_size == 0 || f.vocab_size == 0 {
        return not_a_drafter(format!(
            "zero-sized drafter dimension (head_dim {head_dim}, intermediate_size {}, vocab_size {})",
            f.intermediate_size, f.vocab_size
        ));
    }
    // Bounds against absurd allocations (the target's, plus the block).
    crate::check_limit!("block_size", block_size, MAX_BLOCK_SIZE);
    crate::check_limit!("hidden_size", f.hidden_size, MAX_HIDDEN_SIZE);
    crate::check_limit!(
        "intermediate_size",
        f.intermediate_size,
        MAX_INTERMEDIATE_SIZE
    );
    crate::check_limit!("num_attention_heads", heads, MAX_HEADS);
    crate::check_limit!("head_dim", head_dim, MAX_HEAD_DIM);
    crate::check_limit!("vocab_size", f.vocab_size, MAX_VOCAB_SIZE);
    crate::check_limit!("target_layer_ids (count)", n_taps, MAX_LAYERS);
    Ok(head_dim)
}

/// The heads share KV heads evenly and rotate in pairs; sliding layers have a window.
fn check_attention(cfg: &DrafterConfig) -> Result<()> {
    if cfg.num_kv_heads == 0
        || !cfg.num_heads.is_multiple_of(cfg.num_kv_heads)
        || !cfg.head_dim.is_multiple_of(2)
    {
        return not_a_drafter(format!(
            "{} heads over {} KV heads of {}",
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        ));
    }
    if cfg.layer_kinds.contains(&LayerKind::Sliding) && cfg.sliding_window == 0 {
        return not_a_drafter(
            "sliding layers need use_sliding_window: true and a positive sliding_window",
        );
    }
    Ok(())
}

/// `input_embedding_scale`, `output_multiplier` and `final_logit_softcapping` (every
/// drafter; `dflash_config` first): 1, 1 and off when absent; a cap of 0 is off.
fn draft_scales(f: &DrafterFile) -> Result<(f32, f32, Option<f32>)> {
    let float = |k: &str, v: Option<f32>, default: f32| match v {
        None => Ok(default),
        Some(x) if x.is_finite() => Ok(x),
        Some(_) => not_a_drafter(format!("drafter field {k} is not a number")),
    };
    let output_multiplier = float("output_multiplier", f.dflash(|d| &d.output_multiplier), 1.0)?;
    if output_multiplier <= 0.0 {
        return not_a_drafter(format!(
            "output_multiplier {output_multiplier} (must be positive)"
        ));
    }
    let cap = f.dflash(|d| &d.final_logit_softcapping).flatten();
    Ok((
        float(
            "input_embedding_scale",
            f.dflash(|d| &d.input_embedding_scale),
            1.0,
        )?,
        output_multiplier,
        Some(float("final_logit_softcapping", cap, 0.0)?).filter(|&c| c > 0.0),
    ))
}

/// DFlash2's fields and their checks against the drafter's sizes.
fn dflash2_fields(f: &DrafterFile, block_size: usize) -> Result<DFlash2Config> {
    let int = |k: &str, v: Option<usize>| {
        v.ok_or_else(|| Error::NotADrafter(format!("DFlash2 field {k} missing or not an integer")))
    };
    let d = DFlash2Config {
        conv_kernel_size: int("conv_kernel_size", f.dflash(|d| &d.conv_kernel_size))?,
        conv_group_size: int("conv_group_size", f.dflash(|d| &d.conv_group_size))?,
        selector_rank: int("selector_rank", f.dflash(|d| &d.selector_rank))?,
        selector_top_k: int("selector_top_k", f.dflash(|d| &d.selector_top_k))?,
    };
    if d.conv_kernel_size == 0
        || d.selector_rank == 0
        || d.selector_top_k == 0
        || d.conv_group_size == 0
    {
        return not_a_drafter("DFlash2 sizes must be positive (conv_kernel_size, conv_group_size, selector_rank, selector_top_k)");
    }
    if !f.hidden_size.is_multiple_of(d.conv_group_size) {
        return not_a_drafter(format!(
            "conv_group_size {} does not divide hidden_size {}",
            d.conv_group_size, f.hidden_size
        ));
    }
    if d.conv_kernel_size > block_size {
        return not_a_drafter(format!(
            "conv_kernel_size {} exceeds the block of {block_size}",
            d.conv_kernel_size
        ));
    }
    if d.selector_top_k > f.vocab_size {
        return not_a_drafter(format!(
            "selector_top_k {} exceeds the vocabulary of {}",
            d.selector_top_k, f.vocab_size
        ));
    }
    if d.selector_rank > 1 << 16 {
        return not_a_drafter(format!(
            "selector_rank = {} exceeds {}",
            d.selector_rank,
            1 << 16
        ));
    }
    Ok(d)
}

impl From<&DrafterConfig> for DrafterFile {
    /// The file as the trainer writes it: a Qwen3 config with full or sliding layers,
    /// `block_size` and `num_target_layers` at the top level, the mask token, the taps,
    /// the scales (`final_logit_softcapping` `null` when off; left out of a plain DFlash
    /// drafter at their defaults) and DFlash2's fields in `dflash_config`; `n_predict`
    /// (the block's draft slots) for vLLM. The mask token's text and the draft
    /// vocabulary's size need the target and the vocabulary: the export writes them.
    /// `max_position_embeddings` is not part of a `DrafterConfig`: the writer sets it.
    fn from(c: &DrafterConfig) -> Self {
        let mut dflash = DFlashFields {
            mask_token_id: Some(c.mask_token_id),
            target_layer_ids: Some(c.target_layer_ids.clone()),
            ..DFlashFields::default()
        };
        let default_scales = (c.input_embedding_scale, c.output_multiplier) == (1.0, 1.0)
            && c.final_logit_softcapping.is_none();
        if c.dflash2.is_some() || !default_scales {
            dflash.input_embedding_scale = Some(c.input_embedding_scale);
            dflash.output_multiplier = Some(c.output_multiplier);
            dflash.final_logit_softcapping = Some(c.final_logit_softcapping);
        }
        if let Some(d) = &c.dflash2 {
            dflash.conv_kernel_size = Some(d.conv_kernel_size);
            dflash.conv_group_size = Some(d.conv_group_size);
            dflash.selector_rank = Some(d.selector_rank);
            dflash.selector_top_k = Some(d.selector_top_k);
        }
        let sliding = c.layer_kinds.contains(&LayerKind::Sliding);
        DrafterFile {
            architectures: vec![c.architecture.clone()],
            model_type: Some("qwen3".into()),
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_layers,
            num_attention_heads: c.num_heads,
            num_key_value_heads: Some(c.num_kv_heads),
            head_dim: Some(c.head_dim),
            hidden_act: Some("silu".into()),
            attention_bias: Some(false),
            attention_dropout: Some(0.0),
            rms_norm_eps: Some(c.rms_norm_eps),
            rope: HfRope::from_settings(&c.rope),
            max_position_embeddings: None,
            vocab_size: c.vocab_size,
            tie_word_embeddings: Some(false),
            torch_dtype: Some("bfloat16".into()),
            use_cache: Some(true),
            use_sliding_window: Some(sliding),
            sliding_window: (c.sliding_window > 0).then_some(c.sliding_window),
            max_window_layers: None,
            is_causal: c.is_causal,
            n_predict: (c.block_size > 1).then(|| c.block_size - 1),
            draft_vocab_size: None,
            layer_types: Some(
                c.layer_kinds
                    .iter()
                    .map(|k| match k {
                        LayerKind::Full => "full_attention".into(),
                        LayerKind::Sliding => "sliding_attention".into(),
                    })
                    .collect(),
            ),
            top: DFlashFields {
                block_size: Some(c.block_size),
                num_target_layers: Some(c.num_target_layers),
                ..DFlashFields::default()
            },
            dflash_config: Some(dflash),
        }
    }
}

impl DrafterConfig {
    /// Parses and checks a drafter's config.json ([`DrafterFile`], then its `TryFrom`).
    pub fn from_json(text: &str) -> Result<Self> {
        Self::try_from(DrafterFile::from_json(text)?)
    }
}
