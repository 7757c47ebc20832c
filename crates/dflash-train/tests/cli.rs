//! The `dflash-train` binary end to end on a tiny GGUF target: data, train, export, eval,
//! and typed failures for bad input.

use dflash_core::config::ModelConfig;
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

    let o = train_tiny(&m, &p("data.jsonl"), &p("run"), 6, &[]);
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

    // The held-out samples' own prompt ids: the data's last two, lossless, by their ids.
    let eval_samples = |last: &str| {
        run(&[
            "eval",
            "--model",
            &m,
            "--drafter",
            &p("drafter"),
            "--samples",
            &p("data.jsonl"),
            "--last",
            last,
            "--max-new-tokens",
            "8",
            "--check-plain",
        ])
    };
    let o = eval_samples("2");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let data = std::fs::read_to_string(p("data.jsonl")).unwrap();
    let last_ids: Vec<serde_json::Value> = data
        .lines()
        .skip(10)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].clone())
        .collect();
    let rows = rep["rows"].as_array().unwrap();
    assert_eq!(
        rows.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        last_ids
    );
    assert!(rows.iter().all(|r| r["lossless"] == true));
    // More samples than the file holds: a usage error.
    let o = eval_samples("13");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("usage: --last 13"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

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
    bad_inputs_lose_nothing(&dir, &m);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dflash-train train` of a one-layer, block-4 drafter on the tiny model `m`.
fn train_tiny(
    m: &str,
    data: &str,
    out: &str,
    steps: usize,
    extra: &[&str],
) -> std::process::Output {
    let steps = steps.to_string();
    let mut args = vec![
        "train",
        "--model",
        m,
        "--data",
        data,
        "--out",
        out,
        "--layers",
        "1",
        "--block",
        "4",
        "--steps",
        &steps,
        "--seqs-per-step",
        "2",
        "--anchors",
        "8",
        "--checkpoint-every",
        "3",
        "--holdout",
        "2",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn stderr_of(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The bad inputs of a training run, each refused with its typed error after the whole
/// pipeline ran in `dir` on model `m`: the run's checkpoint and log are what they were.
fn bad_inputs_lose_nothing(dir: &std::path::Path, m: &str) {
    let p = |x: &str| dir.join(x).to_string_lossy().into_owned();
    let before = (
        std::fs::read(p("run/checkpoint.safetensors")).unwrap(),
        std::fs::read(p("run/train.log.jsonl")).unwrap(),
    );
    let train = |data: &str, extra: &[&str]| train_tiny(m, data, &p("run"), 8, extra);
    // A corrupt line in the middle of the data.
    let text = std::fs::read_to_string(p("data.jsonl")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[4] = "{\"id\": \"cut\", \"prompt_ids\": [1, 2";
    std::fs::write(p("corrupt.jsonl"), lines.join("\n") + "\n").unwrap();
    let e = stderr_of(&train(&p("corrupt.jsonl"), &[]));
    assert!(e.contains("bad data") && e.contains("line 5"), "{e}");
    // A resume whose settings differ from the checkpoint's.
    let e = stderr_of(&train(&p("data.jsonl"), &["--lr", "0.001"]));
    assert!(
        e.contains("bad checkpoint") && e.contains("lr 0.0006 (now 0.001)"),
        "{e}"
    );
    let e = stderr_of(&train(&p("data.jsonl"), &["--sampled-head", "16"]));
    assert!(e.contains("sampled_head null"), "{e}");
    assert_eq!(
        before,
        (
            std::fs::read(p("run/checkpoint.safetensors")).unwrap(),
            std::fs::read(p("run/train.log.jsonl")).unwrap(),
        ),
        "a refused run changed the checkpoint or the log"
    );
    // A drafter exported for another target (one more layer, so other taps).
    let other = ModelConfig {
        num_layers: 7,
        ..tiny_drafter_target()
    };
    let other_model = p("other.gguf");
    std::fs::write(
        &other_model,
        write_gguf(&other, &random_weights(&other, 6), GgmlType::Q8_0),
    )
    .unwrap();
    std::fs::write(p("one.jsonl"), "{\"chat\": \"Write a poem.\"}\n").unwrap();
    let eval = |model: &str, prompts: &str| {
        run(&[
            "eval",
            "--model",
            model,
            "--drafter",
            &p("drafter"),
            "--prompts",
            prompts,
        ])
    };
    let o = eval(&other_model, &p("one.jsonl"));
    assert!(!o.status.success());
    assert!(
        stderr_of(&o).contains("num_target_layers"),
        "{}",
        stderr_of(&o)
    );
    // A prompt longer than the target's context (256 positions).
    let long = format!("{{\"prompt\": \"{}\"}}\n", "hello world ".repeat(400));
    std::fs::write(p("long.jsonl"), long).unwrap();
    let o = eval(m, &p("long.jsonl"));
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("context"), "{}", stderr_of(&o));
}
