//! Plain-Rust f32 ops of the CPU reference. Every reduction runs in a fixed order that
//! does not depend on how many rows are computed together (batch invariance).

use crate::config::RopeStyle;

/// Dot product with 8 interleaved partial sums combined by a fixed tree.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

fn n_threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(16)
    }
    #[cfg(target_arch = "wasm32")]
    {
        1
    }
}

/// `y[t, o] = sum_k x[t, k] * w[o, k]` for `n` rows of `x` (`[n, k]`) and `w` (`[m, k]`).
/// Output rows are split across threads; each element is one `dot`.
pub fn matmul_t(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), n * k);
    debug_assert_eq!(w.len(), m * k);
    let mut y = vec![0f32; n * m];
    let threads = n_threads();
    let work = n * m * k;
    if threads <= 1 || work < 1 << 16 {
        matmul_block(x, w, n, k, 0, m, m, &mut y);
        return y;
    }
    // Split the output columns (weight rows) into one contiguous band per thread.
    let band = m.div_ceil(threads);
    let mut parts: Vec<Vec<f32>> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let lo = (t * band).min(m);
                let hi = ((t + 1) * band).min(m);
                s.spawn(move || {
                    let mut part = vec![0f32; n * (hi - lo)];
                    matmul_block(x, w, n, k, lo, hi, hi - lo, &mut part);
                    part
                })
            })
            .collect();
        parts = handles
            .into_iter()
            .map(|h| h.join().expect("matmul thread"))
            .collect();
    });
    for (t, part) in parts.iter().enumerate() {
        let lo = (t * band).min(m);
        let width = part.len() / n.max(1);
        for r in 0..n {
            y[r * m + lo..r * m + lo + width].copy_from_slice(&part[r * width..(r + 1) * width]);
        }
    }
    y
}

#[allow(clippy::too_many_arguments)]
fn matmul_block(
    x: &[f32],
    w: &[f32],
    n: usize,
    k: usize,
    lo: usize,
    hi: usize,
    stride: usize,
    out: &mut [f32],
) {
    for o in lo..hi {
        let wr = &w[o * k..(o + 1) * k];
        for r in 0..n {
            out[r * stride + (o - lo)] = dot(&x[r * k..(r + 1) * k], wr);
        }
    }
}

/// RMSNorm of one row: `x * (1 / sqrt(mean(x^2) + eps)) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for i in 0..x.len() {
        out[i] = (x[i] * scale) * w[i];
    }
}

/// RMSNorm of each row of `x` (rows of `w.len()` values) into the same row of `out`.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    debug_assert!(x.len().is_multiple_of(h) && out.len() == x.len());
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        rms_norm(xr, w, eps, or);
    }
}

/// (cos, sin) of the RoPE angle `pos * inv_freq`, in f32: the GPU engine uploads a
/// table of exactly these values.
#[inline]
pub fn rope_cos_sin(pos: usize, inv_freq: f32) -> (f32, f32) {
    let (s, c) = crate::math::sin_cos(pos as f32 * inv_freq);
    (c, s)
}

/// Rotates one head in place at absolute position `pos`.
pub fn rope(x: &mut [f32], pos: usize, inv_freq: &[f32], style: RopeStyle) {
    let half = inv_freq.len();
    for (i, &f) in inv_freq.iter().enumerate() {
        let (c, s) = rope_cos_sin(pos, f);
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + crate::math::exp(-x))
}

/// Softmax in place with the max subtracted; sums run left to right.
#[inline]
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = crate::math::exp(*v - m);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// A mixture-of-experts router's choice for one token from its scores `logits` (one per
/// expert): the softmax (`softmax`'s order), the `k` most probable experts (ties to the
/// lower index, NaN never), their probabilities divided by their sum (left to right)
/// when `normalize`. `(expert, weight)` in order of choice; the GPU's router
/// (moe.wgsl `route`) is the same arithmetic.
pub fn route_experts(logits: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    softmax(&mut p);
    let mut chosen: Vec<(usize, f32)> = Vec::with_capacity(k);
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (i, &v) in p.iter().enumerate() {
            let taken = chosen.iter().any(|c| c.0 == i);
            if !taken && !v.is_nan() && best.is_none_or(|b| v > p[b]) {
                best = Some(i);
            }
        }
        // All NaN: the lowest experts not yet taken, at weight 0.
        let i = best.unwrap_or_else(|| {
            (0..p.len())
                .find(|i| !chosen.iter().any(|c| c.0 == *i))
                .unwrap_or(0)
        });
        chosen.push((i, if p[i].is_nan() { 0.0 } else { p[i] }));
    }
    if normalize {
        let mut sum = 0f32;
        for c in &chosen {
            sum += c.1;
        }
        for c in chosen.iter_mut() {
            c.1 /= sum;
        }
    }
    chosen
}

/// Index of the largest value; ties go to the lowest index. NaN never wins.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || (x[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

/// Causal grouped-query attention of one query row at absolute position `pos` over the
/// cached keys/values of positions `0..=pos` (rows of `kv_dim` floats). `q` holds
/// `n_heads * head_dim` values; the result goes to `out` (same size).
///
/// Where the CPU has AVX2 the same code runs compiled for it (256-bit vectors; Rust
/// never fuses or reorders float operations, so the bits are the baseline build's).
#[allow(clippy::too_many_arguments)]
pub fn attention_row(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    pos: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    let shape = (n_heads, n_kv_heads, head_dim);
    attention_heads((q, kc, vc, pos), shape, 0..n_heads, out)
}

/// `attention_row`'s query heads `heads` only, into `out` (`heads.len() * head_dim`
/// values): each head's result is the one `attention_row` gives it, so the heads of a
/// row can be split across threads.
pub fn attention_heads(
    args: (&[f32], &[f32], &[f32], usize),
    shape: (usize, usize, usize),
    heads: std::ops::Range<usize>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { attention_row_avx2(args, shape, heads, out) };
    }
    attention_row_body(args, shape, heads, out)
}

/// `attention_row_body` with the two inner loops written for AVX2 where the head size is
/// a multiple of 8: a score is `dot`'s 8 partial sums in one vector (lane l sums
/// elements l, l + 8, ...) and its fixed tree, and each output element gains
/// `p * v` key by key in ascending order, as in the body.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attention_row_avx2(
    (q, kc, vc, pos): (&[f32], &[f32], &[f32], usize),
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    heads: std::ops::Range<usize>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    if !head_dim.is_multiple_of(8) {
        let shape = (n_heads, n_kv_heads, head_dim);
        return attention_row_body((q, kc, vc, pos), shape, heads, out);
    }
    let kv_dim = n_kv_heads * head_dim;
    // The loads below are unchecked: the slices must hold what the body would index.
    assert!(heads.end <= n_heads && q.len() >= n_heads * head_dim);
    assert!(kc.len() >= (pos + 1) * kv_dim && vc.len() >= (pos + 1) * kv_dim);
    assert_eq!(out.len(), heads.len() * head_dim);
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scores = vec![0f32; pos + 1];
    let score = |acc: __m256| {
        // ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)), then dot's empty tail.
        let half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let pair = _mm_hadd_ps(half, half);
        let sum = _mm_cvtss_f32(pair) + _mm_cvtss_f32(_mm_movehdup_ps(pair));
        (sum + 0.0) * scale
    };
    for h in heads.clone() {
        let kh = h / group;
        let qh = q[h * head_dim..(h + 1) * head_dim].as_ptr();
        // Four keys at a time: four independent sums, each in dot's order.
        let key = |j: usize| kc[j * kv_dim + kh * head_dim..][..head_dim].as_ptr();
        let mut j = 0;
        // Eight keys at a time, their trees taken side by side (`scores8`).
        while j + 8 <= scores.len() {
            let k: [*const f32; 8] = std::array::from_fn(|i| key(j + i));
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in (0..head_dim).step_by(8) {
                let qv = _mm256_loadu_ps(qh.add(c));
                for (a, kp) in acc.iter_mut().zip(k) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(qv, _mm256_loadu_ps(kp.add(c))));
                }
            }
            let sums = scores8(acc);
            let scaled = _mm256_mul_ps(
                _mm256_add_ps(sums, _mm256_setzero_ps()),
                _mm256_set1_ps(scale),
            );
            _mm256_storeu_ps(scores[j..j + 8].as_mut_ptr(), scaled);
            j += 8;
        }
        while j + 4 <= scores.len() {
            let k = [key(j), key(j + 1), key(j + 2), key(j + 3)];
            let mut acc = [_mm256_setzero_ps(); 4];
            for c in (0..head_dim).step_by(8) {
                let qv = _mm256_loadu_ps(qh.add(c));
                for (a, kp) in acc.iter_mut().zip(k) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(qv, _mm256_loadu_ps(kp.add(c))));
                }
            }
            for (i, a) in acc.into_iter().enumerate() {
                scores[j + i] = score(a);
            }
            j += 4;
        }
        for (jj, s) in scores.iter_mut().enumerate().skip(j) {
            let mut acc = _mm256_setzero_ps();
            for c in (0..head_dim).step_by(8) {
                let prod =
                    _mm256_mul_ps(_mm256_loadu_ps(qh.add(c)), _mm256_loadu_ps(key(jj).add(c)));
                acc = _mm256_add_ps(acc, prod);
            }
            *s = score(acc);
        }
        softmax(&mut scores);
        let v = vc[kh * head_dim..].as_ptr();
        let dst = out[(h - heads.start) * head_dim..][..head_dim].as_mut_ptr();
        // Each output element's sum runs key by key whichever pieces the head is cut in.
        if head_dim == 128 {
            weighted_values::<16>(&scores, v, kv_dim, dst);
            continue;
        }
        let mut c = 0;
        while c + 64 <= head_dim {
            weighted_values::<8>(&scores, v.add(c), kv_dim, dst.add(c));
            c += 64;
        }
        while c < head_dim {
            weighted_values::<1>(&scores, v.add(c), kv_dim, dst.add(c));
            c += 8;
        }
    }
}

/// The eight sums of eight keys' partial-sum vectors, each by `dot`'s fixed tree
/// `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))` (what `score` computes one at a
/// time), in the lanes of one vector: the halves added per key, then two rounds of
/// pairwise adds.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scores8(a: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // [lo(k) + hi(k), lo(k + 4) + hi(k + 4)]: each lane (a_l + a_{l+4}) of its key.
    let halves = |k: usize| {
        let lo = _mm256_permute2f128_ps::<0x20>(a[k], a[k + 4]);
        let hi = _mm256_permute2f128_ps::<0x31>(a[k], a[k + 4]);
        _mm256_add_ps(lo, hi)
    };
    let (b0, b1, b2, b3) = (halves(0), halves(1), halves(2), halves(3));
    // Per 128-bit half: (a0+a4)+(a1+a5) and (a2+a6)+(a3+a7) of two keys each.
    let (c01, c23) = (_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    // Keys 0-3 in the low half, 4-7 in the high half, in order.
    _mm256_hadd_ps(c01, c23)
}

/// `dst[i] = sum_j p[j] * v[j * stride + i]` for `i < 8 * C`, key by key in ascending
/// order from 0 (the body's `o[i] += p * vj[i]`), the C output vectors in registers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn weighted_values<const C: usize>(p: &[f32], v: *const f32, stride: usize, dst: *mut f32) {
    use std::arch::x86_64::*;
    let mut o = [_mm256_setzero_ps(); C];
    for (j, &pj) in p.iter().enumerate() {
        let vj = v.add(j * stride);
        let pv = _mm256_set1_ps(pj);
        for (c, oc) in o.iter_mut().enumerate() {
            *oc = _mm256_add_ps(*oc, _mm256_mul_ps(pv, _mm256_loadu_ps(vj.add(8 * c))));
        }
    }
    for (c, oc) in o.iter().enumerate() {
        _mm256_storeu_ps(dst.add(8 * c), *oc);
    }
}

#[inline(always)]
fn attention_row_body(
    (q, kc, vc, pos): (&[f32], &[f32], &[f32], usize),
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    heads: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let kv_dim = n_kv_heads * head_dim;
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scores = vec![0f32; pos + 1];
    out.fill(0.0);
    for h in heads.clone() {
        let kh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        for (j, s) in scores.iter_mut().enumerate() {
            *s = dot(
                qh,
                &kc[j * kv_dim + kh * head_dim..j * kv_dim + (kh + 1) * head_dim],
            ) * scale;
        }
        softmax(&mut scores);
        let o = &mut out[(h - heads.start) * head_dim..][..head_dim];
        for (j, &p) in scores.iter().enumerate() {
            let vj = &vc[j * kv_dim + kh * head_dim..j * kv_dim + (kh + 1) * head_dim];
            for i in 0..head_dim {
                o[i] += p * vj[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn attention_row_is_the_plain_bodys_bits_on_every_path() {
        // Head sizes with registers (64, 128), the general vector path (80) and none
        // (12, not a multiple of 8); contexts with and without a tail of keys past the
        // groups of four; one and three query heads per KV head.
        for (hd, heads, kv_heads) in [(64, 9, 3), (128, 4, 4), (80, 6, 2), (12, 2, 1)] {
            for pos in [0, 1, 2, 3, 4, 5, 7, 8, 15, 37] {
                let kv_dim = kv_heads * hd;
                let q = values(heads * hd, 1);
                let kc = values((pos + 1) * kv_dim, 2);
                let vc = values((pos + 1) * kv_dim, 3);
                let mut fast = vec![f32::NAN; heads * hd];
                let mut plain = vec![f32::NAN; heads * hd];
                attention_row(&q, &kc, &vc, pos, heads, kv_heads, hd, &mut fast);
                let shape = (heads, kv_heads, hd);
                attention_row_body((&q, &kc, &vc, pos), shape, 0..heads, &mut plain);
                // Each head alone is the same head of the whole row.
                for h in 0..heads {
                    let mut one = vec![f32::NAN; hd];
                    attention_heads((&q, &kc, &vc, pos), shape, h..h + 1, &mut one);
                    assert_eq!(one, fast[h * hd..(h + 1) * hd]);
                }
                assert_eq!(
                    fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "head_dim {hd}, {heads}/{kv_heads} heads, pos {pos}"
                );
            }
        }
    }
}
