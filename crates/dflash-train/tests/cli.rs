//! The `dflash-train` binary end to end on a tiny GGUF target: data, train, export, eval,
//! and typed failures for bad input.

use dflash_core::formats::ggml::GgmlType;
use dflash_core::testutil::{random_weights, tiny_drafter_target, write_gguf};
use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dflash-train"))
        .args(args)
        .output()
        .expect("run dflash-train")
}

#[test]
fn binary_runs_the_whole_pipeline() {
    let dir = std::env::temp_dir().join(format!("dflash-train-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let c = tiny_drafter_target();
    let model = dir.join("tiny.gguf");
    std::fs::write(
        &model,
        write_gguf(&c, &random_weights(&c, 5), GgmlType::Q8_0),
    )
    .unwrap();
    let p = |x: &str| dir.join(x).to_string_lossy().into_owned();
    let m = model.to_string_lossy().into_owned();
    let no_stdlib = p("empty-stdlib");
    std::fs::create_dir_all(&no_stdlib).unwrap();

    let o = run(&[
        "data",
        "--model",
        &m,
        "--out",
        &p("data.jsonl"),
        "--prompts",
        "12",
        "--max-new-tokens",
        "24",
        "--batch",
        "6",
        "--stdlib",
        &no_stdlib,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(p("data.jsonl"))
            .unwrap()
            .lines()
            .count(),
        12
    );

    let o = run(&[
        "train",
        "--model",
        &m,
        "--data",
        &p("data.jsonl"),
        "--out",
        &p("run"),
        "--layers",
        "1",
        "--block",
        "4",
        "--steps",
        "6",
        "--seqs-per-step",
        "2",
        "--anchors",
        "8",
        "--checkpoint-every",
        "3",
        "--holdout",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["step"], 6);

    let o = run(&["export", "--run", &p("run"), "--out", &p("drafter")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let prompts = p("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": \"a\", \"chat\": \"Write a poem.\"}\n{\"prompt\": \"hello\"}\n",
    )
    .unwrap();
    let o = run(&[
        "eval",
        "--model",
        &m,
        "--drafter",
        &p("drafter"),
        "--prompts",
        &prompts,
        "--max-new-tokens",
        "12",
        "--check-plain",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rep["prompts"], 2);
    assert_eq!(rep["block"], 4);
    assert!(rep["mean_tau"].as_f64().unwrap() >= 1.0);
    assert!(rep["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["lossless"] == true));

    // Bad input: a prompt line without `chat`/`prompt`, a corrupt data file, a missing run.
    std::fs::write(&prompts, "{\"id\": 1}\n").unwrap();
    let o = run(&[
        "eval",
        "--model",
        &m,
        "--drafter",
        &p("drafter"),
        "--prompts",
        &prompts,
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("prompt file line 1"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::write(p("bad.jsonl"), "{\"id\": \"x\"}\n").unwrap();
    let o = run(&[
        "train",
        "--model",
        &m,
        "--data",
        &p("bad.jsonl"),
        "--out",
        &p("run2"),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("bad data"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&["export", "--run", &p("nothing"), "--out", &p("d2")]);
    assert!(!o.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
