//! The CPU reference of the drafter's forward pass: the context K/V from the target's
//! taps, and the block pass over `[anchor, MASK...]`.

use super::*;
use crate::cpu::model::Matrix as Mat;
use crate::cpu::ops::{dot, rms_norm, rope, silu, softmax};
use crate::cpu::quant_matmul::in_pool;
use crate::cpu::CpuKernels;
use crate::quant::QuantMatrix;

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

pub(super) struct CpuSelector {
    pub(super) hidden_projection: Mat,
    pub(super) predecessor: Vec<f32>,
    pub(super) successor: Vec<f32>,
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
    pub(super) selector: Option<CpuSelector>,
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
    /// The reference drafter (f32 weights).
    pub fn new(w: &DrafterWeights) -> Self {
        Self::with_kernels(w, CpuKernels::Reference)
    }

    pub fn with_kernels(w: &DrafterWeights, kernels: CpuKernels) -> Self {
        let mat = |m: &QuantMatrix| Mat::new(m, kernels);
        let layers = w
            .layers
            .iter()
            .zip(&w.config.layer_kinds)
            .map(|(l, &kind)| CpuDraftLayer {
                input_norm: l.input_norm.clone(),
                post_norm: l.post_norm.clone(),
                wq: mat(&l.wq),
                wk: mat(&l.wk),
                wv: mat(&l.wv),
                wo: mat(&l.wo),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                w_gate: mat(&l.w_gate),
                w_up: mat(&l.w_up),
                w_down: mat(&l.w_down),
                kind,
                conv: l.conv.as_ref().map(|c| {
                    let cpu = |g: &GroupedConv| CpuConv {
                        base: g.base.clone(),
                        projection: mat(&g.projection),
                    };
                    [cpu(&c.attention), cpu(&c.mlp)]
                }),
            })
            .collect();
        let selector = w.selector.as_ref().map(|s| CpuSelector {
            hidden_projection: mat(&s.hidden_projection),
            predecessor: s.predecessor.dequantize(),
            successor: s.successor.dequantize(),
        });
        CpuDrafter {
            config: w.config.clone(),
            fc: mat(&w.fc),
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
        in_pool(|| self.extend_context_here(ctx, taps))
    }

    fn extend_context_here(&self, ctx: &mut DraftContext, taps: &[f32]) {
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
        in_pool(|| self.forward_block_here(ctx, block_embeds, start))
    }

    fn forward_block_here(
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
