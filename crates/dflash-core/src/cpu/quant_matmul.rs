//! The quantized CPU engine's matrix product: 4- and 8-bit weights (the GPU formats of
//! `crate::quant`, used as loaded) against activations quantized to 8 bits per group,
//! with exact integer dot products per group.
//!
//! Every output element is computed the same way whatever the kernel (scalar, AVX2,
//! wasm SIMD128) and however many rows share the pass, so results are bit-identical
//! across kernels, hosts and batch sizes:
//!
//! * activations: per group of the weight's group size, `scale = amax / 127` and
//!   `q = round(x * (127 / amax))` in `-127..=127` (scalar code on every host), plus
//!   `sum = scale * sum(q)`;
//! * per group `g`, the exact integer `isum = sum(q_w * q_x)` and the f32 term
//!   `(scale_w * scale_x) * isum + min_w * sum_x` (two products, then one sum: no fused
//!   multiply-add);
//! * the terms go to 8 accumulators by `g % 8`, in ascending `g`, combined by the fixed
//!   tree `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
//!
//! The activation bytes of a group are stored in the order the weight bytes are read:
//! for Q4 (byte `b` of a group holds elements `2b` and `2b + 1` in its low and high
//! nibble) the even elements then the odd ones; for Q8 the natural order.
//!
//! These kernels read the matrices as loaded, one output element at a time; where the
//! CPU has AVX-VNNI or AVX-512 VNNI, and in wasm, the engine repacks matrices (groups of
//! 32; natively also Q8's 16) for the faster `super::packed` kernels, which follow the
//! same definition.

use crate::quant::{QFormat, QuantMatrix};
use half::f16;

/// Why no kernel here sees an f32 matrix: `cpu::matrix::Matrix` runs those dense.
const F32_DENSE: &str = "f32 matrices run dense (cpu::matrix::Matrix), never quantized kernels";

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the packed weight words are read as bytes"
);

/// Rows of activations quantized for one weight format and group size.
#[derive(Debug, Clone)]
pub struct QuantizedRows {
    format: QFormat,
    group: usize,
    n: usize,
    cols: usize,
    /// `[n, cols]` values, each group in the weight format's byte order.
    qs: Vec<i8>,
    /// `[n, cols / group]`.
    scales: Vec<f32>,
    /// `[n, cols / group]`: `scale * sum(q)`.
    sums: Vec<f32>,
    /// `[n, cols / group]`: `sum(q)` (the packed Q8 kernel's bias correction).
    isums: Vec<i32>,
}

impl QuantizedRows {
    /// Quantizes `n` rows of `cols` values for weights of `format` and `group`.
    pub fn new(x: &[f32], n: usize, cols: usize, format: QFormat, group: usize) -> Self {
        assert_eq!(x.len(), n * cols, "activation shape");
        assert!(
            cols.is_multiple_of(group),
            "columns a multiple of the group"
        );
        let groups = n * cols / group;
        let mut out = QuantizedRows {
            format,
            group,
            n,
            cols,
            qs: vec![0; n * cols],
            scales: Vec::with_capacity(groups),
            sums: Vec::with_capacity(groups),
            isums: Vec::with_capacity(groups),
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { out.quantize_avx2(x) };
            return out;
        }
        out.quantize(x);
        out
    }

    /// `quantize` compiled for AVX2 (the same operations: Rust neither fuses nor
    /// reorders them, and `round` keeps its half-away-from-zero meaning).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn quantize_avx2(&mut self, x: &[f32]) {
        self.quantize(x)
    }

    /// Fills the values, scales and sums from `x` (the doc's definition).
    #[inline(always)]
    fn quantize(&mut self, x: &[f32]) {
        let (group, format) = (self.group, self.format);
        for (src, dst) in x.chunks_exact(group).zip(self.qs.chunks_exact_mut(group)) {
            let amax = src.iter().fold(0f32, |a, v| a.max(v.abs()));
            let (scale, inv) = if amax > 0.0 {
                (amax / 127.0, 127.0 / amax)
            } else {
                (0.0, 0.0)
            };
            let quant = |v: f32| (v * inv).round().clamp(-127.0, 127.0) as i8;
            let half = group / 2;
            for (i, &v) in src.iter().enumerate() {
                let at = match format {
                    QFormat::Q4 => (i % 2) * half + i / 2,
                    QFormat::Q8 => i,
                    QFormat::F32 => unreachable!("{F32_DENSE}"),
                };
                dst[at] = quant(v);
            }
            let total: i32 = dst.iter().map(|&q| q as i32).sum();
            self.scales.push(scale);
            self.sums.push(scale * total as f32);
            self.isums.push(total);
        }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    /// `[n, cols]` quantized values, each group in the weight format's byte order.
    pub fn values(&self) -> &[i8] {
        &self.qs
    }

    /// `[n, cols / group]` scales (`amax / 127`).
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// `[n, cols / group]`: `scale * sum(q)`.
    pub fn sums(&self) -> &[f32] {
        &self.sums
    }

    pub fn format(&self) -> QFormat {
        self.format
    }

    pub fn group(&self) -> usize {
        self.group
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn row(&self, t: usize) -> ActRow<'_> {
        let gpr = self.cols / self.group;
        ActRow {
            qs: &self.qs[t * self.cols..(t + 1) * self.cols],
            scales: &self.scales[t * gpr..(t + 1) * gpr],
            sums: &self.sums[t * gpr..(t + 1) * gpr],
            isums: &self.isums[t * gpr..(t + 1) * gpr],
        }
    }
}

/// One row of quantized activations.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) scales: &'a [f32],
    pub(crate) sums: &'a [f32],
    /// Read by the packed kernel (x86_64) only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) isums: &'a [i32],
}

/// One row of a quantized weight matrix.
#[derive(Clone, Copy)]
struct WeightRow<'a> {
    /// The row's packed values as bytes.
    qs: &'a [u8],
    /// f16 bits, one per group.
    scales: &'a [u16],
    mins: &'a [u16],
}

fn weight_row(w: &QuantMatrix, r: usize) -> WeightRow<'_> {
    let words = w.cols * w.format.bits() / 32;
    let gpr = w.groups_per_row();
    let qs: &[u32] = &w.qs[r * words..(r + 1) * words];
    WeightRow {
        qs: bytemuck_bytes(qs),
        scales: &w.scales[r * gpr..(r + 1) * gpr],
        mins: &w.mins[r * gpr..(r + 1) * gpr],
    }
}

fn bytemuck_bytes(words: &[u32]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirements and the length covers
    // exactly the words' bytes; the host is little-endian (checked above).
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 4) }
}

/// The exact integer dot product of group `g` of a weight row with the activations.
#[inline]
fn group_isum_scalar(format: QFormat, group: usize, w: &[u8], x: &[i8], g: usize) -> i32 {
    match format {
        QFormat::Q4 => {
            let half = group / 2;
            let (wb, xb) = (&w[g * half..(g + 1) * half], &x[g * group..(g + 1) * group]);
            let mut s = 0i32;
            for b in 0..half {
                s +=
                    (wb[b] & 0xF) as i32 * xb[b] as i32 + (wb[b] >> 4) as i32 * xb[half + b] as i32;
            }
            s
        }
        QFormat::Q8 => {
            let (wb, xb) = (
                &w[g * group..(g + 1) * group],
                &x[g * group..(g + 1) * group],
            );
            wb.iter()
                .zip(xb)
                .map(|(&a, &b)| a as i8 as i32 * b as i32)
                .sum()
        }
        QFormat::F32 => unreachable!("{F32_DENSE}"),
    }
}

/// Adds group `g`'s term to its accumulator (the one definition every kernel follows).
#[inline]
fn accumulate(acc: &mut [f32; 8], g: usize, isum: i32, w: WeightRow, x: ActRow) {
    let sw = f16::from_bits(w.scales[g]).to_f32();
    let mw = f16::from_bits(w.mins[g]).to_f32();
    let term = (sw * x.scales[g]) * isum as f32 + mw * x.sums[g];
    acc[g % 8] += term;
}

#[inline]
fn combine(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

fn row_dot_scalar(format: QFormat, group: usize, w: WeightRow, x: ActRow) -> f32 {
    let mut acc = [0f32; 8];
    for g in 0..w.scales.len() {
        let isum = group_isum_scalar(format, group, w.qs, x.qs, g);
        accumulate(&mut acc, g, isum, w, x);
    }
    combine(&acc)
}

/// The row kernel chosen for this host once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 with AVX-VNNI's `vpdpbusd` for the byte products (packed matrices: 8 rows
    /// per 256-bit vector).
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// The AVX-VNNI kernel's code with AVX-512 VNNI's encoding of the same 256-bit
    /// instruction (AVX-512 VL): only ever forced, so that hosts without AVX-VNNI test
    /// the 8-row kernel's arithmetic.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni256,
    /// AVX-512 VNNI: packed matrices, 16 rows per 512-bit vector, up to 8 activation
    /// rows per pass over a block.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    Simd128,
}

/// The environment variable that forces a kernel (tests, benchmarks: `scalar`, `avx2`,
/// `avx-vnni`, `avx512-vnni-256`, `avx512-vnni`, `simd128`), where this host has it.
pub const KERNEL_ENV: &str = "DFLASH_CPU_KERNEL";

impl Kernel {
    /// Every kernel, by name (whether or not this host has it).
    pub const ALL: &'static [Kernel] = &[
        Kernel::Scalar,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2,
        #[cfg(target_arch = "x86_64")]
        Kernel::AvxVnni,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Vnni256,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Vnni,
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Kernel::Simd128,
    ];

    /// The kernel this process runs: the one `DFLASH_CPU_KERNEL` forces where this host
    /// has it (see [`Kernel::requested`] for the error otherwise), else the fastest.
    pub fn detect() -> Self {
        static CHOSEN: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| Self::requested().ok().flatten().unwrap_or_else(Self::best))
    }

    /// The kernel `DFLASH_CPU_KERNEL` asks for: None where unset, an error naming it
    /// where it is no kernel or this host lacks its instructions.
    pub fn requested() -> std::result::Result<Option<Kernel>, String> {
        // wasm has no environment: its page picks the build instead.
        let name = match std::env::var(KERNEL_ENV) {
            Ok(n) if !n.is_empty() && cfg!(not(target_arch = "wasm32")) => n,
            _ => return Ok(None),
        };
        let known: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
        let k = Self::ALL
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                format!(
                    "{KERNEL_ENV}={name}: no such kernel (known: {})",
                    known.join(", ")
                )
            })?;
        if !Self::available().contains(&k) {
            let have: Vec<&str> = Self::available().iter().map(|k| k.name()).collect();
            return Err(format!(
                "{KERNEL_ENV}={name}: this CPU lacks its instructions (it runs: {})",
                have.join(", ")
            ));
        }
        Ok(Some(k))
    }

    /// The fastest kernel this host runs.
    fn best() -> Self {
        *Self::available()
            .last()
            .expect("the scalar kernel at least")
    }

    /// Every kernel this host runs, the scalar definition first, the fastest last.
    pub fn available() -> Vec<Kernel> {
        #[allow(unused_mut)]
        let mut all = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("f16c") {
                all.push(Kernel::Avx2);
                if has!("avxvnni") {
                    all.push(Kernel::AvxVnni);
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                    all.push(Kernel::Avx512Vnni256);
                    all.push(Kernel::Avx512Vnni);
                }
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        all.push(Kernel::Simd128);
        all
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => "avx-vnni",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni256 => "avx512-vnni-256",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => "avx512-vnni",
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Kernel::Simd128 => "simd128",
        }
    }

    fn row_dot(self, format: QFormat, group: usize, w: WeightRow, x: ActRow) -> f32 {
        match self {
            Kernel::Scalar => row_dot_scalar(format, group, w, x),
            // SAFETY: `detect` chose this kernel only where the CPU has AVX2 and F16C.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::row_dot::<false>(format, group, w, x) },
            // SAFETY: `detect` chose this kernel only where the CPU also has AVX-VNNI.
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe { avx2::row_dot_vnni(format, group, w, x) },
            // Matrices the packed kernels do not take (packed only where the format and
            // group fit: `PackedMatrix::supports`) run AVX2's steps.
            // SAFETY: these kernels are chosen only where the CPU has AVX2 and F16C too.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni256 | Kernel::Avx512Vnni => unsafe {
                avx2::row_dot::<false>(format, group, w, x)
            },
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            Kernel::Simd128 => simd128::row_dot(format, group, w, x),
        }
    }
}

/// `y[t, o] = sum_k x[t, k] * w[o, k]` for the quantized rows `x` (`[n, k]`) and `w`
/// (`[m, k]`), as `[n, m]`. Output rows are split across the engine's threads.
pub fn quant_matmul(w: &QuantMatrix, x: &QuantizedRows, kernel: Kernel) -> Vec<f32> {
    assert_eq!(
        (w.format, w.group, w.cols),
        (x.format, x.group, x.cols),
        "activations quantized for another matrix"
    );
    let (n, m) = (x.n, w.rows);
    let mut by_weight_row = vec![0f32; m * n];
    let rows_per_task = (m / 64).clamp(16, 256);
    let run = |first_row: usize, out: &mut [f32]| {
        for (i, o) in out.chunks_exact_mut(n).enumerate() {
            let wr = weight_row(w, first_row + i);
            for (t, y) in o.iter_mut().enumerate() {
                *y = kernel.row_dot(w.format, w.group, wr, x.row(t));
            }
        }
    };
    for_each_band(&mut by_weight_row, rows_per_task * n, |band, out| {
        run(band * rows_per_task, out)
    });
    if n == 1 {
        return by_weight_row;
    }
    let mut y = vec![0f32; n * m];
    for (o, row) in by_weight_row.chunks_exact(n).enumerate() {
        for (t, &v) in row.iter().enumerate() {
            y[t * m + o] = v;
        }
    }
    y
}

/// Runs `f` on the CPU engine's threads, so that the matrix products inside split their
/// rows from a pool thread without a wake-up of the caller per product: natively on the
/// engine's own pool; on wasm with threads (atomics) on rayon's global pool, which the
/// page starts (`initThreadPool`); right here on wasm without threads.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    #[cfg(not(target_arch = "wasm32"))]
    {
        static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
        // The default size honours RAYON_NUM_THREADS; without a pool, the caller's thread.
        match POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().build().ok()) {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
    // From outside the pool, a scope runs its body on a pool thread and blocks the caller.
    #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
    {
        rayon::scope(|_| f())
    }
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    f()
}

/// The threads the CPU engine splits its work across (1 on wasm without threads).
pub fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    {
        in_pool(rayon::current_num_threads)
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
    {
        rayon::current_num_threads()
    }
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    1
}

/// Runs `f(band_index, band)` over `out` split into bands of `band_len`: on rayon's
/// threads natively and on wasm with threads, in order on wasm without.
pub(crate) fn for_each_band(
    out: &mut [f32],
    band_len: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(band_len)
            .enumerate()
            .for_each(|(i, band)| f(i, band));
    }
    #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
    for (i, band) in out.chunks_mut(band_len).enumerate() {
        f(i, band);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn matrix(format: QFormat, rows: usize, cols: usize, seed: u32) -> QuantMatrix {
        let mut s = seed;
        let x: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        match format {
            QFormat::Q4 => QuantMatrix::quantize_q4(&x, rows, cols),
            QFormat::Q8 => QuantMatrix::quantize_q8(&x, rows, cols),
            QFormat::F32 => QuantMatrix::from_f32(&x, rows, cols),
        }
    }

    pub(crate) fn activations(n: usize, cols: usize) -> Vec<f32> {
        (0..n * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect()
    }

    /// A Q8 matrix with groups of 16 (as repacked from Q6_K).
    fn matrix_g16(rows: usize, cols: usize) -> QuantMatrix {
        let mut w = matrix(QFormat::Q8, rows, cols, 5);
        let groups = rows * cols / 16;
        w.group = 16;
        w.scales = (0..groups)
            .map(|i| f16::from_f32(0.01 * (i % 7 + 1) as f32).to_bits())
            .collect();
        w.mins = (0..groups)
            .map(|i| f16::from_f32(0.001 * (i % 3) as f32).to_bits())
            .collect();
        w
    }

    #[test]
    fn every_kernel_matches_the_scalar_definition_bit_for_bit() {
        for kernel in Kernel::available() {
            matches_the_scalar_definition(kernel);
        }
        // Random matrices of many shapes too (what the wasm build's test hook runs).
        let (bad, all, ran) = crate::testutil::unpacked_kernel_mismatches();
        eprintln!("unpacked kernels compared with the scalar definition: {ran:?} ({all} values)");
        assert_eq!(bad, 0, "{bad} of {all} values differ");
        crate::testutil::require_kernels(&ran);
    }

    fn matches_the_scalar_definition(kernel: Kernel) {
        // 576 columns: 18 groups of 32 (two blocks of 8 and a tail of 2) or 36 of 16.
        for (format, w) in [
            (QFormat::Q4, matrix(QFormat::Q4, 5, 576, 7)),
            (QFormat::Q8, matrix(QFormat::Q8, 5, 576, 7)),
            (QFormat::Q8, matrix_g16(5, 576)),
        ] {
            // 1 to 9 rows: every count of rows taken at once, alone and after others.
            for n in 1..=9 {
                let x = QuantizedRows::new(&activations(n, 576), n, 576, format, w.group);
                let fast = quant_matmul(&w, &x, kernel);
                let scalar = quant_matmul(&w, &x, Kernel::Scalar);
                assert_eq!(
                    fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{format:?} {kernel:?} {n} rows"
                );
            }
        }
    }

    #[test]
    fn activations_quantize_to_the_plain_codes_bits() {
        // An all-zero group, a spread, and a group whose amax is 127 (so the scaled
        // values are exact) holding halves, which round away from zero.
        let mut x = activations(3, 64);
        x[..32].fill(0.0);
        x[64..69].copy_from_slice(&[127.0, 2.5, -3.5, 0.5, -0.5]);
        for format in [QFormat::Q4, QFormat::Q8] {
            for group in [16, 32] {
                let fast = QuantizedRows::new(&x, 3, 64, format, group);
                let mut plain = QuantizedRows {
                    qs: vec![0; 3 * 64],
                    scales: vec![],
                    sums: vec![],
                    isums: vec![],
                    ..fast.clone()
                };
                plain.quantize(&x);
                assert_eq!(fast.qs, plain.qs);
                if format == QFormat::Q8 {
                    assert_eq!(fast.qs[64..69], [127, 3, -4, 1, -1]);
                }
                assert_eq!(fast.isums, plain.isums);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast.scales), bits(&plain.scales));
                assert_eq!(bits(&fast.sums), bits(&plain.sums));
            }
        }
    }

    #[test]
    fn a_row_does_not_depend_on_the_rows_beside_it() {
        let kernel = Kernel::detect();
        let w = matrix(QFormat::Q4, 300, 256, 3);
        let xs = activations(16, 256);
        let all = quant_matmul(
            &w,
            &QuantizedRows::new(&xs, 16, 256, QFormat::Q4, 32),
            kernel,
        );
        for t in [0, 7, 15] {
            let one = QuantizedRows::new(&xs[t * 256..(t + 1) * 256], 1, 256, QFormat::Q4, 32);
            assert_eq!(quant_matmul(&w, &one, kernel), all[t * 300..(t + 1) * 300]);
        }
    }

    #[test]
    fn close_to_the_f32_product_of_the_dequantized_weights() {
        for format in [QFormat::Q4, QFormat::Q8] {
            let (rows, cols) = (64, 512);
            let w = matrix(format, rows, cols, 11);
            let xs = activations(2, cols);
            let y = quant_matmul(
                &w,
                &QuantizedRows::new(&xs, 2, cols, format, 32),
                Kernel::detect(),
            );
            let dense = w.dequantize();
            for t in 0..2 {
                let xr = &xs[t * cols..(t + 1) * cols];
                let amax = xr.iter().fold(0f32, |a, v| a.max(v.abs()));
                for o in 0..rows {
                    let wr = &dense[o * cols..(o + 1) * cols];
                    let exact: f32 = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
                    // Each activation moves by at most amax / 254; the error is bounded
                    // by that times the row's absolute weight sum.
                    let bound = amax / 254.0 * wr.iter().map(|v| v.abs()).sum::<f32>() + 1e-4;
                    let got = y[t * rows + o];
                    assert!(
                        (got - exact).abs() <= bound,
                        "{format:?} {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn groups_of_16_use_their_own_scales() {
        // A Q8 matrix with groups of 16 (as repacked from Q6_K).
        let mut w = matrix(QFormat::Q8, 4, 64, 5);
        w.group = 16;
        w.scales = (0..16)
            .map(|i| f16::from_f32(0.01 * (i + 1) as f32).to_bits())
            .collect();
        w.mins = vec![f16::from_f32(0.0).to_bits(); 16];
        let xs = activations(1, 64);
        let y = quant_matmul(
            &w,
            &QuantizedRows::new(&xs, 1, 64, QFormat::Q8, 16),
            Kernel::detect(),
        );
        let dense = w.dequantize();
        for o in 0..4 {
            let exact: f32 = dense[o * 64..(o + 1) * 64]
                .iter()
                .zip(&xs)
                .map(|(a, b)| a * b)
                .sum();
            assert!(
                (y[o] - exact).abs() < 0.02 * exact.abs().max(1.0),
                "{} vs {exact}",
                y[o]
            );
        }
    }
}
