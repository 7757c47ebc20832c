//! The wasm SIMD128 row kernel of 8-bit products.

use super::{accumulate, combine, ActRow, WeightRow};
use crate::quant::QFormat;
use std::arch::wasm32::*;

/// Exact dot product of 16 unsigned-or-signed weight bytes (already widened by the
/// caller's choice) with 16 signed activation bytes.
#[inline]
fn dot16(w_lo: v128, w_hi: v128, x: v128) -> v128 {
    let x_lo = i16x8_extend_low_i8x16(x);
    let x_hi = i16x8_extend_high_i8x16(x);
    i32x4_add(i32x4_dot_i16x8(w_lo, x_lo), i32x4_dot_i16x8(w_hi, x_hi))
}

#[inline]
fn hsum(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        + i32x4_extract_lane::<1>(v)
        + i32x4_extract_lane::<2>(v)
        + i32x4_extract_lane::<3>(v)
}

#[inline]
fn group_isum(format: QFormat, group: usize, w: &[u8], x: &[i8], g: usize) -> i32 {
    // SAFETY: the loads stay inside the row slices (bounds checked by the slicing).
    unsafe {
        match format {
            QFormat::Q4 => {
                let wb = &w[g * group / 2..(g + 1) * group / 2];
                let xb = &x[g * group..(g + 1) * group];
                let packed = v128_load(wb.as_ptr().cast());
                let lo = v128_and(packed, u8x16_splat(0x0F));
                let hi = u8x16_shr(packed, 4);
                let even = v128_load(xb.as_ptr().cast());
                let odd = v128_load(xb.as_ptr().add(16).cast());
                let s = i32x4_add(
                    dot16(
                        u16x8_extend_low_u8x16(lo),
                        u16x8_extend_high_u8x16(lo),
                        even,
                    ),
                    dot16(u16x8_extend_low_u8x16(hi), u16x8_extend_high_u8x16(hi), odd),
                );
                hsum(s)
            }
            QFormat::Q8 => {
                let wb = &w[g * group..(g + 1) * group];
                let xb = &x[g * group..(g + 1) * group];
                let mut s = i32x4_splat(0);
                for c in (0..group).step_by(16) {
                    let wv = v128_load(wb.as_ptr().add(c).cast());
                    let xv = v128_load(xb.as_ptr().add(c).cast());
                    s = i32x4_add(
                        s,
                        dot16(i16x8_extend_low_i8x16(wv), i16x8_extend_high_i8x16(wv), xv),
                    );
                }
                hsum(s)
            }
            QFormat::F32 => unreachable!("{}", super::F32_DENSE),
        }
    }
}

pub(super) fn row_dot(format: QFormat, group: usize, w: WeightRow, x: ActRow) -> f32 {
    let mut acc = [0f32; 8];
    for g in 0..w.scales.len() {
        let isum = group_isum(format, group, w.qs, x.qs, g);
        accumulate(&mut acc, g, isum, w, x);
    }
    combine(&acc)
}
