//! The fused kernels against the separate kernels they replace: the same arithmetic, so
//! the same bits (RMSNorm in the GEMV prologue, bias and SwiGLU in its epilogue, the
//! greedy head in the lm_head's epilogue; per-head norms, RoPE and the KV store in one
//! kernel after the QKV GEMV), for every weight format and several row counts.

mod common;
use common::contexts;
use dflash_core::config::RopeStyle;
use dflash_core::formats::ggml::{quantize, GgmlType};
use dflash_core::quant::QuantMatrix;
use dflash_core::testutil::Rng;
use dflash_gpu::ops::{self, GemvFusion};
use dflash_gpu::pipelines::Dispatch;
use dflash_gpu::upload::{concat_rows, f32_buffer, storage_buffer, upload_matrix, work_buffer};
use dflash_gpu::GpuContext;

fn read_u32(ctx: &GpuContext, b: &wgpu::Buffer, n: usize) -> Vec<u32> {
    bytemuck::cast_slice(&ctx.read_back(b, 0, (n * 4) as u64).unwrap()).to_vec()
}

fn run(ctx: &GpuContext, d: &[Dispatch]) {
    ops::submit(ctx, &d.iter().collect::<Vec<_>>());
    ctx.wait().unwrap();
}

fn matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> QuantMatrix {
    let x = rng.vec(rows * cols, 0.5);
    let bytes = match ty {
        GgmlType::Q4_1 => quantize::q4_1(&x),
        GgmlType::Q8_0 => quantize::q8_0(&x),
        _ => quantize::q4_0(&x),
    };
    QuantMatrix::from_ggml("w", ty, &bytes, rows, cols).unwrap()
}

/// One q4 and one q8 source (each kernel variant costs CPU adapters seconds to compile).
const TYPES: [GgmlType; 2] = [GgmlType::Q4_1, GgmlType::Q8_0];

#[test]
fn norm_and_bias_fused_into_the_gemv_give_the_same_bits() {
    for ctx in contexts() {
        let mut rng = Rng(7);
        let (rows, cols, eps) = (72, 192, 1e-5);
        for ty in TYPES {
            let m = upload_matrix(&ctx, "w", &matrix(&mut rng, ty, rows, cols)).unwrap();
            let w = f32_buffer(&ctx, "norm", &rng.vec(cols, 1.0));
            let bias = f32_buffer(&ctx, "bias", &rng.vec(rows, 1.0));
            for n in [1, 16] {
                let x = f32_buffer(&ctx, "x", &rng.vec(n * cols, 2.0));
                let xn = work_buffer(&ctx, "xn", (n * cols * 4) as u64);
                let (y1, y2) = (
                    work_buffer(&ctx, "y1", (n * rows * 4) as u64),
                    work_buffer(&ctx, "y2", (n * rows * 4) as u64),
                );
                let mut d = vec![ops::rmsnorm(&ctx, eps, &w, &x, &xn, n, cols).unwrap()];
                d.extend(ops::gemv(&ctx, &m, &xn, &y1, n, false).unwrap());
                d.push(ops::add_bias(&ctx, &bias, &y1, n, rows).unwrap());
                let f = GemvFusion {
                    norm: Some((&w, eps)),
                    bias: Some(&bias),
                    ..Default::default()
                };
                d.extend(ops::gemv_fused(&ctx, &m, &x, &y2, n, &f).unwrap());
                run(&ctx, &d);
                assert_eq!(
                    read_u32(&ctx, &y1, n * rows),
                    read_u32(&ctx, &y2, n * rows),
                    "{ty:?} n={n} lanes={}",
                    ops::gemv_lanes(&ctx, &m)
                );
            }
        }
    }
}

#[test]
fn stacked_gate_up_with_swiglu_gives_the_same_bits() {
    for ctx in contexts() {
        let mut rng = Rng(8);
        let (ff, cols, eps) = (96, 128, 1e-6);
        for ty in [GgmlType::Q4_1] {
            let gate = upload_matrix(&ctx, "g", &matrix(&mut rng, ty, ff, cols)).unwrap();
            let up = upload_matrix(&ctx, "u", &matrix(&mut rng, ty, ff, cols)).unwrap();
            let both = concat_rows(&ctx, "gu", &[&gate, &up]).expect("same formats stack");
            let w = f32_buffer(&ctx, "norm", &rng.vec(cols, 1.0));
            for n in [1, 16] {
                let x = f32_buffer(&ctx, "x", &rng.vec(n * cols, 2.0));
                let b = |name| work_buffer(&ctx, name, (n * ff * 4) as u64);
                let (g, u, y1, y2) = (b("g"), b("u"), b("y1"), b("y2"));
                let norm = GemvFusion {
                    norm: Some((&w, eps)),
                    ..Default::default()
                };
                let mut d = ops::gemv_fused(&ctx, &gate, &x, &g, n, &norm).unwrap();
                d.extend(ops::gemv_fused(&ctx, &up, &x, &u, n, &norm).unwrap());
                d.push(ops::swiglu(&ctx, &g, &u, &y1, n, ff).unwrap());
                let f = GemvFusion { pair: true, ..norm };
                d.extend(ops::gemv_fused(&ctx, &both, &x, &y2, n, &f).unwrap());
                run(&ctx, &d);
                assert_eq!(
                    read_u32(&ctx, &y1, n * ff),
                    read_u32(&ctx, &y2, n * ff),
                    "{ty:?} n={n}"
                );
            }
        }
    }
}

/// Threads that own 2, 4 or 8 output rows (each activation load serving them all) give the
/// bits of threads that own one, for the plain, norm + bias, SwiGLU-pair and greedy-head
/// GEMVs, q4 and q8, 1 and 16 rows, over a row count no workgroup size divides.
#[test]
fn owning_several_output_rows_per_thread_gives_the_same_bits() {
    use dflash_gpu::context::Tuning;
    let (rows, cols, eps) = (100, 192, 1e-5);
    let outputs_of = |outs: usize| {
        common::gpu_context(&dflash_gpu::GpuOptions {
            tuning: Some(Tuning::gpu().with_uniform_lanes(16, outs)),
            no_f16: true,
            ..Default::default()
        })
    };
    let Some(one) = outputs_of(1) else { return };
    let mut results: Vec<Vec<Vec<u32>>> = Vec::new();
    for outs in [1, 2, 4, 8] {
        let ctx = if outs == 1 {
            one.clone()
        } else {
            outputs_of(outs).unwrap()
        };
        assert_eq!(ctx.tuning.gemv_outputs(rows, cols), outs);
        let mut rng = Rng(11);
        let mut got = Vec::new();
        for ty in TYPES {
            let m = upload_matrix(&ctx, "w", &matrix(&mut rng, ty, rows, cols)).unwrap();
            let w = f32_buffer(&ctx, "norm", &rng.vec(cols, 1.0));
            let bias = f32_buffer(&ctx, "bias", &rng.vec(rows, 1.0));
            for n in [1, 16] {
                let x = f32_buffer(&ctx, "x", &rng.vec(n * cols, 2.0));
                let y = |name| work_buffer(&ctx, name, (n * rows * 4) as u64);
                let (plain, fused, paired) = (y("plain"), y("fused"), y("paired"));
                let parts = ops::argmax_parts(&ctx, &m);
                let best = work_buffer(&ctx, "best", (n * parts * 8) as u64);
                let tokens = work_buffer(&ctx, "tokens", 64);
                let mut d = ops::gemv(&ctx, &m, &x, &plain, n, false).unwrap();
                let norm_bias = GemvFusion {
                    norm: Some((&w, eps)),
                    bias: Some(&bias),
                    ..Default::default()
                };
                d.extend(ops::gemv_fused(&ctx, &m, &x, &fused, n, &norm_bias).unwrap());
                let pair = GemvFusion {
                    pair: true,
                    ..Default::default()
                };
                d.extend(ops::gemv_fused(&ctx, &m, &x, &paired, n, &pair).unwrap());
                let head = GemvFusion {
                    argmax: Some(&best),
                    ..Default::default()
                };
                let logits = y("logits");
                d.extend(ops::gemv_fused(&ctx, &m, &x, &logits, n, &head).unwrap());
                d.push(ops::argmax_reduce(&ctx, &best, &tokens, n, parts).unwrap());
                run(&ctx, &d);
                got.push(read_u32(&ctx, &plain, n * rows));
                got.push(read_u32(&ctx, &fused, n * rows));
                got.push(read_u32(&ctx, &paired, n * rows / 2));
                got.push(read_u32(&ctx, &logits, n * rows));
                got.push(read_u32(&ctx, &tokens, n));
            }
        }
        results.push(got);
    }
    for (outs, got) in [2, 4, 8].iter().zip(&results[1..]) {
        for (i, (a, b)) in results[0].iter().zip(got).enumerate() {
            assert_eq!(a, b, "{outs} rows per thread, result {i}");
        }
    }
}

/// The greedy head's workgroup pick holds wherever a workgroup covers many rows: with 2
/// lanes and 8 rows per thread (256 rows per workgroup) and 16 x rows, more (value,
/// index) pairs than its scratch holds, each x row's token is still the argmax of the
/// logits the same kernel writes.
#[test]
fn the_greedy_head_picks_the_argmax_when_a_workgroup_covers_256_rows() {
    use dflash_gpu::context::Tuning;
    let Some(ctx) = common::gpu_context(&dflash_gpu::GpuOptions {
        tuning: Some(Tuning::gpu().with_uniform_lanes(2, 8)),
        no_f16: true,
        ..Default::default()
    }) else {
        return;
    };
    let (rows, cols, n) = (600, 64, 16);
    let mut rng = Rng(17);
    let m = upload_matrix(&ctx, "w", &matrix(&mut rng, GgmlType::Q8_0, rows, cols)).unwrap();
    assert_eq!(ops::gemv_rows_per_workgroup(&ctx, &m, false), 256);
    let x = f32_buffer(&ctx, "x", &rng.vec(n * cols, 2.0));
    let logits = work_buffer(&ctx, "logits", (n * rows * 4) as u64);
    let parts = ops::argmax_parts(&ctx, &m);
    let best = work_buffer(&ctx, "best", (n * parts * 8) as u64);
    let tokens = work_buffer(&ctx, "tokens", (n * 4) as u64);
    let head = GemvFusion {
        argmax: Some(&best),
        ..Default::default()
    };
    let mut d = ops::gemv_fused(&ctx, &m, &x, &logits, n, &head).unwrap();
    d.push(ops::argmax_reduce(&ctx, &best, &tokens, n, parts).unwrap());
    run(&ctx, &d);
    let values: Vec<f32> = bytemuck::cast_slice(&read_u32(&ctx, &logits, n * rows)).to_vec();
    common::assert_argmax_rows(&read_u32(&ctx, &tokens, n), &values, rows);
}

/// One pass of the norm split between a residual GEMV and the GEMVs after it
/// (`Tuning::norm_in_residual`): the producer adds `w1 a` to the residual `resid` and
/// leaves the norm's share; the consumer is `w2` with a bias, then `w2` as a greedy head.
/// Returns the residual, the consumer's output, the head's logits and tokens.
fn norm_split_pass(
    ctx: &GpuContext,
    (w1, w2): (
        &dflash_gpu::upload::GpuMatrix,
        &dflash_gpu::upload::GpuMatrix,
    ),
    (gain, bias, eps): (&wgpu::Buffer, &wgpu::Buffer, f32),
    (a, resid): (&[f32], &[f32]),
    n: usize,
) -> [Vec<u32>; 4] {
    let (hid, m2) = (w1.rows, w2.rows);
    let a = f32_buffer(ctx, "a", a);
    let x = f32_buffer(ctx, "x", resid);
    let prenorm = work_buffer(ctx, "prenorm", ops::prenorm_bytes(hid));
    let y = work_buffer(ctx, "y", (n * m2 * 4) as u64);
    let logits = work_buffer(ctx, "logits", (n * m2 * 4) as u64);
    let parts = ops::argmax_parts(ctx, w2);
    let best = work_buffer(ctx, "best", (n * parts * 8) as u64);
    let tokens = work_buffer(ctx, "tokens", 64);
    let producer = GemvFusion {
        accumulate: true,
        norm_out: Some(ops::NormOut {
            weight: gain,
            buf: &prenorm,
        }),
        ..Default::default()
    };
    let mut d = ops::gemv_fused(ctx, w1, &a, &x, n, &producer).unwrap();
    let prenormed = Some(ops::Prenormed {
        buf: &prenorm,
        parts: ops::norm_out_parts(ctx, w1),
        eps,
    });
    let consumer = GemvFusion {
        prenormed,
        bias: Some(bias),
        ..Default::default()
    };
    d.extend(ops::gemv_fused(ctx, w2, &prenorm, &y, n, &consumer).unwrap());
    let head = GemvFusion {
        prenormed,
        argmax: Some(&best),
        ..Default::default()
    };
    d.extend(ops::gemv_fused(ctx, w2, &prenorm, &logits, n, &head).unwrap());
    d.push(ops::argmax_reduce(ctx, &best, &tokens, n, parts).unwrap());
    run(ctx, &d);
    [
        read_u32(ctx, &x, n * hid),
        read_u32(ctx, &y, n * m2),
        read_u32(ctx, &logits, n * m2),
        read_u32(ctx, &tokens, n),
    ]
}

/// The norm split between the residual GEMV and the GEMV after it: the residual has the
/// bits of the plain residual GEMV, the output matches the separate RMSNorm + GEMV +
/// bias within rounding (1/rms multiplies the sums at the end, not each x), a row's bits
/// are the same alone and among 16, and the greedy head after it picks the argmax of
/// its logits. 288 rows: a CPU adapter's second producer workgroup is part-filled.
#[test]
fn the_norm_split_into_the_residual_gemv_matches_the_separate_norm() {
    for ctx in contexts() {
        let mut rng = Rng(19);
        let (hid, c1, m2, eps) = (288, 128, 72, 1e-5);
        let w1 = upload_matrix(&ctx, "w1", &matrix(&mut rng, GgmlType::Q4_1, hid, c1)).unwrap();
        let w2 = upload_matrix(&ctx, "w2", &matrix(&mut rng, GgmlType::Q8_0, m2, hid)).unwrap();
        let gain = f32_buffer(&ctx, "gain", &rng.vec(hid, 1.0));
        let bias = f32_buffer(&ctx, "bias", &rng.vec(m2, 1.0));
        let n = 16;
        let (a, resid) = (rng.vec(n * c1, 1.0), rng.vec(n * hid, 2.0));
        let split = norm_split_pass(&ctx, (&w1, &w2), (&gain, &bias, eps), (&a, &resid), n);
        // The separate kernels.
        let (ab, x) = (f32_buffer(&ctx, "a", &a), f32_buffer(&ctx, "x", &resid));
        let xn = work_buffer(&ctx, "xn", (n * hid * 4) as u64);
        let y = work_buffer(&ctx, "y", (n * m2 * 4) as u64);
        let mut d = ops::gemv(&ctx, &w1, &ab, &x, n, true).unwrap();
        d.push(ops::rmsnorm(&ctx, eps, &gain, &x, &xn, n, hid).unwrap());
        d.extend(ops::gemv(&ctx, &w2, &xn, &y, n, false).unwrap());
        d.push(ops::add_bias(&ctx, &bias, &y, n, m2).unwrap());
        run(&ctx, &d);
        assert_eq!(split[0], read_u32(&ctx, &x, n * hid), "the residual");
        let floats = |v: &[u32]| v.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>();
        let (got, want) = (floats(&split[1]), read_f32s(&ctx, &y, n * m2));
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = common::max_abs_diff(&got, &want);
        assert!(err <= 1e-5 * scale, "split norm: {err} against {scale}");
        // The head's logits are the consumer's sums before the bias, the same bits.
        let logits = floats(&split[2]);
        let bias_v: Vec<f32> = read_f32s(&ctx, &bias, m2);
        let plus_bias: Vec<u32> = (0..n * m2)
            .map(|i| (logits[i] + bias_v[i % m2]).to_bits())
            .collect();
        assert_eq!(plus_bias, split[1], "the head's logits + bias");
        common::assert_argmax_rows(&split[3], &logits, m2);
        // Each row alone has its bits among the 16.
        for r in [0, 5, 15] {
            let alone = norm_split_pass(
                &ctx,
                (&w1, &w2),
                (&gain, &bias, eps),
                (&a[r * c1..(r + 1) * c1], &resid[r * hid..(r + 1) * hid]),
                1,
            );
            assert_eq!(alone[1][..], split[1][r * m2..(r + 1) * m2], "row {r}");
            assert_eq!(
                alone[2][..],
                split[2][r * m2..(r + 1) * m2],
                "row {r} logits"
            );
        }
    }
}

/// A tap in the residual GEMV's epilogue writes the bits of the copy it replaces (the
/// residual stream after the add), at its place in a taps row of two taps.
#[test]
fn a_tap_in_the_residual_gemvs_epilogue_gives_the_bits_of_the_copy() {
    for ctx in contexts() {
        let mut rng = Rng(13);
        let (rows, cols) = (96, 128);
        let m = upload_matrix(&ctx, "w", &matrix(&mut rng, GgmlType::Q4_1, rows, cols)).unwrap();
        let state = storage_buffer(&ctx, "st", bytemuck::cast_slice(&[0u32; 4]));
        for n in [1, 16] {
            let x = f32_buffer(&ctx, "x", &rng.vec(n * cols, 1.0));
            let resid = rng.vec(n * rows, 1.0);
            let (y1, y2) = (
                f32_buffer(&ctx, "y1", &resid),
                f32_buffer(&ctx, "y2", &resid),
            );
            let taps = |name| work_buffer(&ctx, name, (n * 2 * rows * 4) as u64);
            let (t1, t2) = (taps("t1"), taps("t2"));
            let mut d = ops::gemv(&ctx, &m, &x, &y1, n, true).unwrap();
            d.push(ops::copy_rows(&ctx, &y1, &t1, &state, n, rows, 2 * rows, rows).unwrap());
            let f = GemvFusion {
                accumulate: true,
                tap: Some(ops::GemvTap {
                    buf: &t2,
                    offset: rows,
                    stride: 2 * rows,
                }),
                ..Default::default()
            };
            d.extend(ops::gemv_fused(&ctx, &m, &x, &y2, n, &f).unwrap());
            run(&ctx, &d);
            assert_eq!(
                read_u32(&ctx, &y1, n * rows),
                read_u32(&ctx, &y2, n * rows),
                "y n={n}"
            );
            let (a, b) = (
                read_u32(&ctx, &t1, 2 * n * rows),
                read_u32(&ctx, &t2, 2 * n * rows),
            );
            for r in 0..n {
                let second = r * 2 * rows + rows..(r + 1) * 2 * rows;
                assert_eq!(a[second.clone()], b[second], "taps row {r}, n={n}");
            }
        }
    }
}

/// The greedy head fused into the lm_head (workgroup partials, then a reduction) picks
/// the argmax kernel's token, over a matrix split into chunks, with ties and NaN.
#[test]
fn the_fused_greedy_head_picks_the_argmax_token() {
    for ctx in contexts() {
        let mut rng = Rng(9);
        let (rows, cols) = (300, 64);
        let q = matrix(&mut rng, GgmlType::Q8_0, rows, cols);
        for per in [rows, 100] {
            let m = dflash_gpu::upload::upload_matrix_chunked(&ctx, "lm", &q, per).unwrap();
            for n in [1, 16] {
                let mut xs = rng.vec(n * cols, 1.0);
                if n > 1 {
                    xs[cols..2 * cols].fill(0.0); // row 1: every logit ties at 0
                }
                let x = f32_buffer(&ctx, "x", &xs);
                let logits = work_buffer(&ctx, "logits", (n * rows * 4) as u64);
                let parts = ops::argmax_parts(&ctx, &m);
                let best = work_buffer(&ctx, "best", (n * parts * 8) as u64);
                let (t1, t2) = (work_buffer(&ctx, "t1", 64), work_buffer(&ctx, "t2", 64));
                let mut d = ops::gemv(&ctx, &m, &x, &logits, n, false).unwrap();
                d.push(ops::argmax(&ctx, &logits, &t1, n, rows, rows).unwrap());
                let f = GemvFusion {
                    argmax: Some(&best),
                    ..Default::default()
                };
                d.extend(ops::gemv_fused(&ctx, &m, &x, &logits, n, &f).unwrap());
                d.push(ops::argmax_reduce(&ctx, &best, &t2, n, parts).unwrap());
                run(&ctx, &d);
                let (a, b) = (read_u32(&ctx, &t1, n), read_u32(&ctx, &t2, n));
                assert_eq!(a, b, "chunks of {per} rows, n={n}");
                if n > 1 {
                    assert_eq!(b[1], 0, "a tie goes to the lowest index");
                }
            }
        }
    }
}

/// One kernel after the QKV GEMV (per-head norms, RoPE, KV store) writes the bits that
/// the separate norm, RoPE and store kernels write.
#[test]
fn qkv_rope_store_gives_the_bits_of_the_separate_kernels() {
    for ctx in contexts() {
        let mut rng = Rng(10);
        let (nh, nkv, hd, pos) = (4, 2, 32, 5u32);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let row = qd + 2 * kvd;
        let table: Vec<f32> = (0..64 * hd / 2)
            .flat_map(|i| {
                let a = i as f32 * 0.01;
                [a.cos(), a.sin()]
            })
            .collect();
        let table = f32_buffer(&ctx, "table", &table);
        let st = storage_buffer(&ctx, "state", bytemuck::cast_slice(&[pos, 0, 0, 0]));
        let (qn, kn) = (
            f32_buffer(&ctx, "qn", &rng.vec(hd, 1.0)),
            f32_buffer(&ctx, "kn", &rng.vec(hd, 1.0)),
        );
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            for norm in [false, true] {
                for n in [1, 16] {
                    let vals = rng.vec(n * row, 1.0);
                    let part = |lo: usize, len: usize| -> Vec<f32> {
                        (0..n)
                            .flat_map(|r| vals[r * row + lo..r * row + lo + len].to_vec())
                            .collect()
                    };
                    let (q, k, v) = (
                        f32_buffer(&ctx, "q", &part(0, qd)),
                        f32_buffer(&ctx, "k", &part(qd, kvd)),
                        f32_buffer(&ctx, "v", &part(qd + kvd, kvd)),
                    );
                    let qkv = f32_buffer(&ctx, "qkv", &vals);
                    let cache = |name| work_buffer(&ctx, name, (64 * kvd * 4) as u64);
                    let (kc1, vc1, kc2, vc2) = (cache("k1"), cache("v1"), cache("k2"), cache("v2"));
                    let rope = |heads| ops::RopeShape {
                        style,
                        heads,
                        head_dim: hd,
                        rope_dim: hd,
                    };
                    let mut d = Vec::new();
                    if norm {
                        d.push(ops::rmsnorm_inplace(&ctx, 1e-6, &qn, &q, n * nh, hd).unwrap());
                        d.push(ops::rmsnorm_inplace(&ctx, 1e-6, &kn, &k, n * nkv, hd).unwrap());
                    }
                    d.push(ops::rope(&ctx, &rope(nh), &st, &table, &q, n).unwrap());
                    d.push(ops::rope(&ctx, &rope(nkv), &st, &table, &k, n).unwrap());
                    d.push(ops::store_kv(&ctx, &k, &st, &kc1, n, kvd).unwrap());
                    d.push(ops::store_kv(&ctx, &v, &st, &vc1, n, kvd).unwrap());
                    let shape = ops::QkvShape {
                        style,
                        n_heads: nh,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        rope_dim: hd,
                        eps: 1e-6,
                        gate: false,
                    };
                    let bufs = ops::QkvBuffers {
                        state: &st,
                        table: &table,
                        qkv: &qkv,
                        qk_norm: norm.then_some([&qn, &kn]),
                        k_cache: &kc2,
                        v_cache: &vc2,
                    };
                    d.push(ops::qkv_rope_store(&ctx, &shape, &bufs, n).unwrap());
                    run(&ctx, &d);
                    let got = read_u32(&ctx, &qkv, n * row);
                    let want_q = read_u32(&ctx, &q, n * qd);
                    for r in 0..n {
                        assert_eq!(
                            &got[r * row..r * row + qd],
                            &want_q[r * qd..(r + 1) * qd],
                            "q, {style:?} norm={norm} n={n} row {r}"
                        );
                    }
                    let c = 64 * kvd / if ctx.f16 { 2 } else { 1 };
                    assert_eq!(read_u32(&ctx, &kc1, c), read_u32(&ctx, &kc2, c), "k cache");
                    assert_eq!(read_u32(&ctx, &vc1, c), read_u32(&ctx, &vc2, c), "v cache");
                }
            }
        }
    }
}

fn read_f32s(ctx: &GpuContext, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
    bytemuck::cast_slice(&ctx.read_back(b, 0, (n * 4) as u64).unwrap()).to_vec()
}

fn read_kv(ctx: &GpuContext, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
    if !ctx.f16 {
        return read_f32s(ctx, b, n);
    }
    let bytes = ctx.read_back(b, 0, (n * 2) as u64).unwrap();
    let halves: &[u16] = bytemuck::cast_slice(&bytes);
    halves.iter().map(|&h| half_to_f32(h)).collect()
}

fn half_to_f32(h: u16) -> f32 {
    let (sign, exp, man) = ((h >> 15) as u32, ((h >> 10) & 31) as i32, (h & 1023) as f32);
    let v = match exp {
        0 => man * 2f32.powi(-24),
        31 => f32::INFINITY,
        e => (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    };
    if sign == 1 {
        -v
    } else {
        v
    }
}

/// The QKV and attention shapes of a layer with `nh` query and `nkv` KV heads of `hd`
/// (neox RoPE over the whole head; the QKV rows stacked q, k, v).
fn attention_shapes(
    nh: usize,
    nkv: usize,
    hd: usize,
    window: usize,
    causal: bool,
) -> (ops::QkvShape, ops::AttentionShape) {
    let qkv = ops::QkvShape {
        style: RopeStyle::Neox,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        rope_dim: hd,
        eps: 1e-6,
        gate: false,
    };
    let att = ops::AttentionShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        window,
        causal,
        q_stride: (nh + 2 * nkv) * hd,
    };
    (qkv, att)
}

/// Chunked attention (GPUs) against qkv.wgsl + attention.wgsl (CPU adapters): the same
/// outputs and cache within rounding (the chunks are merged in another order than one
/// walk over the keys sums them), for rows whose keys span several chunks of 64, with
/// and without per-head norms, causal and not (the drafter's block), with a window, and
/// for groups served by one and by several head tiles.
#[test]
fn chunked_attention_matches_qkv_and_attention() {
    for ctx in contexts() {
        let mut rng = Rng(11);
        let cap = 256; // chunks of 64
        for (nh, nkv, norm, causal, window) in [
            (6, 2, true, true, 0),
            (4, 4, false, true, 0),
            (16, 1, true, true, 0),
            (6, 2, true, false, 100),
        ] {
            let hd = 64;
            let (qd, kvd) = (nh * hd, nkv * hd);
            let row = qd + 2 * kvd;
            let table: Vec<f32> = (0..cap * hd / 2)
                .flat_map(|i| {
                    let a = (i % (hd / 2)) as f32 * 0.3 + (i / (hd / 2)) as f32 * 0.01;
                    [a.cos(), a.sin()]
                })
                .collect();
            let table = f32_buffer(&ctx, "table", &table);
            let (qn, kn) = (
                f32_buffer(&ctx, "qn", &rng.vec(hd, 1.0)),
                f32_buffer(&ctx, "kn", &rng.vec(hd, 1.0)),
            );
            let (shape, att) = attention_shapes(nh, nkv, hd, window, causal);
            let cache = |name| work_buffer(&ctx, name, (cap * kvd * 4) as u64);
            let (kc1, vc1, kc2, vc2) = (cache("k1"), cache("v1"), cache("k2"), cache("v2"));
            let (ml, acc) = ops::attention_partial_bytes(nh, hd, cap);
            let (ml, acc) = (work_buffer(&ctx, "ml", ml), work_buffer(&ctx, "acc", acc));
            // Positions 0..150 in passes of 16 rows (the last shorter), both ways.
            let mut pos = 0;
            while pos < 150 {
                let n = 16.min(150 - pos);
                let st = storage_buffer(&ctx, "st", bytemuck::cast_slice(&[pos as u32, 0, 0, 0]));
                let vals = rng.vec(n * row, 1.0);
                let (qkv1, qkv2) = (f32_buffer(&ctx, "a", &vals), f32_buffer(&ctx, "b", &vals));
                let (o1, o2) = (
                    work_buffer(&ctx, "o1", (n * qd * 4) as u64),
                    work_buffer(&ctx, "o2", (n * qd * 4) as u64),
                );
                let bufs = |qkv, k_cache, v_cache| ops::QkvBuffers {
                    state: &st,
                    table: &table,
                    qkv,
                    qk_norm: norm.then_some([&qn, &kn]),
                    k_cache,
                    v_cache,
                };
                let mut d =
                    vec![ops::qkv_rope_store(&ctx, &shape, &bufs(&qkv1, &kc1, &vc1), n).unwrap()];
                d.push(ops::attention(&ctx, &att, &st, &qkv1, &kc1, &vc1, &o1, n).unwrap());
                let chunked = ops::ChunkedAttentionBuffers {
                    qkv: bufs(&qkv2, &kc2, &vc2),
                    part_ml: &ml,
                    part_acc: &acc,
                    out: &o2,
                };
                d.extend(ops::attention_chunked(&ctx, &shape, &att, &chunked, cap, n).unwrap());
                run(&ctx, &d);
                let (want, got) = (read_f32s(&ctx, &o1, n * qd), read_f32s(&ctx, &o2, n * qd));
                let err = common::max_abs_diff(&want, &got);
                let tol = if ctx.f16 { 2e-3 } else { 2e-5 };
                let case = format!(
                    "{nh}/{nkv} norm={norm} causal={causal} at {pos} f16={}",
                    ctx.f16
                );
                assert!(err <= tol, "output: {err} > {tol}, {case}");
                if pos >= 144 {
                    eprintln!("{case}: max error {err:e}");
                }
                pos += n;
            }
            let (k1, k2) = (
                read_kv(&ctx, &kc1, 150 * kvd),
                read_kv(&ctx, &kc2, 150 * kvd),
            );
            let (v1, v2) = (
                read_kv(&ctx, &vc1, 150 * kvd),
                read_kv(&ctx, &vc2, 150 * kvd),
            );
            let tol = if ctx.f16 { 4e-3 } else { 1e-5 };
            assert!(common::max_abs_diff(&k1, &k2) <= tol, "k cache {nh}/{nkv}");
            assert_eq!(v1, v2, "v cache {nh}/{nkv}");
        }
    }
}

/// Chunked attention with a sliding window: rows 1..16 of a 16-row pass (one workgroup
/// serves several rows) have the bits they have alone, even where a value that only
/// row 0's window sees is infinite (a row never adds 0 * v of another row's key).
#[test]
fn a_windowed_row_in_a_row_tile_has_its_bits_alone_even_beside_an_infinite_value() {
    for ctx in contexts() {
        let mut rng = Rng(12);
        let (nh, nkv, hd, cap, window, prefix) = (6, 2, 64, 256, 24, 48);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let row = qd + 2 * kvd;
        let table: Vec<f32> = (0..cap * hd / 2)
            .flat_map(|i| [(i as f32 * 0.01).cos(), (i as f32 * 0.01).sin()])
            .collect();
        let table = f32_buffer(&ctx, "table", &table);
        let (shape, att) = attention_shapes(nh, nkv, hd, window, true);
        let (ml, acc) = ops::attention_partial_bytes(nh, hd, cap);
        let (ml, acc) = (work_buffer(&ctx, "ml", ml), work_buffer(&ctx, "acc", acc));
        let kv_bytes = if ctx.f16 { 2 } else { 4 };
        let caches: Vec<_> = (0..2)
            .map(|_| {
                let b = |name| work_buffer(&ctx, name, (cap * kvd * kv_bytes) as u64);
                (b("k"), b("v"))
            })
            .collect();
        // One pass of `n` rows at `pos` into cache `which`; its outputs.
        let pass = |which: usize, pos: usize, vals: &[f32], n: usize| -> Vec<f32> {
            let st = storage_buffer(&ctx, "st", bytemuck::cast_slice(&[pos as u32, 0, 0, 0]));
            let qkv = f32_buffer(&ctx, "qkv", vals);
            let out = work_buffer(&ctx, "out", (n * qd * 4) as u64);
            let (k_cache, v_cache) = (&caches[which].0, &caches[which].1);
            let b = ops::ChunkedAttentionBuffers {
                qkv: ops::QkvBuffers {
                    state: &st,
                    table: &table,
                    qkv: &qkv,
                    qk_norm: None,
                    k_cache,
                    v_cache,
                },
                part_ml: &ml,
                part_acc: &acc,
                out: &out,
            };
            run(
                &ctx,
                &ops::attention_chunked(&ctx, &shape, &att, &b, cap, n).unwrap(),
            );
            read_f32s(&ctx, &out, n * qd)
        };
        let prefix_rows = rng.vec(prefix * row, 1.0);
        for (which, (_, v_cache)) in caches.iter().enumerate() {
            for (i, rows) in prefix_rows.chunks(16 * row).enumerate() {
                pass(which, 16 * i, rows, 16);
            }
            // Every value of the one position only row 0 of the pass sees: +inf.
            let inf: Vec<u8> = match ctx.f16 {
                true => bytemuck::cast_slice(&vec![0x7c00u16; kvd]).to_vec(),
                false => bytemuck::cast_slice(&vec![f32::INFINITY; kvd]).to_vec(),
            };
            let at = ((prefix + 1 - window) * kvd * kv_bytes) as u64;
            ctx.queue.write_buffer(v_cache, at, &inf);
        }
        let rows = rng.vec(16 * row, 1.0);
        let together = pass(0, prefix, &rows, 16);
        let mut alone = Vec::new();
        for r in 0..16 {
            alone.extend(pass(1, prefix + r, &rows[r * row..(r + 1) * row], 1));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (t, a) = (&together[qd..], &alone[qd..]);
        assert!(
            t.iter().all(|x| x.is_finite()),
            "rows 1..16 finite (f16={})",
            ctx.f16
        );
        assert_eq!(
            bits(t),
            bits(a),
            "rows 1..16 alone vs together (f16={})",
            ctx.f16
        );
    }
}
