//! DFlash drafters in the z-lab format (config.json + safetensors): loading, validation
//! against the target, and the CPU reference of the drafter's forward pass.
//!
//! The drafter conditions on the target's hidden states: committed rows of taps
//! (`target_layer_ids`, concatenated) go through `hidden_norm(fc(.))` into a persistent
//! per-layer context K/V cache; a block `[anchor, MASK x (B-1)]` at absolute positions
//! attends, without a mask, to `[context | block]`; the target's lm_head reads the block.

use crate::config::{ModelConfig, Rope, RopeStyle};
use crate::cpu::ops::{argmax, dot, rms_norm, rope, silu, softmax};
pub use crate::drafter_file::DrafterFile;
use crate::error::{Error, Result};
use crate::formats::hf::SafeTensorsSource;
use crate::quant::{QFormat, QuantMatrix};
use crate::weights::{checked_matrix, checked_vector, TensorSource};

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
    /// NEOX pairs over whole heads (`dim` = `head_dim`).
    pub rope: Rope,
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

    /// Parses and checks a drafter's config.json ([`DrafterFile`], then its `TryFrom`).
    pub fn from_json(text: &str) -> Result<Self> {
        Self::try_from(DrafterFile::from_json(text)?)
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
        if !(self.rope.theta > 0.0) || self.head_dim > 256 {
            return mismatch(
                "rope settings",
                format!("rope_theta {} head_dim {}", self.rope.theta, self.head_dim),
                "positive theta, head_dim <= 256".into(),
            );
        }
        Ok(())
    }

    pub fn rope_inv_freq(&self) -> Vec<f32> {
        self.rope.inv_freq()
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
    use crate::model_files::require_regular_file;
    let cfg_path = dir.join("config.json");
    require_regular_file(&cfg_path)?;
    let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| io(&cfg_path, e))?;
    let index = dir.join("model.safetensors.index.json");
    let index_bytes = if index.exists() {
        require_regular_file(&index)?;
        Some(std::fs::read(&index).map_err(|e| io(&index, e))?)
    } else {
        None
    };
    let names = crate::model_files::hf_weight_files(index_bytes.as_deref())?;
    let mut blobs = Vec::new();
    for n in &names {
        let p = dir.join(n);
        require_regular_file(&p)?;
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
