//! The pieces every CPU model builds its layers from, the target's and the drafter's
//! alike (as the GPU's drafter reuses the target's blocks): the SwiGLU MLP, the per-head
//! norm and rotation of queries and keys, and the attention core over a run of cached
//! keys (the target's causal rows and the drafter's masked block rows alike).

use super::matrix::{CpuKernels, Matrix, Stacked};
use super::ops::{attention_heads, rms_norm, rope, silu};
use super::quant_matmul::{for_each_band, threads};
use crate::config::RopeStyle;
use crate::quant::QuantMatrix;
use std::ops::Range;

/// A SwiGLU MLP: `down(silu(gate x) * up x)`, gate and up applied as one.
pub(crate) struct Mlp {
    gate_up: Stacked,
    down: Matrix,
}

impl Mlp {
    pub(crate) fn new(
        gate: &QuantMatrix,
        up: &QuantMatrix,
        down: Matrix,
        kernels: CpuKernels,
    ) -> Self {
        Mlp {
            gate_up: Stacked::new(&[gate, up], kernels),
            down,
        }
    }

    /// The MLP of `n` normalised rows `x`: `[n, hidden]`.
    pub(crate) fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        self.down.apply(&swiglu(&self.gate_up, x, n), n)
    }

    pub(crate) fn n_bytes(&self) -> usize {
        self.gate_up.n_bytes() + self.down.n_bytes()
    }
}

/// `silu(gate) * up` of the stacked `[gate; up]` over `n` rows.
pub(crate) fn swiglu(gate_up: &Stacked, x: &[f32], n: usize) -> Vec<f32> {
    let [g, u]: [Vec<f32>; 2] = gate_up.apply(x, n).try_into().expect("two parts");
    g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect()
}

/// How a row's heads are rotated: at `pos`, over each head's first `dim` values.
pub(crate) struct HeadRope<'a> {
    pub pos: usize,
    pub inv_freq: &'a [f32],
    pub dim: usize,
    pub style: RopeStyle,
}

/// Each `hd`-wide head of one row's queries or keys: RMS-normalised by `norm` where the
/// model has one, then rotated.
pub(crate) fn norm_rope_heads(
    row: &mut [f32],
    hd: usize,
    norm: Option<&[f32]>,
    eps: f32,
    r: &HeadRope,
) {
    let mut tmp = vec![0f32; hd];
    for head in row.chunks_exact_mut(hd) {
        if let Some(w) = norm {
            rms_norm(head, w, eps, &mut tmp);
            head.copy_from_slice(&tmp);
        }
        rope(&mut head[..r.dim], r.pos, r.inv_freq, r.style);
    }
}

/// Keys from which a one-row pass splits its attention heads across the threads (below,
/// the split costs more than the heads' work).
const PARALLEL_HEADS_FROM: usize = 256;

/// The head shape of a layer's attention: query heads, KV heads, values per head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub n: usize,
    pub kv: usize,
    pub dim: usize,
}

/// The attention output (`[n, heads.n * heads.dim]`) of `n` query rows `q` (normalised
/// and rotated) over the key and value rows `kc`, `vc` (`[rows, heads.kv * heads.dim]`,
/// in position order): row `r` sees the keys `keys(r)`, each head's softmax over them in
/// that order (`ops::attention_heads`). Rows go to the engine's threads, and one row over
/// many keys splits its heads across them: a row's result is its own either way.
pub(crate) fn attend(
    q: &[f32],
    n: usize,
    (kc, vc): (&[f32], &[f32]),
    keys: &(dyn Fn(usize) -> Range<usize> + Sync),
    heads: Heads,
) -> Vec<f32> {
    let (qd, kvd) = (heads.n * heads.dim, heads.kv * heads.dim);
    let shape = (heads.n, heads.kv, heads.dim);
    // Row r's query, and its keys and values from its first key on, with the position of
    // its last key within them.
    let args = |r: usize| {
        let k = keys(r);
        let last = k.len().checked_sub(1);
        let at = k.start * kvd;
        (&q[r * qd..(r + 1) * qd], &kc[at..], &vc[at..], last)
    };
    let mut att = vec![0f32; n * qd];
    if n == 0 {
        return att;
    }
    let row = |r: usize, out: &mut [f32]| {
        if let (q, kc, vc, Some(last)) = args(r) {
            attention_heads((q, kc, vc, last), shape, 0..heads.n, out)
        }
    };
    match args(0) {
        (q, kc, vc, Some(last)) if n == 1 && last >= PARALLEL_HEADS_FROM => {
            // One row over a long context: its heads split across the threads.
            let per_band = heads.n.div_ceil(threads()).max(1);
            for_each_band(&mut att, per_band * heads.dim, |i, band| {
                let first = i * per_band;
                let hs = first..first + band.len() / heads.dim;
                attention_heads((q, kc, vc, last), shape, hs, band)
            });
        }
        _ if n > 1 => for_each_band(&mut att, qd, row),
        _ => row(0, &mut att),
    }
    att
}
