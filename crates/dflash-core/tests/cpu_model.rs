//! The CPU engines' invariants (the f32 reference and the quantized engine): a
//! position's logits are bit-identical however many tokens share the pass; taps are the
//! residual stream after the chosen layers; KV rollback leaves no trace; the quantized
//! engine stays within its stated tolerance of the reference.

use dflash_core::config::Arch;
use dflash_core::cpu::{CpuKernels, CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf, Rng};
use dflash_core::weights::ModelWeights;

fn model(arch: Arch) -> ModelWeights {
    let c = tiny_config(arch);
    load_gguf(&write_gguf(&c, &random_weights(&c, 21), GgmlType::Q8_0))
        .unwrap()
        .weights
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut r = Rng(5);
    (0..n).map(|_| r.below(vocab) as u32).collect()
}

#[test]
fn logits_are_bit_identical_in_one_token_steps_chunks_and_one_pass() {
    for (arch, kernels) in [Arch::Llama, Arch::Qwen2, Arch::Qwen3]
        .into_iter()
        .flat_map(|a| [(a, CpuKernels::Reference), (a, CpuKernels::Quantized)])
    {
        let w = model(arch);
        let cpu = CpuModel::with_kernels(&w, kernels);
        let v = w.config.vocab_size;
        // 270 tokens: one-token steps past 256 cached keys split their heads across the
        // threads (cpu::model's PARALLEL_HEADS_FROM).
        let toks = tokens(270, v);
        let mut c1 = cpu.new_cache(288);
        let all = cpu
            .forward(&toks, &mut c1, LogitRows::All, &[])
            .unwrap()
            .logits;
        let mut c2 = cpu.new_cache(288);
        let mut steps = Vec::new();
        for t in &toks {
            steps.extend(
                cpu.forward(&[*t], &mut c2, LogitRows::All, &[])
                    .unwrap()
                    .logits,
            );
        }
        let mut c3 = cpu.new_cache(288);
        let mut chunks = Vec::new();
        for ch in toks.chunks(16) {
            chunks.extend(
                cpu.forward(ch, &mut c3, LogitRows::All, &[])
                    .unwrap()
                    .logits,
            );
        }
        assert!(
            all.iter()
                .zip(&steps)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{arch:?} {kernels:?}: one pass vs one-token steps"
        );
        assert!(
            all.iter()
                .zip(&chunks)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{arch:?} {kernels:?}: one pass vs 16-row chunks"
        );
        assert_eq!(all.len(), 270 * v);
    }
}

#[test]
fn taps_are_the_residual_stream_after_the_chosen_layers_the_last_one_normed() {
    let w = model(Arch::Qwen3);
    let c = &w.config;
    let cpu = CpuModel::new(&w);
    let toks = tokens(9, c.vocab_size);
    let last = c.num_layers - 1;
    let mut cache = cpu.new_cache(16);
    let out = cpu
        .forward(&toks, &mut cache, LogitRows::All, &[last, 0])
        .unwrap();
    let h = c.hidden_size;
    assert_eq!(out.taps.len(), toks.len() * 2 * h);
    // The tap of the last layer is after the final norm (as transformers'
    // `output_hidden_states` gives it to z-lab's drafter): the lm_head of it gives the
    // logits.
    let last_rows: Vec<f32> = (0..toks.len())
        .flat_map(|r| out.taps[r * 2 * h..r * 2 * h + h].to_vec())
        .collect();
    let via_tap = cpu.lm_head_rows(&last_rows, toks.len());
    assert!(via_tap
        .iter()
        .zip(&out.logits)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // The tap after layer 0 is the residual after layer 0 of the same model cut to two
    // layers (where it is not the last layer either).
    let mut one = w.clone();
    one.layers.truncate(2);
    one.config.num_layers = 2;
    let cpu1 = CpuModel::new(&one);
    let mut c1 = cpu1.new_cache(16);
    let l1 = cpu1.forward(&toks, &mut c1, LogitRows::All, &[0]).unwrap();
    for r in 0..toks.len() {
        assert_eq!(
            &out.taps[r * 2 * h + h..(r + 1) * 2 * h],
            &l1.taps[r * h..(r + 1) * h],
            "row {r}"
        );
    }
}

#[test]
fn kv_rollback_equals_never_having_seen_the_rejected_tokens() {
    let w = model(Arch::Llama);
    for kernels in [CpuKernels::Reference, CpuKernels::Quantized] {
        kv_rollback_with(&w, kernels);
    }
}

fn kv_rollback_with(w: &ModelWeights, kernels: CpuKernels) {
    let cpu = CpuModel::with_kernels(w, kernels);
    let toks = tokens(30, w.config.vocab_size);
    let (a, b, c) = (&toks[..12], &toks[12..20], &toks[20..]);
    let mut cache = cpu.new_cache(64);
    cpu.forward(a, &mut cache, LogitRows::None, &[]).unwrap();
    cpu.forward(b, &mut cache, LogitRows::None, &[]).unwrap();
    cache.truncate(a.len());
    let after = cpu
        .forward(c, &mut cache, LogitRows::All, &[])
        .unwrap()
        .logits;
    let mut fresh = cpu.new_cache(64);
    cpu.forward(a, &mut fresh, LogitRows::None, &[]).unwrap();
    let want = cpu
        .forward(c, &mut fresh, LogitRows::All, &[])
        .unwrap()
        .logits;
    assert_eq!(after, want);
}

#[test]
fn a_full_cache_is_an_error() {
    let w = model(Arch::Llama);
    let cpu = CpuModel::new(&w);
    let mut cache = cpu.new_cache(8);
    let e = cpu
        .forward(&tokens(9, 100), &mut cache, LogitRows::Last, &[])
        .unwrap_err();
    assert!(matches!(e, dflash_core::Error::ContextOverflow { .. }));
    let e = cpu
        .forward(&tokens(2, 100), &mut cache, LogitRows::Last, &[99])
        .unwrap_err();
    assert!(matches!(e, dflash_core::Error::BadConfig(_)));
}

/// The quantized engine's logits against the reference's: activations rounded to 8 bits
/// per group of 32 move each logit by a few hundredths of the logits' spread on these
/// random models (under 0.6%); the bound is 2% of the spread, and the top token agrees wherever the
/// reference's top-2 margin exceeds that.
#[test]
fn the_quantized_engine_stays_near_the_reference() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let w = model(arch);
        let v = w.config.vocab_size;
        let toks = tokens(24, v);
        let logits = |kernels| {
            let cpu = CpuModel::with_kernels(&w, kernels);
            let mut cache = cpu.new_cache(32);
            cpu.forward(&toks, &mut cache, LogitRows::All, &[])
                .unwrap()
                .logits
        };
        let (want, got) = (logits(CpuKernels::Reference), logits(CpuKernels::Quantized));
        let mut worst = 0f32;
        for (r, (a, b)) in want.chunks(v).zip(got.chunks(v)).enumerate() {
            let hi = a.iter().cloned().fold(f32::MIN, f32::max);
            let lo = a.iter().cloned().fold(f32::MAX, f32::min);
            let bound = 0.02 * (hi - lo);
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            worst = worst.max(diff / (hi - lo));
            assert!(diff <= bound, "{arch:?} row {r}: {diff} > {bound}");
            let top = dflash_core::cpu::ops::argmax(a);
            let mut sorted = a.to_vec();
            sorted.sort_by(|x, y| y.total_cmp(x));
            if sorted[0] - sorted[1] > 2.0 * bound {
                assert_eq!(dflash_core::cpu::ops::argmax(b), top, "{arch:?} row {r}");
            }
        }
        eprintln!(
            "{arch:?}: largest logit difference {:.4} of the spread",
            worst
        );
    }
}
