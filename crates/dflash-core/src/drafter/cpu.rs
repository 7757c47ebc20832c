//! The CPU reference of the drafter's forward pass: the context K/V from the target's
//! taps, and the block pass over `[anchor, MASK...]`.

use super::*;
use crate::config::RopeStyle;
use crate::cpu::layer::{attend, norm_rope_heads, HeadRope, Heads, Mlp};
use crate::cpu::matrix::{Matrix as Mat, Stacked};
use crate::cpu::ops::rms_norm_rows;
use crate::cpu::quant_matmul::in_pool;
use crate::cpu::CpuKernels;
use crate::quant::QuantMatrix;
use std::ops::Range;

struct CpuDraftLayer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    wq: Mat,
    /// `[wk; wv]`: the context rows need no queries.
    kv: Stacked,
    wo: Mat,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    /// The SwiGLU MLP, the target's own piece.
    mlp: Mlp,
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

/// Where a forward pass reports its intermediates: `(name, rows)`, named as the arrays of
/// z-lab's reference fixtures (fixtures/zlab/README.md): `context`, `block_embeds`,
/// `layer_outputs` (once per layer), and DFlash2's `conv.{layer}.{attention_conv |
/// mlp_conv}.{in | kernel | prepared | sublayer_out | finished}`.
pub type Probe<'a> = &'a mut (dyn FnMut(&str, &[f32]) + Send);

/// The CPU reference of the drafter.
pub struct CpuDrafter {
    pub config: DrafterConfig,
    fc: Mat,
    hidden_norm: Vec<f32>,
    norm: Vec<f32>,
    layers: Vec<CpuDraftLayer>,
    inv_freq: Vec<f32>,
    pub(super) selector: Option<CpuSelector>,
    /// The ids its greedy drafts are chosen among (None: the whole vocabulary).
    pub draft_vocab: Option<super::DraftVocab>,
}

/// The persistent context K/V of every draft layer: one row per committed position.
#[derive(Clone, Default)]
pub struct DraftContext {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Rows cached, one per position `0..len` (every row is kept: a sliding layer's
    /// mask picks the rows its window sees).
    pub len: usize,
}

impl DraftContext {
    /// Draft layers it holds rows for.
    pub fn layers(&self) -> usize {
        self.k.len()
    }
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

/// The keys a block query at position `q` sees on a layer of this kind, as the
/// reference masks it, among the positions `0..len` (the context's, then the block's):
/// full layers see everything unless `is_causal`; causal layers only `p <= q`; sliding
/// layers only `q - p < W` and, where not causal, `p - q < W`.
fn visible_keys(c: &DrafterConfig, kind: LayerKind, q: usize, len: usize) -> Range<usize> {
    let window = c.window(kind);
    let first = window.map_or(0, |w| (q + 1).saturating_sub(w));
    let end = match (c.is_causal(kind), window) {
        (true, _) => q + 1,
        (false, Some(w)) => (q + w).min(len),
        (false, None) => len,
    };
    first..end.max(first)
}

/// The drafter's query or key heads of one row: normalised and rotated (NeoX style, the
/// whole head) as the target's are.
fn head_norm_rope(x: &mut [f32], hd: usize, w: &[f32], eps: f32, pos: usize, inv: &[f32]) {
    let rot = HeadRope {
        pos,
        inv_freq: inv,
        dim: hd,
        style: RopeStyle::Neox,
    };
    norm_rope_heads(x, hd, Some(w), eps, &rot);
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
                kv: Stacked::new(&[&l.wk, &l.wv], kernels),
                wo: mat(&l.wo),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                mlp: Mlp::new(&l.w_gate, &l.w_up, mat(&l.w_down), kernels),
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
            draft_vocab: w.draft_vocab.clone(),
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
        in_pool(|| self.extend_context_here(ctx, taps, &mut |_, _| {}))
    }

    /// `extend_context`, reporting the context rows `c` to `probe`.
    pub fn extend_context_probed(&self, ctx: &mut DraftContext, taps: &[f32], probe: Probe) {
        in_pool(|| self.extend_context_here(ctx, taps, probe))
    }

    fn extend_context_here(&self, ctx: &mut DraftContext, taps: &[f32], probe: Probe) {
        let c = &self.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let r = taps.len() / (c.n_taps() * h);
        if r == 0 {
            return;
        }
        let f = self.fc.apply(taps, r);
        let mut cn = vec![0f32; r * h];
        rms_norm_rows(&f, &self.hidden_norm, c.rms_norm_eps, &mut cn);
        probe("context", &cn);
        for (li, l) in self.layers.iter().enumerate() {
            let [mut k, v]: [Vec<f32>; 2] = l.kv.apply(&cn, r).try_into().expect("k, v");
            for i in 0..r {
                head_norm_rope(
                    &mut k[i * c.kv_dim()..(i + 1) * c.kv_dim()],
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
    /// embeddings of `[anchor, MASK...]`) at the positions after the context's,
    /// `ctx.len..ctx.len + B`. The block's keys join the context's for the pass and
    /// leave it after: `ctx` is as it was.
    pub fn forward_block(&self, ctx: &mut DraftContext, block_embeds: &[f32]) -> Vec<f32> {
        in_pool(|| self.forward_block_here(ctx, block_embeds, &mut |_, _| {}))
    }

    /// `forward_block`, reporting its intermediates to `probe`.
    pub fn forward_block_probed(
        &self,
        ctx: &mut DraftContext,
        block_embeds: &[f32],
        probe: Probe,
    ) -> Vec<f32> {
        in_pool(|| self.forward_block_here(ctx, block_embeds, probe))
    }

    fn forward_block_here(
        &self,
        ctx: &mut DraftContext,
        block_embeds: &[f32],
        probe: Probe,
    ) -> Vec<f32> {
        let c = &self.config;
        let h = c.hidden_size;
        assert!(
            block_embeds.len().is_multiple_of(h),
            "block rows of {h} values"
        );
        let mut x = block_embeds.to_vec();
        if c.input_embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.input_embedding_scale);
        }
        probe("block_embeds", &x);
        for (li, l) in self.layers.iter().enumerate() {
            let o = self.block_attention_sublayer((li, l), ctx, &x, probe);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let d = self.block_mlp_sublayer((li, l), &x, probe);
            x.iter_mut().zip(&d).for_each(|(x, d)| *x += d);
            probe("layer_outputs", &x);
        }
        let mut out = vec![0f32; x.len()];
        rms_norm_rows(&x, &self.norm, c.rms_norm_eps, &mut out);
        out
    }

    /// Layer `li`'s attention over the block rows `x` at positions `ctx.len..` and the
    /// context (the target's attention core, each row masked to the keys it sees): its
    /// output, before the residual add.
    fn block_attention_sublayer(
        &self,
        (li, l): (usize, &CpuDraftLayer),
        ctx: &mut DraftContext,
        x: &[f32],
        probe: Probe,
    ) -> Vec<f32> {
        let c = &self.config;
        let (h, hd, qd, kvd) = (c.hidden_size, c.head_dim, c.q_dim(), c.kv_dim());
        let (b, start) = (x.len() / h, ctx.len);
        let tag = format!("conv.{li}.attention_conv");
        let conv = l.conv.as_ref().map(|cv| &cv[0]);
        let (hn, conv) = self.sublayer_input(x, &l.input_norm, conv, &tag, probe);
        let mut q = l.wq.apply(&hn, b);
        let [mut k, v]: [Vec<f32>; 2] = l.kv.apply(&hn, b).try_into().expect("k, v");
        for i in 0..b {
            let (qi, ki) = (&mut q[i * qd..(i + 1) * qd], &mut k[i * kvd..(i + 1) * kvd]);
            let (eps, pos) = (c.rms_norm_eps, start + i);
            head_norm_rope(qi, hd, &l.q_norm, eps, pos, &self.inv_freq);
            head_norm_rope(ki, hd, &l.k_norm, eps, pos, &self.inv_freq);
        }
        let (kc, vc) = (&mut ctx.k[li], &mut ctx.v[li]);
        kc.extend_from_slice(&k);
        vc.extend_from_slice(&v);
        let heads = Heads {
            n: c.num_heads,
            kv: c.num_kv_heads,
            dim: hd,
        };
        let seen = |i: usize| visible_keys(c, l.kind, start + i, start + b);
        let att = attend(&q, b, (kc, vc), &seen, heads);
        kc.truncate(start * kvd);
        vc.truncate(start * kvd);
        let o = l.wo.apply(&att, b);
        self.sublayer_output(o, conv, &tag, probe)
    }

    /// Layer `li`'s MLP over the block rows `x`: its output, before the residual add.
    fn block_mlp_sublayer(
        &self,
        (li, l): (usize, &CpuDraftLayer),
        x: &[f32],
        probe: Probe,
    ) -> Vec<f32> {
        let c = &self.config;
        let b = x.len() / c.hidden_size;
        let tag = format!("conv.{li}.mlp_conv");
        let conv = l.conv.as_ref().map(|cv| &cv[1]);
        let (hn, conv) = self.sublayer_input(x, &l.post_norm, conv, &tag, probe);
        self.sublayer_output(l.mlp.apply(&hn, b), conv, &tag, probe)
    }

    /// DFlash2: one side of a sublayer's convolution over the block rows `x`, the
    /// coefficients from the kernel rows `coef`.
    fn conv_side(&self, cv: &CpuConv, x: &[f32], coef: &[f32], side: usize) -> Vec<f32> {
        let h = self.config.hidden_size;
        let d = self
            .config
            .dflash2
            .as_ref()
            .expect("convolutions only in DFlash2 drafters");
        let (taps, groups) = (d.conv_kernel_size, d.num_groups(h));
        let base = &cv.base[side * taps * h..(side + 1) * taps * h];
        let (stride, offset) = (2 * taps * groups, side * taps * groups);
        grouped_conv(x, h, taps, d.conv_group_size, base, coef, stride, offset)
    }

    /// A sublayer's input: the block rows `x` normalised by `norm`, then side 0 of its
    /// DFlash2 convolution where it has one (returned with the coefficients side 1
    /// takes), reported to `probe` as `{tag}.in`, `.kernel` and `.prepared`.
    fn sublayer_input<'c>(
        &self,
        x: &[f32],
        norm: &[f32],
        conv: Option<&'c CpuConv>,
        tag: &str,
        probe: Probe,
    ) -> (Vec<f32>, Option<(&'c CpuConv, Vec<f32>)>) {
        let mut hn = vec![0f32; x.len()];
        rms_norm_rows(x, norm, self.config.rms_norm_eps, &mut hn);
        let Some(cv) = conv else {
            return (hn, None);
        };
        let coef = cv.projection.apply(&hn, x.len() / self.config.hidden_size);
        probe(&format!("{tag}.in"), &hn);
        probe(&format!("{tag}.kernel"), &coef);
        let prepared = self.conv_side(cv, &hn, &coef, 0);
        probe(&format!("{tag}.prepared"), &prepared);
        (prepared, Some((cv, coef)))
    }

    /// A sublayer's output `o` (before the residual add), through side 1 of its
    /// convolution where it has one, reported as `{tag}.sublayer_out` and `.finished`.
    fn sublayer_output(
        &self,
        o: Vec<f32>,
        conv: Option<(&CpuConv, Vec<f32>)>,
        tag: &str,
        probe: Probe,
    ) -> Vec<f32> {
        let Some((cv, coef)) = conv else {
            return o;
        };
        probe(&format!("{tag}.sublayer_out"), &o);
        let out = self.conv_side(cv, &o, &coef, 1);
        probe(&format!("{tag}.finished"), &out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tiny_drafter_target, write_drafter, DrafterSpec};

    /// The reference's mask, key by key.
    fn visible(c: &DrafterConfig, kind: LayerKind, q: usize, p: usize) -> bool {
        let window = c.window(kind);
        if p <= q {
            window.is_none_or(|w| q - p < w)
        } else {
            !c.is_causal(kind) && window.is_none_or(|w| p - q < w)
        }
    }

    #[test]
    fn each_query_sees_the_run_of_keys_the_reference_mask_shows_it() {
        let t = tiny_drafter_target();
        let files = write_drafter(&t, &DrafterSpec::new(&t, 2, 5));
        let json = std::str::from_utf8(&files["config.json"]).unwrap();
        let mut c = DrafterConfig::from_json(json).unwrap();
        for (window, causal) in [0, 1, 3, 8]
            .into_iter()
            .flat_map(|w| [None, Some(true), Some(false)].map(|k| (w, k)))
        {
            (c.sliding_window, c.is_causal) = (window, causal);
            for kind in [LayerKind::Full, LayerKind::Sliding] {
                for (len, q) in (1..12).flat_map(|len| (0..len).map(move |q| (len, q))) {
                    let want: Vec<usize> = (0..len).filter(|&p| visible(&c, kind, q, p)).collect();
                    let got: Vec<usize> = visible_keys(&c, kind, q, len).collect();
                    assert_eq!(
                        got, want,
                        "{kind:?} W={window} causal={causal:?} q={q} of {len}"
                    );
                }
            }
        }
    }
}
