//! Weights repacked for the quantized CPU engine's AVX-VNNI kernel: eight weight rows
//! interleaved so that one `vpdpbusd` of a weight vector with four activation bytes
//! broadcast gives eight rows' partial sums in its eight lanes. No horizontal sums, no
//! shuffles: each lane is one output row from the first byte to the last.
//!
//! The arithmetic is `quant_matmul`'s definition, bit for bit: per group the exact
//! integer `isum`, the f32 term `(scale_w * scale_x) * isum + min_w * sum_x`, terms into
//! 8 accumulators by `g % 8` in ascending `g`, and the same fixed tree at the end; the
//! lanes only change which rows are computed side by side.
//!
//! Layout (groups of 32): for each block of 8 rows and each group, 32-byte vectors whose
//! lane `r` holds 4 bytes of row `r`: Q4, 4 vectors (bytes `4c..4c + 4` of the row's 16
//! packed bytes: elements `8c..8c + 8`, low nibbles even, high odd); Q8, 8 vectors of the
//! values plus 128 (unsigned, as `vpdpbusd` takes them; the group's
//! `128 * sum(q_x)` is subtracted from the integer sum). Scales and mins per block and
//! group, 8 rows together. A last block past the matrix's rows holds zero rows, computed
//! and never stored.

#[cfg(target_arch = "x86_64")]
use super::quant_matmul::ActRow;
use super::quant_matmul::{Kernel, QuantizedRows};
use crate::quant::{QFormat, QuantMatrix};

/// Whether `kernel` runs packed matrices: AVX-VNNI (its `vpdpbusd` takes the Q8 values
/// plus 128 without saturating; plain AVX2's `vpmaddubsw` would saturate).
pub fn packed_kernel(kernel: Kernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    return kernel == Kernel::AvxVnni;
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kernel;
        false
    }
}

/// Activation rows taken together over a block (its weights loaded once for them).
#[cfg(target_arch = "x86_64")]
const ROWS_AT_ONCE: usize = 4;

/// Rows per interleaved block (the lanes of a 256-bit vector of i32).
pub(crate) const BLOCK: usize = 8;
const GROUP: usize = 32;

/// A quantized matrix in the interleaved layout (see the module's doc).
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    format: QFormat,
    rows: usize,
    cols: usize,
    /// `[block][group][vector][lane][4 bytes]`.
    qs: Vec<u8>,
    /// f16 bits, `[block][group][lane]`.
    scales: Vec<u16>,
    mins: Vec<u16>,
}

/// Bytes one row stores per group.
fn group_bytes(format: QFormat) -> usize {
    GROUP * format.bits() / 8
}

impl PackedMatrix {
    /// Whether `m` has this layout: Q4 or Q8 in groups of 32.
    pub fn supports(m: &QuantMatrix) -> bool {
        matches!(m.format, QFormat::Q4 | QFormat::Q8) && m.group == GROUP
    }

    /// `m` interleaved (None where [`PackedMatrix::supports`] says no).
    pub fn from_quant(m: &QuantMatrix) -> Option<Self> {
        if !Self::supports(m) {
            return None;
        }
        let gpr = m.groups_per_row();
        let blocks = m.rows.div_ceil(BLOCK);
        let gb = group_bytes(m.format);
        let bias = if m.format == QFormat::Q8 { 128u8 } else { 0 };
        let row_bytes = m.cols * m.format.bits() / 8;
        // SAFETY: u8 has no alignment or validity requirements; the length covers the
        // words' bytes exactly (little-endian hosts only, as the kernels check).
        let bytes =
            unsafe { std::slice::from_raw_parts(m.qs.as_ptr().cast::<u8>(), m.qs.len() * 4) };
        let mut qs = vec![0u8; blocks * gpr * BLOCK * gb];
        let mut scales = vec![0u16; blocks * gpr * BLOCK];
        let mut mins = vec![0u16; blocks * gpr * BLOCK];
        for r in 0..m.rows {
            let (b, lane) = (r / BLOCK, r % BLOCK);
            for g in 0..gpr {
                let at = (b * gpr + g) * BLOCK;
                scales[at + lane] = m.scales[r * gpr + g];
                mins[at + lane] = m.mins[r * gpr + g];
                let src = &bytes[r * row_bytes + g * gb..][..gb];
                for (c, four) in src.chunks_exact(4).enumerate() {
                    let dst = &mut qs[(at * gb) + (c * BLOCK + lane) * 4..][..4];
                    for (d, &s) in dst.iter_mut().zip(four) {
                        *d = s.wrapping_add(bias);
                    }
                }
            }
        }
        Some(PackedMatrix {
            format: m.format,
            rows: m.rows,
            cols: m.cols,
            qs,
            scales,
            mins,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn format(&self) -> QFormat {
        self.format
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the matrix proper (as `QuantMatrix::n_bytes` counts them: the padding
    /// rows of a last partial block are left out).
    pub fn n_bytes(&self) -> usize {
        let groups = self.rows * self.cols / GROUP;
        self.rows * self.cols * self.format.bits() / 8 + 4 * groups
    }

    /// Rows `ids` in the usual row-major layout.
    pub fn quant_rows(&self, ids: &[u32]) -> QuantMatrix {
        let gpr = self.cols / GROUP;
        let gb = group_bytes(self.format);
        let bias = if self.format == QFormat::Q8 { 128u8 } else { 0 };
        let mut bytes = Vec::with_capacity(ids.len() * gpr * gb);
        let (mut scales, mut mins) = (Vec::new(), Vec::new());
        for &r in ids {
            let (b, lane) = (r as usize / BLOCK, r as usize % BLOCK);
            for g in 0..gpr {
                let at = (b * gpr + g) * BLOCK;
                scales.push(self.scales[at + lane]);
                mins.push(self.mins[at + lane]);
                for c in 0..gb / 4 {
                    let four = &self.qs[at * gb + (c * BLOCK + lane) * 4..][..4];
                    bytes.extend(four.iter().map(|&v| v.wrapping_sub(bias)));
                }
            }
        }
        QuantMatrix {
            format: self.format,
            rows: ids.len(),
            cols: self.cols,
            group: GROUP,
            qs: bytes
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect(),
            scales,
            mins,
        }
    }

    /// Row `r` dequantized into `out` (`QuantMatrix::dequantize_row`'s values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        self.quant_rows(&[r as u32]).dequantize_row(0, out);
    }

    /// `[n, rows]` for the quantized rows `x` (`[n, cols]`). Only built where
    /// [`packed_kernel`] holds.
    pub fn matmul(&self, x: &QuantizedRows) -> Vec<f32> {
        assert!(
            packed_kernel(Kernel::detect()),
            "no packed kernel on this CPU"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::detect` chose AVX-VNNI only where the CPU has AVX2, F16C and
        // AVX-VNNI.
        return unsafe { self.matmul_vnni(x) };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = x;
            unreachable!("packed_kernel is false off x86_64")
        }
    }

    /// `matmul` with AVX-VNNI.
    ///
    /// # Safety
    /// The CPU must have AVX2, F16C and AVX-VNNI.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn matmul_vnni(&self, x: &QuantizedRows) -> Vec<f32> {
        assert_eq!(
            (self.format, GROUP, self.cols),
            (x.format(), x.group(), x.cols()),
            "activations quantized for another matrix"
        );
        let (n, m) = (x.rows(), self.rows);
        let xs: Vec<ActRow> = (0..n).map(|t| x.row(t)).collect();
        let blocks = m.div_ceil(BLOCK);
        let blocks_per_task = (blocks / 64).clamp(2, 32);
        let mut by_block = vec![0f32; blocks * BLOCK * n];
        super::quant_matmul::for_each_band(&mut by_block, blocks_per_task * BLOCK * n, |i, out| {
            for (j, o) in out.chunks_exact_mut(BLOCK * n).enumerate() {
                let b = i * blocks_per_task + j;
                for (c, x) in xs.chunks(ROWS_AT_ONCE).enumerate() {
                    let dst = &mut o[c * ROWS_AT_ONCE * BLOCK..][..x.len() * BLOCK];
                    // SAFETY: the caller's CPU has the features.
                    unsafe { vnni::block_dots(self, b, x, dst) };
                }
            }
        });
        let mut y = vec![0f32; n * m];
        for t in 0..n {
            for o in 0..m {
                y[t * m + o] = by_block[(o / BLOCK) * BLOCK * n + t * BLOCK + o % BLOCK];
            }
        }
        y
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{group_bytes, PackedMatrix, BLOCK, GROUP};
    use crate::cpu::quant_matmul::ActRow;
    use crate::quant::QFormat;
    use std::arch::x86_64::*;

    /// Four activation bytes from `p` in every lane.
    #[inline(always)]
    unsafe fn broadcast4(p: *const i8) -> __m256i {
        _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
    }

    /// The exact integer sums of one group for the block's 8 rows (lane r: row r) and
    /// each of the T activation rows (`x[t]`: the group's bytes, `x_isum[t]`: their
    /// sum), the weights loaded and unpacked once for all of them.
    #[inline(always)]
    unsafe fn group_isums<const T: usize>(
        format: QFormat,
        w: *const u8,
        x: [*const i8; T],
        x_isum: [i32; T],
    ) -> [__m256i; T] {
        let mut s0 = [_mm256_setzero_si256(); T];
        let mut s1 = [_mm256_setzero_si256(); T];
        match format {
            QFormat::Q4 => {
                let mask = _mm256_set1_epi8(0x0F);
                for c in 0..4 {
                    let v = _mm256_loadu_si256(w.add(c * 32).cast());
                    let lo = _mm256_and_si256(v, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                    for t in 0..T {
                        s0[t] = _mm256_dpbusd_avx_epi32(s0[t], lo, broadcast4(x[t].add(4 * c)));
                        s1[t] =
                            _mm256_dpbusd_avx_epi32(s1[t], hi, broadcast4(x[t].add(16 + 4 * c)));
                    }
                }
                for t in 0..T {
                    s0[t] = _mm256_add_epi32(s0[t], s1[t]);
                }
            }
            QFormat::Q8 => {
                for c in (0..8).step_by(2) {
                    let v0 = _mm256_loadu_si256(w.add(c * 32).cast());
                    let v1 = _mm256_loadu_si256(w.add((c + 1) * 32).cast());
                    for t in 0..T {
                        s0[t] = _mm256_dpbusd_avx_epi32(s0[t], v0, broadcast4(x[t].add(4 * c)));
                        s1[t] = _mm256_dpbusd_avx_epi32(s1[t], v1, broadcast4(x[t].add(4 * c + 4)));
                    }
                }
                // The weights were stored plus 128: take 128 * sum(q_x) back off.
                for t in 0..T {
                    let sum = _mm256_add_epi32(s0[t], s1[t]);
                    s0[t] = _mm256_sub_epi32(sum, _mm256_set1_epi32(128 * x_isum[t]));
                }
            }
            QFormat::F32 => unreachable!("f32 matrices are never packed"),
        }
        s0
    }

    /// Block `b`'s 8 output rows for each of the (at most 4) activation rows `x` into
    /// `out` (`[x row][8]`).
    #[target_feature(enable = "avx2,f16c,avxvnni")]
    pub(super) unsafe fn block_dots(p: &PackedMatrix, b: usize, x: &[ActRow], out: &mut [f32]) {
        match x.len() {
            1 => out.copy_from_slice(block_dot::<1>(p, b, x).as_flattened()),
            2 => out.copy_from_slice(block_dot::<2>(p, b, x).as_flattened()),
            3 => out.copy_from_slice(block_dot::<3>(p, b, x).as_flattened()),
            4 => out.copy_from_slice(block_dot::<4>(p, b, x).as_flattened()),
            n => unreachable!("{n} rows at once"),
        }
    }

    /// Block `b`'s 8 output rows for each of the T activation rows `x` (`out[t]`).
    #[target_feature(enable = "avx2,f16c,avxvnni")]
    pub(super) unsafe fn block_dot<const T: usize>(
        p: &PackedMatrix,
        b: usize,
        x: &[ActRow],
    ) -> [[f32; BLOCK]; T] {
        debug_assert_eq!(x.len(), T);
        let gpr = p.cols / GROUP;
        let gb = group_bytes(p.format);
        let mut acc = [[_mm256_setzero_ps(); 8]; T];
        for g in 0..gpr {
            let at = (b * gpr + g) * BLOCK;
            let mut xp = [std::ptr::null::<i8>(); T];
            let mut xi = [0i32; T];
            for t in 0..T {
                xp[t] = x[t].qs.as_ptr().add(g * GROUP);
                xi[t] = x[t].isums[g];
            }
            let isum = group_isums::<T>(p.format, p.qs.as_ptr().add(at * gb), xp, xi);
            let sw = _mm256_cvtph_ps(_mm_loadu_si128(p.scales.as_ptr().add(at).cast()));
            let mw = _mm256_cvtph_ps(_mm_loadu_si128(p.mins.as_ptr().add(at).cast()));
            for t in 0..T {
                let term = _mm256_add_ps(
                    _mm256_mul_ps(
                        _mm256_mul_ps(sw, _mm256_set1_ps(x[t].scales[g])),
                        _mm256_cvtepi32_ps(isum[t]),
                    ),
                    _mm256_mul_ps(mw, _mm256_set1_ps(x[t].sums[g])),
                );
                acc[t][g % 8] = _mm256_add_ps(acc[t][g % 8], term);
            }
        }
        let mut out = [[0f32; BLOCK]; T];
        for t in 0..T {
            let a = acc[t];
            let sum = _mm256_add_ps(
                _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[1], a[5])),
                _mm256_add_ps(_mm256_add_ps(a[2], a[6]), _mm256_add_ps(a[3], a[7])),
            );
            _mm256_storeu_ps(out[t].as_mut_ptr(), sum);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quant_matmul::tests::{activations, matrix};
    use crate::cpu::quant_matmul::{quant_matmul, Kernel};

    #[test]
    fn rows_come_back_as_they_went_in() {
        for format in [QFormat::Q4, QFormat::Q8] {
            // 13 rows: a last block of 5 beside 3 padding rows.
            let m = matrix(format, 13, 576, 3);
            let p = PackedMatrix::from_quant(&m).unwrap();
            let all: Vec<u32> = (0..13).collect();
            let back = p.quant_rows(&all);
            assert_eq!(
                (back.qs, back.scales, back.mins),
                (m.qs.clone(), m.scales.clone(), m.mins.clone())
            );
            let (mut a, mut b) = (vec![0f32; 576], vec![0f32; 576]);
            p.dequantize_row(11, &mut a);
            m.dequantize_row(11, &mut b);
            assert_eq!(a, b);
            assert_eq!(p.n_bytes(), m.n_bytes());
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_matches_the_scalar_definition_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avxvnni")
            || !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("f16c")
        {
            eprintln!("no AVX-VNNI here: nothing to compare");
            return;
        }
        // 576 columns: 18 groups (two runs of 8 accumulators and a tail of 2); 13 and
        // 300 rows: partial last blocks, one task and several.
        for format in [QFormat::Q4, QFormat::Q8] {
            for rows in [13, 300] {
                let m = matrix(format, rows, 576, 7);
                let p = PackedMatrix::from_quant(&m).unwrap();
                for n in [1, 2, 3, 5, 16] {
                    let x = QuantizedRows::new(&activations(n, 576), n, 576, format, 32);
                    // SAFETY: checked above.
                    let packed = unsafe { p.matmul_vnni(&x) };
                    let scalar = quant_matmul(&m, &x, Kernel::Scalar);
                    assert_eq!(
                        packed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{format:?} {rows} rows x {n}"
                    );
                }
            }
        }
    }
}
