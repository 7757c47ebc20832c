//! Mixture-of-experts targets (qwen3_moe): the CPU reference against transformers'
//! own logits (fixtures/arch/, scripts/make_arch_fixtures.py), the GGUF and Hugging
//! Face layouts of the experts, and the typed error each bad input gets.

use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::{load_gguf, load_hf, load_path_full_precision, HfFiles};
use dflash_core::testutil::{random_weights, tiny_config, write_gguf, write_hf};
use dflash_core::Error;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

fn fixture() -> (std::path::PathBuf, serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/arch/qwen3_moe");
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
/// range (the sums run in another order; the fixture's router scores are at least
/// `router_margin` apart, so both pick the same experts).
#[test]
fn cpu_reference_equals_transformers_qwen3_moe() {
    let (model, r) = fixture();
    let m = load_path_full_precision(&model).unwrap();
    let moe = m.config().moe.as_ref().expect("a mixture");
    assert_eq!((moe.num_experts, moe.experts_per_token), (8, 3));
    assert_eq!(moe.sparse_layers, [true, false, true]);
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
        "max |diff| {diff} (range {range})"
    );
}

/// Greedy decoding one token at a time through the KV cache gives transformers'
/// greedy continuation (recomputed from scratch at every step there).
#[test]
fn greedy_decoding_equals_transformers_qwen3_moe() {
    let (model, r) = fixture();
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
    assert_eq!(got, want);
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
