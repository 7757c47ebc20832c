//! ggml tensor types: block layouts, the reference dequantization (the formulas of
//! ggml, the oracle for our repacking) and simple quantizers used by test helpers.

use half::{bf16, f16};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// Types that GGUF files may carry but dflash-web does not load (Q2_K, IQ*, ...).
    Other(u32),
}

pub const QK_K: usize = 256;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            // Known ggml types that we recognise but cannot load.
            9..=11 | 15..=29 | 31..=41 => Self::Other(id),
            _ => return None,
        })
    }
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::BF16 => 30,
            Self::Other(id) => id,
        }
    }
    pub fn name(self) -> String {
        match self {
            Self::F32 => "F32".into(),
            Self::F16 => "F16".into(),
            Self::BF16 => "BF16".into(),
            Self::Q4_0 => "Q4_0".into(),
            Self::Q4_1 => "Q4_1".into(),
            Self::Q5_0 => "Q5_0".into(),
            Self::Q5_1 => "Q5_1".into(),
            Self::Q8_0 => "Q8_0".into(),
            Self::Q4K => "Q4_K".into(),
            Self::Q5K => "Q5_K".into(),
            Self::Q6K => "Q6_K".into(),
            Self::Other(id) => format!("ggml type {id}"),
        }
    }
    /// (elements per block, bytes per block). Unsupported types have no layout here
    /// (they answer (1, 1)): `parse_header` refuses them before sizing any tensor, and
    /// every other caller checks `is_supported` first.
    pub fn block_size(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (QK_K, 144),
            Self::Q5K => (QK_K, 176),
            Self::Q6K => (QK_K, 210),
            Self::Other(_) => (1, 1),
        }
    }
    pub fn is_supported(self) -> bool {
        !matches!(self, Self::Other(_))
    }
}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `get_scale_min_k4` of ggml: 6-bit scale and min of sub-block `j` of a K-quant block.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Reference dequantization of `n` elements of type `t`, literally the formulas of ggml
/// (`dequantize_row_*`). This is the oracle for the repacked formats.
pub fn dequantize(t: GgmlType, data: &[u8], n: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(n);
    let (bs, bb) = t.block_size();
    assert!(
        n.is_multiple_of(bs) && data.len() >= n / bs * bb,
        "dequantize: bad sizes"
    );
    match t {
        GgmlType::F32 => y.extend(
            data[..n * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap())),
        ),
        GgmlType::F16 => y.extend(
            data[..n * 2]
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::BF16 => y.extend(
            data[..n * 2]
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        _ => {
            for b in data[..n / bs * bb].chunks_exact(bb) {
                dequantize_block(t, b, &mut y);
            }
        }
    }
    y
}

fn dequantize_block(t: GgmlType, b: &[u8], y: &mut Vec<f32>) {
    match t {
        GgmlType::Q4_0 => {
            let d = h(b, 0);
            let qs = &b[2..18];
            let mut out = [0f32; 32];
            for j in 0..16 {
                out[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
                out[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
            }
            y.extend_from_slice(&out);
        }
        GgmlType::Q4_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            let qs = &b[4..20];
            let mut out = [0f32; 32];
            for j in 0..16 {
                out[j] = (qs[j] & 0xF) as f32 * d + m;
                out[j + 16] = (qs[j] >> 4) as f32 * d + m;
            }
            y.extend_from_slice(&out);
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (d, m, off) = if t == GgmlType::Q5_0 {
                (h(b, 0), 0.0, 2)
            } else {
                (h(b, 0), h(b, 2), 4)
            };
            let qh = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
            let qs = &b[off + 4..off + 20];
            let mut out = [0f32; 32];
            for j in 0..16 {
                let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                let x0 = ((qs[j] & 0xF) | xh0) as i32;
                let x1 = ((qs[j] >> 4) | xh1) as i32;
                if t == GgmlType::Q5_0 {
                    out[j] = (x0 - 16) as f32 * d;
                    out[j + 16] = (x1 - 16) as f32 * d;
                } else {
                    out[j] = x0 as f32 * d + m;
                    out[j + 16] = x1 as f32 * d + m;
                }
            }
            y.extend_from_slice(&out);
        }
        GgmlType::Q8_0 => {
            let d = h(b, 0);
            y.extend(b[2..34].iter().map(|&q| (q as i8) as f32 * d));
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let scales = &b[4..16];
            let (qh, ql) = if t == GgmlType::Q5K {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            let mut is = 0;
            let (mut u1, mut u2) = (1u8, 2u8);
            for j in 0..QK_K / 64 {
                let q = &ql[j * 32..j * 32 + 32];
                let (sc, m) = scale_min_k4(is, scales);
                let (d1, m1) = (d * sc as f32, dmin * m as f32);
                let (sc, m) = scale_min_k4(is + 1, scales);
                let (d2, m2) = (d * sc as f32, dmin * m as f32);
                for l in 0..32 {
                    let hi = if t == GgmlType::Q5K && qh[l] & u1 != 0 {
                        16
                    } else {
                        0
                    };
                    y.push(d1 * ((q[l] & 0xF) + hi) as f32 - m1);
                }
                for l in 0..32 {
                    let hi = if t == GgmlType::Q5K && qh[l] & u2 != 0 {
                        16
                    } else {
                        0
                    };
                    y.push(d2 * ((q[l] >> 4) + hi) as f32 - m2);
                }
                is += 2;
                u1 <<= 2;
                u2 <<= 2;
            }
        }
        GgmlType::Q6K => {
            let ql_all = &b[0..128];
            let qh_all = &b[128..192];
            let sc_all = &b[192..208];
            let d = h(b, 208);
            let mut out = [0f32; QK_K];
            for n in 0..2 {
                let (ql, qh, sc) = (&ql_all[n * 64..], &qh_all[n * 32..], &sc_all[n * 8..]);
                let o = &mut out[n * 128..];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    o[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    o[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    o[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    o[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
            y.extend_from_slice(&out);
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Other(_) => unreachable!(),
    }
}

/// One quantization group of a source block in integer form: weight = q * scale + min,
/// with scale and min as the source computes them in f32 (before f16 rounding).
pub struct SourceGroup<'a> {
    pub q: &'a [i32],
    pub scale: f32,
    pub min: f32,
}

/// Walks the quantized blocks of `data` and hands every group to `f` in element order.
/// Group sizes: 32 for the legacy types and the 4/5-bit K-quants, 16 for Q6_K.
pub fn for_each_group(t: GgmlType, data: &[u8], n: usize, mut f: impl FnMut(SourceGroup)) {
    let (bs, bb) = t.block_size();
    let mut q = [0i32; 32];
    for b in data[..n / bs * bb].chunks_exact(bb) {
        match t {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let (d, m, off) = if t == GgmlType::Q4_0 {
                    (h(b, 0), -8.0 * h(b, 0), 2)
                } else {
                    (h(b, 0), h(b, 2), 4)
                };
                for j in 0..16 {
                    q[j] = (b[off + j] & 0xF) as i32;
                    q[j + 16] = (b[off + j] >> 4) as i32;
                }
                f(SourceGroup {
                    q: &q,
                    scale: d,
                    min: m,
                });
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let off = if t == GgmlType::Q5_0 { 2 } else { 4 };
                let qh = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
                let bias = if t == GgmlType::Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    let qs = b[off + 4 + j];
                    q[j] = ((qs & 0xF) as u32 | (((qh >> j) << 4) & 0x10)) as i32 - bias;
                    q[j + 16] = ((qs >> 4) as u32 | ((qh >> (j + 12)) & 0x10)) as i32 - bias;
                }
                let m = if t == GgmlType::Q5_0 { 0.0 } else { h(b, 2) };
                f(SourceGroup {
                    q: &q,
                    scale: h(b, 0),
                    min: m,
                });
            }
            GgmlType::Q8_0 => {
                for j in 0..32 {
                    q[j] = b[2 + j] as i8 as i32;
                }
                f(SourceGroup {
                    q: &q,
                    scale: h(b, 0),
                    min: 0.0,
                });
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let scales = &b[4..16];
                let (qh, ql) = if t == GgmlType::Q5K {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for j in 0..4 {
                    for half in 0..2 {
                        let (sc, m) = scale_min_k4(2 * j + half, scales);
                        let bit = 1u8 << (2 * j + half);
                        for l in 0..32 {
                            let nib = if half == 0 {
                                ql[j * 32 + l] & 0xF
                            } else {
                                ql[j * 32 + l] >> 4
                            };
                            let hi = if t == GgmlType::Q5K && qh[l] & bit != 0 {
                                16
                            } else {
                                0
                            };
                            q[l] = (nib + hi) as i32;
                        }
                        f(SourceGroup {
                            q: &q,
                            scale: d * sc as f32,
                            min: -(dmin * m as f32),
                        });
                    }
                }
            }
            GgmlType::Q6K => {
                let d = h(b, 208);
                let mut vals = [0i32; QK_K];
                for n in 0..2 {
                    let (ql, qh) = (&b[n * 64..], &b[128 + n * 32..]);
                    for l in 0..32 {
                        let o = n * 128;
                        vals[o + l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        vals[o + l + 32] =
                            ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        vals[o + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        vals[o + l + 96] =
                            ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    }
                }
                // Sub-block s of 16 elements uses scale index s (see the `is` walk above).
                for s in 0..16 {
                    let sc = b[192 + s] as i8;
                    f(SourceGroup {
                        q: &vals[s * 16..s * 16 + 16],
                        scale: d * sc as f32,
                        min: 0.0,
                    });
                }
            }
            _ => unreachable!("for_each_group on a float or unsupported type"),
        }
    }
}

/// Quantizers for test helpers and tools: write f32 data as ggml blocks.
pub mod quantize {
    use half::f16;

    pub fn q8_0(x: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for g in x.chunks_exact(32) {
            let amax = g.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            out.extend(
                g.iter()
                    .map(|v| ((v * id).round() as i32).clamp(-128, 127) as i8 as u8),
            );
        }
        out
    }

    pub fn q4_0(x: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for g in x.chunks_exact(32) {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in g {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            for j in 0..16 {
                let a = ((g[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                let b = ((g[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                out.push(a | (b << 4));
            }
        }
        out
    }

    pub fn q4_1(x: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for g in x.chunks_exact(32) {
            let min = g.iter().cloned().fold(f32::INFINITY, f32::min);
            let max = g.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
            for j in 0..16 {
                let a = (((g[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                let b = (((g[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.push(a | (b << 4));
            }
        }
        out
    }

    pub fn f16s(x: &[f32]) -> Vec<u8> {
        x.iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect()
    }

    pub fn f32s(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}
