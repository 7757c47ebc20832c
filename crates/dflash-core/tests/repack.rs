//! Every source type repacked into the GPU formats dequantizes to the source's values:
//! exactly where the source's scale fits f16 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), within the
//! f16 rounding of the combined scale and min for K-quants (scale = d * sc, min =
//! dmin * m), and within half a quantization step for float sources (8-bit absmax).

use dflash_core::formats::ggml::{dequantize, GgmlType};
use dflash_core::quant::{target_format, QFormat, QuantMatrix};
use dflash_core::testutil::Rng;
use half::f16;

const ROWS: usize = 4;
const COLS: usize = 512;

/// Random blocks of type `t` whose f16 fields are finite values of moderate size.
fn random_blocks(t: GgmlType, rng: &mut Rng) -> Vec<u8> {
    let (bs, bb) = t.block_size();
    let mut data = rng.bytes(ROWS * COLS / bs * bb);
    let f16_at: &[usize] = match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    for b in data.chunks_exact_mut(bb) {
        for &o in f16_at {
            let v = f16::from_f32(rng.uniform() * 0.05);
            b[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    data
}

fn check(t: GgmlType, data: &[u8], tol: impl Fn(f32) -> f32) -> QuantMatrix {
    let want = dequantize(t, data, ROWS * COLS);
    let m = QuantMatrix::from_ggml("w", t, data, ROWS, COLS).unwrap();
    let got = m.dequantize();
    let mut worst = 0f32;
    for (i, (&a, &b)) in want.iter().zip(&got).enumerate() {
        let err = (a - b).abs();
        assert!(err <= tol(a), "{t:?} element {i}: source {a}, repacked {b}");
        worst = worst.max(err);
    }
    eprintln!("{t:?}: max error {worst:e}");
    m
}

#[test]
fn exact_types_repack_exactly() {
    let mut rng = Rng(1);
    for t in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        let data = random_blocks(t, &mut rng);
        let m = check(t, &data, |_| 0.0);
        let want_bits = if matches!(t, GgmlType::Q4_0 | GgmlType::Q4_1) {
            4
        } else {
            8
        };
        assert_eq!(m.format.bits(), want_bits, "{t:?} goes to {want_bits} bits");
    }
}

#[test]
fn k_quants_repack_within_f16_rounding_of_the_scale() {
    let mut rng = Rng(2);
    // scale = f16(d * sc) and min = f16(dmin * m) each round by at most 2^-11 relative, so
    // |error| <= 2^-11 * (max|q| * max scale + max min). Here d, dmin < 0.05 and the 6-bit
    // sc, m < 64 (Q6_K: 8-bit |sc| <= 128, no min).
    let ulp = 2f32.powi(-11);
    for (t, max_q, scale_max, min_max) in [
        (GgmlType::Q4K, 15.0, 0.05 * 63.0, 0.05 * 63.0),
        (GgmlType::Q5K, 31.0, 0.05 * 63.0, 0.05 * 63.0),
        (GgmlType::Q6K, 32.0, 0.05 * 128.0, 0.0),
    ] {
        let data = random_blocks(t, &mut rng);
        check(t, &data, |_| ulp * (max_q * scale_max + min_max) + 1e-6);
    }
    assert_eq!(target_format(GgmlType::Q4K), Some((QFormat::Q4, 32)));
    assert_eq!(target_format(GgmlType::Q5K), Some((QFormat::Q8, 32)));
    assert_eq!(target_format(GgmlType::Q6K), Some((QFormat::Q8, 16)));
}

#[test]
fn float_types_quantize_to_8_bits_within_half_a_step() {
    let mut rng = Rng(3);
    let x = rng.vec(ROWS * COLS, 2.0);
    for (t, bytes) in [
        (
            GgmlType::F32,
            x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        ),
        (
            GgmlType::F16,
            x.iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        (
            GgmlType::BF16,
            x.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
    ] {
        // absmax per group <= 2, step = absmax/127: half a step plus f16 rounding.
        let m = check(t, &bytes, |_| 2.0 / 127.0 * 0.5 * 1.01 + 1e-6);
        assert_eq!(m.format, QFormat::Q8);
    }
}

#[test]
fn group_layout_is_vector_aligned() {
    let mut rng = Rng(4);
    let data = random_blocks(GgmlType::Q4_0, &mut rng);
    let m = QuantMatrix::from_ggml("w", GgmlType::Q4_0, &data, ROWS, COLS).unwrap();
    // One vec4<u32> (16 bytes) of nibbles per 32-weight group, one scale and min each.
    assert_eq!(m.qs.len(), ROWS * COLS / 8);
    assert_eq!(m.qs.len() % 4, 0);
    assert_eq!(m.scales.len(), ROWS * COLS / 32);
    assert_eq!(m.mins.len(), m.scales.len());
}

#[test]
fn unsupported_type_and_bad_width_are_typed_errors() {
    let e = QuantMatrix::from_ggml("w", GgmlType::Other(10), &[0; 64], 1, 64).unwrap_err();
    assert!(
        matches!(e, dflash_core::Error::UnsupportedTensorType { .. }),
        "{e}"
    );
    let e = QuantMatrix::from_ggml("w", GgmlType::F32, &[0; 4 * 48], 1, 48).unwrap_err();
    assert!(
        matches!(e, dflash_core::Error::BadTensorLayout { .. }),
        "{e}"
    );
}
