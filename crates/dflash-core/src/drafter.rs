//! DFlash drafters in the z-lab format (config.json + safetensors): loading, validation
//! against the target, and the CPU reference of the drafter's forward pass.
//!
//! The drafter conditions on the target's hidden states: committed rows of taps
//! (`target_layer_ids`, concatenated) go through `hidden_norm(fc(.))` into a persistent
//! per-layer context K/V cache; a block `[anchor, MASK x (B-1)]` at absolute positions
//! attends, without a mask, to `[context | block]`; the target's lm_head reads the block.

use crate::config::{Arch, ModelConfig, RopeStyle};
use crate::cpu::ops::{argmax, dot, rms_norm, rope, silu, softmax};
use crate::error::{Error, Result};
use crate::formats::hf::SafeTensorsSource;
use crate::quant::{QFormat, QuantMatrix};
use crate::weights::{checked_matrix, checked_vector, TensorSource};
use serde::Deserialize;
use serde_json::Value as Json;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Full,
    Sliding,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_freq_factors: Vec<f32>,
    pub vocab_size: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub sliding_window: usize,
    pub num_target_layers: usize,
    pub block_size: usize,
    pub mask_token_id: u32,
    pub target_layer_ids: Vec<usize>,
    /// "DFlashDraftModel" or "DFlash2DraftModel".
    pub architecture: String,
    /// The DFlash2 extras (grouped dynamic convolution, candidate selector).
    pub dflash2: Option<Dflash2Config>,
}

/// DFlash2's fields (`dflash_config` or top level).
#[derive(Debug, Clone, PartialEq)]
pub struct Dflash2Config {
    /// Causal taps of each dynamic convolution.
    pub conv_kernel_size: usize,
    /// Channels sharing one dynamic kernel delta.
    pub conv_group_size: usize,
    pub selector_rank: usize,
    /// Candidates kept per slot from the lm_head.
    pub selector_top_k: usize,
    /// Multiplies the block's input embeddings.
    pub input_embedding_scale: f32,
    /// Multiplies the candidates' logits before the selector scores them.
    pub output_multiplier: f32,
    /// `tanh(x / cap) * cap` on the candidates' logits (None: off).
    pub final_logit_softcapping: Option<f32>,
}

impl Dflash2Config {
    pub fn num_groups(&self, hidden: usize) -> usize {
        hidden / self.conv_group_size
    }
    /// Outputs of a convolution's kernel projection: `2 * taps * groups`.
    pub fn projection_rows(&self, hidden: usize) -> usize {
        2 * self.conv_kernel_size * self.num_groups(hidden)
    }
}

impl DrafterConfig {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    pub fn n_taps(&self) -> usize {
        self.target_layer_ids.len()
    }

    /// The default tap layers: one draft layer taps the middle target layer; otherwise
    /// `n` ids spread evenly from 1 to N-3, rounded.
    pub fn default_target_layer_ids(n_draft: usize, n_target: usize) -> Vec<usize> {
        if n_draft == 1 {
            return vec![n_target / 2];
        }
        let (lo, hi) = (1.0f64, n_target as f64 - 3.0);
        (0..n_draft)
            .map(|i| {
                (lo + i as f64 * (hi - lo) / (n_draft - 1) as f64)
                    .round()
                    .max(0.0) as usize
            })
            .collect()
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let v: Json = serde_json::from_str(text)
            .map_err(|e| Error::NotADrafter(format!("config.json: {e}")))?;
        let archs: Vec<String> = v
            .get("architectures")
            .and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let dcfg = v.get("dflash_config");
        let architecture = archs.iter().find(|a| a.starts_with("DFlash")).cloned();
        if architecture.is_none() && dcfg.is_none() {
            return Err(Error::NotADrafter(
                "config.json names no DFlash architecture and has no dflash_config".into(),
            ));
        }
        let architecture = architecture.unwrap_or_else(|| "DFlashDraftModel".into());
        #[derive(Deserialize)]
        struct Base {
            hidden_size: usize,
            intermediate_size: usize,
            num_hidden_layers: usize,
            num_attention_heads: usize,
            num_key_value_heads: Option<usize>,
            head_dim: Option<usize>,
            rms_norm_eps: Option<f32>,
            rope_theta: Option<f32>,
            vocab_size: usize,
            layer_types: Option<Vec<String>>,
            sliding_window: Option<usize>,
            num_target_layers: Option<usize>,
            block_size: Option<usize>,
        }
        let b: Base = serde_json::from_value(v.clone())
            .map_err(|e| Error::NotADrafter(format!("config.json: {e}")))?;
        let get = |k: &str| dcfg.and_then(|d| d.get(k)).or_else(|| v.get(k));
        let block_size = get("block_size")
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .or(b.block_size)
            .ok_or_else(|| {
                Error::NotADrafter("block_size missing (top level or dflash_config)".into())
            })?;
        let mask_token_id = get("mask_token_id")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| Error::NotADrafter("dflash_config.mask_token_id missing".into()))?
            as u32;
        let num_target_layers = b
            .num_target_layers
            .or_else(|| {
                get("num_target_layers")
                    .and_then(|x| x.as_u64())
                    .map(|x| x as usize)
            })
            .ok_or_else(|| Error::NotADrafter("num_target_layers missing".into()))?;
        let target_layer_ids = match get("target_layer_ids").and_then(|x| x.as_array()) {
            Some(a) => a
                .iter()
                .map(|x| {
                    x.as_u64().map(|u| u as usize).ok_or_else(|| {
                        Error::NotADrafter("target_layer_ids holds a non-integer".into())
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            None => Self::default_target_layer_ids(b.num_hidden_layers, num_target_layers),
        };
        let layer_kinds = match &b.layer_types {
            Some(t) => t
                .iter()
                .map(|k| match k.as_str() {
                    "full_attention" => Ok(LayerKind::Full),
                    "sliding_attention" => Ok(LayerKind::Sliding),
                    other => Err(Error::NotADrafter(format!("layer type {other:?}"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![LayerKind::Full; b.num_hidden_layers],
        };
        if layer_kinds.len() != b.num_hidden_layers {
            return Err(Error::NotADrafter(format!(
                "{} layer_types for {} layers",
                layer_kinds.len(),
                b.num_hidden_layers
            )));
        }
        let heads = b.num_attention_heads;
        if heads == 0 || b.hidden_size == 0 || block_size == 0 || target_layer_ids.is_empty() {
            return Err(Error::NotADrafter("zero-sized drafter dimension".into()));
        }
        let head_dim = b.head_dim.unwrap_or(b.hidden_size / heads);
        // RoPE through the target config parser: top-level `rope_theta`/`rope_scaling` or
        // transformers 5's `rope_parameters`, llama3 scaling, and their checks.
        let has = |k: &str| v.get(k).is_some_and(|x| !x.is_null());
        let (rope_theta, rope_freq_factors) = if has("rope_scaling") || has("rope_parameters") {
            let mut probe = v.clone();
            probe["model_type"] = Json::String("qwen3".into());
            let t = ModelConfig::from_hf_json(&probe.to_string())?;
            (t.rope_theta, t.rope_freq_factors)
        } else {
            (b.rope_theta.unwrap_or(10000.0), vec![])
        };
        let dflash2 = if architecture == "DFlash2DraftModel" || get("conv_kernel_size").is_some() {
            let int = |k: &str| -> Result<usize> {
                get(k)
                    .and_then(|x| x.as_u64())
                    .map(|x| x as usize)
                    .ok_or_else(|| {
                        Error::NotADrafter(format!("DFlash2 field {k} missing or not an integer"))
                    })
            };
            let float = |k: &str, d: f32| -> Result<f32> {
                match get(k) {
                    None | Some(Json::Null) => Ok(d),
                    Some(x) => x
                        .as_f64()
                        .map(|f| f as f32)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| {
                            Error::NotADrafter(format!("DFlash2 field {k} is not a number"))
                        }),
                }
            };
            let d = Dflash2Config {
                conv_kernel_size: int("conv_kernel_size")?,
                conv_group_size: int("conv_group_size")?,
                selector_rank: int("selector_rank")?,
                selector_top_k: int("selector_top_k")?,
                input_embedding_scale: float("input_embedding_scale", 1.0)?,
                output_multiplier: float("output_multiplier", 1.0)?,
                final_logit_softcapping: Some(float("final_logit_softcapping", 0.0)?)
                    .filter(|&c| c > 0.0),
            };
            if d.conv_kernel_size == 0
                || d.selector_rank == 0
                || d.selector_top_k == 0
                || d.conv_group_size == 0
            {
                return Err(Error::NotADrafter("DFlash2 sizes must be positive (conv_kernel_size, conv_group_size, selector_rank, selector_top_k)".into()));
            }
            if !b.hidden_size.is_multiple_of(d.conv_group_size) {
                return Err(Error::NotADrafter(format!(
                    "conv_group_size {} does not divide hidden_size {}",
                    d.conv_group_size, b.hidden_size
                )));
            }
            if d.conv_kernel_size > block_size {
                return Err(Error::NotADrafter(format!(
                    "conv_kernel_size {} exceeds the block of {block_size}",
                    d.conv_kernel_size
                )));
            }
            if d.selector_top_k > b.vocab_size {
                return Err(Error::NotADrafter(format!(
                    "selector_top_k {} exceeds the vocabulary of {}",
                    d.selector_top_k, b.vocab_size
                )));
            }
            Some(d)
        } else {
            None
        };
        let cfg = DrafterConfig {
            dflash2,
            hidden_size: b.hidden_size,
            intermediate_size: b.intermediate_size,
            num_layers: b.num_hidden_layers,
            num_heads: heads,
            num_kv_heads: b.num_key_value_heads.unwrap_or(heads),
            head_dim,
            rms_norm_eps: b.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_freq_factors,
            vocab_size: b.vocab_size,
            sliding_window: b.sliding_window.unwrap_or(0),
            layer_kinds,
            num_target_layers,
            block_size,
            mask_token_id,
            target_layer_ids,
            architecture,
        };
        if cfg.num_kv_heads == 0
            || !cfg.num_heads.is_multiple_of(cfg.num_kv_heads)
            || !cfg.head_dim.is_multiple_of(2)
        {
            return Err(Error::NotADrafter(format!(
                "{} heads over {} KV heads of {}",
                cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
            )));
        }
        if cfg.layer_kinds.contains(&LayerKind::Sliding) && cfg.sliding_window == 0 {
            return Err(Error::NotADrafter(
                "sliding layers without sliding_window".into(),
            ));
        }
        Ok(cfg)
    }

    /// Checks the drafter against its target: one typed error per mismatch.
    pub fn validate_against(&self, t: &ModelConfig) -> Result<()> {
        let mismatch = |field: &'static str, d: String, t: String| {
            Err(Error::DrafterMismatch {
                field,
                drafter: d,
                target: t,
            })
        };
        if self.hidden_size != t.hidden_size {
            return mismatch(
                "hidden_size",
                self.hidden_size.to_string(),
                t.hidden_size.to_string(),
            );
        }
        if self.vocab_size != t.vocab_size {
            return mismatch(
                "vocab_size",
                self.vocab_size.to_string(),
                t.vocab_size.to_string(),
            );
        }
        if self.num_target_layers != t.num_layers {
            return mismatch(
                "num_target_layers",
                self.num_target_layers.to_string(),
                t.num_layers.to_string(),
            );
        }
        if let Some(&bad) = self.target_layer_ids.iter().find(|&&i| i >= t.num_layers) {
            return mismatch(
                "target_layer_ids",
                format!("{:?} (layer {bad})", self.target_layer_ids),
                format!("{} layers", t.num_layers),
            );
        }
        if self.mask_token_id as usize >= t.vocab_size {
            return mismatch(
                "mask_token_id",
                self.mask_token_id.to_string(),
                format!("a vocabulary of {}", t.vocab_size),
            );
        }
        if !(self.rope_theta > 0.0) || self.head_dim > 256 {
            return mismatch(
                "rope settings",
                format!("rope_theta {} head_dim {}", self.rope_theta, self.head_dim),
                "positive theta, head_dim <= 256".into(),
            );
        }
        Ok(())
    }

    pub fn rope_inv_freq(&self) -> Vec<f32> {
        ModelConfig {
            arch: Arch::Qwen3,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_style: RopeStyle::Neox,
            rope_dim: self.head_dim,
            rope_freq_factors: self.rope_freq_factors.clone(),
            max_position_embeddings: 1 << 20,
            qkv_bias: false,
            qk_norm: true,
            tie_word_embeddings: false,
        }
        .rope_inv_freq()
    }
}

/// How to store the drafter's matrices (loading quantizes float weights on request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterPrecision {
    /// 8-bit groups (the default: float checkpoints are quantized like target weights).
    Q8,
    Q4,
}

#[derive(Debug, Clone)]
pub struct DrafterLayer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub wq: QuantMatrix,
    pub wk: QuantMatrix,
    pub wv: QuantMatrix,
    pub wo: QuantMatrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub w_gate: QuantMatrix,
    pub w_up: QuantMatrix,
    pub w_down: QuantMatrix,
    /// DFlash2: the dynamic convolutions around attention and the MLP.
    pub conv: Option<LayerConvs>,
}

/// One grouped dynamic depthwise convolution: `base_kernel` `[2, taps, H]` (side 0 before
/// the sublayer, side 1 after), `kernel_projection` `[2 * taps * groups, H]`.
#[derive(Debug, Clone)]
pub struct GroupedConv {
    pub base: Vec<f32>,
    pub projection: QuantMatrix,
}

#[derive(Debug, Clone)]
pub struct LayerConvs {
    pub attention: GroupedConv,
    pub mlp: GroupedConv,
}

/// DFlash2's candidate selector: `hidden_projection` `[rank, H]` and the predecessor /
/// successor codebooks `[V, rank]` (row-gathered by token id).
#[derive(Debug, Clone)]
pub struct Selector {
    pub hidden_projection: QuantMatrix,
    pub predecessor: QuantMatrix,
    pub successor: QuantMatrix,
}

#[derive(Debug, Clone)]
pub struct DrafterWeights {
    pub config: DrafterConfig,
    /// `[H, n_ids * H]`.
    pub fc: QuantMatrix,
    pub hidden_norm: Vec<f32>,
    pub norm: Vec<f32>,
    pub layers: Vec<DrafterLayer>,
    pub selector: Option<Selector>,
}

impl DrafterWeights {
    /// Loads a drafter from its config.json text and safetensors files.
    pub fn load(
        config_json: &str,
        files: Vec<(&str, &[u8])>,
        precision: DrafterPrecision,
    ) -> Result<Self> {
        let c = DrafterConfig::from_json(config_json)?;
        let src = SafeTensorsSource::new(files, None)?;
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let mat = |name: &str, rows: usize, cols: usize| -> Result<QuantMatrix> {
            let m = checked_matrix(&src, name, rows, cols)?;
            Ok(match precision {
                DrafterPrecision::Q8 => m,
                DrafterPrecision::Q4 => QuantMatrix::quantize_q4(&m.dequantize(), rows, cols),
            })
        };
        let vec = |name: &str, len: usize| checked_vector(&src, name, len);
        let conv = |prefix: String, d: &Dflash2Config| -> Result<GroupedConv> {
            let name = format!("{prefix}.base_kernel");
            let want = vec![2, d.conv_kernel_size, h];
            let shape = src
                .shape(&name)
                .ok_or_else(|| Error::MissingTensor(name.clone()))?;
            if shape != want {
                return Err(Error::ShapeMismatch {
                    tensor: name,
                    expected: want,
                    found: shape,
                });
            }
            Ok(GroupedConv {
                base: src.vector(&name)?,
                projection: checked_matrix(
                    &src,
                    &format!("{prefix}.kernel_projection.weight"),
                    d.projection_rows(h),
                    h,
                )?,
            })
        };
        let mut layers = Vec::new();
        for i in 0..c.num_layers {
            let n = |s: &str| format!("layers.{i}.{s}");
            let convs = match &c.dflash2 {
                Some(d) => Some(LayerConvs {
                    attention: conv(n("attention_conv"), d)?,
                    mlp: conv(n("mlp_conv"), d)?,
                }),
                None => None,
            };
            layers.push(DrafterLayer {
                conv: convs,
                input_norm: vec(&n("input_layernorm.weight"), h)?,
                post_norm: vec(&n("post_attention_layernorm.weight"), h)?,
                wq: mat(&n("self_attn.q_proj.weight"), q, h)?,
                wk: mat(&n("self_attn.k_proj.weight"), kv, h)?,
                wv: mat(&n("self_attn.v_proj.weight"), kv, h)?,
                wo: mat(&n("self_attn.o_proj.weight"), h, q)?,
                q_norm: vec(&n("self_attn.q_norm.weight"), c.head_dim)?,
                k_norm: vec(&n("self_attn.k_norm.weight"), c.head_dim)?,
                w_gate: mat(&n("mlp.gate_proj.weight"), ff, h)?,
                w_up: mat(&n("mlp.up_proj.weight"), ff, h)?,
                w_down: mat(&n("mlp.down_proj.weight"), h, ff)?,
            });
        }
        let selector = match &c.dflash2 {
            Some(d) => Some(Selector {
                hidden_projection: checked_matrix(
                    &src,
                    "candidate_selector.hidden_projection.weight",
                    d.selector_rank,
                    h,
                )?,
                predecessor: checked_matrix(
                    &src,
                    "candidate_selector.predecessor_codebook",
                    c.vocab_size,
                    d.selector_rank,
                )?,
                successor: checked_matrix(
                    &src,
                    "candidate_selector.successor_codebook",
                    c.vocab_size,
                    d.selector_rank,
                )?,
            }),
            None => None,
        };
        Ok(DrafterWeights {
            selector,
            fc: mat("fc.weight", h, c.n_taps() * h)?,
            hidden_norm: vec("hidden_norm.weight", h)?,
            norm: vec("norm.weight", h)?,
            layers,
            config: c,
        })
    }

    pub fn format(&self) -> QFormat {
        self.fc.format
    }
}

/// Loads a drafter folder from the file system.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_drafter_dir(
    dir: &std::path::Path,
    precision: DrafterPrecision,
) -> Result<DrafterWeights> {
    let io = |p: &std::path::Path, e| Error::Io {
        path: p.display().to_string(),
        source: e,
    };
    let cfg_path = dir.join("config.json");
    let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| io(&cfg_path, e))?;
    let index = dir.join("model.safetensors.index.json");
    let index_bytes = if index.exists() {
        Some(std::fs::read(&index).map_err(|e| io(&index, e))?)
    } else {
        None
    };
    let names = crate::model_files::hf_weight_files(index_bytes.as_deref())?;
    let mut blobs = Vec::new();
    for n in &names {
        let p = dir.join(n);
        blobs.push((n.clone(), std::fs::read(&p).map_err(|e| io(&p, e))?));
    }
    DrafterWeights::load(
        &cfg,
        blobs.iter().map(|(n, b)| (n.as_str(), &b[..])).collect(),
        precision,
    )
}

use crate::cpu::model::Matrix as Mat;

struct CpuDraftLayer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    wo: Mat,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    w_gate: Mat,
    w_up: Mat,
    w_down: Mat,
    kind: LayerKind,
    /// DFlash2: (attention, mlp) convolutions.
    conv: Option<[CpuConv; 2]>,
}

struct CpuConv {
    base: Vec<f32>,
    projection: Mat,
}

struct CpuSelector {
    hidden_projection: Mat,
    predecessor: Vec<f32>,
    successor: Vec<f32>,
}

/// The grouped dynamic depthwise convolution over the rows of one block (row i is block
/// position i): `out[i, c] = sum_t (base[t, c] + delta[i, t, c / group]) * x[i - t, c]`,
/// the taps never reaching before the block's first row. `base` is `[taps, H]` (one
/// side of `base_kernel`), `delta` holds each row's `[taps, groups]` coefficients at
/// `delta[i * stride + offset ..]`.
#[allow(clippy::too_many_arguments)]
pub fn grouped_conv(
    x: &[f32],
    h: usize,
    taps: usize,
    group: usize,
    base: &[f32],
    delta: &[f32],
    stride: usize,
    offset: usize,
) -> Vec<f32> {
    let b = x.len() / h;
    let groups = h / group;
    let mut out = vec![0f32; b * h];
    for i in 0..b {
        let d = &delta[i * stride + offset..i * stride + offset + taps * groups];
        for c in 0..h {
            let mut acc = 0f32;
            for t in 0..taps.min(i + 1) {
                acc += (base[t * h + c] + d[t * groups + c / group]) * x[(i - t) * h + c];
            }
            out[i * h + c] = acc;
        }
    }
    out
}

/// The `k` largest values of `x` with their indices: descending, ties by ascending index.
pub fn top_k(x: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b));
    let k = k.min(x.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, x[i as usize])).collect()
}

/// The CPU reference of the drafter.
pub struct CpuDrafter {
    pub config: DrafterConfig,
    fc: Mat,
    hidden_norm: Vec<f32>,
    norm: Vec<f32>,
    layers: Vec<CpuDraftLayer>,
    inv_freq: Vec<f32>,
    selector: Option<CpuSelector>,
}

/// The persistent context K/V of every draft layer: one row per committed position.
#[derive(Clone, Default)]
pub struct DraftContext {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Absolute position of the first cached row (sliding layers drop old rows).
    pub len: usize,
}

impl DraftContext {
    pub fn truncate(&mut self, len: usize, kv_dim: usize) {
        if len < self.len {
            for l in 0..self.k.len() {
                self.k[l].truncate(len * kv_dim);
                self.v[l].truncate(len * kv_dim);
            }
            self.len = len;
        }
    }
}

fn head_norm_rope(
    x: &mut [f32],
    heads: usize,
    hd: usize,
    w: &[f32],
    eps: f32,
    pos: usize,
    inv: &[f32],
) {
    let mut tmp = vec![0f32; hd];
    for h in 0..heads {
        let head = &mut x[h * hd..(h + 1) * hd];
        rms_norm(head, w, eps, &mut tmp);
        head.copy_from_slice(&tmp);
        rope(head, pos, inv, RopeStyle::Neox);
    }
}

impl CpuDrafter {
    pub fn new(w: &DrafterWeights) -> Self {
        let layers = w
            .layers
            .iter()
            .zip(&w.config.layer_kinds)
            .map(|(l, &kind)| CpuDraftLayer {
                input_norm: l.input_norm.clone(),
                post_norm: l.post_norm.clone(),
                wq: Mat::from_quant(&l.wq),
                wk: Mat::from_quant(&l.wk),
                wv: Mat::from_quant(&l.wv),
                wo: Mat::from_quant(&l.wo),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                w_gate: Mat::from_quant(&l.w_gate),
                w_up: Mat::from_quant(&l.w_up),
                w_down: Mat::from_quant(&l.w_down),
                kind,
                conv: l.conv.as_ref().map(|c| {
                    let cpu = |g: &GroupedConv| CpuConv {
                        base: g.base.clone(),
                        projection: Mat::from_quant(&g.projection),
                    };
                    [cpu(&c.attention), cpu(&c.mlp)]
                }),
            })
            .collect();
        let selector = w.selector.as_ref().map(|s| CpuSelector {
            hidden_projection: Mat::from_quant(&s.hidden_projection),
            predecessor: s.predecessor.dequantize(),
            successor: s.successor.dequantize(),
        });
        CpuDrafter {
            config: w.config.clone(),
            fc: Mat::from_quant(&w.fc),
            hidden_norm: w.hidden_norm.clone(),
            norm: w.norm.clone(),
            layers,
            inv_freq: w.config.rope_inv_freq(),
            selector,
        }
    }

    pub fn new_context(&self) -> DraftContext {
        DraftContext {
            k: vec![vec![]; self.layers.len()],
            v: vec![vec![]; self.layers.len()],
            len: 0,
        }
    }

    /// Appends committed rows of taps (`[r, n_ids * H]`, positions `ctx.len..`) to the
    /// context cache: `c = hidden_norm(fc(taps))`, then per layer `k_norm(c Wk)` with RoPE
    /// at the rows' positions, and `c Wv`.
    pub fn extend_context(&self, ctx: &mut DraftContext, taps: &[f32]) {
        let c = &self.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let r = taps.len() / (c.n_taps() * h);
        if r == 0 {
            return;
        }
        let f = self.fc.apply(taps, r);
        let mut cn = vec![0f32; r * h];
        for i in 0..r {
            rms_norm(
                &f[i * h..(i + 1) * h],
                &self.hidden_norm,
                c.rms_norm_eps,
                &mut cn[i * h..(i + 1) * h],
            );
        }
        for (li, l) in self.layers.iter().enumerate() {
            let mut k = l.wk.apply(&cn, r);
            let v = l.wv.apply(&cn, r);
            for i in 0..r {
                head_norm_rope(
                    &mut k[i * c.kv_dim()..(i + 1) * c.kv_dim()],
                    c.num_kv_heads,
                    hd,
                    &l.k_norm,
                    c.rms_norm_eps,
                    ctx.len + i,
                    &self.inv_freq,
                );
            }
            ctx.k[li].extend_from_slice(&k);
            ctx.v[li].extend_from_slice(&v);
        }
        ctx.len += r;
    }

    /// The drafter's final hidden rows for `block_embeds` (`[B, H]`: the target's
    /// embeddings of `[anchor, MASK...]`) at positions `start..start+B`.
    pub fn forward_block(
        &self,
        ctx: &DraftContext,
        block_embeds: &[f32],
        start: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let b = block_embeds.len() / h;
        let mut x = block_embeds.to_vec();
        if let Some(d) = &c.dflash2 {
            x.iter_mut().for_each(|v| *v *= d.input_embedding_scale);
        }
        // DFlash2: one side of a layer's convolution, coefficients from `coef` rows.
        let conv = |cv: &CpuConv, x: &[f32], coef: &[f32], side: usize| -> Vec<f32> {
            let d = c
                .dflash2
                .as_ref()
                .expect("convolutions only in DFlash2 drafters");
            let (taps, groups) = (d.conv_kernel_size, d.num_groups(h));
            grouped_conv(
                x,
                h,
                taps,
                d.conv_group_size,
                &cv.base[side * taps * h..(side + 1) * taps * h],
                coef,
                2 * taps * groups,
                side * taps * groups,
            )
        };
        let mut hn = vec![0f32; b * h];
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, l) in self.layers.iter().enumerate() {
            for i in 0..b {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    &l.input_norm,
                    c.rms_norm_eps,
                    &mut hn[i * h..(i + 1) * h],
                );
            }
            let coef_att = l.conv.as_ref().map(|cv| cv[0].projection.apply(&hn, b));
            if let (Some(cv), Some(coef)) = (&l.conv, &coef_att) {
                hn = conv(&cv[0], &hn, coef, 0);
            }
            let mut q = l.wq.apply(&hn, b);
            let mut k = l.wk.apply(&hn, b);
            let v = l.wv.apply(&hn, b);
            for i in 0..b {
                head_norm_rope(
                    &mut q[i * qd..(i + 1) * qd],
                    nh,
                    hd,
                    &l.q_norm,
                    c.rms_norm_eps,
                    start + i,
                    &self.inv_freq,
                );
                head_norm_rope(
                    &mut k[i * kvd..(i + 1) * kvd],
                    nkv,
                    hd,
                    &l.k_norm,
                    c.rms_norm_eps,
                    start + i,
                    &self.inv_freq,
                );
            }
            // Keys: the context (the last `sliding_window` rows on sliding layers), then the block.
            let n_ctx = ctx.len;
            let first = if l.kind == LayerKind::Sliding {
                n_ctx.saturating_sub(c.sliding_window)
            } else {
                0
            };
            let (kc, vc) = (&ctx.k[li], &ctx.v[li]);
            let n_keys = n_ctx - first + b;
            let key = |j: usize, kh: usize| -> &[f32] {
                if j < n_ctx - first {
                    &kc[(first + j) * kvd + kh * hd..(first + j) * kvd + (kh + 1) * hd]
                } else {
                    let jb = j - (n_ctx - first);
                    &k[jb * kvd + kh * hd..jb * kvd + (kh + 1) * hd]
                }
            };
            let val = |j: usize, kh: usize| -> &[f32] {
                if j < n_ctx - first {
                    &vc[(first + j) * kvd + kh * hd..(first + j) * kvd + (kh + 1) * hd]
                } else {
                    let jb = j - (n_ctx - first);
                    &v[jb * kvd + kh * hd..jb * kvd + (kh + 1) * hd]
                }
            };
            let mut att = vec![0f32; b * qd];
            let mut scores = vec![0f32; n_keys];
            for i in 0..b {
                for hh in 0..nh {
                    let kh = hh / (nh / nkv);
                    let qh = &q[i * qd + hh * hd..i * qd + (hh + 1) * hd];
                    for (j, s) in scores.iter_mut().enumerate() {
                        *s = dot(qh, key(j, kh)) * scale;
                    }
                    softmax(&mut scores);
                    let o = &mut att[i * qd + hh * hd..i * qd + (hh + 1) * hd];
                    for (j, &p) in scores.iter().enumerate() {
                        for (od, vd) in o.iter_mut().zip(val(j, kh)) {
                            *od += p * vd;
                        }
                    }
                }
            }
            let mut o = l.wo.apply(&att, b);
            if let (Some(cv), Some(coef)) = (&l.conv, &coef_att) {
                o = conv(&cv[0], &o, coef, 1);
            }
            for i in 0..b * h {
                x[i] += o[i];
            }
            for i in 0..b {
                rms_norm(
                    &x[i * h..(i + 1) * h],
                    &l.post_norm,
                    c.rms_norm_eps,
                    &mut hn[i * h..(i + 1) * h],
                );
            }
            let coef_mlp = l.conv.as_ref().map(|cv| cv[1].projection.apply(&hn, b));
            if let (Some(cv), Some(coef)) = (&l.conv, &coef_mlp) {
                hn = conv(&cv[1], &hn, coef, 0);
            }
            let g = l.w_gate.apply(&hn, b);
            let u = l.w_up.apply(&hn, b);
            let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            let mut d = l.w_down.apply(&a, b);
            if let (Some(cv), Some(coef)) = (&l.conv, &coef_mlp) {
                d = conv(&cv[1], &d, coef, 1);
            }
            for i in 0..b * h {
                x[i] += d[i];
            }
        }
        let mut out = vec![0f32; b * h];
        for i in 0..b {
            rms_norm(
                &x[i * h..(i + 1) * h],
                &self.norm,
                c.rms_norm_eps,
                &mut out[i * h..(i + 1) * h],
            );
        }
        out
    }
}

/// DFlash2's candidates of the slots after the anchor and the selector's scores.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    /// `[slots][K]` token ids, each slot's lm_head top-K (descending, ties by index).
    pub ids: Vec<Vec<u32>>,
    /// `[slots][K]` their logits after `output_multiplier` and soft-capping.
    pub unary: Vec<Vec<f32>>,
}

impl CpuDrafter {
    pub fn is_dflash2(&self) -> bool {
        self.selector.is_some()
    }

    /// The top-K candidates of each slot from its lm_head logits (`[slots, V]`).
    pub fn candidates(&self, logits: &[f32]) -> Candidates {
        let d = self.config.dflash2.as_ref().expect("a DFlash2 drafter");
        let v = self.config.vocab_size;
        let (mut ids, mut unary) = (Vec::new(), Vec::new());
        for row in logits.chunks(v) {
            let top = top_k(row, d.selector_top_k);
            ids.push(top.iter().map(|t| t.0).collect());
            unary.push(
                top.iter()
                    .map(|t| {
                        let x = t.1 * d.output_multiplier;
                        match d.final_logit_softcapping {
                            Some(cap) => (x / cap).tanh() * cap,
                            None => x,
                        }
                    })
                    .collect(),
            );
        }
        Candidates { ids, unary }
    }

    /// Selector scores of slot `l`'s candidates after predecessor token `pred`:
    /// `unary[c] + sum_r A[pred, r] * hp[r] * B[c, r]`, `hp` the slot's projected hidden.
    pub fn edge_scores(&self, cand: &Candidates, l: usize, pred: u32, hp: &[f32]) -> Vec<f32> {
        let s = self.selector.as_ref().expect("a DFlash2 drafter");
        let rank = hp.len();
        let a = &s.predecessor[pred as usize * rank..(pred as usize + 1) * rank];
        let ah: Vec<f32> = a.iter().zip(hp).map(|(x, y)| x * y).collect();
        cand.ids[l]
            .iter()
            .zip(&cand.unary[l])
            .map(|(&c, &u)| {
                u + dot(
                    &ah,
                    &s.successor[c as usize * rank..(c as usize + 1) * rank],
                )
            })
            .collect()
    }

    /// DFlash2's drafts: candidates per slot, then the greedy walk from the anchor, each
    /// slot taking its best-scoring candidate after the previous choice (ties: lowest
    /// candidate index). `hidden` holds the final rows of the slots after the anchor.
    pub fn select(&self, anchor: u32, hidden: &[f32], logits: &[f32]) -> Vec<u32> {
        self.walk(anchor, hidden, logits, |_, ids, scores| {
            let t = ids[argmax(scores)];
            (t, t)
        })
    }

    /// DFlash2's walk at temperature `t` > 0: each slot draws among its candidates from
    /// softmax(scores / t) by Gumbel-max (noise keyed by seed, the slot's absolute
    /// position and the candidate token) and records that distribution as the proposal
    /// q for rejection sampling. `first_position`: the absolute position of slot 1.
    pub fn select_sampled(
        &self,
        anchor: u32,
        hidden: &[f32],
        logits: &[f32],
        t: f32,
        seed: u64,
        first_position: usize,
    ) -> Vec<crate::rejection::Proposed> {
        self.walk(anchor, hidden, logits, |l, ids, scores| {
            let pick =
                crate::rejection::gumbel_pick(ids, scores, t, seed, (first_position + l) as u32);
            (pick.token, pick)
        })
    }

    /// The walk from the anchor: slot by slot, `pick(slot, candidate ids, scores after
    /// the previous choice)` chooses a token.
    fn walk<T>(
        &self,
        anchor: u32,
        hidden: &[f32],
        logits: &[f32],
        mut pick: impl FnMut(usize, &[u32], &[f32]) -> (u32, T),
    ) -> Vec<T> {
        let s = self.selector.as_ref().expect("a DFlash2 drafter");
        let slots = hidden.len() / self.config.hidden_size;
        let cand = self.candidates(logits);
        let hp = s.hidden_projection.apply(hidden, slots);
        let rank = hp.len() / slots.max(1);
        let mut pred = anchor;
        let mut out = Vec::with_capacity(slots);
        for l in 0..slots {
            let scores = self.edge_scores(&cand, l, pred, &hp[l * rank..(l + 1) * rank]);
            let (token, x) = pick(l, &cand.ids[l], &scores);
            pred = token;
            out.push(x);
        }
        out
    }
}
