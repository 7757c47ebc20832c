//! Weights repacked for the quantized CPU engine's interleaved kernels: natively sixteen
//! weight rows interleaved so that one `vpdpbusd` of a weight vector with four activation
//! bytes broadcast gives sixteen rows' partial sums in its sixteen lanes (AVX-512 VNNI;
//! AVX-VNNI takes each block as two halves of eight rows, 256 bits each); in wasm
//! (SIMD128) four rows whose byte pairs `i32x4.dot_i16x8_s` takes against an activation
//! pair broadcast, four rows' partial sums in its four lanes. AVX2 without VNNI runs the
//! 8-row halves with `vpmaddubsw` + `vpmaddwd` in place of `vpdpbusd`. No horizontal sums, no
//! shuffles: each lane is one output row from the first byte to the last.
//!
//! The arithmetic is `quant_matmul`'s definition, bit for bit: per group the exact
//! integer `isum`, the f32 term `(scale_w * scale_x) * isum + min_w * sum_x`, terms into
//! 8 accumulators by `g % 8` in ascending `g`, and the same fixed tree at the end; the
//! lanes only change which rows are computed side by side.
//!
//! Layout (groups of 32, and Q8's 16): for each block of [`BLOCK`] rows and each group (in
//! the order the kernels walk them: by accumulator, `g % 8`, then ascending `g`), the
//! row's bytes in runs of `LANE_BYTES`, run `c` of every row of the block side by side
//! (lane `r`: row `r`): natively 16 rows x 4 bytes (64-byte runs), in wasm 4 rows x 2
//! bytes.
//! A Q4 row has 16 packed bytes per group (byte `b`: elements `2b` low, `2b + 1` high),
//! so a run's low nibbles meet the group's even activations and its high nibbles the odd
//! ones; a Q8 row has 32. Natively the Q8 values are stored plus 128 (unsigned, as
//! `vpdpbusd` takes them; the group's `128 * sum(q_x)` is subtracted from the integer
//! sum); wasm widens them signed. Scales and mins per block and group, the block's rows
//! together. A last block past the matrix's rows holds zero rows, computed and never
//! stored.

use super::quant_matmul::{ActRow, Kernel, QuantizedRows};
use crate::quant::{QFormat, QuantMatrix};

/// Whether `kernel` runs packed matrices: AVX2, AVX-VNNI and AVX-512 VNNI (`vpdpbusd`,
/// or AVX2's `vpmaddubsw` on nibbles: the Q8 values plus 128 split in two, as one
/// `vpmaddubsw` of them would saturate) and wasm SIMD128.
pub fn packed_kernel(kernel: Kernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    return matches!(
        kernel,
        Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512Vnni256 | Kernel::Avx512Vnni
    );
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return kernel == Kernel::Simd128;
    #[allow(unreachable_code)]
    {
        let _ = kernel;
        false
    }
}

/// Rows per interleaved block: the i32 lanes of a 512-bit vector natively, of a 128-bit
/// one in wasm.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) const BLOCK: usize = 16;
#[cfg(target_arch = "wasm32")]
pub(crate) const BLOCK: usize = 4;
/// Bytes of a row per lane: `vpdpbusd`'s four, `dot_i16x8`'s pair.
#[cfg(not(target_arch = "wasm32"))]
const LANE_BYTES: usize = 4;
#[cfg(target_arch = "wasm32")]
const LANE_BYTES: usize = 2;
/// What the Q8 values are stored plus (see the module's doc).
const Q8_BIAS: u8 = if cfg!(target_arch = "wasm32") { 0 } else { 128 };
const GROUP: usize = 32;
/// Bytes of one run: every row's `LANE_BYTES` of it side by side.
#[cfg(target_arch = "x86_64")]
const RUN: usize = BLOCK * LANE_BYTES;

/// A quantized matrix in the interleaved layout (see the module's doc).
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    format: QFormat,
    /// Values per group: 32, or natively 16 for Q8.
    group: usize,
    rows: usize,
    cols: usize,
    /// `[block][group][run][lane][LANE_BYTES]`.
    qs: Vec<u8>,
    /// f16 bits, `[block][group][lane]`.
    scales: Vec<u16>,
    mins: Vec<u16>,
}

/// `$f::<T, G>(p, b, x)` into `out` for the tile's rows T (one of the literals) and the
/// matrix's group G (32 or 16): the kernels' monomorphic bodies chosen at run time.
#[allow(unused_macros)]
macro_rules! by_tile {
    ($f:ident, $p:expr, $b:expr, $x:expr, $out:expr; $($t:literal)*) => {
        match ($x.rows, $p.group) {
            $(($t, 32) => $out.copy_from_slice($f::<$t, 32>($p, $b, $x).as_flattened()),
              ($t, 16) => $out.copy_from_slice($f::<$t, 16>($p, $b, $x).as_flattened()),)*
            (n, g) => unreachable!("{n} rows at once in groups of {g}"),
        }
    };
}

/// Where group `g` of a row of `gpr` groups is stored in its block: by accumulator,
/// `(g % 8, g / 8)` (the order the kernels walk them, so that a block is read front to
/// back).
fn slot(g: usize, gpr: usize) -> usize {
    let j = g % 8;
    j * (gpr / 8) + j.min(gpr % 8) + g / 8
}

/// Bytes one row stores per group.
fn group_bytes(format: QFormat, group: usize) -> usize {
    group * format.bits() / 8
}

impl PackedMatrix {
    /// Whether `m` has this layout: Q4 or Q8 in groups of 32, and Q8 in groups of 16
    /// (Q6_K's repacking: the K-quant models' attn_v, ffn_down and tied heads).
    pub fn supports(m: &QuantMatrix) -> bool {
        match m.format {
            QFormat::Q4 => m.group == GROUP,
            QFormat::Q8 => m.group == GROUP || m.group == GROUP / 2,
            QFormat::F32 => false,
        }
    }

    /// `m` interleaved (None where [`PackedMatrix::supports`] says no).
    pub fn from_quant(m: &QuantMatrix) -> Option<Self> {
        if !Self::supports(m) {
            return None;
        }
        let gpr = m.groups_per_row();
        let blocks = m.rows.div_ceil(BLOCK);
        let gb = group_bytes(m.format, m.group);
        let bias = if m.format == QFormat::Q8 { Q8_BIAS } else { 0 };
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
                let at = (b * gpr + slot(g, gpr)) * BLOCK;
                scales[at + lane] = m.scales[r * gpr + g];
                mins[at + lane] = m.mins[r * gpr + g];
                let src = &bytes[r * row_bytes + g * gb..][..gb];
                for (c, run) in src.chunks_exact(LANE_BYTES).enumerate() {
                    let dst = &mut qs[(at * gb) + (c * BLOCK + lane) * LANE_BYTES..][..LANE_BYTES];
                    for (d, &s) in dst.iter_mut().zip(run) {
                        *d = s.wrapping_add(bias);
                    }
                }
            }
        }
        Some(PackedMatrix {
            format: m.format,
            group: m.group,
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

    /// Values per group (what its input rows are quantized by).
    pub fn group(&self) -> usize {
        self.group
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the matrix proper (as `QuantMatrix::n_bytes` counts them: the padding
    /// rows of a last partial block are left out).
    pub fn n_bytes(&self) -> usize {
        let groups = self.rows * self.cols / self.group;
        self.rows * self.cols * self.format.bits() / 8 + 4 * groups
    }

    /// Rows `ids` in the usual row-major layout.
    pub fn quant_rows(&self, ids: &[u32]) -> QuantMatrix {
        // A last block's padding rows are not rows of the matrix.
        assert!(
            ids.iter().all(|&r| (r as usize) < self.rows),
            "row id past the matrix's {} rows",
            self.rows
        );
        let gpr = self.cols / self.group;
        let gb = group_bytes(self.format, self.group);
        let bias = if self.format == QFormat::Q8 {
            Q8_BIAS
        } else {
            0
        };
        let mut bytes = Vec::with_capacity(ids.len() * gpr * gb);
        let (mut scales, mut mins) = (Vec::new(), Vec::new());
        for &r in ids {
            let (b, lane) = (r as usize / BLOCK, r as usize % BLOCK);
            for g in 0..gpr {
                let at = (b * gpr + slot(g, gpr)) * BLOCK;
                scales.push(self.scales[at + lane]);
                mins.push(self.mins[at + lane]);
                for c in 0..gb / LANE_BYTES {
                    let run = &self.qs[at * gb + (c * BLOCK + lane) * LANE_BYTES..][..LANE_BYTES];
                    bytes.extend(run.iter().map(|&v| v.wrapping_sub(bias)));
                }
            }
        }
        QuantMatrix {
            format: self.format,
            rows: ids.len(),
            cols: self.cols,
            group: self.group,
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

    /// `[n, rows]` for the quantized rows `x` (`[n, cols]`) with the process's kernel.
    /// Only built where [`packed_kernel`] holds.
    pub fn matmul(&self, x: &QuantizedRows) -> Vec<f32> {
        self.matmul_with(Kernel::detect(), x)
    }

    /// `matmul` with `kernel`, which must be a packed kernel this host runs (the same
    /// bits whichever).
    pub fn matmul_with(&self, kernel: Kernel, x: &QuantizedRows) -> Vec<f32> {
        // The process's own kernel was checked when it was chosen; a forced one here.
        assert!(
            packed_kernel(kernel)
                && (kernel == Kernel::detect() || Kernel::available().contains(&kernel)),
            "{} is no packed kernel of this CPU",
            kernel.name()
        );
        match kernel {
            // SAFETY (each): the CPU has the kernel's features (`Kernel::available`).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => self.in_tiles(x, 4, |b, t, dst| unsafe {
                vnni::block_dots::<vnni::Avx2>(self, b, t, dst)
            }),
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => self.in_tiles(x, 4, |b, t, dst| unsafe {
                vnni::block_dots::<vnni::Vex>(self, b, t, dst)
            }),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni256 => self.in_tiles(x, 4, |b, t, dst| unsafe {
                vnni::block_dots::<vnni::Evex>(self, b, t, dst)
            }),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => self.in_tiles(x, 8, |b, t, dst| unsafe {
                vnni512::block_dots(self, b, t, dst)
            }),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Kernel::Simd128 => self.matmul_simd128(x),
            _ => unreachable!("not a packed kernel"),
        }
    }

    /// The product by blocks (`in_blocks`) with the activation rows in tiles of at most
    /// `height` (x86): `dots(b, tile, out)` gives block `b`'s outputs for a tile's rows.
    #[cfg(target_arch = "x86_64")]
    fn in_tiles(
        &self,
        x: &QuantizedRows,
        height: usize,
        dots: impl Fn(usize, &Tile, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let tiles = tiles(x, height, self.group, self.cols / self.group);
        self.in_blocks(x, height, |b, first, _, dst| {
            dots(b, &tiles[first / height], dst)
        })
    }

    /// `matmul` with wasm SIMD128: the activation rows in tiles of four, each row's group
    /// bytes taken in pairs (`simd128::Tile`).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    fn matmul_simd128(&self, x: &QuantizedRows) -> Vec<f32> {
        let rows: Vec<ActRow> = (0..x.rows()).map(|t| x.row(t)).collect();
        let gpr = self.cols / self.group;
        let tiles: Vec<simd128::Tile> = rows
            .chunks(simd128::TILE)
            .map(|c| simd128::Tile::new(c, self.group, gpr))
            .collect();
        self.in_blocks(x, simd128::TILE, |b, first, _, dst| {
            simd128::block_dots(self, b, &tiles[first / simd128::TILE], dst)
        })
    }

    /// The product by blocks of rows on the engine's threads: `block_dots(b, first, rows,
    /// out)` gives block `b`'s outputs for the activation rows `rows` (`first` the index of
    /// the first), at most `at_once` of them, into `out` (`[row][BLOCK]`).
    fn in_blocks(
        &self,
        x: &QuantizedRows,
        at_once: usize,
        block_dots: impl Fn(usize, usize, &[ActRow], &mut [f32]) + Sync,
    ) -> Vec<f32> {
        assert_eq!(
            (self.format, self.group, self.cols),
            (x.format(), x.group(), x.cols()),
            "activations quantized for another matrix"
        );
        let (n, m) = (x.rows(), self.rows);
        let xs: Vec<ActRow> = (0..n).map(|t| x.row(t)).collect();
        let blocks = m.div_ceil(BLOCK);
        // A few tasks per thread (stolen where one runs late), each a band of blocks.
        let tasks = 4 * super::quant_matmul::threads();
        let blocks_per_task = blocks.div_ceil(tasks).max(1);
        let mut by_block = vec![0f32; blocks * BLOCK * n];
        super::quant_matmul::for_each_band(&mut by_block, blocks_per_task * BLOCK * n, |i, out| {
            for (j, o) in out.chunks_exact_mut(BLOCK * n).enumerate() {
                let b = i * blocks_per_task + j;
                for (c, rows) in xs.chunks(at_once).enumerate() {
                    let dst = &mut o[c * at_once * BLOCK..][..rows.len() * BLOCK];
                    block_dots(b, c * at_once, rows, dst);
                }
            }
        });
        if n == 1 {
            // `[block][BLOCK]` is the row itself, past its end the padding rows.
            by_block.truncate(m);
            return by_block;
        }
        // `[block][row][BLOCK]` into `[row][m]`, a row per band.
        let mut y = vec![0f32; n * m];
        super::quant_matmul::for_each_band(&mut y, m, |t, row| {
            for (b, out) in row.chunks_mut(BLOCK).enumerate() {
                out.copy_from_slice(&by_block[(b * n + t) * BLOCK..][..out.len()]);
            }
        });
        y
    }
}

/// Up to 8 activation rows group-major, as the x86 kernels read them: group `g`'s rows
/// side by side (`qs`: `[g][t][G]`, the rest `[g][t]`), so that one pointer walks all
/// of them and each row is a constant offset from it.
#[cfg(target_arch = "x86_64")]
struct Tile {
    rows: usize,
    group: usize,
    qs: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
    isums: Vec<i32>,
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    /// The rows `x` (at most 8, each of `gpr` groups of `group`) interleaved.
    fn new(x: &[ActRow], group: usize, gpr: usize) -> Self {
        let t_n = x.len();
        assert!((1..=8).contains(&t_n), "{t_n} rows in a tile");
        let mut tile = Tile {
            rows: t_n,
            group,
            qs: Vec::with_capacity(gpr * t_n * group),
            scales: Vec::with_capacity(gpr * t_n),
            sums: Vec::with_capacity(gpr * t_n),
            isums: Vec::with_capacity(gpr * t_n),
        };
        for g in 0..gpr {
            for a in x {
                tile.qs.extend_from_slice(&a.qs[g * group..][..group]);
                tile.scales.push(a.scales[g]);
                tile.sums.push(a.sums[g]);
                tile.isums.push(a.isums[g]);
            }
        }
        tile
    }
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    /// The tile's arrays (values, scales, sums, integer sums), checked to hold T rows of
    /// `gpr` groups of G, for reading through raw pointers (no bounds checks in the
    /// kernels' loops).
    fn pointers<const T: usize, const G: usize>(
        &self,
        gpr: usize,
    ) -> (*const i8, *const f32, *const f32, *const i32) {
        assert!(self.rows == T && self.group == G && self.qs.len() >= gpr * T * G);
        assert!(self.scales.len() >= gpr * T && self.sums.len() >= gpr * T);
        assert!(self.isums.len() >= gpr * T);
        (
            self.qs.as_ptr(),
            self.scales.as_ptr(),
            self.sums.as_ptr(),
            self.isums.as_ptr(),
        )
    }
}

#[cfg(target_arch = "x86_64")]
impl PackedMatrix {
    /// Checks that block `b` (rows of `gb` bytes per group) lies within the arrays, which
    /// the kernels then read through raw pointers.
    fn check_block(&self, b: usize, gb: usize) {
        let gpr = self.cols / self.group;
        assert!((b + 1) * gpr * BLOCK <= self.scales.len());
        assert!(self.mins.len() == self.scales.len() && self.qs.len() >= self.scales.len() * gb);
    }
}

/// `x`'s rows in tiles of at most `height`, for a matrix of `group` and `gpr`.
#[cfg(target_arch = "x86_64")]
fn tiles(x: &QuantizedRows, height: usize, group: usize, gpr: usize) -> Vec<Tile> {
    let rows: Vec<ActRow> = (0..x.rows()).map(|t| x.row(t)).collect();
    rows.chunks(height)
        .map(|c| Tile::new(c, group, gpr))
        .collect()
}

/// Asks for the weight bytes [`PREFETCH_BYTES`] past `w` (the `len` bytes of a group
/// there), so that the stream from memory runs while this group is computed: the
/// kernels walk a band of blocks front to back. A hint only (no fault past the end).
#[inline(always)]
#[cfg(target_arch = "x86_64")]
unsafe fn prefetch_ahead(w: *const u8, len: usize) {
    let ahead = w.wrapping_add(PREFETCH_BYTES);
    for line in (0..len).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
    }
}

/// How far ahead of the group being computed its weights are asked for.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 4096;

/// The 8-row kernel (256-bit vectors): each 16-row block as two halves, the half's
/// lanes of every run (`RUN` bytes apart) its rows. One body for AVX-VNNI's encoding of
/// `vpdpbusd` and AVX-512 VL's.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{group_bytes, PackedMatrix, Tile, BLOCK, RUN};
    use crate::quant::QFormat;
    use std::arch::x86_64::*;

    /// Rows of a half block.
    const HALF: usize = BLOCK / 2;

    /// `vpdpbusd` on 256-bit vectors, in one of its two encodings or as AVX2's
    /// instructions, and the half block's product compiled with those features.
    pub(super) trait Dp: Sized {
        /// `acc` plus, per i32 lane, the four products of `u`'s bytes (unsigned) with
        /// `s`'s (signed, within -127..=127).
        unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
        /// One group's exact integer sums (`group_isums`'s contract).
        #[inline(always)]
        unsafe fn isums<const T: usize, const G: usize>(
            format: QFormat,
            w: *const u8,
            x: *const i8,
            x_isum: *const i32,
        ) -> [__m256i; T] {
            group_isums::<Self, T, G>(format, w, x, x_isum)
        }
        unsafe fn half_dot<const T: usize, const G: usize, const H: usize>(
            p: &PackedMatrix,
            b: usize,
            h: usize,
            x: &Tile,
        ) -> [[[f32; HALF]; T]; H];
    }
    /// AVX2 alone (no VNNI): `vpmaddubsw` (pairs of byte products into i16, exact for
    /// nibbles: 2 * 15 * 127 < 2^15), then `vpmaddwd` into i32 lanes; Q8's bytes (stored
    /// plus 128) split into nibbles, `u = 16 h + l`. Its groups go through `isums`.
    pub(super) struct Avx2;
    impl Dp for Avx2 {
        /// Nibbles only (`u` at most 15); `isums` takes the bytes apart.
        #[inline(always)]
        unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            let pairs = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
        /// The group's byte products summed in i16 lanes before one `vpmaddwd`: a lane
        /// of `vpmaddubsw` holds two products of at most 15 * 127 = 1905, so the 16 of a
        /// group's lane (32 values: 8 runs of nibbles or bytes' nibble halves) stay
        /// within 30,480 < 2^15, exact.
        #[inline(always)]
        unsafe fn isums<const T: usize, const G: usize>(
            format: QFormat,
            w: *const u8,
            x: *const i8,
            x_isum: *const i32,
        ) -> [__m256i; T] {
            let mask = _mm256_set1_epi8(0x0F);
            let mut lo = [_mm256_setzero_si256(); T];
            let mut hi = [_mm256_setzero_si256(); T];
            let add = |acc: &mut __m256i, u: __m256i, s: *const i8| {
                *acc = _mm256_add_epi16(*acc, _mm256_maddubs_epi16(u, broadcast4(s)));
            };
            match format {
                QFormat::Q4 => {
                    for c in 0..G / 8 {
                        let v = _mm256_loadu_si256(w.add(c * RUN).cast());
                        let (l, h) = (
                            _mm256_and_si256(v, mask),
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                        );
                        for (t, acc) in lo.iter_mut().enumerate() {
                            let xt = x.add(t * G + 4 * c);
                            add(acc, l, xt);
                            add(acc, h, xt.add(G / 2));
                        }
                    }
                }
                QFormat::Q8 => {
                    for c in 0..G / 4 {
                        let v = _mm256_loadu_si256(w.add(c * RUN).cast());
                        let (l, h) = (
                            _mm256_and_si256(v, mask),
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                        );
                        for (t, (a, b)) in lo.iter_mut().zip(&mut hi).enumerate() {
                            let xt = x.add(t * G + 4 * c);
                            add(a, l, xt);
                            add(b, h, xt);
                        }
                    }
                }
                QFormat::F32 => unreachable!("f32 matrices are never packed"),
            }
            let mut out = [_mm256_setzero_si256(); T];
            for t in 0..T {
                let l = _mm256_madd_epi16(lo[t], _mm256_set1_epi16(1));
                out[t] = match format {
                    QFormat::Q8 => {
                        let h = _mm256_madd_epi16(hi[t], _mm256_set1_epi16(16));
                        // The weights were stored plus 128: take 128 * sum(q_x) back off.
                        let bias = _mm256_set1_epi32(128 * *x_isum.add(t));
                        _mm256_sub_epi32(_mm256_add_epi32(l, h), bias)
                    }
                    _ => l,
                };
            }
            out
        }
        #[inline(always)]
        unsafe fn half_dot<const T: usize, const G: usize, const H: usize>(
            p: &PackedMatrix,
            b: usize,
            h: usize,
            x: &Tile,
        ) -> [[[f32; HALF]; T]; H] {
            half_dot_avx2::<T, G, H>(p, b, h, x)
        }
    }
    /// AVX-VNNI (VEX).
    pub(super) struct Vex;
    /// AVX-512 VNNI with VL (EVEX): the same instruction and lanes.
    pub(super) struct Evex;
    impl Dp for Vex {
        #[inline(always)]
        unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            _mm256_dpbusd_avx_epi32(acc, u, s)
        }
        #[inline(always)]
        unsafe fn half_dot<const T: usize, const G: usize, const H: usize>(
            p: &PackedMatrix,
            b: usize,
            h: usize,
            x: &Tile,
        ) -> [[[f32; HALF]; T]; H] {
            half_dot_vex::<T, G, H>(p, b, h, x)
        }
    }
    impl Dp for Evex {
        #[inline(always)]
        unsafe fn dp(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
            _mm256_dpbusd_epi32(acc, u, s)
        }
        #[inline(always)]
        unsafe fn half_dot<const T: usize, const G: usize, const H: usize>(
            p: &PackedMatrix,
            b: usize,
            h: usize,
            x: &Tile,
        ) -> [[[f32; HALF]; T]; H] {
            half_dot_evex::<T, G, H>(p, b, h, x)
        }
    }

    /// Four activation bytes from `p` in every lane.
    #[inline(always)]
    unsafe fn broadcast4(p: *const i8) -> __m256i {
        _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
    }

    /// The exact integer sums of one group for a half block's 8 rows (lane r: row r;
    /// `w` the half's first run) and each of the T activation rows (`x`: the tile's
    /// group, row `t` at `t * G`; `x_isum[t]`: its sum), the weights loaded and unpacked
    /// once for all.
    #[inline(always)]
    unsafe fn group_isums<D: Dp, const T: usize, const G: usize>(
        format: QFormat,
        w: *const u8,
        x: *const i8,
        x_isum: *const i32,
    ) -> [__m256i; T] {
        let mut s0 = [_mm256_setzero_si256(); T];
        let mut s1 = [_mm256_setzero_si256(); T];
        match format {
            QFormat::Q4 => {
                let mask = _mm256_set1_epi8(0x0F);
                for c in 0..G / 8 {
                    let v = _mm256_loadu_si256(w.add(c * RUN).cast());
                    let lo = _mm256_and_si256(v, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                    for t in 0..T {
                        let xt = x.add(t * G + 4 * c);
                        s0[t] = D::dp(s0[t], lo, broadcast4(xt));
                        s1[t] = D::dp(s1[t], hi, broadcast4(xt.add(G / 2)));
                    }
                }
                for t in 0..T {
                    s0[t] = _mm256_add_epi32(s0[t], s1[t]);
                }
            }
            QFormat::Q8 => {
                for c in (0..G / 4).step_by(2) {
                    let v0 = _mm256_loadu_si256(w.add(c * RUN).cast());
                    let v1 = _mm256_loadu_si256(w.add((c + 1) * RUN).cast());
                    for t in 0..T {
                        let xt = x.add(t * G + 4 * c);
                        s0[t] = D::dp(s0[t], v0, broadcast4(xt));
                        s1[t] = D::dp(s1[t], v1, broadcast4(xt.add(4)));
                    }
                }
                // The weights were stored plus 128: take 128 * sum(q_x) back off.
                for t in 0..T {
                    let sum = _mm256_add_epi32(s0[t], s1[t]);
                    let bias = _mm256_set1_epi32(128 * *x_isum.add(t));
                    s0[t] = _mm256_sub_epi32(sum, bias);
                }
            }
            QFormat::F32 => unreachable!("f32 matrices are never packed"),
        }
        s0
    }

    /// Block `b`'s 16 output rows for each of the tile's (at most 4) rows into `out`
    /// (`[x row][16]`), half by half.
    ///
    /// # Safety
    /// The CPU must have AVX2, F16C and `D`'s `vpdpbusd`.
    pub(super) unsafe fn block_dots<D: Dp>(p: &PackedMatrix, b: usize, x: &Tile, out: &mut [f32]) {
        let put = |out: &mut [f32], h0: usize, halves: &[[[f32; HALF]; T_MAX]]| {
            for (h, rows) in halves.iter().enumerate() {
                for (t, v) in rows.iter().enumerate().take(x.rows) {
                    out[t * BLOCK + (h0 + h) * HALF..][..HALF].copy_from_slice(v);
                }
            }
        };
        // One or two rows: both halves in one walk of the block (the walk's own work is
        // then shared by 16 outputs); more: a half at a time (their accumulators fill the
        // registers).
        macro_rules! rows {
            ($($t:literal)*) => {
                match (x.rows, p.group) {
                    $(($t, 32) => if $t <= 2 {
                        put(out, 0, &widen(D::half_dot::<$t, 32, 2>(p, b, 0, x)))
                    } else {
                        for h in 0..2 { put(out, h, &widen(D::half_dot::<$t, 32, 1>(p, b, h, x))) }
                    },
                    ($t, 16) => if $t <= 2 {
                        put(out, 0, &widen(D::half_dot::<$t, 16, 2>(p, b, 0, x)))
                    } else {
                        for h in 0..2 { put(out, h, &widen(D::half_dot::<$t, 16, 1>(p, b, h, x))) }
                    },)*
                    (n, g) => unreachable!("{n} rows at once in groups of {g}"),
                }
            };
        }
        rows!(1 2 3 4)
    }

    /// The most rows a tile of this kernel holds.
    const T_MAX: usize = 4;

    /// `halves` with each half's rows padded to [`T_MAX`].
    fn widen<const T: usize, const H: usize>(
        halves: [[[f32; HALF]; T]; H],
    ) -> [[[f32; HALF]; T_MAX]; H] {
        halves.map(|rows| std::array::from_fn(|t| rows.get(t).copied().unwrap_or_default()))
    }

    /// `half_dot_body` for `$d`, compiled with `$features`: halves `h..h + H` of block
    /// `b`, their 8 output rows for each of the T activation rows.
    macro_rules! half_dot_with {
        ($name:ident, $d:ty, $features:literal) => {
            #[target_feature(enable = $features)]
            unsafe fn $name<const T: usize, const G: usize, const H: usize>(
                p: &PackedMatrix,
                b: usize,
                h: usize,
                x: &Tile,
            ) -> [[[f32; HALF]; T]; H] {
                half_dot_body::<$d, T, G, H>(p, b, h, x)
            }
        };
    }
    half_dot_with!(half_dot_vex, Vex, "avx2,f16c,avxvnni");
    half_dot_with!(half_dot_avx2, Avx2, "avx2,f16c");
    half_dot_with!(half_dot_evex, Evex, "avx2,f16c,avx512f,avx512vl,avx512vnni");

    /// The definition's float steps on 8 lanes: per accumulator `j` the terms of groups
    /// `j, j + 8, ...` in order (consecutive in the layout), then the definition's tree.
    #[inline(always)]
    unsafe fn half_dot_body<D: Dp, const T: usize, const G: usize, const H: usize>(
        p: &PackedMatrix,
        b: usize,
        h0: usize,
        x: &Tile,
    ) -> [[[f32; HALF]; T]; H] {
        let gpr = p.cols / G;
        let gb = group_bytes(p.format, G);
        let (xq, xs, xm, xi) = x.pointers::<T, G>(gpr);
        p.check_block(b, gb);
        assert!(h0 + H <= 2);
        let mut parts = [[[_mm256_setzero_ps(); T]; H]; 8];
        for (j, part) in parts.iter_mut().enumerate().take(gpr) {
            let mut acc = [[_mm256_setzero_ps(); T]; H];
            let first = b * gpr + super::slot(j, gpr);
            for (k, g) in (j..gpr).step_by(8).enumerate() {
                let at = (first + k) * BLOCK;
                let w = p.qs.as_ptr().add(at * gb);
                if h0 == 0 {
                    super::prefetch_ahead(w, BLOCK * gb);
                }
                for (hh, acc) in acc.iter_mut().enumerate() {
                    let h = h0 + hh;
                    let isum = D::isums::<T, G>(
                        p.format,
                        w.add(h * HALF * 4),
                        xq.add(g * T * G),
                        xi.add(g * T),
                    );
                    let sw = _mm256_cvtph_ps(_mm_loadu_si128(
                        p.scales.as_ptr().add(at + h * HALF).cast(),
                    ));
                    let mw =
                        _mm256_cvtph_ps(_mm_loadu_si128(p.mins.as_ptr().add(at + h * HALF).cast()));
                    for t in 0..T {
                        let term = _mm256_add_ps(
                            _mm256_mul_ps(
                                _mm256_mul_ps(sw, _mm256_set1_ps(*xs.add(g * T + t))),
                                _mm256_cvtepi32_ps(isum[t]),
                            ),
                            _mm256_mul_ps(mw, _mm256_set1_ps(*xm.add(g * T + t))),
                        );
                        acc[t] = _mm256_add_ps(acc[t], term);
                    }
                }
            }
            *part = acc;
        }
        let mut out = [[[0f32; HALF]; T]; H];
        for (hh, rows) in out.iter_mut().enumerate() {
            for (t, o) in rows.iter_mut().enumerate() {
                let a = parts.map(|p| p[hh][t]);
                let sum = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[1], a[5])),
                    _mm256_add_ps(_mm256_add_ps(a[2], a[6]), _mm256_add_ps(a[3], a[7])),
                );
                _mm256_storeu_ps(o.as_mut_ptr(), sum);
            }
        }
        out
    }
}

/// The 16-row kernel (AVX-512 VNNI): a block's 16 rows in the lanes of one 512-bit
/// vector, each activation row's four bytes broadcast from memory. The groups of a block
/// are walked by accumulator (`g % 8 = j`, ascending `g` within each), so that one f32
/// accumulator per activation row is live: the definition's sums, in its order.
#[cfg(target_arch = "x86_64")]
mod vnni512 {
    use super::{group_bytes, PackedMatrix, Tile, BLOCK, RUN};
    use crate::quant::QFormat;
    use std::arch::x86_64::*;

    /// Four activation bytes from `p` in every lane.
    #[inline(always)]
    unsafe fn broadcast4(p: *const i8) -> __m512i {
        _mm512_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
    }

    /// The exact integer sums of one group for the block's 16 rows (`w`: the group's
    /// first run) and each of the T activation rows (`x`: the tile's group, row `t` at
    /// `t * G`; `x_isum[t]`: its sum), the weights loaded and unpacked once for all. Two
    /// chains per row where there are under 4 rows to keep the multiply pipes busy, else
    /// one (exact integers: any order gives the same sum).
    #[inline(always)]
    unsafe fn group_isums<const T: usize, const G: usize>(
        format: QFormat,
        w: *const u8,
        x: *const i8,
        x_isum: *const i32,
    ) -> [__m512i; T] {
        let two = T < 4;
        let mut s0 = [_mm512_setzero_si512(); T];
        let mut s1 = [_mm512_setzero_si512(); T];
        // The second half of a group's sums: into the second chain or the first.
        let second = |s0: &mut [__m512i; T], s1: &mut [__m512i; T], t: usize, u, x| {
            if two {
                s1[t] = _mm512_dpbusd_epi32(s1[t], u, x);
            } else {
                s0[t] = _mm512_dpbusd_epi32(s0[t], u, x);
            }
        };
        match format {
            QFormat::Q4 => {
                let mask = _mm512_set1_epi8(0x0F);
                for c in 0..G / 8 {
                    let v = _mm512_loadu_si512(w.add(c * RUN).cast());
                    let lo = _mm512_and_si512(v, mask);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                    for t in 0..T {
                        let xt = x.add(t * G + 4 * c);
                        s0[t] = _mm512_dpbusd_epi32(s0[t], lo, broadcast4(xt));
                        second(&mut s0, &mut s1, t, hi, broadcast4(xt.add(G / 2)));
                    }
                }
                if two {
                    for t in 0..T {
                        s0[t] = _mm512_add_epi32(s0[t], s1[t]);
                    }
                }
            }
            QFormat::Q8 => {
                for c in (0..G / 4).step_by(2) {
                    let v0 = _mm512_loadu_si512(w.add(c * RUN).cast());
                    let v1 = _mm512_loadu_si512(w.add((c + 1) * RUN).cast());
                    for t in 0..T {
                        let xt = x.add(t * G + 4 * c);
                        s0[t] = _mm512_dpbusd_epi32(s0[t], v0, broadcast4(xt));
                        second(&mut s0, &mut s1, t, v1, broadcast4(xt.add(4)));
                    }
                }
                // The weights were stored plus 128: take 128 * sum(q_x) back off.
                for t in 0..T {
                    let sum = if two {
                        _mm512_add_epi32(s0[t], s1[t])
                    } else {
                        s0[t]
                    };
                    let bias = _mm512_set1_epi32(128 * *x_isum.add(t));
                    s0[t] = _mm512_sub_epi32(sum, bias);
                }
            }
            QFormat::F32 => unreachable!("f32 matrices are never packed"),
        }
        s0
    }

    /// Block `b`'s 16 output rows for each of the tile's rows into `out` (`[x row][16]`).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, VL and VNNI, and F16C.
    pub(super) unsafe fn block_dots(p: &PackedMatrix, b: usize, x: &Tile, out: &mut [f32]) {
        by_tile!(block_dot, p, b, x, out; 1 2 3 4 5 6 7 8)
    }

    /// Block `b`'s 16 output rows for each of the T activation rows: per accumulator `j`
    /// the terms of groups `j, j + 8, ...` in order (consecutive in the layout), then the
    /// definition's tree.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    unsafe fn block_dot<const T: usize, const G: usize>(
        p: &PackedMatrix,
        b: usize,
        x: &Tile,
    ) -> [[f32; BLOCK]; T] {
        let gpr = p.cols / G;
        let gb = group_bytes(p.format, G);
        let (xq, xs, xm, xi) = x.pointers::<T, G>(gpr);
        p.check_block(b, gb);
        // `parts[j][t]`: accumulator j of activation row t (0 where there are under 8
        // groups, as the definition's unused accumulators).
        let mut parts = [[_mm512_setzero_ps(); T]; 8];
        for (j, part) in parts.iter_mut().enumerate().take(gpr) {
            let mut acc = [_mm512_setzero_ps(); T];
            let first = b * gpr + super::slot(j, gpr);
            for (k, g) in (j..gpr).step_by(8).enumerate() {
                let at = (first + k) * BLOCK;
                let w = p.qs.as_ptr().add(at * gb);
                super::prefetch_ahead(w, BLOCK * gb);
                let isum = group_isums::<T, G>(p.format, w, xq.add(g * T * G), xi.add(g * T));
                let sw = _mm512_cvtph_ps(_mm256_loadu_si256(p.scales.as_ptr().add(at).cast()));
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(p.mins.as_ptr().add(at).cast()));
                for t in 0..T {
                    let term = _mm512_add_ps(
                        _mm512_mul_ps(
                            _mm512_mul_ps(sw, _mm512_set1_ps(*xs.add(g * T + t))),
                            _mm512_cvtepi32_ps(isum[t]),
                        ),
                        _mm512_mul_ps(mw, _mm512_set1_ps(*xm.add(g * T + t))),
                    );
                    acc[t] = _mm512_add_ps(acc[t], term);
                }
            }
            *part = acc;
        }
        let mut out = [[0f32; BLOCK]; T];
        for t in 0..T {
            let a = parts.map(|p| p[t]);
            let sum = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[1], a[5])),
                _mm512_add_ps(_mm512_add_ps(a[2], a[6]), _mm512_add_ps(a[3], a[7])),
            );
            _mm512_storeu_ps(out[t].as_mut_ptr(), sum);
        }
        out
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use super::{group_bytes, PackedMatrix, BLOCK};
    use crate::cpu::quant_matmul::ActRow;
    use crate::quant::QFormat;
    use std::arch::wasm32::*;

    /// Four f16 values (bits at `p`) as f32, exactly as `half` converts them: the bits
    /// moved into f32 place and scaled by 2^112 (exact for zeros, subnormals and
    /// normals), infinities and NaNs (quieted, as `half` does) set apart.
    #[inline(always)]
    fn f16x4_to_f32(p: &[u16]) -> v128 {
        assert!(p.len() >= 4);
        // SAFETY: 8 bytes at p (checked above).
        let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(p.as_ptr().cast()) });
        let sign = i32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
        let em = v128_and(h, u32x4_splat(0x7fff));
        let moved = i32x4_shl(em, 13);
        let finite = f32x4_mul(moved, f32x4_splat(f32::from_bits(0x7780_0000))); // 2^112
        let nan = v128_and(u32x4_gt(em, u32x4_splat(0x7c00)), u32x4_splat(0x0040_0000));
        let special = v128_or(v128_or(moved, u32x4_splat(0x7f80_0000)), nan);
        let is_special = u32x4_ge(em, u32x4_splat(0x7c00));
        v128_or(v128_bitselect(special, finite, is_special), sign)
    }

    /// Activation rows a tile holds: four rows' accumulators and sums stay in registers.
    pub(super) const TILE: usize = 4;

    /// Up to [`TILE`] activation rows group-major, each group's bytes in pairs (`i32`: the
    /// first byte's i16 in the low half): `pairs` `[g][t][G / 2]`, the rest `[g][t]`.
    pub(super) struct Tile {
        rows: usize,
        group: usize,
        pairs: Vec<i32>,
        scales: Vec<f32>,
        sums: Vec<f32>,
    }

    impl Tile {
        pub(super) fn new(x: &[ActRow], group: usize, gpr: usize) -> Self {
            assert!((1..=TILE).contains(&x.len()), "{} rows in a tile", x.len());
            let pair =
                |p: &[i8]| (p[0] as i16 as u16 as u32 | (p[1] as i16 as u16 as u32) << 16) as i32;
            let mut tile = Tile {
                rows: x.len(),
                group,
                pairs: Vec::with_capacity(gpr * x.len() * group / 2),
                scales: Vec::with_capacity(gpr * x.len()),
                sums: Vec::with_capacity(gpr * x.len()),
            };
            for g in 0..gpr {
                for a in x {
                    let bytes = &a.qs[g * group..][..group];
                    tile.pairs.extend(bytes.chunks_exact(2).map(pair));
                    tile.scales.push(a.scales[g]);
                    tile.sums.push(a.sums[g]);
                }
            }
            tile
        }
    }

    /// `dot_i16x8` of four rows' byte pairs (widened) with one activation pair.
    #[inline(always)]
    fn dot(w: v128, x: i32) -> v128 {
        i32x4_dot_i16x8(w, i32x4_splat(x))
    }

    /// The exact integer sums of one group for the block's 4 rows (lane r: row r) and
    /// each of the T activation rows (`x`: the tile's group, row `t`'s G / 2 pairs at
    /// `t * G / 2`), the weights loaded and widened once for all of them.
    #[inline(always)]
    fn group_isums<const T: usize, const G: usize>(
        format: QFormat,
        w: &[u8],
        x: &[i32],
    ) -> [v128; T] {
        let mut s = [i32x4_splat(0); T];
        let load = |c: usize| {
            let v = &w[16 * c..16 * c + 16];
            // SAFETY: 16 bytes (sliced above).
            unsafe { v128_load(v.as_ptr().cast()) }
        };
        let x = &x[..T * G / 2];
        match format {
            QFormat::Q4 => {
                for c in 0..G / 8 {
                    // Runs 2c and 2c + 1: low nibbles against even pairs 2c, 2c + 1,
                    // high nibbles against odd pairs G / 4 + 2c, G / 4 + 2c + 1.
                    let v = load(c);
                    let lo = v128_and(v, u8x16_splat(0x0F));
                    let hi = u8x16_shr(v, 4);
                    let (lo0, lo1) = (u16x8_extend_low_u8x16(lo), u16x8_extend_high_u8x16(lo));
                    let (hi0, hi1) = (u16x8_extend_low_u8x16(hi), u16x8_extend_high_u8x16(hi));
                    for (t, st) in s.iter_mut().enumerate() {
                        let xt = &x[t * G / 2..][..G / 2];
                        let even = i32x4_add(dot(lo0, xt[2 * c]), dot(lo1, xt[2 * c + 1]));
                        let odd =
                            i32x4_add(dot(hi0, xt[G / 4 + 2 * c]), dot(hi1, xt[G / 4 + 2 * c + 1]));
                        *st = i32x4_add(*st, i32x4_add(even, odd));
                    }
                }
            }
            QFormat::Q8 => {
                for c in 0..G / 4 {
                    let v = load(c);
                    let (w0, w1) = (i16x8_extend_low_i8x16(v), i16x8_extend_high_i8x16(v));
                    for (t, st) in s.iter_mut().enumerate() {
                        let xt = &x[t * G / 2..][..G / 2];
                        let d = i32x4_add(dot(w0, xt[2 * c]), dot(w1, xt[2 * c + 1]));
                        *st = i32x4_add(*st, d);
                    }
                }
            }
            QFormat::F32 => unreachable!("f32 matrices are never packed"),
        }
        s
    }

    /// Block `b`'s 4 output rows for each of the tile's rows into `out` (`[x row][4]`).
    pub(super) fn block_dots(p: &PackedMatrix, b: usize, x: &Tile, out: &mut [f32]) {
        by_tile!(block_dot, p, b, x, out; 1 2 3 4)
    }

    /// Block `b`'s 4 output rows for each of the T activation rows, in `row_dot`'s float
    /// steps: per accumulator `j` the terms of groups `j, j + 8, ...` in order
    /// (consecutive in the layout), then the definition's tree.
    fn block_dot<const T: usize, const G: usize>(
        p: &PackedMatrix,
        b: usize,
        x: &Tile,
    ) -> [[f32; BLOCK]; T] {
        let gpr = p.cols / G;
        let gb = group_bytes(p.format, G);
        assert!(x.rows == T && x.group == G);
        let mut parts = [[f32x4_splat(0.0); T]; 8];
        for (j, part) in parts.iter_mut().enumerate().take(gpr) {
            let mut acc = [f32x4_splat(0.0); T];
            let first = b * gpr + super::slot(j, gpr);
            for (k, g) in (j..gpr).step_by(8).enumerate() {
                let at = (first + k) * BLOCK;
                let xg = &x.pairs[g * T * G / 2..][..T * G / 2];
                let isum = group_isums::<T, G>(p.format, &p.qs[at * gb..(at + BLOCK) * gb], xg);
                let sw = f16x4_to_f32(&p.scales[at..at + BLOCK]);
                let mw = f16x4_to_f32(&p.mins[at..at + BLOCK]);
                let (xs, xm) = (&x.scales[g * T..][..T], &x.sums[g * T..][..T]);
                for t in 0..T {
                    let term = f32x4_add(
                        f32x4_mul(
                            f32x4_mul(sw, f32x4_splat(xs[t])),
                            f32x4_convert_i32x4(isum[t]),
                        ),
                        f32x4_mul(mw, f32x4_splat(xm[t])),
                    );
                    acc[t] = f32x4_add(acc[t], term);
                }
            }
            *part = acc;
        }
        let mut out = [[0f32; BLOCK]; T];
        for (t, o) in out.iter_mut().enumerate() {
            let a = parts.map(|p| p[t]);
            let sum = f32x4_add(
                f32x4_add(f32x4_add(a[0], a[4]), f32x4_add(a[1], a[5])),
                f32x4_add(f32x4_add(a[2], a[6]), f32x4_add(a[3], a[7])),
            );
            for (l, v) in o.iter_mut().enumerate() {
                *v = match l {
                    0 => f32x4_extract_lane::<0>(sum),
                    1 => f32x4_extract_lane::<1>(sum),
                    2 => f32x4_extract_lane::<2>(sum),
                    _ => f32x4_extract_lane::<3>(sum),
                };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quant_matmul::tests::matrix;

    #[test]
    fn rows_come_back_as_they_went_in() {
        for format in [QFormat::Q4, QFormat::Q8] {
            // 13 rows: a partial last block beside padding rows.
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

    #[test]
    fn every_packed_kernel_is_the_scalar_definition_bit_for_bit() {
        let (bad, all, ran) = crate::testutil::packed_kernel_mismatches();
        eprintln!("packed kernels compared with the scalar definition: {ran:?} ({all} values)");
        assert_eq!(bad, 0, "{bad} of {all} values differ");
        // Every packed kernel the host runs was compared (none skipped for want of it).
        let want: Vec<&str> = Kernel::available()
            .into_iter()
            .filter(|&k| packed_kernel(k))
            .map(Kernel::name)
            .collect();
        assert_eq!(ran, want);
        assert!(ran.is_empty() || all > 0);
        crate::testutil::require_kernels(&ran);
    }
}
