//! Qwen3.5 hybrid targets on the GPU (transformers' tiny Qwen3_5ForCausalLM of
//! fixtures/arch/qwen3_5, repacked to 8 bits): Gated DeltaNet layers (delta_net.wgsl)
//! and gated attention against the CPU reference, a position's logits the same bits
//! alone, in a 16-row pass and in prefill (the recurrence walks a pass's rows in order),
//! DFlash over it lossless (the verify pass's states replayed to the accepted rows), and
//! a rollback the GPU cannot do refused with a typed error.

use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::model_files::{load_path, LoadedModel};
use dflash_gpu::{GpuError, GpuModel, GpuModelOptions};
use std::path::Path;
mod common;

fn fixture(case: &str) -> LoadedModel {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/arch");
    load_path(&dir.join(case).join("model")).unwrap()
}

fn hybrid() -> LoadedModel {
    fixture("qwen3_5")
}

use common::tokens;

fn opts(context: usize) -> GpuModelOptions {
    GpuModelOptions {
        context,
        ..Default::default()
    }
}

/// 12 rows in one pass, then 3 more one at a time (through the states the pass left):
/// every row's logits within the dense models' tolerance of the CPU reference's.
#[test]
fn hybrid_logits_match_the_cpu_reference() {
    // Qwen3.5, and Qwen3.5-MoE (experts and a shared expert in every layer).
    for case in ["qwen3_5", "qwen3_5_moe"] {
        logits_match(&fixture(case));
    }
}

fn logits_match(m: &LoadedModel) {
    let cpu = CpuModel::new(&m.weights);
    let toks = tokens(15, m.config().vocab_size, 3);
    let mut cache = cpu.new_cache(64);
    let mut want = cpu
        .forward(&toks[..12], &mut cache, LogitRows::All, &[])
        .unwrap()
        .logits;
    for t in &toks[12..] {
        want.extend(
            cpu.forward(&[*t], &mut cache, LogitRows::All, &[])
                .unwrap()
                .logits,
        );
    }
    for ctx in common::contexts() {
        let mut g = GpuModel::new(ctx.clone(), &m.weights, &opts(64)).unwrap();
        g.step(&toks[..12]).unwrap();
        let mut got = g.read_logits(12).unwrap();
        for t in &toks[12..] {
            g.step(&[*t]).unwrap();
            got.extend(g.read_logits(1).unwrap());
        }
        let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
        let d = common::max_abs_diff(&want, &got);
        eprintln!(
            "{:?} f16-kv={}: max |gpu - cpu| = {d:e} (scale {scale})",
            m.config().arch,
            ctx.f16
        );
        let tol = if ctx.f16 { 5e-3 } else { 1e-4 } * scale.max(1.0);
        assert!(d <= tol, "{d} > {tol}");
    }
}

#[test]
fn a_hybrid_position_is_bit_identical_alone_in_a_16_row_pass_and_in_prefill() {
    let m = hybrid();
    let toks = tokens(40, m.config().vocab_size, 4);
    for ctx in common::contexts() {
        let mut g = GpuModel::new(ctx.clone(), &m.weights, &opts(64)).unwrap();
        common::assert_batch_invariant(&mut g, &toks, 37);
    }
}

/// A rollback into the past keeps no state on the GPU: the next pass is a typed error
/// (a reset to the start works).
#[test]
fn rollbacks_the_gpu_cannot_do_are_typed_errors() {
    let Some(ctx) = common::contexts().into_iter().next() else {
        return;
    };
    let m = hybrid();
    let toks = tokens(8, m.config().vocab_size, 5);
    let mut g = GpuModel::new(ctx.clone(), &m.weights, &opts(64)).unwrap();
    let first = g.step(&toks).unwrap();
    g.truncate(5);
    match g.step(&toks[5..6]) {
        Err(GpuError::Core(dflash_core::Error::Internal(m))) => assert!(m.contains("rolled back")),
        other => panic!("a lost state was used: {:?}", other.map(|_| ())),
    }
    g.truncate(0);
    assert_eq!(g.step(&toks).unwrap(), first);
}

/// DFlash over the hybrid target on the GPU: each verify pass's DeltaNet states are
/// kept, and after acceptance put back and the accepted rows replayed, so speculative
/// output equals plain decoding token for token (random drafter, greedy and seeded).
#[test]
fn dflash_on_a_hybrid_target_equals_plain_decoding() {
    let m = hybrid();
    let moe = fixture("qwen3_5_moe");
    if let Some(ctx) = common::contexts().pop() {
        common::assert_dflash_lossless(&ctx, &moe, 1, &tokens(9, 127, 7));
    }
    if let Some(ctx) = common::contexts().into_iter().next() {
        common::assert_dflash_lossless(&ctx, &m, 1, &tokens(9, m.config().vocab_size - 1, 6));
    }
}

/// Generation on a GPU keeps a step in flight (pipelined), and the one past the end of
/// generation is dropped; a hybrid model's recurrent states include it, so the next turn
/// cannot reuse the cache and is prefilled whole: it equals the same turn on a cache
/// forgotten first, after plain decoding, after DFlash, and as a plain turn on the DFlash
/// pair's target (a request with DFlash off). Before, plain decoding's reuse ran into
/// the lost states' error, and the others reused a cache the states had run past.
#[test]
fn a_hybrid_turn_after_a_dropped_pipelined_step_equals_a_fresh_one() {
    use dflash_core::generate::GenerateRequest;
    use dflash_core::speculative::BlockSize;
    use dflash_gpu::speculative::Speculative;
    let Some(ctx) = common::gpu_tuned_context(true) else {
        return;
    };
    let m = hybrid();
    let w = common::random_drafter(&m, 1);
    let mut plain = GpuModel::new(ctx.clone(), &m.weights, &opts(96)).unwrap();
    let taps = GpuModelOptions {
        taps: w.config.target_layer_ids.clone(),
        ..opts(96)
    };
    let mut spec = Speculative::new(GpuModel::new(ctx, &m.weights, &taps).unwrap(), &w).unwrap();
    let req = |prompt: &[u32], n| GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_new_tokens: n,
        sampling: Default::default(),
        stop_strings: vec![],
        context: 96,
        interrupt: Default::default(),
        grammar: None,
    };
    let tok = &m.tokenizer;
    let on_plain = |g: &mut GpuModel, r: &GenerateRequest| {
        g.generate(tok, r, &|| 0.0, &mut |_| {}).unwrap().tokens
    };
    let on_dflash = |s: &mut Speculative, r: &GenerateRequest| {
        let x = s.generate(tok, r, &BlockSize::Fixed(4), &|| 0.0, &mut |_| {});
        x.unwrap().result.tokens
    };
    let first = tokens(9, m.config().vocab_size - 1, 11);
    // A stop string (a token's text after the second) ends generation with a step in
    // flight.
    let whole = on_plain(&mut plain, &req(&first, 24));
    let text = |i: usize| tok.decode(&whole[i..i + 1], false).unwrap();
    let at = (2..whole.len().min(9))
        .find(|&i| !text(i).trim().is_empty() && !text(i).contains('\u{FFFD}'));
    let stop = GenerateRequest {
        stop_strings: vec![text(at.expect("a token with text"))],
        ..req(&first, 24)
    };
    let reply = on_plain(&mut plain, &stop);
    let next: Vec<u32> = [&first[..], &reply, &first[..3]].concat();
    let got = on_plain(&mut plain, &req(&next, 8));
    plain.forget_cached();
    let want = on_plain(&mut plain, &req(&next, 8));
    assert_eq!(got, want, "plain decoding");
    assert_eq!(on_dflash(&mut spec, &stop), reply);
    assert_eq!(on_dflash(&mut spec, &req(&next, 8)), want, "DFlash");
    on_dflash(&mut spec, &stop);
    assert_eq!(
        on_plain(&mut spec.target, &req(&next, 8)),
        want,
        "plain after DFlash"
    );
    assert!(
        spec.steps_dropped >= 2,
        "{} DFlash steps dropped",
        spec.steps_dropped
    );
}

/// A GGUF hybrid (llama.cpp's layout: value heads tiled, so head h reads key head
/// h mod key_heads) on the GPU against the CPU reference of the same file.
#[test]
fn a_gguf_hybrid_with_tiled_value_heads_matches_the_cpu_reference() {
    use dflash_core::config::Arch;
    use dflash_core::formats::ggml::GgmlType;
    use dflash_core::testutil::{random_weights, tiny_config, write_gguf};
    let c = tiny_config(Arch::Qwen35);
    let m = dflash_core::model_files::load_gguf(&write_gguf(
        &c,
        &random_weights(&c, 14),
        GgmlType::Q8_0,
    ))
    .unwrap();
    assert!(m.config().hybrid.as_ref().unwrap().tiled_value_heads);
    logits_match(&m);
}
