//! DFlash2 on the CPU reference: `DFlash2DraftModel` checkpoints with the names vLLM
//! loads, a typed error for each inconsistent field or shape, the grouped dynamic
//! convolution and the candidate selector against their definitions, and the
//! speculative loop with a DFlash2 drafter equal to plain decoding token for token.

use dflash_core::cpu::CpuModel;
use dflash_core::drafter::{grouped_conv, top_k, CpuDrafter, DrafterPrecision, DrafterWeights};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::model_files::{load_gguf, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{generate_speculative_cpu, BlockSize};
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_dflash2_drafter, write_gguf, DFlash2Spec,
    DrafterSpec, Rng,
};
use dflash_core::Error;
use std::collections::BTreeMap;

fn target() -> LoadedModel {
    let c = tiny_drafter_target();
    load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap()
}

fn spec(seed: u64) -> DrafterSpec {
    let c = tiny_drafter_target();
    DrafterSpec {
        layers: 2,
        block_size: 8,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: c.vocab_size as u32 - 1,
        seed,
    }
}

fn d2() -> DFlash2Spec {
    DFlash2Spec::new(2, 16, 32, 8)
}

fn load(files: &BTreeMap<String, Vec<u8>>) -> dflash_core::Result<DrafterWeights> {
    let cfg = std::str::from_utf8(&files["config.json"]).unwrap();
    DrafterWeights::load(
        cfg,
        vec![("model.safetensors", &files["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
}

/// The files with config.json edited.
fn edit(
    files: &BTreeMap<String, Vec<u8>>,
    f: impl Fn(&mut serde_json::Value),
) -> BTreeMap<String, Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    f(&mut v);
    let mut out = files.clone();
    out.insert("config.json".into(), serde_json::to_vec(&v).unwrap());
    out
}

#[test]
fn dflash2_drafters_load_with_the_published_names() {
    let t = target();
    let mut s = d2();
    s.output_multiplier = Some(0.5);
    s.final_logit_softcapping = Some(20.0);
    let w = load(&write_dflash2_drafter(t.config(), &spec(1), &s)).unwrap();
    let d = w.config.dflash2.clone().expect("DFlash2 fields");
    assert_eq!(w.config.architecture, "DFlash2DraftModel");
    assert_eq!(
        (
            d.conv_kernel_size,
            d.conv_group_size,
            d.selector_rank,
            d.selector_top_k
        ),
        (2, 16, 32, 8)
    );
    let c = &w.config;
    assert_eq!(
        (
            c.output_multiplier,
            c.final_logit_softcapping,
            c.input_embedding_scale
        ),
        (0.5, Some(20.0), 1.0)
    );
    assert_eq!(d.projection_rows(64), 2 * 2 * 4);
    let conv = w.layers[1].conv.as_ref().unwrap();
    assert_eq!(conv.attention.base.len(), 2 * 2 * 64);
    assert_eq!(
        (conv.mlp.projection.rows, conv.mlp.projection.cols),
        (16, 64)
    );
    let sel = w.selector.as_ref().unwrap();
    assert_eq!(
        (sel.predecessor.rows, sel.predecessor.cols),
        (t.config().vocab_size, 32)
    );
    assert_eq!(
        (sel.hidden_projection.rows, sel.hidden_projection.cols),
        (32, 64)
    );
    w.config.validate_against(t.config()).unwrap();
    // A transformers 5 config: `rope_parameters` instead of a top-level rope_theta.
    let files = edit(&write_dflash2_drafter(t.config(), &spec(1), &s), |v| {
        let o = v.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("rope_scaling");
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_theta": 1000000, "rope_type": "default"}),
        );
    });
    assert_eq!(load(&files).unwrap().config.rope.theta, 1e6);
    // Absent scalars take 1, 1 and no capping.
    let c = load(&write_dflash2_drafter(t.config(), &spec(1), &d2()))
        .unwrap()
        .config;
    assert_eq!(
        (
            c.output_multiplier,
            c.final_logit_softcapping,
            c.input_embedding_scale
        ),
        (1.0, None, 1.0)
    );
}

/// A broken drafter folder and the check its error must pass.
type Case<'a> = (&'a str, BTreeMap<String, Vec<u8>>, fn(&Error) -> bool);

#[test]
fn inconsistent_dflash2_fields_and_shapes_are_typed_errors() {
    let t = target();
    let files = write_dflash2_drafter(t.config(), &spec(2), &d2());
    let cases: Vec<Case> = vec![
        (
            "group not dividing hidden",
            edit(&files, |v| {
                v["dflash_config"]["conv_group_size"] = 24.into()
            }),
            |e| matches!(e, Error::NotADrafter(_)),
        ),
        (
            "no conv_kernel_size",
            edit(&files, |v| {
                v["dflash_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("conv_kernel_size");
            }),
            |e| matches!(e, Error::NotADrafter(_)),
        ),
        (
            "zero rank",
            edit(&files, |v| v["dflash_config"]["selector_rank"] = 0.into()),
            |e| matches!(e, Error::NotADrafter(_)),
        ),
        (
            "top-k past the vocabulary",
            edit(&files, |v| {
                v["dflash_config"]["selector_top_k"] = 100000.into()
            }),
            |e| matches!(e, Error::NotADrafter(_)),
        ),
        (
            "kernel longer than the block",
            edit(&files, |v| {
                v["dflash_config"]["conv_kernel_size"] = 9.into()
            }),
            |e| matches!(e, Error::NotADrafter(_)),
        ),
        (
            "non-numeric multiplier",
            edit(&files, |v| {
                v["dflash_config"]["output_multiplier"] = "x".into()
            }),
            |e| matches!(e, Error::NotADrafter(_)),
        ),
        // Config and tensors disagree: the tensor's shape is named.
        (
            "base kernel taps",
            edit(&files, |v| {
                v["dflash_config"]["conv_kernel_size"] = 3.into()
            }),
            |e| matches!(e, Error::ShapeMismatch { tensor, .. } if tensor.ends_with("attention_conv.base_kernel")),
        ),
        (
            "projection width",
            edit(&files, |v| {
                v["dflash_config"]["conv_group_size"] = 32.into()
            }),
            |e| matches!(e, Error::ShapeMismatch { tensor, .. } if tensor.ends_with("kernel_projection.weight")),
        ),
        (
            "selector rank",
            edit(&files, |v| v["dflash_config"]["selector_rank"] = 64.into()),
            |e| matches!(e, Error::ShapeMismatch { tensor, .. } if tensor.starts_with("candidate_selector")),
        ),
    ];
    for (what, f, ok) in cases {
        let e = load(&f).err().unwrap_or_else(|| panic!("{what}: loaded"));
        assert!(ok(&e), "{what}: {e}");
    }
    // DFlash tensors only, under the DFlash2 architecture: the missing tensor is named.
    let plain = dflash_core::testutil::write_drafter(t.config(), &spec(2));
    let f = edit(&plain, |v| {
        v["architectures"] = serde_json::json!(["DFlash2DraftModel"]);
        for (k, x) in [
            ("conv_kernel_size", 2),
            ("conv_group_size", 16),
            ("selector_rank", 32),
            ("selector_top_k", 8),
        ] {
            v["dflash_config"][k] = x.into();
        }
    });
    assert!(matches!(load(&f), Err(Error::MissingTensor(n)) if n.contains("conv")));
}

/// The convolution written the way vLLM writes it: shifted copies of the block, masked
/// where a tap would cross the block start.
fn conv_by_shifts(
    x: &[f32],
    h: usize,
    taps: usize,
    group: usize,
    base: &[f32],
    delta: &[Vec<Vec<f32>>],
) -> Vec<f32> {
    let b = x.len() / h;
    let mut out = vec![0f32; b * h];
    for t in 0..taps {
        for i in 0..b {
            if i < t {
                continue; // the masked (zero-padded) part of the shifted copy
            }
            for c in 0..h {
                out[i * h + c] += (base[t * h + c] + delta[i][t][c / group]) * x[(i - t) * h + c];
            }
        }
    }
    out
}

#[test]
fn the_grouped_convolution_matches_its_definition() {
    let mut rng = Rng(3);
    for (h, taps, group, b) in [
        (64, 2, 16, 8),
        (64, 3, 8, 5),
        (32, 2, 32, 16),
        (48, 1, 16, 4),
    ] {
        let groups = h / group;
        let x = rng.vec(b * h, 1.0);
        let base = rng.vec(2 * taps * h, 1.0);
        let coef = rng.vec(b * 2 * taps * groups, 1.0); // [b, 2, taps, groups]
        for side in 0..2 {
            let got = grouped_conv(
                &x,
                h,
                taps,
                group,
                &base[side * taps * h..(side + 1) * taps * h],
                &coef,
                2 * taps * groups,
                side * taps * groups,
            );
            let delta: Vec<Vec<Vec<f32>>> = (0..b)
                .map(|i| {
                    (0..taps)
                        .map(|t| {
                            (0..groups)
                                .map(|g| {
                                    coef[i * 2 * taps * groups
                                        + side * taps * groups
                                        + t * groups
                                        + g]
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let want = conv_by_shifts(
                &x,
                h,
                taps,
                group,
                &base[side * taps * h..(side + 1) * taps * h],
                &delta,
            );
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-5, "h {h} taps {taps} side {side}: {diff}");
            // Row 0 sees only itself: the taps never cross the block start.
            for c in 0..h {
                let d0 = coef[side * taps * groups + c / group];
                assert!((got[c] - (base[side * taps * h + c] + d0) * x[c]).abs() < 1e-5);
            }
        }
    }
}

#[test]
fn top_k_is_descending_with_ties_by_index() {
    let x = [0.5, 2.0, -1.0, 2.0, 0.5, 3.0, f32::NEG_INFINITY];
    assert_eq!(top_k(&x, 4), vec![(5, 3.0), (1, 2.0), (3, 2.0), (0, 0.5)]);
    assert_eq!(top_k(&x, 10).len(), 7);
}

#[test]
fn the_selector_walks_the_best_edges_from_the_anchor() {
    let t = target();
    let (v, h) = (t.config().vocab_size, t.config().hidden_size);
    let mut s = d2();
    s.output_multiplier = Some(0.7);
    s.final_logit_softcapping = Some(3.0);
    let w = load(&write_dflash2_drafter(t.config(), &spec(4), &s)).unwrap();
    let d = CpuDrafter::new(&w);
    let sel = w.selector.as_ref().unwrap();
    let (a, bb, hp_w) = (
        sel.predecessor.dequantize(),
        sel.successor.dequantize(),
        sel.hidden_projection.dequantize(),
    );
    let mut rng = Rng(9);
    for slots in [1usize, 3, 7] {
        let hidden = rng.vec(slots * h, 1.0);
        let logits = rng.vec(slots * v, 4.0);
        let anchor = rng.below(v) as u32;
        // Brute force: every slot's K best by sorting, unary through multiplier and cap,
        // edges from the previous choice, first best.
        let mut pred = anchor;
        let mut want = Vec::new();
        for l in 0..slots {
            let row = &logits[l * v..(l + 1) * v];
            let mut order: Vec<usize> = (0..v).collect();
            order.sort_by(|&i, &j| row[j].partial_cmp(&row[i]).unwrap().then(i.cmp(&j)));
            let hp: Vec<f32> = (0..32)
                .map(|r| (0..h).map(|c| hp_w[r * h + c] * hidden[l * h + c]).sum())
                .collect();
            let mut best = (f32::NEG_INFINITY, 0u32);
            for &c in &order[..8] {
                let unary = (row[c] * 0.7 / 3.0).tanh() * 3.0;
                let edge: f32 = (0..32)
                    .map(|r| a[pred as usize * 32 + r] * hp[r] * bb[c * 32 + r])
                    .sum();
                if unary + edge > best.0 {
                    best = (unary + edge, c as u32);
                }
            }
            pred = best.1;
            want.push(pred);
        }
        assert_eq!(d.select(anchor, &hidden, &logits), want, "{slots} slots");
    }
}

#[test]
fn a_dflash2_drafter_is_lossless_on_the_cpu() {
    let t = target();
    let cpu = CpuModel::new(&t.weights);
    let mut s = d2();
    s.input_embedding_scale = Some(1.5);
    s.output_multiplier = Some(0.8);
    let d = CpuDrafter::new(&load(&write_dflash2_drafter(t.config(), &spec(6), &s)).unwrap());
    let mut r = Rng(77);
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..5 + 9 * i).map(|_| r.below(260) as u32).collect())
        .collect();
    for sp in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 11,
            ..Default::default()
        },
    ] {
        for p in &prompts {
            let req = GenerateRequest {
                prompt_ids: p.clone(),
                max_new_tokens: 32,
                sampling: sp.clone(),
                stop_strings: vec![],
                context: 256,
                interrupt: Default::default(),
                grammar: None,
            };
            let plain = generate_cpu(&cpu, &t.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap();
            for b in [
                BlockSize::Fixed(2),
                BlockSize::Fixed(4),
                BlockSize::Fixed(8),
                BlockSize::auto_linear(8, 0.02),
            ] {
                let out = generate_speculative_cpu(
                    &cpu,
                    &d,
                    &t.tokenizer,
                    &req,
                    &b,
                    &|| 0.0,
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(
                    out.result.tokens, plain.tokens,
                    "{b:?} T={}",
                    sp.temperature
                );
            }
        }
    }
}

/// With identity convolutions (base tap 0 = 1, no dynamic part) a DFlash2 layer is a
/// DFlash layer: the block's hidden rows equal those of the same drafter without the
/// convolutions; random convolutions change them.
#[test]
fn identity_convolutions_reduce_dflash2_to_dflash() {
    use dflash_core::quant::QuantMatrix;
    let t = target();
    let cpu = CpuModel::new(&t.weights);
    let w = load(&write_dflash2_drafter(t.config(), &spec(8), &d2())).unwrap();
    let (h, taps) = (64, 2);
    let mut ident = w.clone();
    for l in &mut ident.layers {
        let c = l.conv.as_mut().unwrap();
        for g in [&mut c.attention, &mut c.mlp] {
            g.base = (0..2 * taps * h)
                .map(|i| if (i / h) % taps == 0 { 1.0 } else { 0.0 })
                .collect();
            g.projection =
                QuantMatrix::quantize_q8(&vec![0.0; g.projection.rows * h], g.projection.rows, h);
        }
    }
    let mut plain = w.clone();
    plain.config.dflash2 = None;
    plain.selector = None;
    for l in &mut plain.layers {
        l.conv = None;
    }
    let taps_rows = {
        let ids: Vec<u32> = (0..12).map(|i| (i * 7 % 200) as u32).collect();
        let mut cache = cpu.new_cache(64);
        cpu.forward(
            &ids,
            &mut cache,
            dflash_core::cpu::LogitRows::Last,
            &w.config.target_layer_ids,
        )
        .unwrap()
        .taps
    };
    let block: Vec<u32> = std::iter::once(5)
        .chain(std::iter::repeat_n(w.config.mask_token_id, 7))
        .collect();
    let embeds = cpu.embed(&block).unwrap();
    let run = |w: &DrafterWeights| {
        let d = CpuDrafter::new(w);
        let mut ctx = d.new_context();
        d.extend_context(&mut ctx, &taps_rows);
        d.forward_block(&mut ctx, &embeds)
    };
    let (a, b, c) = (run(&ident), run(&plain), run(&w));
    let diff = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max)
    };
    assert!(
        diff(&a, &b) < 1e-5,
        "identity convolutions: {}",
        diff(&a, &b)
    );
    assert!(diff(&c, &b) > 1e-2, "random convolutions change the block");
}
