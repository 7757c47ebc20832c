//! The `dflash` binary on a tiny GGUF model: JSON output fields, streaming text, and a
//! clear error (exit status 1, no panic) for a bad file.

use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::testutil::{random_weights, tiny_config, write_dir, write_gguf, write_hf};
use std::process::Command;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dflash-cli-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn dflash(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn generate_json_reports_tokens_text_and_timings() {
    let c = tiny_config(Arch::Qwen2);
    let path = tmp("json").join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 3), GgmlType::Q8_0),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let out = dflash(&[
        "generate",
        "--model",
        p,
        "--chat",
        "say the hello",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let toks = v["tokens"].as_array().unwrap();
    assert!(!toks.is_empty() && toks.len() <= 6);
    assert!(v["text"].is_string());
    assert!(v["prompt_tokens"].as_u64().unwrap() > 10);
    for k in [
        "load_s",
        "prefill_s",
        "decode_s",
        "prefill_tok_s",
        "decode_tok_s",
    ] {
        assert!(v["timings"][k].is_number(), "timings.{k}");
    }
    // The same seed gives the same tokens; the streamed text equals the JSON text.
    let again = dflash(&[
        "generate",
        "--model",
        p,
        "--chat",
        "say the hello",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--json",
    ]);
    let w: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["tokens"], w["tokens"]);
    let streamed = dflash(&[
        "generate",
        "--model",
        p,
        "--chat",
        "say the hello",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--device",
        "cpu",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&streamed.stdout).trim_end_matches('\n'),
        v["text"].as_str().unwrap()
    );
}

#[test]
fn a_hugging_face_folder_is_a_model_too() {
    let c = tiny_config(Arch::Llama);
    let dir = tmp("hf");
    write_dir(
        &dir,
        &write_hf(&c, &random_weights(&c, 4), safetensors::Dtype::BF16, 2),
    )
    .unwrap();
    let out = dflash(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "the hello",
        "--max-new-tokens",
        "4",
        "--device",
        "cpu",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_bad_file_is_a_clear_error() {
    let path = tmp("bad").join("bad.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = dflash(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "x",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: file is truncated"), "{err}");
    assert!(!err.contains("panicked"));
}

/// Whether a wgpu adapter exists here (CI: lavapipe, required by DFLASH_REQUIRE_GPU=1).
fn have_gpu() -> bool {
    let ok = !dflash(&["adapters"]).stdout.is_empty();
    if !ok && std::env::var("DFLASH_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("no GPU adapter");
    }
    ok
}

#[test]
fn gpu_and_cpu_devices_generate_the_same_greedy_tokens() {
    if !have_gpu() {
        return;
    }
    let c = tiny_config(Arch::Llama);
    let path = tmp("gpu").join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 8), GgmlType::Q4_0),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let run = |dev: &str| -> serde_json::Value {
        let out = dflash(&[
            "generate",
            "--model",
            p,
            "--prompt",
            "the hello world",
            "--max-new-tokens",
            "12",
            "--device",
            dev,
            "--no-f16",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{dev}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (g, c) = (run("gpu"), run("cpu"));
    assert_eq!(g["device"], "gpu");
    assert_eq!(g["tokens"], c["tokens"]);
    assert_eq!(g["text"], c["text"]);
    // Sampling on the GPU: the same seed gives the same tokens.
    let sampled = || -> serde_json::Value {
        let out = dflash(&[
            "generate",
            "--model",
            p,
            "--prompt",
            "the hello world",
            "--max-new-tokens",
            "12",
            "--device",
            "gpu",
            "--temperature",
            "0.9",
            "--top-p",
            "0.9",
            "--seed",
            "5",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert_eq!(sampled()["tokens"], sampled()["tokens"]);
}

#[test]
fn bench_reports_speed_bandwidth_and_memory() {
    if !have_gpu() {
        return;
    }
    let c = tiny_config(Arch::Qwen2);
    let path = tmp("bench").join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 9), GgmlType::Q8_0),
    )
    .unwrap();
    let out = dflash(&[
        "bench",
        "--model",
        path.to_str().unwrap(),
        "--prompt-tokens",
        "20",
        "--decode-tokens",
        "4",
        "--reps",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "decode_tok_s",
        "prefill_tok_s",
        "weight_bytes_per_token",
        "gemv_gbps",
        "copy_gbps",
        "gemv_copy_ratio",
        "load_s",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    assert!(v["adapter"]["name"].is_string());
    let mem = &v["gpu_memory_bytes"];
    let parts = mem["weights"].as_u64().unwrap()
        + mem["kv_cache"].as_u64().unwrap()
        + mem["activations"].as_u64().unwrap();
    assert_eq!(parts, mem["total"].as_u64().unwrap());
}

#[test]
fn dflash_generate_and_bench_are_lossless_on_a_tiny_model() {
    use dflash_core::testutil::tiny_drafter_target;
    let gpu = have_gpu();
    let c = tiny_drafter_target();
    let dir = tmp("dflash");
    let model = dir.join("target.gguf");
    std::fs::write(
        &model,
        write_gguf(&c, &random_weights(&c, 12), GgmlType::Q8_0),
    )
    .unwrap();
    let (m, d) = (model.to_str().unwrap(), dir.join("drafter"));
    let out = dflash(&[
        "make-random-drafter",
        "--model",
        m,
        "--out",
        d.to_str().unwrap(),
        "--seed",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let devices: &[&str] = if gpu { &["cpu", "gpu"] } else { &["cpu"] };
    for dev in devices {
        let run = |extra: &[&str]| -> serde_json::Value {
            let mut args = vec![
                "generate",
                "--model",
                m,
                "--prompt",
                "the hello world",
                "--max-new-tokens",
                "20",
                "--device",
                dev,
                "--json",
            ];
            args.extend_from_slice(extra);
            let out = dflash(&args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let plain = run(&[]);
        for block in ["1", "4", "auto"] {
            let s = run(&["--drafter", d.to_str().unwrap(), "--block", block]);
            assert_eq!(s["tokens"], plain["tokens"], "{dev} block {block}");
            assert!(s["dflash"]["mean_tau"].as_f64().unwrap() >= 1.0);
        }
    }
    if gpu {
        let prompts = dir.join("p.jsonl");
        std::fs::write(&prompts, "{\"id\": \"x\", \"prompt\": \"the hello\"}\n{\"id\": \"y\", \"chat\": \"say the hello\"}\n").unwrap();
        let out = dflash(&[
            "bench",
            "--model",
            m,
            "--drafter",
            d.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--max-new-tokens",
            "12",
            "--block",
            "4",
            "--temperature",
            "0.8",
            "--seed",
            "2",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["lossless"], true);
        for k in ["plain_tok_s", "dflash_tok_s", "speedup", "mean_tau"] {
            assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
        }
        assert!(v["acceptance_by_position"].is_array());
        assert_eq!(v["rows"][1]["id"], "y");
    }
}
