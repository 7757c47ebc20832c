//! The pieces every CPU model builds its layers from, the target's and the drafter's
//! alike (as the GPU's drafter reuses the target's blocks): the SwiGLU MLP, and the
//! per-head norm and rotation of queries and keys.

use super::matrix::{CpuKernels, Matrix, Stacked};
use super::ops::{rms_norm, rope, silu};
use crate::config::RopeStyle;
use crate::quant::QuantMatrix;

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
