//! Conformance with z-lab's reference implementation (`dflash==0.1.0`) on the fixtures of
//! `scripts/make_zlab_fixtures.py` (`fixtures/zlab/`): targets written by transformers
//! and drafters written by the reference's own classes load unchanged; the default tap
//! layers are the reference's `build_target_layer_ids`; and our speculative loop gives
//! the reference's `dflash_generate` tokens at T=0 up to the target's first near-tie (our
//! target keeps its weights in 8 bits, the reference's in f32, so a near-tie may fall the
//! other way) while staying equal to our plain decoding token for token.
//!
//! Known differences not yet fixed (issue 21), so not asserted here: sliding-window
//! layers (the reference is causal inside the block with a per-query window),
//! `input_embedding_scale` / `output_multiplier` / `final_logit_softcapping` on plain
//! DFlash drafters, and a tap of the target's last layer (the reference's is after the
//! final norm). They change drafts and acceptance, never the output (lossless).

use dflash_core::cpu::CpuModel;
use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterConfig, DrafterPrecision};
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::model_files::load_path;
use dflash_core::speculative::{generate_speculative_cpu, BlockSize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A top-2 logit margin of the reference's target under this may fall either way in
/// ours (8-bit weights).
const NEAR_TIE: f64 = 0.2;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/zlab")
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.json").exists())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no fixtures in fixtures/zlab");
    v
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn default_tap_layers_are_the_references() {
    let t = json(&root().join("layer_ids.json"));
    let mut checked = 0;
    for row in t["table"].as_array().unwrap() {
        let (n_target, n_draft) = (
            row["num_target_layers"].as_u64().unwrap() as usize,
            row["num_draft_layers"].as_u64().unwrap() as usize,
        );
        let want: Vec<i64> = row["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        // Ids outside the target (tiny targets) are refused by our validation anyway.
        if want.iter().any(|&i| i < 0 || i as usize >= n_target) {
            continue;
        }
        let ours = DrafterConfig::default_target_layer_ids(n_draft, n_target);
        let ours: Vec<i64> = ours.iter().map(|&i| i as i64).collect();
        assert_eq!(
            ours, want,
            "{n_target} target layers, {n_draft} draft layers"
        );
        checked += 1;
    }
    assert!(checked > 100, "{checked} pairs checked");
}

#[test]
fn reference_written_pairs_load_and_generate_the_reference_tokens() {
    for dir in cases() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let r = json(&dir.join("reference.json"));
        let target = load_path(&dir.join(r["target"].as_str().unwrap()))
            .unwrap_or_else(|e| panic!("{name}: target: {e}"));
        let dw = load_drafter_dir(
            &dir.join(r["drafter"].as_str().unwrap()),
            DrafterPrecision::Q8,
        )
        .unwrap_or_else(|e| panic!("{name}: drafter: {e}"));
        assert_eq!(
            dw.config.target_layer_ids,
            ids(&r["target_layer_ids"])
                .iter()
                .map(|&i| i as usize)
                .collect::<Vec<_>>(),
            "{name}"
        );
        let cpu = CpuModel::new(&target.weights);
        let d = CpuDrafter::new(&dw);
        let prompts = r["prompts"].as_array().unwrap();
        for g in r["generate"].as_array().unwrap() {
            let Some(margins) = g["target_greedy_margin"].as_array() else {
                continue;
            };
            let prompt = ids(&prompts[g["prompt_index"].as_u64().unwrap() as usize]);
            let want = ids(&g["output"]);
            let req = GenerateRequest {
                prompt_ids: prompt,
                max_new_tokens: want.len(),
                sampling: Default::default(),
                stop_strings: vec![],
                context: 256,
                interrupt: Default::default(),
            };
            let plain = generate_cpu(&cpu, &target.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap();
            let block = BlockSize::Fixed(g["block_size"].as_u64().unwrap() as usize);
            let spec = generate_speculative_cpu(
                &cpu,
                &d,
                &target.tokenizer,
                &req,
                &block,
                &|| 0.0,
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(spec.result.tokens, plain.tokens, "{name}: lossless");
            let sure = margins
                .iter()
                .position(|m| m.as_f64().unwrap() < NEAR_TIE)
                .unwrap_or(margins.len());
            let n = sure.min(plain.tokens.len()).min(want.len());
            assert_eq!(
                plain.tokens[..n],
                want[..n],
                "{name}: prompt {}: ours {:?}, the reference's {:?} (first near-tie at {sure})",
                g["prompt_index"],
                plain.tokens,
                want
            );
            eprintln!(
                "{name} prompt {} block {}: {n}/{} tokens equal (first near-tie at {sure}); taus ours {:?}, reference {}",
                g["prompt_index"], g["block_size"], want.len(), spec.taus, g["acceptance_lengths"]
            );
        }
    }
}
