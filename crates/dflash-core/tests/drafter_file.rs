//! The drafter's config.json schema: the committed drafter's file parses to its config
//! and is exactly what the writer writes, configs survive the file round trip, every
//! variant of the z-lab format reads the same, and every bad field is a typed error.

use dflash_core::config::{Rope, RopeScaling, RopeStyle};
use dflash_core::drafter::file::MAX_BLOCK_SIZE;
use dflash_core::drafter::{DFlash2Config, DrafterConfig, DrafterFile, LayerKind};
use dflash_core::Error;
use serde_json::{json, Value};

/// A named edit of a config.json.
type Edit<'a> = (&'a str, Box<dyn Fn(&mut Value)>);

fn committed_text() -> String {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../drafters/smollm2-135m-instruct-dflash-b16/config.json"
    );
    std::fs::read_to_string(p).unwrap()
}

fn committed() -> Value {
    serde_json::from_str(&committed_text()).unwrap()
}

fn parse(v: &Value) -> dflash_core::Result<DrafterConfig> {
    DrafterConfig::from_json(&v.to_string())
}

/// The SmolLM2 drafter's config, field by field.
fn smollm2_drafter() -> DrafterConfig {
    DrafterConfig {
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 3,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        // Written as 9.999999747378752e-6: the f32 1e-5 widened to f64.
        rms_norm_eps: 1e-5,
        rope: Rope::plain(100000.0, RopeStyle::Neox, 64),
        vocab_size: 49152,
        layer_kinds: vec![LayerKind::Full; 3],
        sliding_window: 0,
        is_causal: None,
        input_embedding_scale: 1.0,
        output_multiplier: 1.0,
        final_logit_softcapping: None,
        num_target_layers: 30,
        block_size: 16,
        mask_token_id: 16,
        target_layer_ids: vec![1, 14, 27],
        architecture: "DFlashDraftModel".into(),
        dflash2: None,
    }
}

fn dflash2() -> DFlash2Config {
    DFlash2Config {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 32,
        selector_top_k: 8,
    }
}

#[test]
fn the_committed_drafter_parses_and_is_what_the_writer_writes() {
    let text = committed_text();
    let c = DrafterConfig::from_json(&text).unwrap();
    assert_eq!(c, smollm2_drafter());
    let mut file = DrafterFile {
        max_position_embeddings: Some(8192),
        ..DrafterFile::from(&c)
    };
    // `dflash-train serving-files` adds the mask token's text from the target's tokenizer.
    file.dflash_config.as_mut().unwrap().mask_token = Some("<empty_output>".into());
    assert_eq!(file.to_json_pretty(), text.trim_end());
    assert_eq!(DrafterFile::from_json(&text).unwrap(), file);
}

#[test]
fn configs_survive_the_file_round_trip() {
    let sliding = DrafterConfig {
        layer_kinds: vec![LayerKind::Sliding, LayerKind::Full, LayerKind::Sliding],
        sliding_window: 2048,
        ..smollm2_drafter()
    };
    let llama3 = DrafterConfig {
        rope: Rope {
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
            ..Rope::plain(500000.0, RopeStyle::Neox, 64)
        },
        ..smollm2_drafter()
    };
    let d2 = DrafterConfig {
        architecture: "DFlash2DraftModel".into(),
        block_size: 8,
        dflash2: Some(dflash2()),
        ..smollm2_drafter()
    };
    let d2_capped = DrafterConfig {
        input_embedding_scale: 0.5,
        output_multiplier: 2.0,
        final_logit_softcapping: Some(30.0),
        ..d2.clone()
    };
    // The scale fields on a plain DFlash drafter, and is_causal.
    let scaled = DrafterConfig {
        input_embedding_scale: 1.5,
        output_multiplier: 0.75,
        final_logit_softcapping: Some(4.0),
        is_causal: Some(false),
        ..sliding.clone()
    };
    for c in [smollm2_drafter(), sliding, llama3, d2, d2_capped, scaled] {
        let text = DrafterFile::from(&c).to_json_pretty();
        assert_eq!(DrafterConfig::from_json(&text).unwrap(), c, "{text}");
    }
}

#[test]
fn every_variant_of_the_format_reads_the_same() {
    let want = smollm2_drafter();
    let variants: Vec<Edit> = vec![
        (
            "block_size in dflash_config",
            Box::new(|v| {
                let b = v.as_object_mut().unwrap().remove("block_size").unwrap();
                v["dflash_config"]["block_size"] = b;
            }),
        ),
        (
            "num_target_layers in dflash_config",
            Box::new(|v| {
                let n = v.as_object_mut().unwrap().remove("num_target_layers");
                v["dflash_config"]["num_target_layers"] = n.unwrap();
            }),
        ),
        (
            "taps and mask at the top level, no dflash_config",
            Box::new(|v| {
                let d = v.as_object_mut().unwrap().remove("dflash_config").unwrap();
                v["mask_token_id"] = d["mask_token_id"].clone();
                v["target_layer_ids"] = d["target_layer_ids"].clone();
            }),
        ),
        (
            "no architectures, a dflash_config",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("architectures");
            }),
        ),
        (
            "other architectures beside, non-strings ignored",
            Box::new(|v| v["architectures"] = json!([3, "Qwen3ForCausalLM", "DFlashDraftModel"])),
        ),
        (
            "layer_types, sliding_window and rope_scaling absent",
            Box::new(|v| {
                let o = v.as_object_mut().unwrap();
                for k in ["layer_types", "sliding_window", "rope_scaling"] {
                    o.remove(k);
                }
            }),
        ),
        (
            "transformers 5 rope_parameters",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("rope_theta");
                v["rope_parameters"] = json!({"rope_theta": 100000, "rope_type": "default"});
            }),
        ),
        (
            "default scaling in rope_scaling",
            Box::new(|v| v["rope_scaling"] = json!({"type": "default"})),
        ),
        (
            "unknown fields",
            Box::new(|v| {
                v["quantization_config"] = json!({"bits": 4});
                v["dflash_config"]["future_field"] = json!([1, 2]);
            }),
        ),
    ];
    for (what, edit) in variants {
        let mut v = committed();
        edit(&mut v);
        assert_eq!(parse(&v).unwrap(), want, "{what}");
    }
    // The default taps when none are given (3 draft layers over 30 target layers).
    let mut v = committed();
    v["dflash_config"]["target_layer_ids"] = Value::Null;
    assert_eq!(parse(&v).unwrap().target_layer_ids, vec![1, 14, 27]);
    // DFlash2's fields at the top level, and its defaults.
    let mut v = committed();
    v["architectures"] = json!(["DFlash2DraftModel"]);
    for (k, x) in [
        ("conv_kernel_size", 2),
        ("conv_group_size", 16),
        ("selector_rank", 32),
        ("selector_top_k", 8),
    ] {
        v[k] = x.into();
    }
    v["final_logit_softcapping"] = Value::Null;
    assert_eq!(parse(&v).unwrap().dflash2, Some(dflash2()));
    // A negative cap is no capping, as before.
    v["dflash_config"]["final_logit_softcapping"] = json!(-1.0);
    assert_eq!(parse(&v).unwrap().dflash2, Some(dflash2()));
}

#[test]
fn every_bad_field_is_a_typed_error() {
    let not_a_drafter: Vec<Edit> = vec![
        ("block_size 0", Box::new(|v| v["block_size"] = 0.into())),
        ("head_dim 0", Box::new(|v| v["head_dim"] = 0.into())),
        ("odd head_dim", Box::new(|v| v["head_dim"] = 63.into())),
        (
            "intermediate_size 0",
            Box::new(|v| v["intermediate_size"] = 0.into()),
        ),
        ("hidden_size 0", Box::new(|v| v["hidden_size"] = 0.into())),
        ("vocab_size 0", Box::new(|v| v["vocab_size"] = 0.into())),
        (
            "no heads",
            Box::new(|v| v["num_attention_heads"] = 0.into()),
        ),
        (
            "heads not shared by the KV heads",
            Box::new(|v| v["num_key_value_heads"] = 2.into()),
        ),
        (
            "zero KV heads",
            Box::new(|v| v["num_key_value_heads"] = 0.into()),
        ),
        (
            "layer_types for other layers",
            Box::new(|v| v["layer_types"] = json!(["full_attention"])),
        ),
        (
            "unknown layer type",
            Box::new(|v| v["layer_types"][1] = "linear_attention".into()),
        ),
        (
            "sliding layers without a window",
            Box::new(|v| v["layer_types"][1] = "sliding_attention".into()),
        ),
        (
            "no taps",
            Box::new(|v| v["dflash_config"]["target_layer_ids"] = json!([])),
        ),
        (
            "a tap that is no layer id",
            Box::new(|v| v["dflash_config"]["target_layer_ids"] = json!([1, -2])),
        ),
        (
            "no mask token",
            Box::new(|v| {
                v["dflash_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("mask_token_id");
            }),
        ),
        (
            "mask token past u32",
            Box::new(|v| v["dflash_config"]["mask_token_id"] = (1u64 << 33).into()),
        ),
        (
            "no block_size",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("block_size");
            }),
        ),
        (
            "no num_target_layers",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("num_target_layers");
            }),
        ),
        (
            "no hidden_size",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("hidden_size");
            }),
        ),
        (
            "a target's config",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("dflash_config");
                v["architectures"] = json!(["Qwen3ForCausalLM"]);
            }),
        ),
        (
            "string block_size",
            Box::new(|v| v["block_size"] = "16".into()),
        ),
    ];
    let dflash2_file = || {
        let mut v = committed();
        v["architectures"] = json!(["DFlash2DraftModel"]);
        v["block_size"] = 8.into();
        for (k, x) in [
            ("conv_kernel_size", 2),
            ("conv_group_size", 16),
            ("selector_rank", 32),
            ("selector_top_k", 8),
        ] {
            v["dflash_config"][k] = x.into();
        }
        v
    };
    assert_eq!(parse(&dflash2_file()).unwrap().dflash2, Some(dflash2()));
    let dflash2_bad: Vec<Edit> = vec![
        (
            "group not dividing hidden",
            Box::new(|v| v["dflash_config"]["conv_group_size"] = 7.into()),
        ),
        (
            "zero group",
            Box::new(|v| v["dflash_config"]["conv_group_size"] = 0.into()),
        ),
        (
            "kernel longer than the block",
            Box::new(|v| v["dflash_config"]["conv_kernel_size"] = 9.into()),
        ),
        (
            "zero kernel",
            Box::new(|v| v["dflash_config"]["conv_kernel_size"] = 0.into()),
        ),
        (
            "zero rank",
            Box::new(|v| v["dflash_config"]["selector_rank"] = 0.into()),
        ),
        (
            "rank 2^40",
            Box::new(|v| v["dflash_config"]["selector_rank"] = (1u64 << 40).into()),
        ),
        (
            "top-k past the vocabulary",
            Box::new(|v| v["dflash_config"]["selector_top_k"] = 49153.into()),
        ),
        (
            "no selector_top_k",
            Box::new(|v| {
                v["dflash_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("selector_top_k");
            }),
        ),
        (
            "multiplier not a number",
            Box::new(|v| v["dflash_config"]["output_multiplier"] = "x".into()),
        ),
        (
            "multiplier past f32",
            Box::new(|v| v["dflash_config"]["output_multiplier"] = 1e300.into()),
        ),
        (
            "scale past f32",
            Box::new(|v| v["dflash_config"]["input_embedding_scale"] = (-1e300).into()),
        ),
    ];
    let cases = not_a_drafter
        .into_iter()
        .map(|(w, e)| (w, committed(), e))
        .chain(dflash2_bad.into_iter().map(|(w, e)| (w, dflash2_file(), e)));
    for (what, mut v, edit) in cases {
        edit(&mut v);
        match parse(&v) {
            Err(Error::NotADrafter(_)) => {}
            other => panic!("{what}: expected NotADrafter, got {other:?}"),
        }
    }
    // Sizes past `dflash_core::limits`: the error names the limit.
    let over_limit: Vec<(&str, u64, &str)> = vec![
        ("block_size", 1 << 40, "MAX_BLOCK_SIZE"),
        ("block_size", MAX_BLOCK_SIZE + 1, "MAX_BLOCK_SIZE"),
        ("head_dim", 1 << 20, "MAX_HEAD_DIM"),
        ("hidden_size", 1 << 40, "MAX_HIDDEN_SIZE"),
        ("intermediate_size", 1 << 30, "MAX_INTERMEDIATE_SIZE"),
        ("vocab_size", 1 << 30, "MAX_VOCAB_SIZE"),
    ];
    for (field, value, want) in over_limit {
        let mut v = committed();
        v[field] = value.into();
        match parse(&v) {
            Err(Error::LimitExceeded {
                limit, value: got, ..
            }) if limit == want => {
                assert!(got > 0, "{field}: the value is reported");
            }
            other => panic!("{field} = {value}: expected LimitExceeded {want}, got {other:?}"),
        }
    }
    // RoPE's errors are the target parser's.
    let rope_bad: Vec<Edit> = vec![
        (
            "two thetas",
            Box::new(|v| v["rope_parameters"] = json!({"rope_theta": 1000})),
        ),
        (
            "unsupported scaling",
            Box::new(|v| v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0})),
        ),
        (
            "llama3 without its fields",
            Box::new(|v| v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0})),
        ),
        (
            "llama3 with low > high",
            Box::new(|v| {
                v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0,
                    "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192})
            }),
        ),
    ];
    for (what, edit) in rope_bad {
        let mut v = committed();
        edit(&mut v);
        match parse(&v) {
            Err(Error::BadConfig(_)) => {}
            other => panic!("{what}: expected BadConfig, got {other:?}"),
        }
    }
    // Not JSON at all.
    assert!(matches!(
        DrafterConfig::from_json("{"),
        Err(Error::NotADrafter(_))
    ));
}
