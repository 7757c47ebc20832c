//! The GPU engine on z-lab's reference fixtures (`fixtures/zlab/`, see
//! `crates/dflash-core/tests/zlab.rs`, where the CPU reference is checked against the
//! reference's own arrays): on every case (sliding layers, the scale fields on plain
//! DFlash, a tap of the target's last layer, DFlash2) the GPU drafter's block rows equal
//! the CPU reference's within 1e-3 (f32 cache; 1e-2 with f16) and its drafts are the
//! argmax of its own rows; the speculative loop gives the reference's `dflash_generate`
//! tokens up to the target's first near-tie, token for token the GPU's plain decoding.

mod common;

use common::contexts;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterPrecision};
use dflash_core::generate::GenerateRequest;
use dflash_core::model_files::load_path;
use dflash_core::speculative::BlockSize;
use dflash_core::testutil::zlab::{cases, ids, json};
use dflash_gpu::model::OutputHead;
use dflash_gpu::speculative::Speculative;
use dflash_gpu::{GpuModel, GpuModelOptions};

/// A top-2 logit margin of the reference's target under this may fall either way.
const NEAR_TIE: f64 = 0.2;

#[test]
fn the_gpu_drafter_and_loop_agree_with_the_cpu_reference_and_z_lab() {
    for ctx in contexts() {
        for dir in cases() {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let r = json(&dir.join("reference.json"));
            let t = load_path(&dir.join(r["target"].as_str().unwrap())).unwrap();
            let w = load_drafter_dir(
                &dir.join(r["drafter"].as_str().unwrap()),
                DrafterPrecision::Q8,
            )
            .unwrap();
            let taps = w.config.target_layer_ids.clone();
            let opts = GpuModelOptions {
                context: 128,
                taps,
                ..Default::default()
            };
            let target = GpuModel::new(ctx.clone(), &t.weights, &opts).unwrap();
            let mut plain = target.sharing_weights(&opts).unwrap();
            let mut spec = Speculative::new(target, &w).unwrap();
            // One block after the fixture's block prompt, against the CPU reference.
            let p = ids(&r["prompts"][r["block"]["prompt_index"].as_u64().unwrap() as usize]);
            let b = w.config.block_size.min(8);
            let anchor = spec.prefill(&p, OutputHead::Argmax).unwrap();
            spec.step(b, OutputHead::Argmax).unwrap();
            let got = spec.read_draft_hidden(b).unwrap();
            let (cpu_t, cpu_d) = (CpuModel::new(&t.weights), CpuDrafter::new(&w));
            let mut cache = cpu_t.new_cache(p.len());
            let out = cpu_t
                .forward(&p, &mut cache, LogitRows::Last, &w.config.target_layer_ids)
                .unwrap();
            assert_eq!(cpu_t.argmax_last(&out.logits), anchor, "{name}");
            let mut dctx = cpu_d.new_context();
            cpu_d.extend_context(&mut dctx, &out.taps);
            let mut block = vec![anchor];
            block.extend(std::iter::repeat_n(w.config.mask_token_id, b - 1));
            let want = cpu_d.forward_block(&mut dctx, &cpu_t.embed(&block).unwrap());
            let max = common::max_abs_diff(&got, &want);
            eprintln!(
                "{name} (f16={}): drafter GPU vs CPU max error {max:e}",
                ctx.f16
            );
            assert!(max < if ctx.f16 { 1e-2 } else { 1e-3 }, "{name}: {max}");
            if w.config.dflash2.is_none() {
                // Plain DFlash drafts: the argmax of the lm_head over the GPU's own rows.
                let h = w.config.hidden_size;
                let v = w.config.vocab_size;
                let logits = cpu_t.lm_head_rows(&got[h..], b - 1);
                let drafts: Vec<u32> = logits
                    .chunks(v)
                    .map(|row| dflash_core::cpu::ops::argmax(row) as u32)
                    .collect();
                assert_eq!(spec.read_drafts(b).unwrap(), drafts, "{name}");
            }
            // The loop: the reference's tokens up to its first near-tie, lossless.
            for g in r["generate"].as_array().unwrap() {
                let Some(margins) = g["target_greedy_margin"].as_array() else {
                    continue;
                };
                let prompt = ids(&r["prompts"][g["prompt_index"].as_u64().unwrap() as usize]);
                let want = ids(&g["output"]);
                let req = GenerateRequest {
                    prompt_ids: prompt,
                    max_new_tokens: want.len(),
                    sampling: Default::default(),
                    stop_strings: vec![],
                    context: 128,
                    interrupt: Default::default(),
                    grammar: None,
                };
                let block = BlockSize::Fixed(g["block_size"].as_u64().unwrap() as usize);
                let s = spec
                    .generate(&t.tokenizer, &req, &block, &|| 0.0, &mut |_| {})
                    .unwrap();
                let pl = plain
                    .generate(&t.tokenizer, &req, &|| 0.0, &mut |_| {})
                    .unwrap();
                assert_eq!(s.result.tokens, pl.tokens, "{name}: lossless");
                let sure = margins
                    .iter()
                    .position(|m| m.as_f64().unwrap() < NEAR_TIE)
                    .unwrap_or(margins.len());
                let n = sure.min(pl.tokens.len()).min(want.len());
                assert_eq!(pl.tokens[..n], want[..n], "{name}: the reference's tokens");
            }
        }
    }
}
