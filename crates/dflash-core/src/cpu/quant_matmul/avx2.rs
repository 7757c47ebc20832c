//! The AVX2 row kernel of 8-bit products (x86_64), the unpacked fallback of the packed
//! kernels.

use super::{combine, ActRow, WeightRow};
use crate::quant::QFormat;
use std::arch::x86_64::*;

/// Sums the 8 i32 lanes of each of 8 vectors: lane `j` of the result is the sum of
/// vector `j`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum8(v: [__m256i; 8]) -> __m256i {
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    let c = _mm256_hadd_epi32(v[4], v[5]);
    let d = _mm256_hadd_epi32(v[6], v[7]);
    let ab = _mm256_hadd_epi32(a, b);
    let cd = _mm256_hadd_epi32(c, d);
    let lo = _mm256_permute2x128_si256::<0x20>(ab, cd);
    let hi = _mm256_permute2x128_si256::<0x31>(ab, cd);
    _mm256_add_epi32(lo, hi)
}

/// One group's weight bytes as unsigned values and its activations with the
/// weights' signs: Q4 (16 bytes, nibbles widened low-then-high) or Q8 group 32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn group_operands(format: QFormat, w: *const u8, x: *const i8) -> (__m256i, __m256i) {
    let xv = _mm256_loadu_si256(x.cast());
    match format {
        QFormat::Q4 => {
            let packed = _mm_loadu_si128(w.cast());
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(packed, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), mask);
            (_mm256_set_m128i(hi, lo), xv)
        }
        QFormat::Q8 => {
            let wv = _mm256_loadu_si256(w.cast());
            (_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
        }
        QFormat::F32 => unreachable!("{}", super::F32_DENSE),
    }
}

/// The 8 lanes of exact products of one group (lane `j`: bytes `4j..4j + 4`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn group_lanes<const VNNI: bool>(format: QFormat, w: *const u8, x: *const i8) -> __m256i {
    let (u, s) = group_operands(format, w, x);
    if VNNI {
        dpbusd(u, s)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// `vpdpbusd` where the caller has AVX-VNNI: the same exact lane sums in one step.
#[inline(always)]
unsafe fn dpbusd(u: __m256i, s: __m256i) -> __m256i {
    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn inner(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    }
    inner(u, s)
}

#[target_feature(enable = "avx2,f16c,avxvnni")]
pub(super) unsafe fn row_dot_vnni(format: QFormat, group: usize, w: WeightRow, x: ActRow) -> f32 {
    row_dot::<true>(format, group, w, x)
}

/// `row_dot` of the module's definition, 8 groups at a time where the group has 32
/// values; groups of 16 and the tail take the scalar steps.
/// The exact sums of up to 8 consecutive groups from `g` (`k` of them; lanes past
/// `k` are 0), lane `j` for group `g + j`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn group_sums<const VNNI: bool>(
    format: QFormat,
    group: usize,
    w: WeightRow,
    x: ActRow,
    g: usize,
    k: usize,
) -> __m256i {
    let wbytes = group * format.bits() / 8;
    let mut v = [_mm256_setzero_si256(); 8];
    if group == 32 {
        for (j, l) in v.iter_mut().enumerate().take(k) {
            let gj = g + j;
            *l = group_lanes::<VNNI>(
                format,
                w.qs.as_ptr().add(gj * wbytes),
                x.qs.as_ptr().add(gj * 32),
            );
        }
        return hsum8(v);
    }
    // Groups of 16 (Q8 only), two per vector: lanes 0-3 the even group, 4-7 the odd.
    for (j, l) in v.iter_mut().enumerate().take(k / 2) {
        let gj = g + 2 * j;
        *l = group_lanes::<VNNI>(
            format,
            w.qs.as_ptr().add(gj * wbytes),
            x.qs.as_ptr().add(gj * 16),
        );
    }
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    // Lanes [g0, g2, g4, g6 | g1, g3, g5, g7] into order.
    _mm256_permutevar8x32_epi32(
        _mm256_hadd_epi32(a, b),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
    )
}

/// `row_dot` of the module's definition, 8 groups at a time (the last step masked).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn row_dot<const VNNI: bool>(
    format: QFormat,
    group: usize,
    w: WeightRow,
    x: ActRow,
) -> f32 {
    let groups = w.scales.len();
    let mut acc = _mm256_setzero_ps();
    let mut g = 0;
    while g < groups {
        let k = (groups - g).min(8);
        let isum = _mm256_cvtepi32_ps(group_sums::<VNNI>(format, group, w, x, g, k));
        let (sw, mw, sx, xs) = if k == 8 {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(w.scales.as_ptr().add(g).cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(w.mins.as_ptr().add(g).cast())),
                _mm256_loadu_ps(x.scales.as_ptr().add(g)),
                _mm256_loadu_ps(x.sums.as_ptr().add(g)),
            )
        } else {
            let (mut a, mut b) = ([0u16; 8], [0u16; 8]);
            let (mut c, mut d) = ([0f32; 8], [0f32; 8]);
            a[..k].copy_from_slice(&w.scales[g..]);
            b[..k].copy_from_slice(&w.mins[g..]);
            c[..k].copy_from_slice(&x.scales[g..]);
            d[..k].copy_from_slice(&x.sums[g..]);
            (
                _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().cast())),
                _mm256_loadu_ps(c.as_ptr()),
                _mm256_loadu_ps(d.as_ptr()),
            )
        };
        let term = _mm256_add_ps(
            _mm256_mul_ps(_mm256_mul_ps(sw, sx), isum),
            _mm256_mul_ps(mw, xs),
        );
        let sum = _mm256_add_ps(acc, term);
        acc = if k == 8 {
            sum
        } else {
            // Lanes past `k` keep their value exactly (adding 0 could flip a -0).
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), lane);
            _mm256_blendv_ps(acc, sum, _mm256_castsi256_ps(keep))
        };
        g += 8;
    }
    let mut a = [0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), acc);
    combine(&a)
}
