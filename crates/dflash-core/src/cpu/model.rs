//! The target model forward on the CPU: embedding, RMSNorm, RoPE, grouped-query
//! attention over a KV cache, SwiGLU MLP, lm_head; optional hidden-state taps.

use super::delta_net::{CpuDeltaNet, LinearState};
use super::ops::{argmax, rms_norm, rms_norm_rows, route_experts};
use super::quant_matmul::in_pool;
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Error, Result};
use crate::quant::QuantMatrix;
use crate::weights::{FeedForward, Mixer, ModelWeights, MoeWeights};

use super::layer::{attend, norm_rope_heads, swiglu, HeadRope, Heads, Mlp};
pub use super::matrix::CpuKernels;
use super::matrix::{Matrix, Stacked};

struct Layer {
    attn_norm: Vec<f32>,
    mixer: CpuMixer,
    ffn_norm: Vec<f32>,
    ffn: Ffn,
}

enum CpuMixer {
    Attention(Attention),
    DeltaNet(CpuDeltaNet),
}

struct Attention {
    /// `[wq; wk; wv]`, and the output gate's rows where the model has one.
    qkv: Stacked,
    wo: Matrix,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

impl CpuMixer {
    fn new(m: Mixer, c: &ModelConfig, kernels: CpuKernels) -> Self {
        match (m, &c.hybrid) {
            (Mixer::Attention(a), _) => CpuMixer::Attention(Attention {
                qkv: Stacked::new(
                    &[&a.wq, &a.wk, &a.wv]
                        .into_iter()
                        .chain(a.gate.as_ref())
                        .collect::<Vec<_>>(),
                    kernels,
                ),
                wo: Matrix::owned(a.wo, kernels),
                bq: a.bq,
                bk: a.bk,
                bv: a.bv,
                q_norm: a.q_norm,
                k_norm: a.k_norm,
            }),
            (Mixer::DeltaNet(d), Some(h)) => {
                CpuMixer::DeltaNet(CpuDeltaNet::new(d, h, c.rms_norm_eps, kernels))
            }
            (Mixer::DeltaNet(_), None) => {
                unreachable!("ModelWeights::load gives linear layers only with a HybridConfig")
            }
        }
    }

    fn n_bytes(&self) -> usize {
        match self {
            CpuMixer::Attention(a) => a.qkv.n_bytes() + a.wo.n_bytes(),
            CpuMixer::DeltaNet(d) => d.n_bytes(),
        }
    }
}

/// A layer's feed-forward on the CPU.
enum Ffn {
    Dense(Mlp),
    Moe(Experts),
}

/// A mixture of experts: the router, each expert's `[gate; up]` and down, and the
/// shared expert's (`[gate; up]`, down, its weighing row).
struct Experts {
    router: Matrix,
    experts: Vec<(Stacked, Matrix)>,
    shared: Option<Box<(Stacked, Matrix, Matrix)>>,
    k: usize,
    normalize: bool,
}

impl Ffn {
    fn new(ffn: FeedForward, moe: Option<&MoeConfig>, kernels: CpuKernels) -> Self {
        match (ffn, moe) {
            (FeedForward::Dense { gate, up, down }, _) => {
                Ffn::Dense(Mlp::new(&gate, &up, Matrix::owned(down, kernels), kernels))
            }
            (FeedForward::Moe(m), Some(c)) => Ffn::Moe(Experts::new(m, c, kernels)),
            (FeedForward::Moe(_), None) => {
                unreachable!("ModelWeights::load gives experts only with a MoeConfig")
            }
        }
    }

    fn n_bytes(&self) -> usize {
        match self {
            Ffn::Dense(mlp) => mlp.n_bytes(),
            // A token reads the router and its k experts.
            Ffn::Moe(e) => {
                let per = e
                    .experts
                    .first()
                    .map_or(0, |(gu, d)| gu.n_bytes() + d.n_bytes());
                e.router.n_bytes() + e.k * per
            }
        }
    }

    /// The feed-forward of `n` normalised rows: `[n, hidden]`.
    fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        match self {
            Ffn::Dense(mlp) => mlp.apply(x, n),
            Ffn::Moe(e) => e.apply(x, n),
        }
    }
}

impl Experts {
    fn new(m: MoeWeights, c: &MoeConfig, kernels: CpuKernels) -> Self {
        let (ff, h) = (c.expert_intermediate_size, m.down.rows / c.num_experts);
        let experts = (0..c.num_experts)
            .map(|e| {
                let gate = m.gate.row_range(e * ff, ff);
                let up = m.up.row_range(e * ff, ff);
                let down = Matrix::owned(m.down.row_range(e * h, h), kernels);
                (Stacked::new(&[&gate, &up], kernels), down)
            })
            .collect();
        let shared = m.shared.map(|s| {
            let weigh = Matrix::owned(s.weigh, kernels);
            let gate_up = Stacked::new(&[&s.gate, &s.up], kernels);
            Box::new((gate_up, Matrix::owned(s.down, kernels), weigh))
        });
        Experts {
            router: Matrix::owned(m.router, kernels),
            experts,
            shared,
            k: c.experts_per_token,
            normalize: c.norm_topk_prob,
        }
    }

    /// Each row routed to its experts; an expert runs once over the rows that chose it;
    /// a row's output is `sum_j w_j * expert_j(x)` in order of choice.
    fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        let h = x.len() / n;
        let logits = self.router.apply(x, n);
        let e_count = self.experts.len();
        let routes: Vec<Vec<(usize, f32)>> = (0..n)
            .map(|r| {
                route_experts(
                    &logits[r * e_count..(r + 1) * e_count],
                    self.k,
                    self.normalize,
                )
            })
            .collect();
        // outs[r * k + j]: row r's j-th expert's output.
        let mut outs = vec![Vec::new(); n * self.k];
        for (e, (gate_up, down)) in self.experts.iter().enumerate() {
            let users: Vec<(usize, usize)> = (0..n)
                .flat_map(|r| routes[r].iter().position(|c| c.0 == e).map(|j| (r, j)))
                .collect();
            if users.is_empty() {
                continue;
            }
            let xs: Vec<f32> = users
                .iter()
                .flat_map(|&(r, _)| &x[r * h..(r + 1) * h])
                .copied()
                .collect();
            let y = down.apply(&swiglu(gate_up, &xs, users.len()), users.len());
            for (i, &(r, j)) in users.iter().enumerate() {
                outs[r * self.k + j] = y[i * h..(i + 1) * h].to_vec();
            }
        }
        let mut out = vec![0f32; n * h];
        for r in 0..n {
            for (j, &(_, w)) in routes[r].iter().enumerate() {
                for (o, &y) in out[r * h..(r + 1) * h]
                    .iter_mut()
                    .zip(&outs[r * self.k + j])
                {
                    *o += w * y;
                }
            }
        }
        // The shared expert's output, weighed by sigmoid of its gate, after the routed.
        if let Some((gate_up, down, weigh)) = self.shared.as_deref() {
            let y = down.apply(&swiglu(gate_up, x, n), n);
            let g = weigh.apply(x, n);
            for r in 0..n {
                let s = 1.0 / (1.0 + crate::math::exp(-g[r]));
                let rows = out[r * h..(r + 1) * h]
                    .iter_mut()
                    .zip(&y[r * h..(r + 1) * h]);
                for (o, &y) in rows {
                    *o += s * y;
                }
            }
        }
        out
    }
}

pub struct CpuModel {
    pub config: ModelConfig,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Option<Matrix>,
    inv_freq: Vec<f32>,
    kernels: CpuKernels,
}

/// Per-layer keys and values of every position computed so far; a hybrid model's
/// linear layers' recurrent states instead, with the states after each row of the last
/// pass (what a speculative rollback into that pass restores).
#[derive(Clone)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    kv_dim: usize,
    /// A hybrid model's linear layers' states (boxed: most caches have none).
    rec: Box<Recurrent>,
}

/// The recurrent states of a KvCache's linear layers.
#[derive(Clone)]
struct Recurrent {
    /// Per layer: a linear layer's state after `len` tokens (None: attention).
    linear: Vec<Option<LinearState>>,
    /// (length, `linear` after that many tokens) before and after each row of the last
    /// pass.
    history: Vec<(usize, Vec<Option<LinearState>>)>,
    /// `linear` does not match `len` (rolled back further than the last pass).
    lost: bool,
}

impl KvCache {
    pub fn new(config: &ModelConfig, capacity: usize) -> Self {
        let kv_dim = config.kv_dim();
        KvCache {
            k: (0..config.num_layers)
                .map(|_| Vec::with_capacity(capacity.min(4096) * kv_dim))
                .collect(),
            v: (0..config.num_layers)
                .map(|_| Vec::with_capacity(capacity.min(4096) * kv_dim))
                .collect(),
            len: 0,
            capacity,
            kv_dim,
            rec: Box::new(Recurrent {
                linear: Self::fresh_states(config),
                history: Vec::new(),
                lost: false,
            }),
        }
    }

    fn fresh_states(config: &ModelConfig) -> Vec<Option<LinearState>> {
        (0..config.num_layers)
            .map(|i| {
                let h = config.hybrid.as_ref().filter(|h| h.is_linear(i))?;
                Some(LinearState::new(h))
            })
            .collect()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Drops every position from `len` on (speculative rollback, multi-turn reuse). Each
    /// layer's rows are cut to the kept ones too, so that rows a failed pass appended to
    /// some layers only are gone.
    /// Recurrent states go back to the state after `len` tokens where the last pass
    /// passed it (or to the start); further back they are lost and the next forward
    /// pass is an error.
    pub fn truncate(&mut self, len: usize) {
        let len = self.len.min(len);
        if len < self.len && self.rec.linear.iter().any(Option::is_some) {
            if len == 0 {
                self.rec.linear.iter_mut().flatten().for_each(|s| {
                    s.conv.fill(0.0);
                    s.s.fill(0.0);
                });
                self.rec.lost = false;
            } else if let Some((_, states)) = self.rec.history.iter().find(|h| h.0 == len) {
                self.rec.linear = states.clone();
            } else {
                self.rec.lost = true;
            }
            self.rec.history.retain(|h| h.0 <= len);
        }
        self.len = len;
        for l in 0..self.k.len() {
            self.k[l].truncate(self.len * self.kv_dim);
            self.v[l].truncate(self.len * self.kv_dim);
        }
    }
}

/// Which rows of a forward pass get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    All,
    Last,
    None,
}

#[derive(Debug)]
pub struct ForwardOutput {
    /// `[rows, vocab]` for the rows asked for.
    pub logits: Vec<f32>,
    /// `[n, taps.len() * hidden]`: the residual stream after each tapped layer (after
    /// the final norm for the last layer), in the order the taps were given,
    /// concatenated per token.
    pub taps: Vec<f32>,
}

impl CpuModel {
    /// The reference engine (f32 weights): the oracle.
    pub fn new(w: &ModelWeights) -> Self {
        Self::with_kernels(w, CpuKernels::Reference)
    }

    pub fn with_kernels(w: &ModelWeights, kernels: CpuKernels) -> Self {
        Self::from_weights(w.clone(), kernels)
    }

    /// The engine over `w`, consumed layer by layer (the browser holds the model once,
    /// not twice, while it builds).
    pub fn from_weights(w: ModelWeights, kernels: CpuKernels) -> Self {
        let mat = |m: QuantMatrix| Matrix::owned(m, kernels);
        let inv_freq = w.config.rope_inv_freq();
        let c = w.config.clone();
        let layers = w
            .layers
            .into_iter()
            .map(|l| Layer {
                mixer: CpuMixer::new(l.mixer, &c, kernels),
                ffn: Ffn::new(l.ffn, c.moe.as_ref(), kernels),
                attn_norm: l.attn_norm,
                ffn_norm: l.ffn_norm,
            })
            .collect();
        CpuModel {
            config: w.config,
            embed: mat(w.embed),
            layers,
            norm: w.norm,
            lm_head: w.lm_head.map(mat),
            inv_freq,
            kernels,
        }
    }

    pub fn kernels(&self) -> CpuKernels {
        self.kernels
    }

    /// Bytes of weights one decode step reads: every layer matrix, the norms and the
    /// lm_head (the embedding when it is tied).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let lm = self.lm_head.as_ref().unwrap_or(&self.embed).n_bytes();
        let norms = 2 * self.config.hidden_size * 4;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.mixer.n_bytes() + l.ffn.n_bytes() + norms)
            .sum();
        (lm + layers) as u64
    }

    pub fn new_cache(&self, capacity: usize) -> KvCache {
        KvCache::new(&self.config, capacity)
    }

    /// Embedding rows of `tokens`.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let h = self.config.hidden_size;
        let mut x = Vec::with_capacity(tokens.len() * h);
        for &t in tokens {
            if t as usize >= self.embed.rows() {
                return Err(Error::TokenOutOfRange {
                    id: t,
                    vocab: self.embed.rows(),
                });
            }
            self.embed.push_row(t as usize, &mut x);
        }
        Ok(x)
    }

    /// The output head: the lm_head, or the embedding where the head is tied to it.
    pub(crate) fn head_matrix(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// lm_head alone over rows that are already normalised (the drafter's output).
    pub fn lm_head_rows(&self, x: &[f32], n: usize) -> Vec<f32> {
        in_pool(|| self.lm_head.as_ref().unwrap_or(&self.embed).apply(x, n))
    }

    /// Final norm and lm_head of hidden rows `x` (`[n, hidden]`).
    pub fn logits_of(&self, x: &[f32], n: usize) -> Vec<f32> {
        let h = self.config.hidden_size;
        let mut normed = vec![0f32; n * h];
        rms_norm_rows(
            &x[..n * h],
            &self.norm,
            self.config.rms_norm_eps,
            &mut normed,
        );
        self.lm_head
            .as_ref()
            .unwrap_or(&self.embed)
            .apply(&normed, n)
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their K/V to the cache and
    /// returns logits for the rows asked for and the residual stream after the layers
    /// in `taps` (0-based decoder layer ids).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        rows: LogitRows,
        taps: &[usize],
    ) -> Result<ForwardOutput> {
        in_pool(|| self.forward_here(tokens, cache, rows, taps))
    }

    fn forward_here(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        rows: LogitRows,
        taps: &[usize],
    ) -> Result<ForwardOutput> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Ok(ForwardOutput {
                logits: vec![],
                taps: vec![],
            });
        }
        self.check_pass(cache, n, taps)?;
        let h = c.hidden_size;
        let start = cache.len;
        let mut x = self.embed(tokens)?;
        let mut tap_out = vec![0f32; n * taps.len() * h];
        let mut normed = vec![0f32; n * h];
        if cache.rec.lost {
            return Err(Error::Internal(
                "a linear-attention state was rolled back past its last pass".into(),
            ));
        }
        let mut snapshots = vec![cache.rec.linear.clone(); n];
        cache.rec.history = vec![(start, cache.rec.linear.clone())];
        for (li, l) in self.layers.iter().enumerate() {
            rms_norm_rows(&x, &l.attn_norm, c.rms_norm_eps, &mut normed);
            let o = self.mixer_output((li, l), &normed, n, cache, &mut snapshots);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            rms_norm_rows(&x, &l.ffn_norm, c.rms_norm_eps, &mut normed);
            let d = l.ffn.apply(&normed, n);
            x.iter_mut().zip(&d).for_each(|(x, d)| *x += d);
            self.copy_taps(li, &x, taps, &mut tap_out);
        }
        cache.len += n;
        if cache.rec.linear.iter().any(Option::is_some) {
            let rows = snapshots.into_iter().enumerate();
            cache
                .rec
                .history
                .extend(rows.map(|(r, s)| (start + r + 1, s)));
        }
        let logits = match rows {
            LogitRows::All => self.logits_of(&x, n),
            LogitRows::Last => self.logits_of(&x[(n - 1) * h..], 1),
            LogitRows::None => vec![],
        };
        Ok(ForwardOutput {
            logits,
            taps: tap_out,
        })
    }

    /// A pass of `n` rows fits the cache and its taps name layers of the model.
    fn check_pass(&self, cache: &KvCache, n: usize, taps: &[usize]) -> Result<()> {
        if cache.len + n > cache.capacity {
            return Err(Error::ContextOverflow {
                prompt_tokens: cache.len + n,
                max_new_tokens: 0,
                context: cache.capacity,
            });
        }
        let layers = self.config.num_layers;
        match taps.iter().find(|&&t| t >= layers) {
            Some(bad) => Err(Error::BadConfig(format!(
                "tap layer {bad} >= {layers} layers"
            ))),
            None => Ok(()),
        }
    }

    /// Layer `li`'s attention or DeltaNet over the normalised rows (their states after
    /// each row into `snapshots`): its output, before the residual add.
    fn mixer_output(
        &self,
        (li, l): (usize, &Layer),
        normed: &[f32],
        n: usize,
        cache: &mut KvCache,
        snapshots: &mut [Vec<Option<LinearState>>],
    ) -> Vec<f32> {
        match &l.mixer {
            CpuMixer::Attention(a) => self.attention(a, normed, n, cache, li),
            CpuMixer::DeltaNet(d) => {
                let state = cache.rec.linear[li]
                    .as_mut()
                    .expect("a linear layer's state");
                let mut r = 0;
                d.forward(normed, n, state, &mut |s| {
                    snapshots[r][li] = Some(s.clone());
                    r += 1;
                })
            }
        }
    }

    /// The residual rows `x` after layer `li` into each tap of that layer
    /// (`tap_out[r, tap, hidden]`). A tap of the last layer is after the final norm, as
    /// transformers' `output_hidden_states` gives it to the reference drafter.
    fn copy_taps(&self, li: usize, x: &[f32], taps: &[usize], tap_out: &mut [f32]) {
        let c = &self.config;
        let h = c.hidden_size;
        let last = li + 1 == c.num_layers;
        for (ti, _) in taps.iter().enumerate().filter(|(_, &t)| t == li) {
            for (r, row) in x.chunks_exact(h).enumerate() {
                let dst = &mut tap_out[(r * taps.len() + ti) * h..][..h];
                match last {
                    true => rms_norm(row, &self.norm, c.rms_norm_eps, dst),
                    false => dst.copy_from_slice(row),
                }
            }
        }
    }

    /// Attention of `n` normalised rows at positions `cache.len..` over layer `li`'s
    /// KV cache (their K/V appended), through o_proj: `[n, hidden]`.
    fn attention(
        &self,
        l: &Attention,
        normed: &[f32],
        n: usize,
        cache: &mut KvCache,
        li: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let (hd, nh, nkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let start = cache.len;
        let mut parts = l.qkv.apply(normed, n).into_iter();
        let mut next = || parts.next().expect("q, k and v");
        let (mut q, mut k, mut v) = (next(), next(), next());
        let gate = parts.next();
        for (m, b, d) in [
            (&mut q, &l.bq, qd),
            (&mut k, &l.bk, kvd),
            (&mut v, &l.bv, kvd),
        ] {
            if let Some(b) = b {
                for r in 0..n {
                    for i in 0..d {
                        m[r * d + i] += b[i];
                    }
                }
            }
        }
        for r in 0..n {
            let (inv_freq, dim, style) = (&self.inv_freq[..], c.rope.dim, c.rope.style);
            let rot = HeadRope {
                pos: start + r,
                inv_freq,
                dim,
                style,
            };
            for (m, d, norm) in [(&mut q, qd, &l.q_norm), (&mut k, kvd, &l.k_norm)] {
                let row = &mut m[r * d..(r + 1) * d];
                norm_rope_heads(row, hd, norm.as_deref(), c.rms_norm_eps, &rot);
            }
        }
        cache.k[li].extend_from_slice(&k);
        cache.v[li].extend_from_slice(&v);
        let heads = Heads {
            n: nh,
            kv: nkv,
            dim: hd,
        };
        // Row r sees the cached rows and the pass's rows up to its own position.
        let causal = |r: usize| 0..start + r + 1;
        let kv = (&cache.k[li][..], &cache.v[li][..]);
        let mut att = attend(&q, n, kv, &causal, heads);
        if let Some(g) = gate {
            for (a, &g) in att.iter_mut().zip(&g) {
                *a *= 1.0 / (1.0 + crate::math::exp(-g));
            }
        }
        l.wo.apply(&att, n)
    }

    /// Greedy next token of the last row of a forward output.
    pub fn argmax_last(&self, logits: &[f32]) -> u32 {
        let v = self.config.vocab_size;
        argmax(&logits[logits.len() - v..]) as u32
    }
}
