//! The architectures added after the z-lab fixtures: mixture-of-experts (qwen3_moe) and
//! hybrid Gated DeltaNet (qwen3_5) targets. The CPU reference against transformers' own
//! logits and greedy output (fixtures/arch/, scripts/make_arch_fixtures.py), the GGUF
//! and Hugging Face layouts of the experts, a recurrent state's rollback, and the typed
//! error each bad input gets.

use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::{load_gguf, load_hf, load_path_full_precision, HfFiles};
use dflash_core::testutil::{random_weights, tiny_config, write_gguf, write_hf};
use dflash_core::Error;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

fn fixture(case: &str) -> (std::path::PathBuf, serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/arch")
        .join(case);
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    (dir.join("model"), serde_json::from_str(&text).unwrap())
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// transformers' float32 logits at every position of a 24-token sequence, from the
/// model's own checkpoint loaded at full precision: equal within 1e-4 of the logits'
/// range (the sums run in another order).
fn logits_equal_transformers(case: &str) -> dflash_core::model_files::LoadedModel {
    let (model, r) = fixture(case);
    let m = load_path_full_precision(&model).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let seq = ids(&r["ids"]);
    let mut cache = cpu.new_cache(64);
    let got = cpu
        .forward(&seq, &mut cache, LogitRows::All, &[])
        .unwrap()
        .logits;
    let want: Vec<f32> = r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect();
    assert_eq!(got.len(), want.len());
    let range = want.iter().fold(0f32, |a, x| a.max(x.abs()));
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        diff < 1e-4 * range.max(1.0),
        "{case}: max |diff| {diff} (range {range})"
    );
    m
}

/// Greedy decoding one token at a time through the cache gives transformers' greedy
/// continuation (recomputed from scratch at every step there).
fn greedy_equals_transformers(case: &str) {
    let (model, r) = fixture(case);
    let cpu = CpuModel::new(&load_path_full_precision(&model).unwrap().weights);
    let (prompt, want) = (ids(&r["prompt"]), ids(&r["greedy"]));
    let mut cache = cpu.new_cache(64);
    let out = cpu
        .forward(&prompt, &mut cache, LogitRows::Last, &[])
        .unwrap();
    let mut got = vec![cpu.argmax_last(&out.logits)];
    while got.len() < want.len() {
        let out = cpu
            .forward(&got[got.len() - 1..], &mut cache, LogitRows::Last, &[])
            .unwrap();
        got.push(cpu.argmax_last(&out.logits));
    }
    assert_eq!(got, want, "{case}");
}

/// The fixture's router scores are at least `router_margin` apart, so both engines pick
/// the same experts.
#[test]
fn cpu_reference_equals_transformers_qwen3_moe() {
    let m = logits_equal_transformers("qwen3_moe");
    let moe = m.config().moe.as_ref().expect("a mixture");
    assert_eq!((moe.num_experts, moe.experts_per_token), (8, 3));
    assert_eq!(moe.sparse_layers, [true, false, true]);
    greedy_equals_transformers("qwen3_moe");
}

/// Gated DeltaNet layers 0, 1, 3 (the recurrence token by token, against transformers'
/// chunked prefill and its recurrent decode), gated attention with partial RoPE at 2.
#[test]
fn cpu_reference_equals_transformers_qwen3_5() {
    let m = logits_equal_transformers("qwen3_5");
    let h = m.config().hybrid.as_ref().expect("linear layers");
    assert_eq!(h.linear_layers, [true, true, false, true]);
    assert_eq!(m.config().rope.dim, 8);
    greedy_equals_transformers("qwen3_5");
}

/// Qwen3.5-MoE: the hybrid layers with a mixture in every layer and a shared expert
/// weighed by sigmoid of its gate (no intermediate_size in its config).
#[test]
fn cpu_reference_equals_transformers_qwen3_5_moe() {
    let m = logits_equal_transformers("qwen3_5_moe");
    let moe = m.config().moe.as_ref().expect("a mixture");
    assert_eq!(moe.shared_expert_intermediate_size, Some(32));
    assert!(moe.norm_topk_prob && moe.sparse_layers.iter().all(|&s| s));
    assert_eq!(
        m.config().hybrid.as_ref().unwrap().linear_layers,
        [true, false, true]
    );
    greedy_equals_transformers("qwen3_5_moe");
}

/// A hybrid model's cache rolls back into its last pass (the speculative verify's
/// rejection): the states after the kept rows are restored, and decoding on gives the
/// logits of a run that never took the rejected rows; a rollback further back is a
/// typed error, not wrong logits; a reset to the start is always possible.
#[test]
fn a_recurrent_state_rolls_back_within_its_last_pass() {
    let (model, r) = fixture("qwen3_5");
    let cpu = CpuModel::new(&load_path_full_precision(&model).unwrap().weights);
    let seq = ids(&r["ids"]);
    let logits = |cache: &mut dflash_core::cpu::KvCache, t: &[u32]| {
        cpu.forward(t, cache, LogitRows::All, &[]).unwrap().logits
    };
    let mut straight = cpu.new_cache(64);
    logits(&mut straight, &seq[..10]);
    let want = logits(&mut straight, &seq[10..14]);
    let mut verify = cpu.new_cache(64);
    logits(&mut verify, &seq[..6]);
    // A 7-row "verify pass" of which 4 rows are kept.
    logits(&mut verify, &[seq[6], seq[7], seq[8], seq[9], 1, 2, 3]);
    verify.truncate(10);
    let got = logits(&mut verify, &seq[10..14]);
    let d = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d < 1e-5, "after the rollback: {d}");
    // Further back than the last pass began: the next pass refuses.
    verify.truncate(5);
    match cpu.forward(&seq[5..6], &mut verify, LogitRows::All, &[]) {
        Err(Error::Internal(m)) => assert!(m.contains("rolled back"), "{m}"),
        other => panic!("a lost state was used: {:?}", other.map(|_| ())),
    }
    verify.truncate(0);
    logits(&mut verify, &seq[..10]);
    let again = logits(&mut verify, &seq[10..14]);
    let d = again
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d < 1e-5, "after a reset: {d}");
}

fn hf(
    files: &BTreeMap<String, Vec<u8>>,
) -> dflash_core::Result<dflash_core::model_files::LoadedModel> {
    let refs: HfFiles = files.iter().map(|(k, v)| (k.clone(), &v[..])).collect();
    load_hf(&refs)
}

/// GGUF keeps a layer's experts in one 3-D tensor per projection, Hugging Face one
/// tensor per expert: both load into the same stacked matrices, bit for bit, and the
/// config read from either is the one written.
#[test]
fn gguf_and_hf_experts_load_into_the_same_stacks() {
    let c = tiny_config(Arch::Qwen3Moe);
    let w = random_weights(&c, 11);
    let g = load_gguf(&write_gguf(&c, &w, GgmlType::F32)).unwrap();
    let h = hf(&write_hf(&c, &w, Dtype::F32, 2)).unwrap();
    assert_eq!(g.config().moe, c.moe);
    assert_eq!(h.config().moe, c.moe);
    for (i, (a, b)) in g.weights.layers.iter().zip(&h.weights.layers).enumerate() {
        assert_eq!(
            a.ffn.dense().is_none(),
            c.moe.as_ref().unwrap().is_sparse(i)
        );
        for (x, y) in a.ffn.matrices().into_iter().zip(b.ffn.matrices()) {
            assert_eq!((x.rows, x.cols), (y.rows, y.cols), "layer {i}");
            assert_eq!(
                (&x.qs, &x.scales, &x.mins),
                (&y.qs, &y.scales, &y.mins),
                "layer {i}"
            );
        }
    }
}

fn with_config(files: &mut BTreeMap<String, Vec<u8>>, edit: impl Fn(&mut serde_json::Value)) {
    let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    edit(&mut cfg);
    files.insert("config.json".into(), cfg.to_string().into_bytes());
}

/// A top-k over the expert count, a dense layer that does not exist and a checkpoint
/// without one expert: each a typed error naming the field or the tensor.
#[test]
fn bad_mixture_configs_and_checkpoints_are_typed_errors() {
    let c = tiny_config(Arch::Qwen3Moe);
    let w = random_weights(&c, 12);
    let files = write_hf(&c, &w, Dtype::F32, 1);

    let mut f = files.clone();
    with_config(&mut f, |v| v["num_experts_per_tok"] = 9.into());
    match hf(&f) {
        Err(Error::BadConfig(m)) => assert!(m.contains("num_experts_per_tok 9"), "{m}"),
        other => panic!("top-k 9 of 8 experts: {:?}", other.map(|_| ())),
    }

    let mut f = files.clone();
    with_config(&mut f, |v| v["mlp_only_layers"] = serde_json::json!([3]));
    match hf(&f) {
        Err(Error::BadConfig(m)) => assert!(m.contains("mlp_only_layers"), "{m}"),
        other => panic!("a dense layer 3 of 3: {:?}", other.map(|_| ())),
    }

    let mut w5 = w.clone();
    let (shape, vals) = w5.remove("blk.2.ffn_up_exps.weight").unwrap();
    let per = shape[1] * shape[2];
    // Hugging Face: every expert but 5 (the writer splits the stack per expert).
    let missing = "model.layers.2.mlp.experts.5.up_proj.weight";
    let mut f = write_hf(&c, &w5, Dtype::F32, 1);
    let st = safetensors::SafeTensors::deserialize(&f["model.safetensors"]).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    for e in (0..8).filter(|&e| e != 5) {
        let bytes = vals[e * per..(e + 1) * per]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let name = format!("model.layers.2.mlp.experts.{e}.up_proj.weight");
        tensors.push((name, Dtype::F32, shape[1..].to_vec(), bytes));
    }
    f.insert(
        "model.safetensors".into(),
        dflash_core::formats::hf::write_safetensors(&tensors),
    );
    match hf(&f) {
        Err(Error::MissingTensor(t)) => assert_eq!(t, missing),
        other => panic!("a checkpoint without expert 5: {:?}", other.map(|_| ())),
    }

    // GGUF: the stack of a layer's up projections absent.
    match load_gguf(&write_gguf(&c, &w5, GgmlType::F32)) {
        Err(Error::MissingTensor(t)) => assert_eq!(t, "blk.2.ffn_up_exps.weight"),
        other => panic!("a GGUF without blk.2.ffn_up_exps: {:?}", other.map(|_| ())),
    }
}

/// A layer-type list that does not match the layer count, and a layer type the engine
/// does not know: BadConfig naming the field.
#[test]
fn bad_hybrid_configs_are_typed_errors() {
    let (model, _) = fixture("qwen3_5");
    let text = std::fs::read_to_string(model.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["layer_types"] = serde_json::json!(["linear_attention", "full_attention"]);
    match dflash_core::config::ModelConfig::from_hf_json(&v.to_string()) {
        Err(Error::BadConfig(m)) => assert!(m.contains("layer_types has 2 entries"), "{m}"),
        other => panic!("2 layer types for 4 layers: {other:?}"),
    }
    v["layer_types"] = serde_json::json!(["linear_attention", "mamba", "full_attention", "x"]);
    match dflash_core::config::ModelConfig::from_hf_json(&v.to_string()) {
        Err(Error::BadConfig(m)) => assert!(m.contains("\"mamba\""), "{m}"),
        other => panic!("an unknown layer type: {other:?}"),
    }
}

/// DFlash on the CPU reference over the hybrid target (its verify passes roll the
/// recurrent states back to the accepted rows): a random z-lab drafter's output equals
/// plain decoding token for token at every block size, greedy and seeded T = 0.8.
#[test]
fn dflash_on_a_hybrid_target_equals_plain_decoding() {
    use dflash_core::drafter::{CpuDrafter, DrafterPrecision, DrafterWeights};
    use dflash_core::generate::{generate_cpu, GenerateRequest};
    use dflash_core::sampling::SamplingParams;
    use dflash_core::speculative::{generate_speculative_cpu, BlockSize};
    use dflash_core::testutil::{write_drafter, DrafterSpec};
    let (model, r) = fixture("qwen3_5");
    let t = load_path_full_precision(&model).unwrap();
    let spec = DrafterSpec {
        layers: 1,
        block_size: 16,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: t.config().vocab_size as u32 - 1,
        seed: 3,
    };
    let f = write_drafter(t.config(), &spec);
    let w = DrafterWeights::load(
        std::str::from_utf8(&f["config.json"]).unwrap(),
        vec![("model.safetensors", &f["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
    .unwrap();
    let (cpu, d) = (CpuModel::new(&t.weights), CpuDrafter::new(&w));
    let seeded = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: 5,
        ..Default::default()
    };
    for sp in [SamplingParams::default(), seeded] {
        let req = GenerateRequest {
            prompt_ids: ids(&r["prompt"]),
            max_new_tokens: 24,
            sampling: sp.clone(),
            stop_strings: vec![],
            context: 64,
            interrupt: Default::default(),
            grammar: None,
        };
        let plain = generate_cpu(&cpu, &t.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap();
        let blocks = [1, 2, 4, 16].map(BlockSize::Fixed);
        for b in blocks.into_iter().chain([BlockSize::auto_linear(16, 0.02)]) {
            let s =
                generate_speculative_cpu(&cpu, &d, &t.tokenizer, &req, &b, &|| 0.0, &mut |_| {})
                    .unwrap();
            assert_eq!(s.result.tokens, plain.tokens, "{b:?} T={}", sp.temperature);
        }
    }
}

/// A Qwen3.5 model as llama.cpp's converter writes it (norms as 1 + w, A as -exp(A_log),
/// the value heads in tiled order; testutil::write_gguf does what the converter does)
/// and as transformers saves it: the same config but the value heads' order, the same
/// logits up to summation order (value heads of 32 dims: a head's out_proj columns are
/// one quantization group, so the reordered columns repack to the same values), and the
/// whole-file and streamed GGUF loads the same bits.
#[test]
fn gguf_and_hf_copies_of_a_hybrid_model_agree() {
    let max_diff = |a: &[f32], b: &[f32]| {
        let range = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        d / range.max(1.0)
    };
    let logits = |m: &dflash_core::model_files::LoadedModel| {
        let cpu = CpuModel::new(&m.weights);
        let mut cache = cpu.new_cache(32);
        let t = [104, 101, 108, 108, 111, 32, 119, 9];
        cpu.forward(&t, &mut cache, LogitRows::All, &[])
            .unwrap()
            .logits
    };
    for arch in [Arch::Qwen35, Arch::Qwen35Moe] {
        let mut c = tiny_config(arch);
        c.hybrid.as_mut().unwrap().value_head_dim = 32;
        let w = random_weights(&c, 13);
        let file = write_gguf(&c, &w, GgmlType::F32);
        let g = load_gguf(&file).unwrap();
        let h = hf(&write_hf(&c, &w, Dtype::F32, 1)).unwrap();
        let (gh, hh) = (
            g.config().hybrid.clone().unwrap(),
            h.config().hybrid.clone().unwrap(),
        );
        assert!(gh.tiled_value_heads && !hh.tiled_value_heads, "{arch:?}");
        let untiled = dflash_core::config::HybridConfig {
            tiled_value_heads: false,
            ..gh
        };
        assert_eq!(untiled, hh, "{arch:?}");
        let d = max_diff(&logits(&h), &logits(&g));
        assert!(
            d < 2e-2,
            "{arch:?}: GGUF vs HF logits differ by {d} of the range"
        );
        let path =
            std::env::temp_dir().join(format!("dflash-{arch:?}-{}.gguf", std::process::id()));
        std::fs::write(&path, &file).unwrap();
        let streamed = dflash_core::model_files::load_path(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(logits(&streamed), logits(&g), "{arch:?}: streamed");
    }
}

/// A multimodal checkpoint as transformers saves Qwen3_5ForConditionalGeneration: the
/// text model's config under `text_config`, its tensors under `model.language_model.`,
/// a vision tower beside them: the text model loads as the text-only checkpoint does
/// (the same config and logits), the vision tower unread.
#[test]
fn a_multimodal_hybrid_checkpoint_loads_its_text_model() {
    let (model, _) = fixture("qwen3_5");
    let read = |f: &str| std::fs::read(model.join(f)).unwrap();
    let text_cfg: serde_json::Value = serde_json::from_slice(&read("config.json")).unwrap();
    let st_bytes = read("model.safetensors");
    let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let n = n.replacen("model.", "model.language_model.", 1);
            (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())
        })
        .collect();
    tensors.push((
        "model.visual.patch_embed.proj.weight".into(),
        Dtype::F32,
        vec![2, 3],
        vec![0; 24],
    ));
    let config = serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_cfg,
        "vision_config": {"depth": 1},
        "tie_word_embeddings": false,
    });
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    files.insert("config.json".into(), config.to_string().into_bytes());
    files.insert("tokenizer.json".into(), read("tokenizer.json"));
    let st = dflash_core::formats::hf::write_safetensors(&tensors);
    files.insert("model.safetensors".into(), st);
    let multi = hf(&files).unwrap();
    assert!(multi.notes[0].contains("vision tower"), "{:?}", multi.notes);
    let text = dflash_core::model_files::load_path(&model).unwrap();
    assert!(text.notes.is_empty());
    assert_eq!(multi.config(), text.config());
    let logits = |m: &dflash_core::model_files::LoadedModel| {
        let cpu = CpuModel::new(&m.weights);
        let mut cache = cpu.new_cache(16);
        cpu.forward(&[1, 2, 3, 4], &mut cache, LogitRows::All, &[])
            .unwrap()
            .logits
    };
    assert_eq!(logits(&multi), logits(&text));
}
