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

/// The tiny Qwen2 model (Q8_0, seed 3) written to a test folder.
fn tiny_qwen2_file(name: &str) -> std::path::PathBuf {
    let c = tiny_config(Arch::Qwen2);
    let path = tmp(name).join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 3), GgmlType::Q8_0),
    )
    .unwrap();
    path
}

/// `dflash args`; a bench without `--device` is the GPU bench, as these tests mean it
/// (its default on a software adapter is the CPU engine: `bench_picks_its_device_as_generate_does`).
fn dflash(args: &[&str]) -> std::process::Output {
    let mut all = args.to_vec();
    if args.first() == Some(&"bench") && !args.contains(&"--device") {
        all.extend(["--device", "gpu"]);
    }
    Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(all)
        .output()
        .unwrap()
}

#[test]
fn generate_json_reports_tokens_text_and_timings() {
    let path = tiny_qwen2_file("json");
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
fn gpu_and_reference_devices_generate_the_same_greedy_tokens() {
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
    let (g, c) = (run("gpu"), run("reference"));
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

/// `dflash` with `DFLASH_CPU_KERNEL=kernel`.
fn dflash_with_kernel(kernel: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dflash"))
        .env(dflash_core::cpu::quant_matmul::KERNEL_ENV, kernel)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_cpu_kernel_can_be_forced_and_gives_the_same_tokens() {
    use dflash_core::cpu::quant_matmul::Kernel;
    // Q4_0 and Q8_0 tensors: groups of 32, which the packed kernels take.
    let c = tiny_config(Arch::Llama);
    let path = tmp("kernels").join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 6), GgmlType::Q4_0),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let gen = [
        "generate",
        "--model",
        p,
        "--prompt",
        "one two three",
        "--max-new-tokens",
        "12",
        "--device",
        "cpu",
        "--json",
    ];
    let mut first: Option<serde_json::Value> = None;
    let available = Kernel::available();
    eprintln!(
        "forced kernels: {:?}",
        available.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    for k in &available {
        let out = dflash_with_kernel(k.name(), &gen);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", k.name());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        match &first {
            None => first = Some(v["tokens"].clone()),
            Some(t) => assert_eq!(
                &v["tokens"],
                t,
                "{} against {}",
                k.name(),
                available[0].name()
            ),
        }
        let out = dflash_with_kernel(
            k.name(),
            &[
                "bench",
                "--device",
                "cpu",
                "--model",
                p,
                "--prompt-tokens",
                "8",
                "--decode-tokens",
                "2",
                "--json",
            ],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            v["cpu"]["kernel"],
            k.name(),
            "the bench names the kernel that ran"
        );
    }
    // An unknown kernel, and one this CPU lacks, are usage errors naming it.
    let out = dflash_with_kernel("avx9000", &gen);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("avx9000") && err.contains("no such kernel"),
        "{err}"
    );
    if let Some(k) = Kernel::ALL.iter().find(|k| !available.contains(k)) {
        let out = dflash_with_kernel(k.name(), &gen);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(k.name()) && err.contains("lacks"), "{err}");
    }
}

#[test]
fn cpu_bench_runs_synthetic_shapes_within_the_host_memory() {
    let v = bench_json(&[
        "--device",
        "cpu",
        "--synthetic",
        "test-tiny",
        "--prompt-tokens",
        "12",
        "--decode-tokens",
        "3",
    ]);
    for k in [
        "decode_tok_s",
        "prefill_tok_s",
        "decode_gbps",
        "read_gbps",
        "decode_read_ratio",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    let rows: Vec<u64> = v["pass_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(rows, [1, 2, 4, 8, 16, 32, 64]);
    let costs = v["pass_cost_over_one_row"].as_array().unwrap();
    assert_eq!((costs.len(), costs[0].as_f64()), (7, Some(1.0)));
    assert_eq!(v["memory_budget"]["source"], "MemAvailable");
    // A plan over the budget is refused before anything is allocated, the pair's too.
    for extra in [&[][..], &["--drafter", "synthetic"][..]] {
        let mut args = vec![
            "bench",
            "--device",
            "cpu",
            "--synthetic",
            "qwen3-8b",
            "--memory-budget",
            "1G",
        ];
        args.extend_from_slice(extra);
        let err = usage_error(&args);
        assert!(
            err.contains("host memory") && err.contains("1073741824"),
            "{err}"
        );
    }
}

#[test]
fn cpu_bench_runs_a_synthetic_pair_with_simulated_acceptance() {
    let v = check_simulated_pair(|profile| bench_json(&tiny_pair("cpu", profile, &[])));
    assert_eq!(v["synthetic"]["weights"], "random, made in host memory");
}

/// The tiny synthetic pair's bench on `device` at block 8 with the simulated acceptance
/// `profile`, and `extra` arguments.
fn tiny_pair(
    device: &'static str,
    profile: &'static str,
    extra: &[&'static str],
) -> Vec<&'static str> {
    let mut a = vec![
        "--device",
        device,
        "--synthetic",
        "test-tiny",
        "--drafter",
        "synthetic",
    ];
    a.extend([
        "--prompt-tokens",
        "16",
        "--max-new-tokens",
        "24",
        "--block",
        "8",
    ]);
    a.extend(["--accept-profile", profile]);
    a.extend_from_slice(extra);
    a
}

/// A pair run by `run(profile)` accepts what the profile says and stays lossless: every
/// draft of three slots right (tau above 3, nothing accepted past them), or none.
/// Returns the first run's JSON.
fn check_simulated_pair(run: impl Fn(&'static str) -> serde_json::Value) -> serde_json::Value {
    let v = run("1,1,1");
    assert_eq!(v["acceptance"], "simulated");
    assert_eq!(v["accept_profile"], serde_json::json!([1.0, 1.0, 1.0]));
    assert_eq!(
        v["lossless"], true,
        "the target verifies what the profile drafts"
    );
    assert!(v["mean_tau"].as_f64().unwrap() > 3.0, "{}", v["mean_tau"]);
    assert_eq!(
        v["accepted_by_position"][3], 0,
        "slots past the profile are wrong"
    );
    let none = run("0");
    assert_eq!(none["lossless"], true);
    assert_eq!(
        none["mean_tau"].as_f64(),
        Some(1.0),
        "nothing drafted is right"
    );
    v
}

/// Without `--device` the bench takes what `generate` and `serve` take: the GPU bench on a
/// hardware adapter, the CPU engine's (with a note) where the adapter is a software one
/// or there is none, and the GPU where a GPU-only option asks for it.
#[test]
fn bench_picks_its_device_as_generate_does() {
    let c = tiny_config(Arch::Llama);
    let path = tmp("bench-auto").join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 4), GgmlType::Q4_0),
    )
    .unwrap();
    let args = [
        "bench",
        "--model",
        path.to_str().unwrap(),
        "--decode-tokens",
        "2",
        "--json",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let on_cpu = err.contains("is a software one") || err.contains("no GPU adapter");
    assert_eq!(v["cpu"]["device"] == "cpu", on_cpu, "{err}\n{v}");
    if on_cpu {
        assert!(err.contains("note: "), "{err}");
        // A GPU-only option takes the GPU bench without a note.
        let out = Command::new(env!("CARGO_BIN_EXE_dflash"))
            .args(args)
            .args(["--pipelined", "false"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !err.contains("note: "), "{err}");
    }
}

#[test]
fn cpu_bench_reports_speed_and_bandwidth_and_refuses_gpu_flags() {
    let c = tiny_config(Arch::Llama);
    let path = tmp("bench-cpu").join("tiny.gguf");
    std::fs::write(
        &path,
        write_gguf(&c, &random_weights(&c, 4), GgmlType::Q4_0),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    for device in ["cpu", "reference"] {
        let v = bench_json(&[
            "--device",
            device,
            "--model",
            p,
            "--prompt-tokens",
            "12",
            "--decode-tokens",
            "3",
        ]);
        for k in [
            "decode_tok_s",
            "prefill_tok_s",
            "weight_bytes_per_token",
            "decode_gbps",
            "copy_gbps",
            "decode_copy_ratio",
        ] {
            assert!(v[k].as_f64().unwrap() > 0.0, "{device} {k}");
        }
        assert_eq!(v["cpu"]["device"], device);
        assert!(v["cpu"]["threads"].as_u64().unwrap() >= 1);
    }
    for flag in [
        &["--model", p, "--profile"][..],
        &["--model", p, "--pipelined", "true"],
        &["--model", p, "--fuse-norm", "true"],
        &["--model", p, "--norm-in-residual", "true"],
    ] {
        let mut args = vec!["bench", "--device", "cpu"];
        args.extend_from_slice(flag);
        let err = usage_error(&args);
        assert!(err.contains("for the GPU bench"), "{err}");
    }
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
    let prompts = dir.join("p.jsonl");
    std::fs::write(&prompts, "{\"id\": \"x\", \"prompt\": \"the hello\"}\n{\"id\": \"y\", \"chat\": \"say the hello\"}\n").unwrap();
    // The CPU engine's bench: plain against DFlash on the same prompts, one object per
    // block size, every one lossless (the bench fails otherwise).
    let v = bench_json(&[
        "--device",
        "cpu",
        "--model",
        m,
        "--drafter",
        d.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--max-new-tokens",
        "12",
        "--block",
        "1,4,auto",
    ]);
    let runs = v.as_array().expect("one object per block size");
    assert_eq!(runs.len(), 3);
    for r in runs {
        assert_eq!(r["lossless"], true, "{}", r["block"]);
        assert_eq!(r["rows"].as_array().unwrap().len(), 2);
        assert_eq!(r["cpu"]["device"], "cpu");
        assert!(r["dflash_tok_s"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(runs[0]["mean_tau"], 1.0, "block 1 drafts nothing");
    assert!(
        runs[2]["step_costs"].is_array(),
        "auto measures the step costs"
    );
    // Its steps refine them, and the next prompt starts from the refined costs.
    let refined = runs[2]["step_costs_refined"]
        .as_array()
        .expect("refined costs");
    assert_eq!(
        refined.len(),
        runs[2]["step_costs"].as_array().unwrap().len()
    );
    assert!(
        runs[1]["step_costs_refined"].is_null(),
        "a fixed block has none"
    );
    if gpu {
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
            "--pipelined",
            "true",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["lossless"], true);
        assert_eq!(v["pipelined"], true, "--pipelined true on any adapter");
        for k in ["plain_tok_s", "dflash_tok_s", "speedup", "mean_tau"] {
            assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
        }
        assert!(v["acceptance_by_position"].is_array());
        assert_eq!(v["rows"][1]["id"], "y");
        assert_eq!(v["acceptance"], "measured");
        // Simulated acceptance on the real pair: the plain tokens replayed as drafts.
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
            "--accept-profile",
            "1,1,1",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["lossless"], true);
        assert_eq!(v["acceptance"], "simulated");
        assert_eq!(v["pipelined"], false, "simulated drafts follow each step");
        assert!(v["mean_tau"].as_f64().unwrap() > 1.0);
    }
}

/// `dflash bench` run by the test, its JSON when it succeeded.
fn bench_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = dflash(&all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A failed command's stderr (exit status 1: a typed error, not a panic).
fn usage_error(args: &[&str]) -> String {
    let out = dflash(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.starts_with("error: ") && !err.contains("panicked"),
        "{err}"
    );
    err
}

#[test]
fn synthetic_bench_decodes_and_refuses_what_does_not_fit() {
    if !have_gpu() {
        return;
    }
    let v = bench_json(&[
        "--synthetic",
        "test-tiny",
        "--prompt-tokens",
        "20",
        "--decode-tokens",
        "4",
        "--reps",
        "1",
    ]);
    assert_eq!(v["model"], "synthetic:test-tiny");
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        v["gpu_memory_bytes"]["weights"],
        v["synthetic"]["weight_bytes"]
    );
    // 20 GB of weights against a 1 GiB budget: refused by the plan, in no time.
    let t = std::time::Instant::now();
    let err = usage_error(&[
        "bench",
        "--synthetic",
        "qwen2.5-32b",
        "--drafter",
        "synthetic",
        "--memory-budget",
        "1G",
    ]);
    assert!(err.contains("the budget is 1073741824"), "{err}");
    assert!(t.elapsed().as_secs_f64() < 30.0);
    let err = usage_error(&["bench", "--synthetic", "gpt-9"]);
    assert!(err.contains("qwen3-8b"), "{err}");
}

#[test]
fn accept_profile_bad_values_are_usage_errors() {
    let tiny = [
        "bench",
        "--synthetic",
        "test-tiny",
        "--drafter",
        "synthetic",
    ];
    for (bad, says) in [
        ("1.5", "outside [0, 1]"),
        ("-0.1", "outside [0, 1]"),
        ("0.5,x", "not a number"),
        ("0.5,,1", "not a number"),
        ("nan", "outside [0, 1]"),
        ("1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "15 draft slots"),
    ] {
        let mut args = tiny.to_vec();
        args.extend(["--accept-profile", bad]);
        let err = usage_error(&args);
        assert!(err.contains(says), "{bad}: {err}");
    }
    let err = usage_error(&["bench", "--synthetic", "test-tiny", "--accept-profile", "1"]);
    assert!(err.contains("needs --drafter"), "{err}");
    let err = usage_error(&["bench", "--synthetic", "test-tiny", "--drafter", "some/dir"]);
    assert!(err.contains("`synthetic`"), "{err}");
}

#[test]
fn rounds_decode_every_prompt_again_and_sum_the_times() {
    if !have_gpu() {
        return;
    }
    let run = |rounds: &'static str| {
        bench_json(&[
            "--synthetic",
            "test-tiny",
            "--drafter",
            "synthetic",
            "--limit",
            "2",
            "--prompt-tokens",
            "8",
            "--max-new-tokens",
            "12",
            "--block",
            "4",
            "--accept-profile",
            "1,1",
            "--rounds",
            rounds,
        ])
    };
    let (one, two) = (run("1"), run("2"));
    assert_eq!((&two["rounds"], &two["prompts"]), (&2.into(), &2.into()));
    let rows = two["rows"].as_array().unwrap();
    let round_of = |r: &serde_json::Value| r["round"].as_u64().unwrap();
    assert_eq!(rows.iter().map(round_of).collect::<Vec<_>>(), [0, 0, 1, 1]);
    // Every round decodes the same tokens, plainly and with DFlash (odd rounds DFlash
    // first), and the totals are the rows' sums.
    assert_eq!(two["lossless"], true);
    let sum = |v: &serde_json::Value, key: &str| -> f64 {
        let rows = v["rows"].as_array().unwrap();
        rows.iter().map(|r| r[key].as_f64().unwrap()).sum()
    };
    assert_eq!(
        two["plain_tokens"],
        2 * one["plain_tokens"].as_u64().unwrap()
    );
    assert_eq!(two["steps"], 2 * one["steps"].as_u64().unwrap());
    let plain_s = two["plain_decode_s"].as_f64().unwrap();
    assert!((sum(&two, "plain_decode_s") - plain_s).abs() < 1e-9 * plain_s.max(1.0));
    // Zero rounds is refused by the argument parser (its usage error, exit code 2).
    let out = dflash(&[
        "bench",
        "--synthetic",
        "test-tiny",
        "--drafter",
        "synthetic",
        "--rounds",
        "0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--rounds"), "{err}");
}

#[test]
fn accept_profile_sets_tau_on_a_synthetic_pair() {
    if !have_gpu() {
        return;
    }
    let args = |profile, extra: &[&'static str]| tiny_pair("gpu", profile, extra);
    let v = check_simulated_pair(|profile| bench_json(&args(profile, &[])));
    // The drafter's matrices are kept in 4 bits unless asked otherwise.
    assert_eq!(v["drafter_precision"], "q4");
    let q4_bytes = v["synthetic"]["drafter"]["weight_bytes"].as_u64().unwrap();
    // The random drafter drafting among the first 100 ids: the same simulated run.
    let with_vocab = |n: &'static str| args("1,1,1", &["--synthetic-draft-vocab", n]);
    let v = bench_json(&with_vocab("100"));
    assert_eq!(v["lossless"], true);
    assert_eq!(v["synthetic_draft_vocab"], 100);
    assert!(v["mean_tau"].as_f64().unwrap() > 3.0, "{}", v["mean_tau"]);
    let err = usage_error(&[&["bench"][..], &with_vocab("0")].concat());
    assert!(err.contains("--synthetic-draft-vocab 0"), "{err}");
    // The drafter's matrices in 8 bits: more bytes, the same simulated run; f32 is
    // refused by the GPU with a typed error.
    let v = bench_json(&args("1,1,1", &["--drafter-precision", "q8"]));
    assert_eq!(
        (&v["lossless"], &v["drafter_precision"]),
        (&true.into(), &"q8".into())
    );
    assert!(v["mean_tau"].as_f64().unwrap() > 3.0, "{}", v["mean_tau"]);
    let q8_bytes = v["synthetic"]["drafter"]["weight_bytes"].as_u64().unwrap();
    assert!(q4_bytes < q8_bytes * 3 / 4, "{q4_bytes} vs {q8_bytes}");
    let err = usage_error(&[&["bench"][..], &args("1", &["--drafter-precision", "f32"])].concat());
    assert!(err.contains("no f32 matrices"), "{err}");
}

/// One step of a profile: its dispatches summed by shape give its dispatch count and
/// total, the shares sum to 1, and the whole pass was timed.
fn check_profiled_step(step: &serde_json::Value) {
    let rows = step["by_shape"].as_array().unwrap();
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let count: u64 = rows.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    assert_eq!(count, step["dispatches"].as_u64().unwrap(), "{step}");
    let total: f64 = rows.iter().map(|r| f(&r["total_us"])).sum();
    assert!(
        (total - f(&step["total_us"])).abs() <= 1e-6 * total,
        "{step}"
    );
    let shares: f64 = rows.iter().map(|r| f(&r["share"])).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    // The whole pass was timed (more than a µs, and not past ten times its dispatches).
    let (pass, total) = (f(&step["pass_us"]), f(&step["total_us"]));
    assert!(
        pass > 1.0 && pass < 10.0 * total,
        "{pass} us whole, {total} us summed"
    );
}

#[test]
fn the_profile_counts_every_dispatch_and_times_whole_steps() {
    if !have_gpu() {
        return;
    }
    // The GPU plan (RMSNorm fused into the GEMVs) on whatever adapter this is, and the
    // DFlash step of block 4.
    let v = bench_json(&[
        "--synthetic",
        "test-tiny",
        "--drafter",
        "synthetic",
        "--tuning",
        "gpu",
        "--profile",
        "--profile-block",
        "4",
        "--prompt-tokens",
        "16",
        "--max-new-tokens",
        "8",
        "--block",
        "4",
    ]);
    let p = &v["profile"];
    let (one, block) = (&p["one_row_step"], &p["block_step"]);
    let dispatches = one["dispatches"].as_u64().unwrap();
    assert_eq!(p["block_rows"], 4);
    assert_eq!(block["name"], "DFlash step, block 4");
    // The drafter's dispatches come on top of the target's.
    assert!(block["dispatches"].as_u64().unwrap() > dispatches);
    check_profiled_step(one);
    check_profiled_step(block);
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let ratio = |key: &str| f(&block[key]) / f(&one[key]);
    assert!((f(&p["step_cost_block_over_1"]) - ratio("pass_us")).abs() < 1e-9);
    assert!((f(&p["step_cost_dispatch_sums"]) - ratio("total_us")).abs() < 1e-9);
    // Every dispatch of both steps is in one family row.
    let families = p["families"].as_array().unwrap();
    let sum = |key: &str| -> u64 { families.iter().map(|r| r[key].as_u64().unwrap()).sum() };
    assert_eq!(sum("count_1"), dispatches);
    assert_eq!(sum("count_block"), block["dispatches"].as_u64().unwrap());
    let norms = families.iter().find(|r| r["family"] == "rmsnorm");
    assert!(norms.is_none_or(|r| r["count_1"] == 0), "{norms:?}");
}

/// Runs `dflash args` with stdout a pipe whose reader is gone before anything is
/// written (`dflash ... | head -c0`): (exit status, stderr).
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_quietly_not_in_a_panic() {
    let path = tiny_qwen2_file("pipe");
    let p = path.to_str().unwrap();
    let gen = [
        "generate",
        "--model",
        p,
        "--prompt",
        "hello",
        "--max-new-tokens",
        "4",
        "--device",
        "cpu",
    ];
    for args in [
        vec!["tokenize", "--model", p, "--text", "hello"],
        gen.to_vec(),
        [&gen[..], &["--json"]].concat(),
    ] {
        let (code, err) = with_closed_stdout(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[cfg(unix)]
#[test]
fn a_fifo_as_the_model_is_a_clear_error_not_a_hang() {
    let fifo = tmp("fifo").join("model.gguf");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.map(|s| s.success()).unwrap_or(false) {
        eprintln!("skipping: mkfifo is not available");
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_dflash"))
        .args(["tokenize", "--model", fifo.to_str().unwrap(), "--text", "x"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("dflash hung on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn non_finite_sampling_arguments_are_clear_errors() {
    let path = tiny_qwen2_file("nan");
    for (flag, v) in [
        ("--temperature", "NaN"),
        ("--temperature", "inf"),
        ("--top-p", "NaN"),
        ("--min-p", "-inf"),
    ] {
        let out = dflash(&[
            "generate",
            "--model",
            path.to_str().unwrap(),
            "--prompt",
            "x",
            "--device",
            "cpu",
            &format!("{flag}={v}"),
        ]);
        assert_eq!(out.status.code(), Some(1), "{flag} {v}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("invalid sampling parameters"),
            "{flag} {v}: {err}"
        );
    }
}

/// `dflash plan` of a pair of `fixtures/published/`: its JSON (stdout) and exit status.
fn plan_of(pair: &str, extra: &[&str]) -> (serde_json::Value, Option<i32>, String) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/published")
        .join(pair);
    let (config, drafter) = (dir.join("config.json"), dir.join("drafter.json"));
    let mut args = vec![
        "plan",
        "--config",
        config.to_str().unwrap(),
        "--drafter",
        drafter.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = dflash(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{pair}: {stderr}"));
    (v, out.status.code(), stderr)
}

/// The published pairs users load: each passes validation and gets a plan at 4k and 32k
/// tokens of context; where one does not fit 32 GiB the typed error names the budget.
#[test]
fn published_pairs_validate_and_get_memory_plans() {
    if !have_gpu() {
        return;
    }
    let gib = |x: &serde_json::Value| x.as_u64().unwrap() as f64 / (1u64 << 30) as f64;
    for pair in [
        "qwen3-4b-dflash-b16",
        "qwen3-8b-dflash-b16",
        "llama-3.1-8b-instruct-dflash-b16",
    ] {
        let (v, code, err) = plan_of(pair, &[]);
        assert_eq!(code, Some(0), "{pair}: {err}");
        let plans = v["plans"].as_array().unwrap();
        assert_eq!(plans.len(), 2);
        for p in plans {
            assert_eq!(p["fits"], true);
            let parts = ["weights", "kv_cache", "activations"].map(|k| p[k].as_u64().unwrap());
            assert_eq!(parts.iter().sum::<u64>(), p["total"].as_u64().unwrap());
        }
        // The KV cache grows with the context, the weights do not.
        assert_eq!(plans[0]["weights"], plans[1]["weights"]);
        assert!(gib(&plans[1]["kv_cache"]) > 7.0 * gib(&plans[0]["kv_cache"]));
        assert!((3.0..9.0).contains(&gib(&plans[0]["weights"])), "{pair}");
    }
    // The 30B-A3B mixture: all 128 experts' weights on the GPU (~21 GiB as Q4_K_M
    // repacked), fits 32 GiB at 4k and 32k tokens; the KV of 4 KV heads stays small.
    let (v, code, err) = plan_of("qwen3-coder-30b-a3b-instruct-dflash-b16", &[]);
    assert_eq!(code, Some(0), "{err}");
    let plans = v["plans"].as_array().unwrap();
    assert!(
        (18.0..24.0).contains(&gib(&plans[0]["weights"])),
        "{}",
        plans[0]
    );
    assert!(plans.iter().all(|p| p["fits"] == true));
    assert!(gib(&plans[1]["kv_cache"]) < 4.0);
    // The 9B hybrid: 24 Gated DeltaNet layers keep a fixed state (with its pre-verify
    // copy), so only 8 layers' KV grows with the context.
    let (v, code, err) = plan_of("qwen3.5-9b-dflash-b16", &[]);
    assert_eq!(code, Some(0), "{err}");
    let plans = v["plans"].as_array().unwrap();
    let state = gib(&plans[0]["recurrent_state"]);
    assert!((0.05..0.2).contains(&state), "{state}");
    assert_eq!(plans[0]["recurrent_state"], plans[1]["recurrent_state"]);
    let growth = gib(&plans[1]["kv_cache"]) - gib(&plans[0]["kv_cache"]);
    assert!((1.0..2.0).contains(&growth), "{growth}");
    // 32B in 4 bits fits 32 GiB at 4k tokens, not at 32k.
    let (v, code, err) = plan_of("qwen2.5-32b-instruct-w4a16-dflash2", &[]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(v["plans"][0]["fits"], true);
    assert_eq!(v["plans"][1]["fits"], false);
    assert!(
        err.starts_with("error: ") && err.contains("budget is 34359738368"),
        "{err}"
    );
    // 70B does not fit at all; within the browser's limits the same error.
    for extra in [&[][..], &["--browser-limits", "--context", "4096"]] {
        let (v, code, err) = plan_of("llama-3.3-70b-instruct-w4a16-dflash2", extra);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(v["plans"][0]["fits"], false);
        assert!(err.contains("budget"), "{err}");
    }
    // A larger budget fits it.
    let (v, code, _) = plan_of(
        "llama-3.3-70b-instruct-w4a16-dflash2",
        &["--memory-budget", "80G", "--context", "4096"],
    );
    assert_eq!((code, &v["plans"][0]["fits"]), (Some(0), &true.into()));
}

/// A drafter folder's `draft_vocab.json` puts its rows of the head in `dflash plan`'s
/// drafter weights (as `SyntheticSpec::draft_head_bytes` sizes them); a list made for
/// another vocabulary is an error.
#[test]
fn the_plan_counts_a_drafter_folders_draft_vocabulary() {
    if !have_gpu() {
        return;
    }
    let pair = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/published/qwen3-4b-dflash-b16");
    let dir = tmp("plan-draft-vocab");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(pair.join("drafter.json"), dir.join("config.json")).unwrap();
    let target = std::fs::read_to_string(pair.join("config.json")).unwrap();
    let drafter = std::fs::read_to_string(pair.join("drafter.json")).unwrap();
    let spec = dflash_core::synthetic::SyntheticSpec::from_configs("t", &target, &drafter).unwrap();
    let vocab = spec.config.vocab_size;
    let plan = |dir: &std::path::Path| {
        let config = pair.join("config.json");
        let args = [
            "plan",
            "--config",
            config.to_str().unwrap(),
            "--drafter",
            dir.to_str().unwrap(),
            "--json",
        ];
        let out = dflash(&args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (
            serde_json::from_slice::<serde_json::Value>(&out.stdout).ok(),
            err,
        )
    };
    let (without, err) = plan(&dir);
    let without = without.unwrap_or_else(|| panic!("{err}"));
    assert!(without["draft_vocab"].is_null());
    let ids = dflash_core::drafter::DraftVocab::new((0..1000).collect(), vocab).unwrap();
    let vocab_file = dir.join(dflash_core::drafter::DRAFT_VOCAB_FILE);
    std::fs::write(&vocab_file, ids.to_json(vocab, "test")).unwrap();
    let (with, err) = plan(&dir);
    let with = with.unwrap_or_else(|| panic!("{err}"));
    assert_eq!(with["draft_vocab"], 1000);
    let weights = |v: &serde_json::Value| v["plans"][0]["drafter_weights"].as_u64().unwrap();
    assert_eq!(
        weights(&with) - weights(&without),
        spec.draft_head_bytes(1000)
    );
    std::fs::write(&vocab_file, ids.to_json(vocab + 1, "test")).unwrap();
    let (_, err) = plan(&dir);
    assert!(
        err.contains("draft_vocab.json") && err.contains("vocabulary"),
        "{err}"
    );
}

#[test]
fn zero_prompt_or_decode_tokens_are_usage_errors() {
    // `bench --prompt-tokens 0` panicked in the CPU engine's argmax (found by
    // scripts/hostile-battery.py).
    for (flag, device) in [
        ("--prompt-tokens", "cpu"),
        ("--decode-tokens", "cpu"),
        ("--prompt-tokens", "gpu"),
    ] {
        let err = usage_error(&[
            "bench",
            "--synthetic",
            "test-tiny",
            "--device",
            device,
            flag,
            "0",
        ]);
        assert!(err.contains("at least 1"), "{err}");
    }
}
