//! Mixture-of-experts targets (qwen3_moe) on the GPU: the router, the experts' GEMVs
//! over the rows that chose them and the weighted sum against the CPU reference, with
//! hidden-state taps after a sparse layer; a position's logits the same bits alone, in
//! a 16-row pass and in prefill; the streamed GGUF's expert stacks.

use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf};
use dflash_core::weights::ModelWeights;
use dflash_gpu::{GpuModel, GpuModelOptions};
mod common;
use common::max_abs_diff;

fn tiny_moe(t: GgmlType, seed: u64) -> (ModelWeights, Vec<u8>) {
    let c = tiny_config(Arch::Qwen3Moe);
    let file = write_gguf(&c, &random_weights(&c, seed), t);
    (load_gguf(&file).unwrap().weights, file)
}

use common::tokens;

/// Logits of 12 rows in one pass and the taps after layers 0 (sparse) and 2 (sparse,
/// the last: after the final norm) equal the CPU reference's within the dense models'
/// tolerance, and each row's argmax is the GPU's token.
#[test]
fn moe_logits_and_taps_match_the_cpu_reference() {
    for ctx in common::contexts() {
        for t in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (w, _) = tiny_moe(t, 41);
            let cpu = CpuModel::new(&w);
            let toks = tokens(12, w.config.vocab_size, 5);
            let taps = vec![0, 2];
            let mut cache = cpu.new_cache(64);
            let want = cpu
                .forward(&toks, &mut cache, LogitRows::All, &taps)
                .unwrap();
            let opts = GpuModelOptions {
                context: 64,
                taps,
                ..Default::default()
            };
            let mut g = GpuModel::new(ctx.clone(), &w, &opts).unwrap();
            let ids = g.step(&toks).unwrap();
            let got = g.read_logits(toks.len()).unwrap();
            let scale = want.logits.iter().fold(0f32, |a, x| a.max(x.abs()));
            let tol = if ctx.f16 { 5e-3 } else { 5e-5 } * scale.max(1.0);
            let d = max_abs_diff(&want.logits, &got);
            eprintln!(
                "qwen3_moe {t:?} f16-kv={}: max |gpu - cpu| = {d:e}",
                ctx.f16
            );
            assert!(d <= tol, "{t:?}: logits differ by {d} > {tol}");
            common::assert_argmax_rows(&ids, &got, w.config.vocab_size);
            let d = max_abs_diff(&want.taps, &g.read_taps(toks.len()).unwrap());
            assert!(
                d < if ctx.f16 { 1e-2 } else { 1e-3 },
                "{t:?}: taps differ by {d}"
            );
        }
    }
}

/// 40 positions one row at a time, in passes of 16 rows and in prefill: the same bits
/// (each row's experts are read by the workgroups of the experts it chose, whatever the
/// other rows chose).
#[test]
fn a_moe_position_is_bit_identical_alone_in_a_16_row_pass_and_in_prefill() {
    for ctx in common::contexts() {
        let (w, _) = tiny_moe(GgmlType::Q4_0, 42);
        let v = w.config.vocab_size;
        let toks = tokens(40, v, 6);
        let opts = GpuModelOptions {
            context: 64,
            ..Default::default()
        };
        let mut g = GpuModel::new(ctx.clone(), &w, &opts).unwrap();
        common::assert_batch_invariant(&mut g, &toks, 37);
    }
}

/// A GGUF streamed into GPU buffers (each 3-D expert stack uploaded as it arrives)
/// gives the logits of the host-loaded model, bit for bit.
#[test]
fn a_streamed_moe_gguf_equals_the_loaded_model() {
    let Some(ctx) = common::contexts().into_iter().next() else {
        return;
    };
    let (w, file) = tiny_moe(GgmlType::Q4_1, 43);
    let toks = tokens(9, w.config.vocab_size, 7);
    let opts = GpuModelOptions {
        context: 32,
        ..Default::default()
    };
    let mut a = GpuModel::new(ctx.clone(), &w, &opts).unwrap();
    a.step(&toks).unwrap();
    let want = a.read_logits(toks.len()).unwrap();
    let mut s = dflash_gpu::stream_load::StreamLoader::new(ctx, file.len() as u64);
    for chunk in file.chunks(1000) {
        s.push(chunk).unwrap();
    }
    let mut b = s.finish(&opts).unwrap().model;
    b.step(&toks).unwrap();
    let got = b.read_logits(toks.len()).unwrap();
    assert!(want
        .iter()
        .zip(&got)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// A 6-layer qwen3_moe target (sparse layers 0, 2, 4, 5) with a random z-lab drafter:
/// speculative output equals plain decoding token for token at every block size, greedy
/// and seeded T = 0.8 (the verify pass routes each row alone, so its rows are the plain
/// step's bits).
#[test]
fn dflash_on_a_moe_target_equals_plain_decoding_at_every_block_size() {
    let Some(ctx) = common::contexts().into_iter().last() else {
        return;
    };
    let mut c = tiny_config(Arch::Qwen3Moe);
    c.num_layers = 6;
    c.moe.as_mut().unwrap().sparse_layers = vec![true, false, true, false, true, true];
    let t = load_gguf(&write_gguf(&c, &random_weights(&c, 44), GgmlType::Q4_0)).unwrap();
    common::assert_dflash_lossless(&ctx, &t, 2, &tokens(9, c.vocab_size - 1, 9));
}
