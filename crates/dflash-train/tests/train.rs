//! The whole trainer on a tiny synthetic target: self-distilled data through the chat
//! template, a training run whose loss falls, a resume that continues the same run, an
//! export that the engine loads, and a trained drafter whose tau on its own prompts beats
//! a random drafter's while every output stays equal to plain decoding.

use dflash_core::cpu::CpuModel;
use dflash_core::drafter::{load_drafter_dir, CpuDrafter, DrafterPrecision};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_dir, write_drafter, write_gguf, DrafterSpec,
};
use dflash_train::data::{distill, read_samples, DataOptions};
use dflash_train::eval::evaluate;
use dflash_train::target::Target;
use dflash_train::train::{train, Init, TrainConfig};

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dflash-train-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tiny runs' settings: one layer, blocks of 8, 30 steps of 4 sequences.
fn tiny_train_config(vocab_size: usize) -> TrainConfig {
    TrainConfig {
        layers: 1,
        block_size: 8,
        gamma: 4.0,
        lr: 1e-2,
        warmup_frac: 0.05,
        weight_decay: 0.01,
        steps: 30,
        seqs_per_step: 4,
        anchors_per_seq: 16,
        max_seq_len: 256,
        checkpoint_every: 10,
        mask_token_id: vocab_size as u32 - 1,
        seed: 3,
        grad_clip: 1.0,
        dflash2: None,
        sampled_head: None,
        stop_at: None,
    }
}

#[test]
fn tiny_run_learns_and_exports_a_loadable_drafter() {
    let c = tiny_drafter_target();
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 5), GgmlType::Q8_0)).unwrap();
    let target = Target::new(&m.weights, &candle_core::Device::Cpu).unwrap();
    let dir = tmp("run");
    // Data: 24 short prompts answered by the target, resumable.
    let mut prompts = dflash_train::prompts::writing_prompts();
    prompts.truncate(24);
    let data = dir.join("data.jsonl");
    let opts = DataOptions {
        batch: 8,
        max_new_tokens: 40,
        max_prompt_tokens: 160,
    };
    let bar = indicatif::ProgressBar::hidden();
    assert_eq!(
        distill(&m, &target, &prompts[..16], &data, &opts, &bar).unwrap(),
        16
    );
    // A cut last line is dropped and the rest resumes.
    let text = std::fs::read_to_string(&data).unwrap();
    std::fs::write(&data, &text[..text.len() - 10]).unwrap();
    assert_eq!(
        distill(&m, &target, &prompts, &data, &opts, &bar).unwrap(),
        9
    );
    let samples = read_samples(&data).unwrap();
    assert_eq!(samples.len(), 24);
    assert!(samples.iter().all(|s| !s.response_ids.is_empty()));

    // Train 60 steps, interrupted at 30 and resumed.
    let run = dir.join("drafter-run");
    let mut tc = tiny_train_config(c.vocab_size);
    train(&target, &samples, &run, &tc, Init::Random, true).unwrap();
    // An interruption after the checkpoint: the lines of steps it logged but did not
    // keep are dropped on resume (they run again).
    let log_path = run.join("train.log.jsonl");
    let mut text = std::fs::read_to_string(&log_path).unwrap();
    text.push_str("{\"step\": 31, \"loss\": 9.0}\n{\"step\": 32, \"loss\": 9.0}\n");
    std::fs::write(&log_path, text).unwrap();
    tc.steps = 300;
    let last = train(&target, &samples, &run, &tc, Init::Random, true).unwrap();
    assert_eq!(last.step, 300);
    let log: Vec<serde_json::Value> = std::fs::read_to_string(run.join("train.log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(log.len(), 300, "one log line per step across the resume");
    assert!(log.iter().enumerate().all(|(i, r)| r["step"] == i + 1));
    let mean = |xs: &[serde_json::Value]| {
        xs.iter().map(|r| r["loss"].as_f64().unwrap()).sum::<f64>() / xs.len() as f64
    };
    let (first, end) = (mean(&log[..5]), mean(&log[295..]));
    assert!(end < 0.8 * first, "loss fell from {first} to only {end}");
    // A different block size in the same run directory is refused.
    let bad = TrainConfig {
        block_size: 4,
        ..tc.clone()
    };
    assert!(train(&target, &samples, &run, &bad, Init::Random, true).is_err());
    // So is any other setting but the step count, named, and nothing of the run is lost.
    let other_lr = TrainConfig {
        lr: 2e-2,
        steps: 310,
        ..tc.clone()
    };
    let err = train(&target, &samples, &run, &other_lr, Init::Random, true).unwrap_err();
    assert!(
        matches!(&err, dflash_train::TrainError::Checkpoint(m) if m.contains("lr 0.01 (now 0.02)")),
        "{err}"
    );
    let lines = std::fs::read_to_string(run.join("train.log.jsonl")).unwrap();
    assert_eq!(
        lines.lines().count(),
        300,
        "the refused resume trained nothing"
    );
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("checkpoint.json")).unwrap())
            .unwrap();
    assert_eq!(state["step"], 300);

    // A run stopped early (stop_at, `--stop-at`) and resumed with another step count is
    // reproduced bit for bit by stopping where it was resumed: the schedule spans the
    // step count of each part (here 12 steps on a 20-step schedule, then 8 on a 16-step
    // one), the sampled head's draws and the batches follow the step.
    let parts = |dir: &std::path::Path, at: usize| {
        let sampled = tc.sampled_head.or(Some(dflash_train::train::SampledHead {
            negatives: 8,
            full_every: 4,
        }));
        for (steps, stop_at) in [(20, Some(at)), (16, None)] {
            let part = TrainConfig {
                steps,
                stop_at,
                sampled_head: sampled,
                ..tc.clone()
            };
            train(&target, &samples, dir, &part, Init::Random, true).unwrap();
        }
        std::fs::read(dir.join("checkpoint.safetensors")).unwrap()
    };
    let (again, other) = (
        parts(&dir.join("parts-a"), 12),
        parts(&dir.join("parts-b"), 12),
    );
    assert_eq!(again, other, "the same parts give the same weights");
    assert_ne!(
        again,
        parts(&dir.join("parts-c"), 10),
        "the stop step matters"
    );

    // A sampled head: the softmax over the responses' tokens and 8 random ids, the whole
    // vocabulary every 4th step; its loss falls too.
    let sampled_run = dir.join("sampled-run");
    let sampled = TrainConfig {
        steps: 120,
        sampled_head: Some(dflash_train::train::SampledHead {
            negatives: 8,
            full_every: 4,
        }),
        ..tc.clone()
    };
    train(
        &target,
        &samples,
        &sampled_run,
        &sampled,
        Init::Random,
        true,
    )
    .unwrap();
    let slog: Vec<serde_json::Value> = std::fs::read_to_string(sampled_run.join("train.log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let in_responses: std::collections::BTreeSet<u32> = samples
        .iter()
        .flat_map(|s| s.response_ids.clone())
        .collect();
    for r in &slog {
        let step = r["step"].as_u64().unwrap();
        match r["head_rows"].as_u64() {
            None => assert_eq!(step % 4, 0, "step {step} ran the whole vocabulary"),
            Some(rows) => {
                assert_ne!(step % 4, 0, "step {step} should run the whole vocabulary");
                assert!(rows >= in_responses.len() as u64 && rows <= in_responses.len() as u64 + 8);
            }
        }
    }
    let full_loss = |xs: &[serde_json::Value]| {
        let full: Vec<_> = xs
            .iter()
            .filter(|r| r["head_rows"].is_null())
            .cloned()
            .collect();
        mean(&full)
    };
    let (first, end) = (full_loss(&slog[..20]), full_loss(&slog[100..]));
    assert!(
        end < 0.9 * first,
        "whole-vocabulary loss fell from {first} to only {end}"
    );

    // Export, load in the engine, and compare with a random drafter of the same shape.
    let out = dir.join("exported");
    dflash_train::export::export(&run, &out).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["architectures"][0], "DFlashDraftModel");
    assert_eq!(
        cfg["dflash_config"]["target_layer_ids"],
        serde_json::json!([3])
    );
    let trained = load_drafter_dir(&out, DrafterPrecision::Q8).unwrap();
    let rand_dir = dir.join("random");
    let spec = DrafterSpec {
        layers: 1,
        block_size: 8,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: c.vocab_size as u32 - 1,
        seed: 9,
    };
    write_dir(&rand_dir, &write_drafter(&c, &spec)).unwrap();
    let random = load_drafter_dir(&rand_dir, DrafterPrecision::Q8).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let eval_prompts: Vec<(String, Vec<u32>)> = samples
        .iter()
        .take(8)
        .map(|s| (s.id.clone(), s.prompt_ids.clone()))
        .collect();
    let t = evaluate(
        &m,
        &cpu,
        &CpuDrafter::new(&trained),
        &eval_prompts,
        8,
        32,
        true,
        |_| {},
    )
    .unwrap();
    let r = evaluate(
        &m,
        &cpu,
        &CpuDrafter::new(&random),
        &eval_prompts,
        8,
        32,
        true,
        |_| {},
    )
    .unwrap();
    assert!(
        t.rows
            .iter()
            .chain(&r.rows)
            .all(|row| row.lossless == Some(true)),
        "speculative output differs from plain"
    );
    eprintln!(
        "tau trained {:.2} vs random {:.2}; acceptance {:?}",
        t.mean_tau, r.mean_tau, t.acceptance_by_position
    );
    assert!(
        t.mean_tau > r.mean_tau + 1.0,
        "trained tau {} vs random {}",
        t.mean_tau,
        r.mean_tau
    );
    // The prompts run in parallel: each row, and the sums in the prompts' order, are those
    // of each prompt evaluated alone.
    let (mut taus, mut steps) = (0.0, 0usize);
    for (p, row) in eval_prompts.iter().zip(&t.rows) {
        let one = evaluate(
            &m,
            &cpu,
            &CpuDrafter::new(&trained),
            std::slice::from_ref(p),
            8,
            32,
            false,
            |_| {},
        )
        .unwrap();
        let alone = &one.rows[0];
        assert_eq!(
            (&alone.id, alone.tokens, alone.steps, alone.tau),
            (&row.id, row.tokens, row.steps, row.tau)
        );
        taus += one.mean_tau * one.rows[0].steps as f64;
        steps += one.rows[0].steps;
    }
    assert!((taus / steps as f64 - t.mean_tau).abs() < 1e-9);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--init-from-target`: the drafter's layer is the target's top layer, with a llama
/// GGUF's interleaved Q/K rows put back in the neox (Hugging Face) order.
#[test]
fn init_from_target_copies_the_top_layers_in_neox_order() {
    use dflash_core::config::Arch;
    use dflash_core::drafter::DrafterConfig;
    use dflash_core::testutil::tiny_config;
    let c = tiny_config(Arch::Llama);
    let w = random_weights(&c, 8);
    let m = load_gguf(&write_gguf(&c, &w, GgmlType::F32)).unwrap();
    let cfg = dflash_train::train::drafter_config(&c, 1, 4, 5);
    let text = dflash_train::train::drafter_file(&c, &cfg).to_json_pretty();
    let dc = DrafterConfig::from_json(&text).unwrap();
    let p =
        dflash_train::draft_model::DraftParams::init(&dc, &candle_core::Device::Cpu, 1).unwrap();
    dflash_train::train::init_from_target(&p, &m.weights, &dc).unwrap();
    let top = c.num_layers - 1;
    let get = |n: &str| {
        p.vars[n]
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    // Equal up to the q8 repacking of the loader (a wrong row order is off by ~0.2).
    let close = |a: Vec<f32>, b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 5e-3);
    assert!(close(
        get("layers.0.self_attn.q_proj.weight"),
        &w[&format!("blk.{top}.attn_q.weight")].1
    ));
    assert!(close(
        get("layers.0.self_attn.k_proj.weight"),
        &w[&format!("blk.{top}.attn_k.weight")].1
    ));
    assert!(close(
        get("layers.0.mlp.down_proj.weight"),
        &w[&format!("blk.{top}.ffn_down.weight")].1
    ));
    // fc selects the last tap.
    let fc = get("fc.weight");
    let h = c.hidden_size;
    assert_eq!(fc.iter().filter(|&&x| x == 1.0).count(), h);
    assert_eq!(fc[(h - 1) * h + h - 1], 1.0);
}

/// The quantized CPU engine answers like the plain generation loop on the same engine:
/// the same greedy tokens, each answer ending at (and keeping) its first stop token.
#[test]
fn the_quantized_engine_answers_as_plain_greedy_generation() {
    use dflash_core::cpu::CpuKernels;
    use dflash_core::generate::{generate_cpu, GenerateRequest};
    use dflash_train::data::Answerer;
    let c = tiny_drafter_target();
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 5), GgmlType::Q8_0)).unwrap();
    let cpu = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    let prompts: Vec<Vec<u32>> = dflash_train::prompts::writing_prompts()[..4]
        .iter()
        .map(|p| m.chat_ids(None, &p.text).unwrap())
        .collect();
    let is_stop = |t: u32| m.tokenizer.is_stop(t);
    let answers = cpu.answer(&prompts, 24, &is_stop).unwrap();
    for (p, a) in prompts.iter().zip(&answers) {
        let req = GenerateRequest {
            prompt_ids: p.clone(),
            max_new_tokens: 24,
            sampling: Default::default(),
            stop_strings: vec![],
            context: p.len() + 32,
            interrupt: Default::default(),
            grammar: None,
        };
        let plain = generate_cpu(&cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap();
        let stop_at = a.iter().position(|&t| is_stop(t));
        assert_eq!(
            stop_at.map_or(a.len(), |i| i + 1),
            a.len(),
            "ends at its first stop"
        );
        assert_eq!(
            &a[..stop_at.unwrap_or(a.len())],
            &plain.tokens[..stop_at.unwrap_or(a.len())]
        );
        assert!(stop_at.is_some() || a.len() == 24);
    }
}

/// The draft vocabulary: the stop tokens first, then the ids most frequent in the
/// responses, then in the prompts, then the lowest ids; ascending in the file.
#[test]
fn the_draft_vocabulary_ranks_response_ids_first() {
    use dflash_train::data::{draft_vocab, Sample};
    let sample = |prompt: Vec<u32>, response: Vec<u32>| Sample {
        id: "s".into(),
        source: "test".into(),
        prompt_ids: prompt,
        response_ids: response,
    };
    let samples = [
        sample(vec![40, 40, 41], vec![7, 7, 7, 9, 9, 30]),
        sample(vec![40, 42], vec![30, 30, 30, 30, 9]),
    ];
    let ids = |size| {
        draft_vocab(&samples, 50, size, &[2])
            .unwrap()
            .ids()
            .to_vec()
    };
    // 2 (stop), then 30 (5 times), 7 (3), 9 (3), then prompts' 40, 41, 42, then 0, 1, 3.
    assert_eq!(ids(2), vec![2, 30]);
    assert_eq!(ids(4), vec![2, 7, 9, 30]);
    assert_eq!(ids(6), vec![2, 7, 9, 30, 40, 41]);
    assert_eq!(ids(10), vec![0, 1, 2, 3, 7, 9, 30, 40, 41, 42]);
    assert_eq!(ids(1000).len(), 50, "at most the vocabulary");
}

#[test]
fn the_head_by_candle_ops_gives_the_fused_ops_loss_and_hits() {
    // The head path CUDA runs (candle's own ops, the argmax left on the device until
    // the step settles it), run here on the CPU against the fused CPU op on one
    // sequence: the same loss within f32 rounding, the same counts and hits, and a
    // gradient that reaches the drafter's weights.
    use dflash_train::draft_model::{DraftParams, DraftTrainer, SeqBatch};
    let c = tiny_drafter_target();
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 5), GgmlType::Q8_0)).unwrap();
    let dev = candle_core::Device::Cpu;
    let target = Target::new(&m.weights, &dev).unwrap();
    let tc = tiny_train_config(c.vocab_size);
    let dcfg = dflash_train::train::run_drafter_config(&target.config, &tc);
    let params = DraftParams::init(&dcfg, &dev, 3).unwrap();
    let mut trainer =
        DraftTrainer::new(dcfg.clone(), &target.embed, &target.lm_head, 4.0, 128).unwrap();
    let tokens: Vec<u32> = (0..40u32)
        .map(|i| (i * 7 + 3) % (c.vocab_size as u32 - 1))
        .collect();
    let taps = target.taps_of(&tokens, &dcfg.target_layer_ids).unwrap();
    let anchors = [3usize, 10, 17, 25];
    let batch = SeqBatch {
        taps: &taps,
        tokens: &tokens,
        anchors: &anchors,
        loss_from: 5,
        head: None,
    };
    assert!(trainer.fused_head, "the CPU's default is the fused op");
    let fused = trainer.sequence_loss(&params, &batch).unwrap();
    trainer.fused_head = false;
    let mut ops = trainer.sequence_loss(&params, &batch).unwrap();
    assert!(fused.pending.is_none() && ops.pending.is_some());
    assert!(
        ops.correct.iter().all(|&n| n == 0),
        "nothing counted before settling"
    );
    ops.settle().unwrap();
    assert!(ops.pending.is_none());
    assert_eq!(fused.counts, ops.counts);
    assert!(fused.counts.iter().sum::<usize>() >= 20);
    assert_eq!(fused.correct, ops.correct);
    let (a, b) = (
        fused.weighted_nll.to_scalar::<f32>().unwrap(),
        ops.weighted_nll.to_scalar::<f32>().unwrap(),
    );
    assert!(
        a > 0.0 && (a - b).abs() <= 1e-4 * a,
        "fused {a} against candle's ops {b}"
    );
    let grads = ops.weighted_nll.backward().unwrap();
    let reached = params
        .all()
        .iter()
        .filter(|(_, v)| grads.get(v.as_tensor()).is_some())
        .count();
    assert!(
        reached >= params.all().len() / 2,
        "{reached} of {} weights",
        params.all().len()
    );
}
