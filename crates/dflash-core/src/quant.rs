//! The GPU's weight formats, shared by every model source.
//!
//! * `Q4`: groups of 32 weights; unsigned nibbles packed 8 per `u32` (one `vec4<u32>`
//!   per group); an f16 scale and an f16 min per group: `w = q * scale + min`.
//! * `Q8`: groups of 32 (or 16, for Q6_K sources) weights; signed bytes packed 4 per
//!   `u32`; an f16 scale and an f16 min per group: `w = q * scale + min`.
//!
//! * `F32`: unquantized f32 values (their bits, one per `u32`; no scales or mins), for
//!   a full-precision drafter on the CPU engines (the GPU kernels read Q4/Q8 only).
//!
//! Values, scales and mins live in separate arrays so that a kernel reads each with
//! aligned 16-byte vector loads. Matrices are row-major `[rows, cols]`; `cols` is a
//! multiple of the group size. Every source type is repacked into one of these at load.
//!
//! # Where each format comes from
//!
//! - `Q4` (group 32): from Q4_0, Q4_1, Q4_K and GPTQ/AWQ int4 sources.
//! - `Q8` (group 32, 16 for Q6_K): from Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 and F32/F16/BF16
//!   sources.
//!
//! `w = q * scale + min`, values, scales and mins in three separate arrays, row-major
//! `[rows, cols]`. Exact for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0; K-quants round `d*sc` and `dmin*m`
//! to f16 (relative 2^-11); float weights are quantized to 8 bits (absmax, error <= half
//! a step). A 4-bit format never receives a source with more than 4 bits. Q6_K keeps its
//! 16-weight sub-blocks as groups of 16 rather than losing its per-16 scales.
//!
//! # The full-precision format
//!
//! The third format, `f32` (`QFormat::F32`: the values' bits, no scales), holds the
//! full-precision path of the CPU engines: a drafter loaded with `DrafterPrecision::F32`
//! (`dflash generate --drafter-precision f32`) and a Hugging Face target loaded with
//! `model_files::load_path_full_precision`, as z-lab's reference keeps them. Such
//! matrices run dense on either CPU engine (`cpu::matrix::Matrix`,
//! `crates/dflash-core/src/cpu/matrix.rs`); the GPU refuses them with `Unsupported`
//! (`upload_matrix`). On the z-lab fixtures the full-precision pair matches the
//! reference's arrays to ~1e-6 and its drafts everywhere
//! (`crates/dflash-core/tests/zlab.rs`); on SmolLM2 the 8-bit drafter accepts exactly as
//! many drafts as the f32 one (`results/drafter-precision-smollm2.json`).
//!
//! 4 bits (`DrafterPrecision::Q4`, the default everywhere: `generate`, `bench`, `serve`,
//! the browser, and a synthetic pair's `SyntheticSpec::drafter_format`;
//! `--drafter-precision q8` for 8) takes the drafter's bytes per step to a little over
//! half for ~1% of tau: on lavapipe block 2 went from 0.88x to 0.93x plain and auto from
//! 0.93-0.98x to 0.98-0.99x, at the same slot-1 acceptance
//! (`results/drafter-q4-vs-q8-lavapipe.jsonl`); on a bandwidth-bound GPU the drafter's
//! bytes are the whole of its cost, and `scripts/device-check.sh` runs the synthetic
//! qwen3-8b pair with 8 bits beside the default.

use crate::error::{Error, Result};
use crate::formats::ggml::{self, GgmlType};
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    Q4,
    Q8,
    F32,
}

impl QFormat {
    pub fn bits(self) -> usize {
        match self {
            QFormat::Q4 => 4,
            QFormat::Q8 => 8,
            QFormat::F32 => 32,
        }
    }
}

#[derive(Debug, Clone)]
pub struct QuantMatrix {
    pub format: QFormat,
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    /// Packed values, row-major; `cols * bits / 32` words per row.
    pub qs: Vec<u32>,
    /// f16 bits, one per group, row-major.
    pub scales: Vec<u16>,
    /// f16 bits, one per group, row-major.
    pub mins: Vec<u16>,
}

/// The format and group size a source type is repacked to: 4-bit sources stay 4-bit,
/// anything that would lose precision in 4 bits goes to 8 bits.
pub fn target_format(t: GgmlType) -> Option<(QFormat, usize)> {
    Some(match t {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K => (QFormat::Q4, 32),
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K | GgmlType::Q8_0 => (QFormat::Q8, 32),
        GgmlType::Q6K => (QFormat::Q8, 16),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (QFormat::Q8, 32),
        GgmlType::Other(_) => return None,
    })
}

impl QuantMatrix {
    fn with_capacity(format: QFormat, rows: usize, cols: usize, group: usize) -> Self {
        let groups = rows * cols / group;
        QuantMatrix {
            format,
            rows,
            cols,
            group,
            qs: Vec::with_capacity(rows * cols * format.bits() / 32),
            scales: Vec::with_capacity(groups),
            mins: Vec::with_capacity(groups),
        }
    }

    pub fn groups_per_row(&self) -> usize {
        self.cols / self.group
    }

    /// Bytes the matrix occupies in GPU memory (values + scales + mins).
    pub fn n_bytes(&self) -> usize {
        self.qs.len() * 4 + self.scales.len() * 2 + self.mins.len() * 2
    }

    fn push_group(&mut self, q: &[i32], scale: f32, min: f32) {
        self.scales.push(f16::from_f32(scale).to_bits());
        self.mins.push(f16::from_f32(min).to_bits());
        match self.format {
            QFormat::Q4 => {
                for w in q.chunks_exact(8) {
                    let mut word = 0u32;
                    for (i, &v) in w.iter().enumerate() {
                        debug_assert!((0..16).contains(&v));
                        word |= (v as u32 & 0xF) << (4 * i);
                    }
                    self.qs.push(word);
                }
            }
            QFormat::F32 => unreachable!("f32 matrices are built by QuantMatrix::from_f32"),
            QFormat::Q8 => {
                for w in q.chunks_exact(4) {
                    let mut word = 0u32;
                    for (i, &v) in w.iter().enumerate() {
                        debug_assert!((-128..128).contains(&v));
                        word |= (v as i8 as u8 as u32) << (8 * i);
                    }
                    self.qs.push(word);
                }
            }
        }
    }

    /// Integer value of element `(r, c)`.
    #[inline]
    pub fn q(&self, r: usize, c: usize) -> i32 {
        let i = r * self.cols + c;
        match self.format {
            QFormat::Q4 => ((self.qs[i / 8] >> (4 * (i % 8))) & 0xF) as i32,
            QFormat::Q8 => ((self.qs[i / 4] >> (8 * (i % 4))) & 0xFF) as u8 as i8 as i32,
            // Not an integer format: its values are `dequantize_row`'s.
            QFormat::F32 => f32::from_bits(self.qs[i]) as i32,
        }
    }

    /// Dequantizes row `r` into `out` (`cols` values): `q * scale + min` in f32 (an
    /// `F32` matrix's own values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if self.format == QFormat::F32 {
            let row = &self.qs[r * self.cols..(r + 1) * self.cols];
            for (o, &b) in out.iter_mut().zip(row) {
                *o = f32::from_bits(b);
            }
            return;
        }
        let gpr = self.groups_per_row();
        for g in 0..gpr {
            let s = f16::from_bits(self.scales[r * gpr + g]).to_f32();
            let m = f16::from_bits(self.mins[r * gpr + g]).to_f32();
            for j in 0..self.group {
                let c = g * self.group + j;
                out[c] = self.q(r, c) as f32 * s + m;
            }
        }
    }

    /// The matrices one under the other (rows concatenated), or None where their
    /// formats, groups or columns differ.
    pub fn stack_rows(parts: &[&QuantMatrix]) -> Option<QuantMatrix> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| (p.format, p.group, p.cols) != (first.format, first.group, first.cols))
        {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let mut m = Self::with_capacity(first.format, rows, first.cols, first.group);
        for p in parts {
            m.qs.extend_from_slice(&p.qs);
            m.scales.extend_from_slice(&p.scales);
            m.mins.extend_from_slice(&p.mins);
        }
        Some(m)
    }

    /// Rows `ids` (in that order) as a matrix of their own (a drafter's draft head).
    pub fn gather_rows(&self, ids: &[u32]) -> QuantMatrix {
        let words = self.cols * self.format.bits() / 32;
        let gpr = if self.format == QFormat::F32 {
            0
        } else {
            self.groups_per_row()
        };
        let mut m = QuantMatrix {
            rows: ids.len(),
            qs: Vec::with_capacity(ids.len() * words),
            scales: Vec::with_capacity(ids.len() * gpr),
            mins: Vec::with_capacity(ids.len() * gpr),
            ..*self
        };
        for &r in ids {
            let r = r as usize;
            m.qs.extend_from_slice(&self.qs[r * words..(r + 1) * words]);
            m.scales
                .extend_from_slice(&self.scales[r * gpr..(r + 1) * gpr]);
            m.mins.extend_from_slice(&self.mins[r * gpr..(r + 1) * gpr]);
        }
        m
    }

    /// Rows `lo..lo + n` as a matrix of their own (one expert of a stack).
    pub fn row_range(&self, lo: usize, n: usize) -> QuantMatrix {
        let words = self.cols * self.format.bits() / 32;
        let gpr = if self.format == QFormat::F32 {
            0
        } else {
            self.groups_per_row()
        };
        QuantMatrix {
            rows: n,
            qs: self.qs[lo * words..(lo + n) * words].to_vec(),
            scales: self.scales[lo * gpr..(lo + n) * gpr].to_vec(),
            mins: self.mins[lo * gpr..(lo + n) * gpr].to_vec(),
            ..*self
        }
    }

    /// An unquantized `[rows, cols]` matrix (`F32`: one group per row, no scales).
    pub fn from_f32(x: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(x.len(), rows * cols, "from_f32: {rows}x{cols} values");
        QuantMatrix {
            format: QFormat::F32,
            rows,
            cols,
            group: cols,
            qs: x.iter().map(|v| v.to_bits()).collect(),
            scales: Vec::new(),
            mins: Vec::new(),
        }
    }

    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }

    /// Repacks `rows x cols` elements of ggml type `t` (row-major, as GGUF stores a
    /// 2-D tensor with `ne0 = cols`).
    pub fn from_ggml(
        name: &str,
        t: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let (format, group) = target_format(t).ok_or_else(|| Error::UnsupportedTensorType {
            tensor: name.into(),
            dtype: t.name(),
        })?;
        let (bs, bb) = t.block_size();
        let n = rows * cols;
        if !cols.is_multiple_of(group) || !cols.is_multiple_of(bs) {
            return Err(Error::BadTensorLayout {
                tensor: name.into(),
                reason: format!("{cols} columns are not a multiple of the group size {group}"),
            });
        }
        if data.len() < n / bs * bb {
            return Err(Error::BadTensorLayout {
                tensor: name.into(),
                reason: "data shorter than its shape".into(),
            });
        }
        match t {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                Ok(Self::quantize_q8(&ggml::dequantize(t, data, n), rows, cols))
            }
            _ => {
                let mut m = Self::with_capacity(format, rows, cols, group);
                ggml::for_each_group(t, data, n, |g| {
                    debug_assert_eq!(g.q.len(), group);
                    m.push_group(g.q, g.scale, g.min)
                });
                Ok(m)
            }
        }
    }

    /// Symmetric 8-bit quantization of float weights: per group of 32, scale = absmax/127
    /// (rounded to f16 first), q = round(x / scale). Error per element <= scale / 2.
    pub fn quantize_q8(x: &[f32], rows: usize, cols: usize) -> Self {
        let mut m = Self::with_capacity(QFormat::Q8, rows, cols, 32);
        let mut q = [0i32; 32];
        for g in x.chunks_exact(32) {
            let amax = g.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = f16::from_f32(amax / 127.0).to_f32();
            for (qi, &v) in q.iter_mut().zip(g) {
                *qi = if scale > 0.0 {
                    (v / scale).round().clamp(-127.0, 127.0) as i32
                } else {
                    0
                };
            }
            m.push_group(&q, scale, 0.0);
        }
        m
    }

    /// Asymmetric 4-bit quantization (used for optional 4-bit loading of float weights):
    /// per group of 32, scale = (max-min)/15, min = the group minimum.
    pub fn quantize_q4(x: &[f32], rows: usize, cols: usize) -> Self {
        let mut m = Self::with_capacity(QFormat::Q4, rows, cols, 32);
        let mut q = [0i32; 32];
        for g in x.chunks_exact(32) {
            let lo = g.iter().cloned().fold(f32::INFINITY, f32::min);
            let hi = g.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let scale = f16::from_f32((hi - lo) / 15.0).to_f32();
            let min = f16::from_f32(lo).to_f32();
            for (qi, &v) in q.iter_mut().zip(g) {
                *qi = if scale > 0.0 {
                    ((v - min) / scale).round().clamp(0.0, 15.0) as i32
                } else {
                    0
                };
            }
            m.push_group(&q, scale, min);
        }
        m
    }

    /// Builds a matrix from integer groups given by a packed-int4 checkpoint (GPTQ/AWQ):
    /// `q[r][c]` in 0..16, and per (row, group) `scale` and `zero` with
    /// `w = (q - zero) * scale`. `src_group` is the checkpoint's group size along `cols`
    /// (a multiple of 32).
    pub fn from_int4_zero_scale(
        rows: usize,
        cols: usize,
        src_group: usize,
        q: impl Fn(usize, usize) -> i32,
        scale: impl Fn(usize, usize) -> f32,
        zero: impl Fn(usize, usize) -> f32,
    ) -> Self {
        let mut m = Self::with_capacity(QFormat::Q4, rows, cols, 32);
        let mut buf = [0i32; 32];
        for r in 0..rows {
            for g in 0..cols / 32 {
                let sg = g * 32 / src_group;
                for (j, b) in buf.iter_mut().enumerate() {
                    *b = q(r, g * 32 + j);
                }
                let s = scale(r, sg);
                m.push_group(&buf, s, -zero(r, sg) * s);
            }
        }
        m
    }
}
