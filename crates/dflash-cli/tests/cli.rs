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
    Command::new(env!("CARGO_BIN_EXE_dflash")).args(args).output().unwrap()
}

#[test]
fn generate_json_reports_tokens_text_and_timings() {
    let c = tiny_config(Arch::Qwen2);
    let path = tmp("json").join("tiny.gguf");
    std::fs::write(&path, write_gguf(&c, &random_weights(&c, 3), GgmlType::Q8_0)).unwrap();
    let p = path.to_str().unwrap();
    let out = dflash(&["generate", "--model", p, "--chat", "say the hello", "--max-new-tokens", "6", "--temperature", "0.7", "--seed", "3", "--device", "cpu", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let toks = v["tokens"].as_array().unwrap();
    assert!(!toks.is_empty() && toks.len() <= 6);
    assert!(v["text"].is_string());
    assert!(v["prompt_tokens"].as_u64().unwrap() > 10);
    for k in ["load_s", "prefill_s", "decode_s", "prefill_tok_s", "decode_tok_s"] {
        assert!(v["timings"][k].is_number(), "timings.{k}");
    }
    // The same seed gives the same tokens; the streamed text equals the JSON text.
    let again = dflash(&["generate", "--model", p, "--chat", "say the hello", "--max-new-tokens", "6", "--temperature", "0.7", "--seed", "3", "--json"]);
    let w: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["tokens"], w["tokens"]);
    let streamed = dflash(&["generate", "--model", p, "--chat", "say the hello", "--max-new-tokens", "6", "--temperature", "0.7", "--seed", "3"]);
    assert_eq!(String::from_utf8_lossy(&streamed.stdout).trim_end_matches('\n'), v["text"].as_str().unwrap());
}

#[test]
fn a_hugging_face_folder_is_a_model_too() {
    let c = tiny_config(Arch::Llama);
    let dir = tmp("hf");
    write_dir(&dir, &write_hf(&c, &random_weights(&c, 4), safetensors::Dtype::BF16, 2)).unwrap();
    let out = dflash(&["generate", "--model", dir.to_str().unwrap(), "--prompt", "the hello", "--max-new-tokens", "4", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_bad_file_is_a_clear_error() {
    let path = tmp("bad").join("bad.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = dflash(&["generate", "--model", path.to_str().unwrap(), "--prompt", "x", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: file is truncated"), "{err}");
    assert!(!err.contains("panicked"));
}
