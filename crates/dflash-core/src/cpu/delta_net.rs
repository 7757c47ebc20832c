//! A Gated DeltaNet layer on the CPU (transformers' `Qwen3_5GatedDeltaNet`, its
//! token-by-token recurrence): the depthwise causal convolution with SiLU over q, k, v,
//! L2-normalised q and k (q scaled by `1 / sqrt(key_head_dim)`), per value head the
//! state `S` (`key_head_dim x value_head_dim`) decayed by `exp(g)`, `g = A *
//! softplus(a + dt_bias)`, and updated by the delta rule `S += k (beta (v - S^T k))^T`,
//! the read-out `S^T q` RMS-normalised and gated by `silu(z)`.
//!
//! # Qwen3.5 hybrid targets
//!
//! **Qwen3.5 hybrids** (`qwen3_5`, and `qwen3_5_moe` with experts in every layer: its
//! mixture of experts is described in `crates/dflash-gpu/src/ops/moe.rs`'s module docs;
//! `config::HybridConfig`; `weights::Mixer::{Attention, DeltaNet}`; Hugging Face folders,
//! a multimodal checkpoint's `text_config` read and its vision tower not loaded; GGUF as
//! llama.cpp's converter writes it: `ssm.*` metadata, norms already `1 + w`, `ssm_a`
//! already `-exp(A_log)`, the value heads reordered from grouped-by-key-head to tiled,
//! which `HybridConfig::tiled_value_heads` records so that head h reads key head h mod
//! key_heads on both engines; the gate rows are split on the host, so a streamed GPU load
//! refuses these files).
//!
//! Full-attention layers have an output gate (q_proj's per-head gate rows split off at
//! load into `AttentionWeights::gate`, stacked after v in the QKV GEMV;
//! `elementwise.wgsl sigmoid_gate` after attention) and partial RoPE; norms are
//! zero-centred (stored as `1 + w`). Gated DeltaNet layers (`cpu::delta_net`, this
//! module, and `delta_net.wgsl`): one GEMV of `[qkv; z; b; a]`, the depthwise causal
//! convolution + SiLU (a thread per channel, the rows in order, the last `kernel - 1`
//! inputs kept), the recurrence (a workgroup per value head, the rows in order:
//! L2-normalised q/k, decay `exp(A softplus(a + dt_bias))`, the delta rule, the
//! read-out's gated RMSNorm), out_proj + residual. A row's state depends only on the
//! rows before it, computed alike whatever the pass: one token, a 16-row verify and
//! prefill give the same bits.
//!
//! # Speculative verification over recurrent state
//!
//! After a verify pass of b rows of which k are kept, each linear layer's state must be
//! the state after row k. The CPU reference keeps the state after every row of its last
//! pass (`KvCache::truncate` restores one; a rollback further back is refused, a reset to
//! 0 is always possible). The GPU replays (`crates/dflash-gpu/src/ops/delta_net.rs`):
//! before the verify pass `snapshot` copies each linear layer's states and the pass's
//! first position; the pass keeps its input projection's rows per layer; after `accept`
//! has moved the position, `restore` puts the copies back and `conv`/`recur` with
//! `REPLAY` run again over the accepted rows only (position − pass start, read on the
//! GPU). Chosen over keeping every row's state because of memory and bandwidth on the 9B
//! shape: a layer's S is 32 heads × 128 × 128 f32 = 2 MiB, 24 linear layers 48 MiB;
//! per-row snapshots of a 16-row verify write 16 × 48 = 768 MiB per step (~1.3 ms at 608
//! GB/s), the replay writes the 48 MiB copy, reads it back and recomputes at most 16 rows
//! of recurrence (no matmuls): ~0.2 ms, with 2 × 48 MiB + 12 MiB of projection rows held.
//! KV rollback of the attention layers stays the position. Multi-turn reuse keeps a
//! hybrid cache whole or not at all (`reusable_rows`).

use super::matrix::{Matrix, Stacked};
use super::ops::{dot, rms_norm, silu};
use crate::config::HybridConfig;
use crate::weights::DeltaNetWeights;

/// One layer's recurrent state after some tokens: the convolution's last `kernel - 1`
/// inputs (oldest first) and every value head's `S`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearState {
    pub conv: Vec<f32>,
    pub s: Vec<f32>,
}

impl LinearState {
    pub fn new(c: &HybridConfig) -> Self {
        LinearState {
            conv: vec![0.0; (c.conv_kernel - 1) * c.conv_dim()],
            s: vec![0.0; c.state_len()],
        }
    }
}

pub(crate) struct CpuDeltaNet {
    /// `[qkv; z; b; a]`: one product of the normalised rows.
    proj: Stacked,
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    decay: Vec<f32>,
    norm: Vec<f32>,
    out: Matrix,
    shape: HybridConfig,
    eps: f32,
}

fn softplus(x: f32) -> f32 {
    // torch's softplus (beta 1, threshold 20).
    if x > 20.0 {
        x
    } else {
        crate::math::ln_1p(crate::math::exp(x))
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + crate::math::exp(-x))
}

/// `x * rsqrt(sum(x^2) + 1e-6)` in place (transformers' `l2norm`).
fn l2_normalise(x: &mut [f32]) {
    let inv = 1.0 / (dot(x, x) + 1e-6).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

impl CpuDeltaNet {
    pub(crate) fn new(
        w: DeltaNetWeights,
        shape: &HybridConfig,
        eps: f32,
        kernels: super::CpuKernels,
    ) -> Self {
        CpuDeltaNet {
            proj: Stacked::new(&[&w.qkv, &w.z, &w.b, &w.a], kernels),
            conv: w.conv,
            dt_bias: w.dt_bias,
            decay: w.decay,
            norm: w.norm,
            out: Matrix::owned(w.out, kernels),
            shape: shape.clone(),
            eps,
        }
    }

    pub(crate) fn n_bytes(&self) -> usize {
        self.proj.n_bytes() + self.out.n_bytes()
    }

    /// The layer over `n` normalised rows (`x`, `[n, hidden]`), one token after the
    /// other from `state`, which it leaves after the last; `after_each` gets the state
    /// after every row.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        n: usize,
        state: &mut LinearState,
        after_each: &mut dyn FnMut(&LinearState),
    ) -> Vec<f32> {
        let c = &self.shape;
        let [qkv, z, b, a]: [Vec<f32>; 4] = self.proj.apply(x, n).try_into().expect("four parts");
        let (cd, vd, nv) = (c.conv_dim(), c.value_dim(), c.value_heads);
        let mut read = vec![0f32; n * vd];
        for t in 0..n {
            let mixed = self.convolve(&qkv[t * cd..(t + 1) * cd], &mut state.conv);
            let (bv, av) = (&b[t * nv..(t + 1) * nv], &a[t * nv..(t + 1) * nv]);
            let out = &mut read[t * vd..(t + 1) * vd];
            self.recur(&mixed, (bv, av), &mut state.s, out);
            self.gated_norm(out, &z[t * vd..(t + 1) * vd]);
            after_each(state);
        }
        self.out.apply(&read, n)
    }

    /// The convolution of one token's q, k, v channels with the previous `kernel - 1`
    /// inputs (`history`, shifted by this one), then SiLU.
    fn convolve(&self, input: &[f32], history: &mut [f32]) -> Vec<f32> {
        let (cd, k) = (self.shape.conv_dim(), self.shape.conv_kernel);
        let out = (0..cd)
            .map(|ch| {
                let w = &self.conv[ch * k..(ch + 1) * k];
                let mut acc = 0f32;
                for (j, &wj) in w[..k - 1].iter().enumerate() {
                    acc += wj * history[j * cd + ch];
                }
                silu(acc + w[k - 1] * input[ch])
            })
            .collect();
        if k > 1 {
            history.copy_within(cd.., 0);
            history[(k - 2) * cd..].copy_from_slice(input);
        }
        out
    }

    /// One token through every value head's state: decay, delta-rule update, read-out
    /// into `out` (`[value_heads, value_head_dim]`).
    fn recur(&self, mixed: &[f32], (b, a): (&[f32], &[f32]), s: &mut [f32], out: &mut [f32]) {
        let c = &self.shape;
        let (dk, dv, kd) = (c.key_head_dim, c.value_head_dim, c.key_dim());
        for h in 0..c.value_heads {
            let kh = c.key_head_of(h);
            let mut q = mixed[kh * dk..(kh + 1) * dk].to_vec();
            let mut k = mixed[kd + kh * dk..kd + (kh + 1) * dk].to_vec();
            let v = &mixed[2 * kd + h * dv..2 * kd + (h + 1) * dv];
            l2_normalise(&mut q);
            l2_normalise(&mut k);
            let scale = 1.0 / (dk as f32).sqrt();
            q.iter_mut().for_each(|x| *x *= scale);
            let g = crate::math::exp(self.decay[h] * softplus(a[h] + self.dt_bias[h]));
            let beta = sigmoid(b[h]);
            let sh = &mut s[h * dk * dv..(h + 1) * dk * dv];
            sh.iter_mut().for_each(|x| *x *= g);
            let o = &mut out[h * dv..(h + 1) * dv];
            for j in 0..dv {
                let mut mem = 0f32;
                for i in 0..dk {
                    mem += sh[i * dv + j] * k[i];
                }
                let delta = (v[j] - mem) * beta;
                for i in 0..dk {
                    sh[i * dv + j] += k[i] * delta;
                }
                let mut r = 0f32;
                for i in 0..dk {
                    r += sh[i * dv + j] * q[i];
                }
                o[j] = r;
            }
        }
    }

    /// Each value head's read-out RMS-normalised by `norm` and gated by `silu(z)`.
    fn gated_norm(&self, out: &mut [f32], z: &[f32]) {
        let dv = self.shape.value_head_dim;
        let mut tmp = vec![0f32; dv];
        for (o, zh) in out.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            rms_norm(o, &self.norm, self.eps, &mut tmp);
            for ((x, &t), &g) in o.iter_mut().zip(&tmp).zip(zh) {
                *x = t * silu(g);
            }
        }
    }
}
