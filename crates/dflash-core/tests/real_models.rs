//! Agreement with llama.cpp on the real test models (fixtures made by
//! scripts/make_llamacpp_fixtures.py). The models come from scripts/fetch-models.sh;
//! without them these tests are skipped, unless DFLASH_REQUIRE_MODELS=1 (CI) makes
//! their absence a failure. DFLASH_TF_POSITIONS limits the teacher-forced positions.

use dflash_core::chat::Message;
use dflash_core::cpu::{CpuKernels, CpuModel, LogitRows};
use dflash_core::generate::{generate_cpu, GenerateRequest};
use dflash_core::model_files::{load_path, LoadedModel};
use dflash_core::sampling::SamplingParams;
use serde_json::Value;
use std::path::PathBuf;

fn model_path(file: &str) -> Option<PathBuf> {
    dflash_core::testutil::cached_model(file)
}

fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/llamacpp")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_tokenizer(m: &LoadedModel, fx: &Value) {
    for case in fx["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = m.tokenizer.encode(text, false).unwrap();
        assert_eq!(got, want, "token ids of {text:?}");
        assert_eq!(
            m.tokenizer.decode(&got, false).unwrap(),
            text,
            "decode(encode(x)) of {text:?}"
        );
    }
}

fn check_chat_template(m: &LoadedModel, fx: &Value) {
    let tpl = m.chat_template.as_ref().expect("chat template");
    for g in fx["greedy"].as_array().unwrap() {
        let rendered = tpl
            .render(&[Message::new("user", g["chat"].as_str().unwrap())], true)
            .unwrap();
        assert_eq!(
            rendered,
            g["prompt"].as_str().unwrap(),
            "chat template rendering"
        );
        assert_eq!(
            m.tokenizer.encode(&rendered, true).unwrap(),
            ids(&g["prompt_ids"])
        );
    }
}

/// Teacher-forced top-1 agreement: at least `min_rate`, and every disagreement a
/// near-tie (llama.cpp's top-2 margin under 1.0 logit).
fn check_teacher_forced(m: &LoadedModel, cpu: &CpuModel, fx: &Value, min_rate: f64) {
    let tf = &fx["teacher_forced"];
    let all = ids(&tf["ids"]);
    let rows = tf["rows"].as_array().unwrap();
    let n = std::env::var("DFLASH_TF_POSITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(rows.len())
        .min(rows.len());
    let mut cache = cpu.new_cache(n + 1);
    let out = cpu
        .forward(&all[..n], &mut cache, LogitRows::All, &[])
        .unwrap();
    let v = m.config().vocab_size;
    let (mut agree, mut near_tie_misses) = (0, 0);
    for (i, row) in rows[..n].iter().enumerate() {
        let ours = dflash_core::cpu::ops::argmax(&out.logits[i * v..(i + 1) * v]) as u64;
        if ours == row["top1"].as_u64().unwrap() {
            agree += 1;
        } else {
            let margin = row["margin"].as_f64().unwrap();
            assert!(
                margin < 1.0,
                "position {i}: ours {ours}, llama.cpp {} with margin {margin}",
                row["top1"]
            );
            near_tie_misses += 1;
        }
    }
    let rate = agree as f64 / n as f64;
    eprintln!(
        "teacher-forced top-1 agreement {agree}/{n} = {:.2}% ({near_tie_misses} near-tie misses)",
        rate * 100.0
    );
    assert!(rate >= min_rate, "agreement {rate}");
}

/// Greedy generation equals llama.cpp's up to the first near-tie.
fn check_greedy(m: &LoadedModel, cpu: &CpuModel, fx: &Value) {
    for g in fx["greedy"].as_array().unwrap() {
        let want = ids(&g["tokens"]);
        let margins: Vec<f64> = g["margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let req = GenerateRequest {
            prompt_ids: ids(&g["prompt_ids"]),
            max_new_tokens: want.len(),
            sampling: SamplingParams::default(),
            stop_strings: vec![],
            context: 1024,
            interrupt: Default::default(),
            grammar: None,
        };
        let r = generate_cpu(cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap();
        // Equal token for token until the first divergence, which must be a near-tie.
        let mut matched = 0;
        for (i, &w) in want.iter().enumerate() {
            if m.tokenizer.is_stop(w) {
                assert_eq!(r.tokens.len(), i, "llama.cpp stopped at {i}");
                break;
            }
            match r.tokens.get(i) {
                Some(&ours) if ours == w => matched += 1,
                ours => {
                    assert!(
                        margins[i] < 1.0,
                        "greedy token {i} for {:?}: ours {ours:?}, llama.cpp {w} (margin {})",
                        g["chat"],
                        margins[i]
                    );
                    break;
                }
            }
        }
        eprintln!(
            "greedy {:?}: {matched}/{} tokens equal (a divergence only at a near-tie)",
            g["chat"].as_str().unwrap(),
            want.len()
        );
    }
}

fn run(file: &str, fixture_name: &str) {
    let Some(p) = model_path(file) else { return };
    let m = load_path(&p).unwrap();
    let fx = fixture(fixture_name);
    check_tokenizer(&m, &fx);
    check_chat_template(&m, &fx);
    let cpu = CpuModel::new(&m.weights);
    check_greedy(&m, &cpu, &fx);
    check_teacher_forced(&m, &cpu, &fx, 0.98);
    // The quantized engine rounds activations to 8 bits per group as llama.cpp does, but
    // not in the same way (nor its f16 KV cache): SmolLM2 gives 97.5% (14 misses in
    // 560, all near-ties) where the reference gives 98.75%.
    let fast = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    check_greedy(&m, &fast, &fx);
    check_teacher_forced(&m, &fast, &fx, 0.97);
}

#[test]
fn smollm2_agrees_with_llama_cpp() {
    run("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2.json");
}

#[test]
fn qwen25_coder_agrees_with_llama_cpp() {
    run("Qwen2.5-Coder-0.5B-Instruct.gguf", "qwen25-coder.json");
}
