//! Loading tiny synthetic models written in the real formats, and the typed error that
//! every kind of bad input gets.

use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::formats::gguf::{parse_header, writer, Value};
use dflash_core::model_files::{load_gguf, load_hf, HfFiles, LoadedModel};
use dflash_core::testutil::{
    gguf_metadata, random_weights, tiny_config, write_gguf, write_hf, Rng,
};
use dflash_core::Error;
use safetensors::Dtype;
use std::collections::BTreeMap;

const PROMPT: [u32; 7] = [104, 101, 108, 108, 111, 32, 119];

fn logits(m: &LoadedModel) -> Vec<f32> {
    let cpu = CpuModel::new(&m.weights);
    let mut cache = cpu.new_cache(32);
    cpu.forward(&PROMPT, &mut cache, LogitRows::All, &[])
        .unwrap()
        .logits
}

fn hf(files: &BTreeMap<String, Vec<u8>>) -> dflash_core::Result<LoadedModel> {
    let refs: HfFiles = files.iter().map(|(k, v)| (k.clone(), &v[..])).collect();
    load_hf(&refs)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn gguf_and_hf_copies_of_a_model_agree_for_every_architecture() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Qwen3Moe] {
        let c = tiny_config(arch);
        let w = random_weights(&c, 7);
        let g = load_gguf(&write_gguf(&c, &w, GgmlType::F32)).unwrap();
        assert_eq!(g.config(), &c, "{arch:?} config from GGUF metadata");
        let h = hf(&write_hf(&c, &w, Dtype::F32, 1)).unwrap();
        // GGUF llama stores Q/K permuted for interleaved RoPE; HF uses rotate-half. The
        // same model through both paths differs only by summation order in q.k.
        let (lg, lh) = (logits(&g), logits(&h));
        let d = max_diff(&lg, &lh);
        assert!(d < 1e-4, "{arch:?}: GGUF vs HF logits differ by {d}");
        assert!(lg.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn sharded_safetensors_equal_a_single_file() {
    let c = tiny_config(Arch::Qwen2);
    let w = random_weights(&c, 8);
    let one = logits(&hf(&write_hf(&c, &w, Dtype::F32, 1)).unwrap());
    let three = logits(&hf(&write_hf(&c, &w, Dtype::F32, 3)).unwrap());
    assert_eq!(one, three);
}

#[test]
fn f16_and_bf16_checkpoints_load() {
    let c = tiny_config(Arch::Llama);
    let w = random_weights(&c, 9);
    let f32l = logits(&hf(&write_hf(&c, &w, Dtype::F32, 1)).unwrap());
    for dt in [Dtype::F16, Dtype::BF16] {
        let l = logits(&hf(&write_hf(&c, &w, dt, 2)).unwrap());
        let d = max_diff(&f32l, &l);
        assert!(d < 0.2, "{dt:?} logits differ from f32 by {d}");
    }
}

#[test]
fn gguf_quantized_matrix_types_load() {
    let c = tiny_config(Arch::Llama);
    let w = random_weights(&c, 10);
    let reference = logits(&load_gguf(&write_gguf(&c, &w, GgmlType::F32)).unwrap());
    for t in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        let m = load_gguf(&write_gguf(&c, &w, t)).unwrap();
        let d = max_diff(&reference, &logits(&m));
        assert!(d < 3.0, "{t:?} is far from f32: {d}");
    }
}

#[test]
fn tokenizer_and_chat_template_come_from_the_file() {
    let c = tiny_config(Arch::Qwen3);
    let w = random_weights(&c, 11);
    for m in [
        load_gguf(&write_gguf(&c, &w, GgmlType::Q8_0)).unwrap(),
        hf(&write_hf(&c, &w, Dtype::F32, 1)).unwrap(),
    ] {
        let text = m
            .chat_template
            .as_ref()
            .unwrap()
            .render(
                &[dflash_core::chat::Message::new("user", "say the hello")],
                true,
            )
            .unwrap();
        assert_eq!(text, "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n<|im_start|>user\nsay the hello<|im_end|>\n<|im_start|>assistant\n");
        let ids = m.tokenizer.encode(&text, true).unwrap();
        let im_start = m.tokenizer.token_to_id("<|im_start|>").unwrap();
        assert_eq!(
            ids[0], im_start,
            "special tokens in the text are recognised"
        );
        assert!(
            ids.contains(&m.tokenizer.token_to_id("Ġthe").unwrap()),
            "merges apply"
        );
        assert_eq!(m.tokenizer.decode(&ids, false).unwrap(), text);
        assert!(m
            .tokenizer
            .is_stop(m.tokenizer.token_to_id("<|im_end|>").unwrap()));
    }
}

// ---------- GPTQ / AWQ packed int4 ----------

/// Files, then the packed layer's q, scales, zeros and its rows, cols and group size.
type PackedModel = (
    BTreeMap<String, Vec<u8>>,
    Vec<i32>,
    Vec<f32>,
    Vec<i32>,
    usize,
    usize,
    usize,
);

fn pack_model_with_int4(method: &str) -> PackedModel {
    let c = tiny_config(Arch::Qwen2);
    let w = random_weights(&c, 12);
    let mut files = write_hf(&c, &w, Dtype::F16, 1);
    // Replace layer 0's q_proj with a packed int4 layer.
    let (out, inp, group) = (c.q_dim(), c.hidden_size, 32);
    let groups = inp / group;
    let mut rng = Rng(13);
    let q: Vec<i32> = (0..out * inp).map(|_| rng.below(16) as i32).collect(); // [out][in]
                                                                              // GPTQ v1 stores zero - 1 in 4 bits, so its zeros are 1..=15.
    let z: Vec<i32> = (0..out * groups).map(|_| if method == "gptq" { 1 + rng.below(15) } else { rng.below(16) } as i32).collect(); // [out][g]
    let s: Vec<f32> = (0..out * groups)
        .map(|_| half::f16::from_f32(0.01 + rng.uniform().abs() * 0.02).to_f32())
        .collect();
    let (qweight, qzeros, qshape) = if method == "gptq" {
        let mut qw = vec![0i32; inp / 8 * out];
        for o in 0..out {
            for i in 0..inp {
                qw[(i / 8) * out + o] |= q[o * inp + i] << (4 * (i % 8));
            }
        }
        let mut qz = vec![0i32; groups * out / 8];
        for o in 0..out {
            for g in 0..groups {
                qz[g * (out / 8) + o / 8] |= (z[o * groups + g] - 1) << (4 * (o % 8));
                // stored minus one
            }
        }
        (qw, qz, vec![inp / 8, out])
    } else {
        const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
        let mut qw = vec![0i32; inp * out / 8];
        for i in 0..inp {
            for col in 0..out / 8 {
                for (k, &o) in ORDER.iter().enumerate() {
                    qw[i * (out / 8) + col] |= q[(col * 8 + o) * inp + i] << (4 * k);
                }
            }
        }
        let mut qz = vec![0i32; groups * out / 8];
        for g in 0..groups {
            for col in 0..out / 8 {
                for (k, &o) in ORDER.iter().enumerate() {
                    qz[g * (out / 8) + col] |= z[(col * 8 + o) * groups + g] << (4 * k);
                }
            }
        }
        (qw, qz, vec![inp, out / 8])
    };
    let mut scales = vec![0f32; groups * out];
    for o in 0..out {
        for g in 0..groups {
            scales[g * out + o] = s[o * groups + g];
        }
    }
    let st = safetensors::SafeTensors::deserialize(&files["model.safetensors"]).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.0.self_attn.q_proj.weight")
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    let i32b = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let p = "model.layers.0.self_attn.q_proj";
    tensors.push((format!("{p}.qweight"), Dtype::I32, qshape, i32b(&qweight)));
    tensors.push((
        format!("{p}.qzeros"),
        Dtype::I32,
        vec![groups, out / 8],
        i32b(&qzeros),
    ));
    tensors.push((
        format!("{p}.scales"),
        Dtype::F16,
        vec![groups, out],
        dflash_core::formats::hf::f16_bytes(&scales),
    ));
    if method == "gptq" {
        tensors.push((
            format!("{p}.g_idx"),
            Dtype::I32,
            vec![inp],
            i32b(
                &(0..inp as i32)
                    .map(|i| i / group as i32)
                    .collect::<Vec<_>>(),
            ),
        ));
    }
    files.insert(
        "model.safetensors".into(),
        dflash_core::formats::hf::write_safetensors(&tensors),
    );
    let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    cfg["quantization_config"] = serde_json::json!({"quant_method": method, "bits": 4, "group_size": group, "desc_act": false, "sym": false, "version": "gemm"});
    files.insert("config.json".into(), cfg.to_string().into_bytes());
    (files, q, s, z, out, inp, groups)
}

#[test]
fn gptq_and_awq_int4_layers_repack_to_q4() {
    for method in ["gptq", "awq"] {
        let (files, q, s, z, out, inp, groups) = pack_model_with_int4(method);
        let m = hf(&files).unwrap();
        let wq = &m.weights.layers[0].attention().unwrap().wq;
        assert_eq!(wq.format, dflash_core::quant::QFormat::Q4);
        let got = wq.dequantize();
        let mut worst = 0f32;
        for o in 0..out {
            for i in 0..inp {
                let g = i / (inp / groups);
                let (sc, zz) = (s[o * groups + g], z[o * groups + g] as f32);
                let want = (q[o * inp + i] as f32 - zz) * sc;
                let err = (got[o * inp + i] - want).abs();
                // min = -z*s is rounded to f16: error <= 2^-11 * |z * s|.
                assert!(
                    err <= 2f32.powi(-11) * (zz * sc).abs() + 1e-7,
                    "{method} ({o},{i}): {} vs {want}",
                    got[o * inp + i]
                );
                worst = worst.max(err);
            }
        }
        eprintln!("{method}: max error {worst:e}");
    }
}

#[test]
fn act_order_gptq_is_refused() {
    let (mut files, ..) = pack_model_with_int4("gptq");
    let st = safetensors::SafeTensors::deserialize(&files["model.safetensors"]).unwrap();
    let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let mut data = t.data().to_vec();
            if n.ends_with("g_idx") {
                data.swap(0, 4); // g_idx[0] <-> g_idx[1]: still valid, but for a different group order
                data[0] = 1;
            }
            (n, t.dtype(), t.shape().to_vec(), data)
        })
        .collect();
    files.insert(
        "model.safetensors".into(),
        dflash_core::formats::hf::write_safetensors(&tensors),
    );
    assert!(matches!(hf(&files), Err(Error::UnsupportedQuantization(_))));
}

// ---------- bad input ----------

fn tiny_gguf() -> Vec<u8> {
    let c = tiny_config(Arch::Llama);
    write_gguf(&c, &random_weights(&c, 1), GgmlType::Q8_0)
}

#[test]
fn truncated_gguf() {
    let f = tiny_gguf();
    let h = parse_header(&f, f.len() as u64).unwrap();
    // Cut inside the header: Truncated. Cut inside the data: tensor out of bounds.
    assert!(matches!(load_gguf(&f[..100]), Err(Error::Truncated { .. })));
    assert!(matches!(load_gguf(&f[..3]), Err(Error::BadMagic { .. })));
    let cut = (h.data_offset as usize + f.len()) / 2;
    assert!(matches!(
        load_gguf(&f[..cut]),
        Err(Error::TensorOutOfBounds { .. })
    ));
}

#[test]
fn bad_magic_and_version() {
    let mut f = tiny_gguf();
    f[0] = b'X';
    assert!(matches!(load_gguf(&f), Err(Error::BadMagic { .. })));
    // GGUF v2 has the same layout as v3 and loads.
    let mut f = tiny_gguf();
    f[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert!(load_gguf(&f).is_ok());
    let mut f = tiny_gguf();
    f[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert!(matches!(load_gguf(&f), Err(Error::UnsupportedVersion(7))));
}

fn one_tensor_file(dims: Vec<u64>, dtype: GgmlType, bytes: Vec<u8>) -> Vec<u8> {
    writer::write(
        &[("general.architecture".into(), Value::String("llama".into()))],
        &[writer::TensorData {
            name: "t".into(),
            dims,
            dtype,
            bytes,
        }],
    )
}

#[test]
fn tensor_data_outside_the_file() {
    let mut f = one_tensor_file(vec![32, 2], GgmlType::F32, vec![0; 256]);
    // The tensor's entry: name "t", 2 dims (32, 2), type F32, then its offset: move it far away.
    let mut entry = 1u64.to_le_bytes().to_vec();
    entry.push(b't');
    entry.extend_from_slice(&2u32.to_le_bytes());
    entry.extend_from_slice(&32u64.to_le_bytes());
    entry.extend_from_slice(&2u64.to_le_bytes());
    entry.extend_from_slice(&0u32.to_le_bytes());
    let pos = f.windows(entry.len()).position(|w| w == entry).unwrap() + entry.len();
    f[pos..pos + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::TensorOutOfBounds { .. })
    ));
    // Dims whose product overflows are refused too.
    let f = one_tensor_file(vec![1 << 40, 1 << 40], GgmlType::F32, vec![0; 64]);
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::BadTensorLayout { .. } | Error::TensorOutOfBounds { .. })
    ));
}

#[test]
fn unknown_tensor_type() {
    let f = one_tensor_file(vec![32], GgmlType::Other(99), vec![0; 32]);
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::UnknownTensorType { type_id: 99, .. })
    ));
    // A known ggml type that we do not load (Q2_K) is refused with the header: it has
    // no layout here to size its data by.
    let c = tiny_config(Arch::Llama);
    let w = random_weights(&c, 1);
    let mut md = gguf_metadata(&c);
    md.retain(|(k, _)| !k.is_empty());
    let mut tensors: Vec<writer::TensorData> = Vec::new();
    for (name, (shape, vals)) in &w {
        let q2k = name == "blk.0.attn_q.weight";
        tensors.push(writer::TensorData {
            name: name.clone(),
            dims: shape.iter().rev().map(|&d| d as u64).collect(),
            dtype: if q2k {
                GgmlType::Other(10)
            } else {
                GgmlType::F32
            },
            bytes: if q2k {
                vec![0; vals.len()]
            } else {
                vals.iter().flat_map(|v| v.to_le_bytes()).collect()
            },
        });
    }
    let f = writer::write(&md, &tensors);
    assert!(matches!(
        load_gguf(&f),
        Err(Error::UnsupportedTensorType { .. })
    ));
}

#[test]
fn absurd_header_sizes_are_refused_before_allocating() {
    let mut f = Vec::new();
    f.extend_from_slice(b"GGUF");
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&0u64.to_le_bytes());
    f.extend_from_slice(&u64::MAX.to_le_bytes()); // kv count
                                                  // Each over its limit of dflash_core::limits, which the error names.
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::LimitExceeded {
            limit: "MAX_GGUF_KEYS",
            ..
        })
    ));
    let mut g = f[..8].to_vec();
    g.extend_from_slice(&u64::MAX.to_le_bytes()); // tensor count
    g.extend_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        parse_header(&g, g.len() as u64),
        Err(Error::LimitExceeded {
            limit: "MAX_GGUF_TENSORS",
            ..
        })
    ));
    // A string that claims 2^60 bytes, and an array that claims 2^60 items.
    for (ty, tail, limit) in [
        (8u32, vec![], "MAX_GGUF_STRING_BYTES"),
        (9u32, 4u32.to_le_bytes().to_vec(), "MAX_GGUF_ARRAY_ITEMS"),
    ] {
        let mut h = f[..8].to_vec();
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&1u64.to_le_bytes());
        h.extend_from_slice(&1u64.to_le_bytes());
        h.push(b'k');
        h.extend_from_slice(&ty.to_le_bytes());
        h.extend_from_slice(&tail);
        h.extend_from_slice(&(1u64 << 60).to_le_bytes());
        h.extend_from_slice(&[0; 64]);
        let e = parse_header(&h, h.len() as u64).unwrap_err();
        assert!(
            matches!(e, Error::LimitExceeded { limit: l, .. } if l == limit),
            "type {ty}: {e}"
        );
    }
    // A config asking for absurd dimensions.
    let c = tiny_config(Arch::Llama);
    let mut md = gguf_metadata(&c);
    for (k, v) in md.iter_mut() {
        if k == "llama.embedding_length" {
            *v = Value::U64(1 << 40);
        }
    }
    let f = writer::write(&md, &[]);
    assert!(matches!(
        load_gguf(&f),
        Err(Error::LimitExceeded {
            limit: "MAX_HIDDEN_SIZE",
            ..
        })
    ));
}

#[test]
fn config_and_tensor_shape_mismatch() {
    let c = tiny_config(Arch::Qwen2);
    let mut w = random_weights(&c, 2);
    w.insert(
        "blk.1.ffn_up.weight".into(),
        (
            vec![c.intermediate_size, c.hidden_size - 32],
            vec![0.0; c.intermediate_size * (c.hidden_size - 32)],
        ),
    );
    match load_gguf(&write_gguf(&c, &w, GgmlType::F32)) {
        Err(Error::ShapeMismatch {
            tensor,
            expected,
            found,
        }) => {
            assert_eq!(tensor, "blk.1.ffn_up.weight");
            assert_eq!(expected, vec![96, 64]);
            assert_eq!(found, vec![96, 32]);
        }
        other => panic!("expected ShapeMismatch, got {:?}", other.err()),
    }
    let files = write_hf(&c, &w, Dtype::F32, 1);
    assert!(matches!(hf(&files), Err(Error::ShapeMismatch { .. })));
    let mut w = random_weights(&c, 2);
    w.remove("blk.2.attn_k.bias");
    assert!(
        matches!(load_gguf(&write_gguf(&c, &w, GgmlType::F32)), Err(Error::MissingTensor(t)) if t == "blk.2.attn_k.bias")
    );
}

#[test]
fn missing_tokenizer() {
    let c = tiny_config(Arch::Llama);
    let w = random_weights(&c, 3);
    let mut md = gguf_metadata(&c);
    md.retain(|(k, _)| k != "tokenizer.ggml.model");
    let f = {
        let full = write_gguf(&c, &w, GgmlType::F32);
        let h = parse_header(&full, full.len() as u64).unwrap();
        let tensors: Vec<writer::TensorData> = h
            .tensors
            .iter()
            .map(|t| writer::TensorData {
                name: t.name.clone(),
                dims: t.dims.clone(),
                dtype: t.dtype,
                bytes: full[t.offset as usize..(t.offset + t.n_bytes) as usize].to_vec(),
            })
            .collect();
        writer::write(&md, &tensors)
    };
    assert!(matches!(load_gguf(&f), Err(Error::MissingTokenizer(_))));
    let mut files = write_hf(&c, &w, Dtype::F32, 1);
    files.remove("tokenizer.json");
    assert!(matches!(hf(&files), Err(Error::MissingTokenizer(_))));
    // An unmapped pre-tokenizer is refused rather than guessed.
    let mut md = gguf_metadata(&c);
    for (k, v) in md.iter_mut() {
        if k == "tokenizer.ggml.pre" {
            *v = Value::String("mystery".into());
        }
    }
    assert!(matches!(
        load_gguf(&writer::write(&md, &[])),
        Err(Error::UnsupportedTokenizer(_))
    ));
}

#[test]
fn unsupported_architecture() {
    let c = tiny_config(Arch::Llama);
    let mut md = gguf_metadata(&c);
    md[0].1 = Value::String("gptneox".into());
    assert!(
        matches!(load_gguf(&writer::write(&md, &[])), Err(Error::UnsupportedArchitecture(a)) if a == "gptneox")
    );
    let mut files = write_hf(&c, &random_weights(&c, 1), Dtype::F32, 1);
    let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    cfg["model_type"] = serde_json::json!("mamba");
    files.insert("config.json".into(), cfg.to_string().into_bytes());
    assert!(matches!(hf(&files), Err(Error::UnsupportedArchitecture(_))));
}

#[test]
fn prompt_longer_than_the_context() {
    use dflash_core::generate::{generate_cpu, GenerateRequest};
    let c = tiny_config(Arch::Llama);
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 4), GgmlType::F32)).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let req = GenerateRequest {
        prompt_ids: vec![1; 40],
        max_new_tokens: 8,
        sampling: Default::default(),
        stop_strings: vec![],
        context: 32,
        interrupt: Default::default(),
        grammar: None,
    };
    let e = generate_cpu(&cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ContextOverflow {
                prompt_tokens: 40,
                context: 32,
                ..
            }
        ),
        "{e}"
    );
    // A token id outside the vocabulary is an error too, not an index panic.
    let req = GenerateRequest {
        prompt_ids: vec![1, 100_000],
        context: 32,
        ..req
    };
    assert!(matches!(
        generate_cpu(&cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {}),
        Err(Error::TokenOutOfRange { .. })
    ));
}

/// Random bytes and random corruptions of valid files: every outcome is Ok or a typed
/// error; a panic fails the test.
#[test]
fn random_bytes_never_panic_either_loader() {
    let mut rng = Rng(99);
    let valid_gguf = tiny_gguf();
    let c = tiny_config(Arch::Qwen2);
    let valid_hf = write_hf(&c, &random_weights(&c, 5), Dtype::F16, 1);
    let mut errors = std::collections::BTreeMap::<String, usize>::new();
    let mut count = |r: dflash_core::Result<LoadedModel>| {
        let k = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("{e:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap()
                .to_string(),
        };
        *errors.entry(k).or_default() += 1;
    };
    for i in 0..300 {
        // Pure noise, with and without a GGUF magic.
        let len = rng.below(4096);
        let mut noise = rng.bytes(len);
        if i % 2 == 0 && noise.len() >= 8 {
            noise[..4].copy_from_slice(b"GGUF");
            noise[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        count(load_gguf(&noise));
        // A valid file with a few bytes changed (header region mostly) or cut short.
        let mut f = valid_gguf.clone();
        for _ in 0..1 + rng.below(4) {
            let at = if rng.below(4) == 0 {
                rng.below(f.len())
            } else {
                rng.below(f.len().min(20_000))
            };
            f[at] = rng.next_u64() as u8;
        }
        if rng.below(3) == 0 {
            f.truncate(rng.below(f.len()));
        }
        count(load_gguf(&f));
        // HF: corrupt the safetensors header or the config.
        let mut files = valid_hf.clone();
        let st = files.get_mut("model.safetensors").unwrap();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(st.len().min(4096));
            st[at] = rng.next_u64() as u8;
        }
        if rng.below(3) == 0 {
            let cfg = files.get_mut("config.json").unwrap();
            let at = rng.below(cfg.len());
            cfg[at] = rng.next_u64() as u8;
        }
        count(hf(&files));
    }
    eprintln!("outcomes: {errors:?}");
    assert!(
        errors.len() > 3,
        "the corruptions should reach several different errors"
    );
}
