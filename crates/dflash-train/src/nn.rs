//! Differentiable building blocks shared by the target and the drafter (candle's fused
//! RMSNorm and RoPE kernels have no backward pass, so these are written with plain ops).

use candle_core::{DType, Device, Result, Tensor, D};
use dflash_core::config::RopeStyle;

/// `x * rsqrt(mean(x^2) + eps) * w` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_mul(&(ms + eps as f64)?.sqrt()?.recip()?)?
        .broadcast_mul(w)
}

/// cos/sin of `pos * inv_freq` for every position up to a maximum.
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
    rope_dim: usize,
    style: RopeStyle,
}

impl RopeTables {
    pub fn new(
        inv_freq: &[f32],
        rope_dim: usize,
        style: RopeStyle,
        max_pos: usize,
        dev: &Device,
    ) -> Result<Self> {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for &f in inv_freq {
                let (c, s) = dflash_core::cpu::ops::rope_cos_sin(p, f);
                cos.push(c);
                sin.push(s);
            }
        }
        Ok(RopeTables {
            cos: Tensor::from_vec(cos, (max_pos, half), dev)?,
            sin: Tensor::from_vec(sin, (max_pos, half), dev)?,
            rope_dim,
            style,
        })
    }

    /// Tables for positions `[S, T]` (u32), shaped `[S, 1, T, rope_dim/2]`.
    pub fn gather(&self, pos: &Tensor) -> Result<(Tensor, Tensor)> {
        let (s, t) = pos.dims2()?;
        let flat = pos.flatten_all()?;
        let half = self.rope_dim / 2;
        let g = |m: &Tensor| m.index_select(&flat, 0)?.reshape((s, 1, t, half));
        Ok((g(&self.cos)?, g(&self.sin)?))
    }

    /// Rotates `x` `[S, heads, T, hd]` (the first `rope_dim` dims of each head).
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let hd = x.dim(D::Minus1)?;
        let rd = self.rope_dim;
        let half = rd / 2;
        let xr = if rd < hd {
            x.narrow(D::Minus1, 0, rd)?
        } else {
            x.clone()
        };
        let rotated = match self.style {
            RopeStyle::Neox => {
                let a = xr.narrow(D::Minus1, 0, half)?;
                let b = xr.narrow(D::Minus1, half, half)?;
                let ra = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
                let rb = (a.broadcast_mul(sin)? + b.broadcast_mul(cos)?)?;
                Tensor::cat(&[ra, rb], D::Minus1)?
            }
            RopeStyle::Interleaved => {
                let (s, h, t, _) = xr.dims4()?;
                let pairs = xr.reshape((s, h, t, half, 2))?;
                let a = pairs.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
                let b = pairs.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
                let ra = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
                let rb = (a.broadcast_mul(sin)? + b.broadcast_mul(cos)?)?;
                Tensor::stack(&[ra, rb], D::Minus1)?.reshape((s, h, t, rd))?
            }
        };
        if rd < hd {
            Tensor::cat(&[rotated, x.narrow(D::Minus1, rd, hd - rd)?], D::Minus1)
        } else {
            Ok(rotated)
        }
    }
}

/// A tensor of u32 positions.
pub fn positions(pos: Vec<u32>, s: usize, t: usize, dev: &Device) -> Result<Tensor> {
    Tensor::from_vec(pos, (s, t), dev)?.to_dtype(DType::U32)
}
