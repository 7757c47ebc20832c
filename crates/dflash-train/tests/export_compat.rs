//! The exported drafter folder against what the servers beyond this engine read: every
//! config key and tensor name of z-lab's reference, vLLM, SGLang and llama.cpp's
//! converter, taken from their sources at the commits below (read, not run), is in the
//! folder a tiny run exports and `serving-files` completes, with the value that loader
//! expects; the draft vocabulary's `d2t` form lies outside model.safetensors and maps back
//! to the same ids; our loader reads it.

use dflash_core::drafter::{
    load_drafter_dir, DraftVocab, DrafterPrecision, D2T_FILE, DRAFT_VOCAB_FILE,
};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_drafter_target, write_gguf};
use dflash_core::Error;
use dflash_train::data::Sample;
use dflash_train::target::Target;
use dflash_train::train::{train, Init, TrainConfig};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// A loader: where it was read, the config.json keys it reads (a `.` path into the
/// object), and the tensors it reads from the folder's `model*.safetensors`.
struct Loader {
    name: &'static str,
    source: &'static str,
    keys: &'static [&'static str],
    /// Per-layer tensors are listed once with `{i}`.
    tensors: &'static [&'static str],
}

/// The per-layer tensors every loader maps (z-lab's `Qwen3DFlashDecoderLayer` names).
const LAYER: &[&str] = &[
    "layers.{i}.input_layernorm.weight",
    "layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.self_attn.k_norm.weight",
    "layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.mlp.up_proj.weight",
    "layers.{i}.mlp.down_proj.weight",
];

const LOADERS: &[Loader] = &[
    Loader {
        name: "z-lab reference",
        source: "z-lab/dflash dflash/model.py @44947fb",
        keys: &[
            "dflash_config.target_layer_ids",
            "dflash_config.mask_token_id",
            "block_size",
            "num_target_layers",
            "layer_types",
        ],
        tensors: &["fc.weight", "hidden_norm.weight", "norm.weight"],
    },
    Loader {
        name: "vLLM",
        source: "vllm-project/vllm qwen3_dflash.py @036a00d1f5d00d449d02dce9babdd15a5b4d06c9, \
                 config/speculative.py @002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443, \
                 v1/spec_decode/llm_base_proposer.py @00c4f22dae4795e34658bead82fa071e6bb7ae39",
        // `n_predict` is num_speculative_tokens' default (without either, it raises);
        // the method is auto-detected only from "dflash" in the path.
        keys: &[
            "architectures",
            "dflash_config.mask_token_id",
            "dflash_config.target_layer_ids",
            "n_predict",
            "hidden_size",
            "num_hidden_layers",
            "layer_types",
        ],
        tensors: &["fc.weight", "hidden_norm.weight", "norm.weight"],
    },
    Loader {
        name: "SGLang",
        source:
            "sgl-project/sglang srt/models/dflash.py @003b23d7388eabdfbfecd2610c7e228f9f6a2734, \
                 srt/speculative/dflash_utils.py @00731f0bc9fa81c39802754fb4b62e9cce967582; \
                 older builds (dflash_worker.py @7f151c5ebdb3af4467c2a5d3ccc5f54e71d2ba35) \
                 resolve the mask by `mask_token` only",
        keys: &[
            "num_hidden_layers",
            "num_target_layers",
            "block_size",
            "dflash_config.target_layer_ids",
            "dflash_config.mask_token_id",
            "dflash_config.mask_token",
            "layer_types",
        ],
        tensors: &["fc.weight", "hidden_norm.weight", "norm.weight"],
    },
    Loader {
        name: "llama.cpp converter",
        source: "ggml-org/llama.cpp conversion/qwen.py (DFlashModel) \
                 @03173d5e78f8ccd7ccbb385f1f7b4a21266377dc; needs --target-model-dir",
        keys: &[
            "block_size",
            "dflash_config.target_layer_ids",
            "dflash_config.mask_token_id",
        ],
        tensors: &["fc.weight", "hidden_norm.weight", "norm.weight"],
    },
];

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "dflash-export-compat-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn key<'a>(cfg: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(cfg, |v, k| v.get(k))
        .filter(|v| !v.is_null())
}

#[test]
fn the_exported_folder_carries_what_vllm_sglang_and_llama_cpp_read() {
    let c = tiny_drafter_target();
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 5), GgmlType::Q8_0)).unwrap();
    let target = Target::new(&m.weights, &candle_core::Device::Cpu).unwrap();
    let dir = tmp("folder");
    // Two steps on two made-up samples: the export's names and shapes, not its quality.
    let samples: Vec<Sample> = (0..2u32)
        .map(|s| Sample {
            id: format!("s{s}"),
            source: "test".into(),
            prompt_ids: (1..20).map(|i| (i * 7 + s) % 200).collect(),
            response_ids: (1..40).map(|i| (i * 13 + s) % 200).collect(),
        })
        .collect();
    let tc = TrainConfig {
        layers: 2,
        block_size: 8,
        gamma: 4.0,
        lr: 1e-3,
        warmup_frac: 0.0,
        weight_decay: 0.0,
        steps: 2,
        seqs_per_step: 2,
        anchors_per_seq: 2,
        max_seq_len: 64,
        checkpoint_every: 2,
        mask_token_id: c.vocab_size as u32 - 1,
        seed: 1,
        grad_clip: 1.0,
        dflash2: None,
        sampled_head: None,
        stop_at: None,
    };
    let run = dir.join("run");
    train(&target, &samples, &run, &tc, Init::Random, true).unwrap();
    let out = dir.join("exported-dflash");
    dflash_train::export::export(&run, &out).unwrap();
    let ids: Vec<u32> = vec![0, 3, 4, 17, 100, c.vocab_size as u32 - 2];
    let vocab = DraftVocab::new(ids.clone(), c.vocab_size).unwrap();
    std::fs::write(
        out.join(DRAFT_VOCAB_FILE),
        vocab.to_json(c.vocab_size, "test"),
    )
    .unwrap();
    assert_eq!(
        dflash_train::export::serving_files(&out, &m, true).unwrap(),
        ids.len()
    );

    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let model = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&model).unwrap();
    for l in LOADERS {
        for k in l.keys {
            assert!(
                key(&cfg, k).is_some(),
                "{} ({}) reads {k}: missing",
                l.name,
                l.source
            );
        }
        let layer_names = (0..tc.layers)
            .flat_map(|i| LAYER.iter().map(move |t| t.replace("{i}", &i.to_string())));
        for t in l.tensors.iter().map(|t| t.to_string()).chain(layer_names) {
            let v = st
                .tensor(&t)
                .unwrap_or_else(|_| panic!("{} reads {t}: missing", l.name));
            assert_eq!(v.dtype(), Dtype::BF16, "{t}");
        }
    }
    let h = c.hidden_size;
    assert_eq!(
        st.tensor("fc.weight").unwrap().shape(),
        [
            h,
            h * key(&cfg, "dflash_config.target_layer_ids")
                .unwrap()
                .as_array()
                .unwrap()
                .len()
        ]
    );
    let (_, meta) = SafeTensors::read_metadata(&model).unwrap();
    assert_eq!(
        meta.metadata()
            .as_ref()
            .and_then(|m| m.get("format"))
            .map(String::as_str),
        Some("pt")
    );
    // Values: the mask token's text is the mask id's (older SGLang resolves it through the
    // target's tokenizer, newer ones check the two agree); vLLM drafts block - 1 slots.
    let mask_id = key(&cfg, "dflash_config.mask_token_id")
        .unwrap()
        .as_u64()
        .unwrap() as u32;
    let mask = key(&cfg, "dflash_config.mask_token")
        .unwrap()
        .as_str()
        .unwrap();
    assert_eq!(
        m.tokenizer.token_to_id(mask),
        Some(mask_id),
        "mask_token {mask:?}"
    );
    assert_eq!(cfg["n_predict"], 7);
    assert_eq!(cfg["block_size"], 8);
    assert_eq!(cfg["architectures"][0], "DFlashDraftModel");
    // Nothing a loader without a draft vocabulary reads holds a reduced head: not
    // model.safetensors (transformers, llama.cpp's model*.safetensors, SGLang).
    for name in ["d2t", "t2d", "lm_head.weight", "embed_tokens.weight"] {
        assert!(st.tensor(name).is_err(), "model.safetensors holds {name}");
    }

    // The d2t form (vLLM: draft_vocab_size, `d2t` int64 with target = i + d2t[i], and the
    // drafter's own lm_head rows): the same ids, the target's head rows in bf16.
    assert_eq!(cfg["draft_vocab_size"], ids.len());
    let d2t_bytes = std::fs::read(out.join(D2T_FILE)).unwrap();
    let d = SafeTensors::deserialize(&d2t_bytes).unwrap();
    let d2t = d.tensor("d2t").unwrap();
    assert_eq!((d2t.dtype(), d2t.shape()), (Dtype::I64, &[ids.len()][..]));
    let offsets: Vec<i64> = d2t
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mapped: Vec<u32> = offsets
        .iter()
        .enumerate()
        .map(|(i, o)| (i as i64 + o) as u32)
        .collect();
    assert_eq!(mapped, ids);
    let head = d.tensor("lm_head.weight").unwrap();
    assert_eq!(
        (head.dtype(), head.shape()),
        (Dtype::BF16, &[ids.len(), h][..])
    );
    let mut row = vec![0f32; h];
    for (k, &id) in ids.iter().enumerate() {
        m.weights.lm_head().dequantize_row(id as usize, &mut row);
        let got: Vec<f32> = head.data()[k * h * 2..(k + 1) * h * 2]
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let want: Vec<f32> = row
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(got, want, "head row of id {id}");
    }

    // Our loader: either form alone gives the same list; two that disagree are refused.
    let both = load_drafter_dir(&out, DrafterPrecision::Q8).unwrap();
    assert_eq!(both.draft_vocab.as_ref().map(|v| v.ids()), Some(&ids[..]));
    std::fs::remove_file(out.join(DRAFT_VOCAB_FILE)).unwrap();
    let d2t_only = load_drafter_dir(&out, DrafterPrecision::Q8).unwrap();
    assert_eq!(d2t_only.draft_vocab, both.draft_vocab);
    let other = DraftVocab::new(vec![1, 2, 3], c.vocab_size).unwrap();
    std::fs::write(
        out.join(DRAFT_VOCAB_FILE),
        other.to_json(c.vocab_size, "other"),
    )
    .unwrap();
    match load_drafter_dir(&out, DrafterPrecision::Q8) {
        Err(Error::BadConfig(msg)) => assert!(msg.contains("list different ids"), "{msg}"),
        r => panic!(
            "disagreeing draft vocabularies: {:?}",
            r.map(|w| w.draft_vocab)
        ),
    }
    // A d2t whose length is not config.json's draft_vocab_size is refused by name.
    let mut bad = cfg.clone();
    bad["draft_vocab_size"] = 5.into();
    std::fs::write(out.join("config.json"), bad.to_string()).unwrap();
    std::fs::remove_file(out.join(DRAFT_VOCAB_FILE)).unwrap();
    match load_drafter_dir(&out, DrafterPrecision::Q8) {
        Err(Error::BadConfig(msg)) => assert!(
            msg.contains(D2T_FILE) && msg.contains("draft_vocab_size"),
            "{msg}"
        ),
        r => panic!(
            "d2t against draft_vocab_size: {:?}",
            r.map(|w| w.draft_vocab)
        ),
    }
    // Without --d2t the form is removed with its size (vLLM would otherwise build an
    // uninitialized head): a folder never names a draft vocabulary it lacks.
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
    assert_eq!(
        dflash_train::export::serving_files(&out, &m, false).unwrap(),
        0
    );
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("draft_vocab_size").is_none() && !out.join(D2T_FILE).exists());
    assert_eq!(
        load_drafter_dir(&out, DrafterPrecision::Q8)
            .unwrap()
            .draft_vocab,
        None
    );
    let _ = std::fs::remove_dir_all(&dir);
}
