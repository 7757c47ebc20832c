//! DFlash2 training (`--arch dflash2`) on a tiny synthetic target: the trainer's forward
//! is the engine's (the CPU reference), a DFlash2 drafter grown from a DFlash one starts
//! as the same drafter, a run teaches the selector, and the export carries the tensor
//! names and config fields DFlash2 loaders read.

use candle_core::{Device, Tensor};
use dflash_core::cpu::CpuModel;
use dflash_core::drafter::{
    load_drafter_dir, CpuDrafter, DFlash2Config, DrafterConfig, DrafterPrecision, DrafterWeights,
};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::{load_gguf, LoadedModel};
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_dflash2_drafter, DFlash2Spec, DrafterSpec,
};
use dflash_train::data::{distill, read_samples, DataOptions, Sample};
use dflash_train::draft_model::{param_shapes, DraftParams, DraftTrainer};
use dflash_train::eval::evaluate;
use dflash_train::target::Target;
use dflash_train::train::{drafter_file, run_drafter_config, train, Init, TrainConfig};

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dflash-train-d2-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sizes() -> DFlash2Config {
    DFlash2Config {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 32,
        selector_top_k: 4,
    }
}

fn config(vocab: u32, dflash2: Option<DFlash2Config>, steps: usize, lr: f64) -> TrainConfig {
    TrainConfig {
        layers: 1,
        block_size: 8,
        gamma: 4.0,
        lr,
        warmup_frac: 0.05,
        weight_decay: 0.01,
        steps,
        seqs_per_step: 4,
        anchors_per_seq: 16,
        max_seq_len: 256,
        checkpoint_every: 50,
        mask_token_id: vocab - 1,
        seed: 3,
        grad_clip: 1.0,
        dflash2,
        sampled_head: None,
        stop_at: None,
    }
}

/// The tiny target and 24 self-distilled samples.
fn setup(dir: &std::path::Path) -> (LoadedModel, Target, Vec<Sample>) {
    let c = tiny_drafter_target();
    let m = load_gguf(&dflash_core::testutil::write_gguf(
        &c,
        &random_weights(&c, 5),
        GgmlType::Q8_0,
    ))
    .unwrap();
    let target = Target::new(&m.weights, &Device::Cpu).unwrap();
    let mut prompts = dflash_train::prompts::writing_prompts();
    prompts.truncate(24);
    let data = dir.join("data.jsonl");
    let opts = DataOptions {
        batch: 8,
        max_new_tokens: 40,
        max_prompt_tokens: 160,
    };
    distill(
        &m,
        &target,
        &prompts,
        &data,
        &opts,
        &indicatif::ProgressBar::hidden(),
    )
    .unwrap();
    let samples = read_samples(&data).unwrap();
    (m, target, samples)
}

fn log_of(run: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("train.log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The trainer's DFlash2 block forward (convolutions with random kernels and deltas)
/// equals the CPU reference's `forward_block` on the same weights. The reference
/// quantizes the drafter's matrices to 8 bits at load, so the trainer runs here on those
/// dequantized values too: what is left is float summation order, tolerance 1e-4
/// (relative L2). Control: with the convolutions reset to the identity the difference is
/// orders of magnitude larger, so the comparison sees the convolutions.
#[test]
fn dflash2_forward_equals_the_cpu_reference() {
    let c = tiny_drafter_target();
    let m = load_gguf(&dflash_core::testutil::write_gguf(
        &c,
        &random_weights(&c, 5),
        GgmlType::Q8_0,
    ))
    .unwrap();
    let target = Target::new(&m.weights, &Device::Cpu).unwrap();
    let tc = config(c.vocab_size as u32, Some(sizes()), 1, 0.0);
    let cfg = run_drafter_config(&c, &tc);
    let cfg_json = drafter_file(&c, &cfg).to_json_pretty();
    let dc = DrafterConfig::from_json(&cfg_json).unwrap();
    assert_eq!(dc, cfg);
    assert!(dc.dflash2.is_some());
    let p = DraftParams::init(&dc, &Device::Cpu, 11).unwrap();
    // Random DFlash2 tensors (their initial values are the identity and zeros).
    let mut rng = dflash_core::rng::Rng(4);
    for (name, shape) in param_shapes(&dc) {
        if name.contains("_conv.") || name.starts_with("candidate_selector") {
            let n: usize = shape.iter().product();
            let scale = if name.ends_with("base_kernel") {
                0.7
            } else {
                0.2
            };
            let v: Vec<f32> = (0..n)
                .map(|_| (rng.uniform() * 2.0 - 1.0) * scale)
                .collect();
            p.vars[&name]
                .set(&Tensor::from_vec(v, shape, &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    // The engine's drafter from these tensors (f32 safetensors), then the trainer on the
    // engine's dequantized matrices.
    let weights = DrafterWeights::load(
        &cfg_json,
        vec![("model.safetensors", &f32_safetensors(&p))],
        DrafterPrecision::Q8,
    )
    .unwrap();
    let dq = dequantized(&weights);
    assert_eq!(p.take_from(&dq).unwrap(), dq.len());
    let cpu = CpuDrafter::new(&weights);

    let trainer = DraftTrainer::new(dc.clone(), &target.embed, &target.lm_head, 4.0, 64).unwrap();
    let (h, b) = (dc.hidden_size, dc.block_size);
    let l = 20;
    let taps_v: Vec<f32> = (0..l * dc.n_taps() * h)
        .map(|_| rng.uniform() * 2.0 - 1.0)
        .collect();
    let taps = Tensor::from_vec(taps_v.clone(), (l, dc.n_taps() * h), &Device::Cpu).unwrap();
    let tokens: Vec<u32> = (0..l as u32)
        .map(|i| (i * 7 + 3) % (c.vocab_size as u32 - 1))
        .collect();
    let anchors = [5usize, 11];
    let embed: Vec<f32> = target.embed.flatten_all().unwrap().to_vec1().unwrap();
    let reference = |cpu: &CpuDrafter, an: usize| -> Vec<f32> {
        let mut ctx = cpu.new_context();
        cpu.extend_context(&mut ctx, &taps_v[..an * dc.n_taps() * h]);
        let block: Vec<f32> = (0..b)
            .flat_map(|k| {
                let t = if k == 0 { tokens[an] } else { dc.mask_token_id } as usize;
                embed[t * h..(t + 1) * h].to_vec()
            })
            .collect();
        cpu.forward_block(&mut ctx, &block)
    };
    let rel = |x: &[f32], y: &[f32]| -> f64 {
        let d: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let n: f64 = y.iter().map(|b| (*b as f64).powi(2)).sum();
        (d / n).sqrt()
    };
    let ours = trainer
        .final_norm(
            &p,
            &trainer.block_hidden(&p, &taps, &tokens, &anchors).unwrap(),
        )
        .unwrap();
    for (ai, &an) in anchors.iter().enumerate() {
        let got: Vec<f32> = ours
            .get(ai)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let e = rel(&got, &reference(&cpu, an));
        assert!(e < 1e-4, "anchor {an}: relative error {e}");
    }
    // Control: identity convolutions in the trainer only.
    let control = DraftParams::init(&dc, &Device::Cpu, 11).unwrap();
    let mut dq_id = dq.clone();
    dq_id.retain(|n, _| !n.contains("_conv."));
    control.take_from(&dq_id).unwrap();
    let theirs = trainer
        .final_norm(
            &control,
            &trainer
                .block_hidden(&control, &taps, &tokens, &anchors)
                .unwrap(),
        )
        .unwrap();
    let got: Vec<f32> = theirs
        .get(0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(
        rel(&got, &reference(&cpu, anchors[0])) > 1e-2,
        "the convolutions change the output"
    );
}

fn f32_safetensors(p: &DraftParams) -> Vec<u8> {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = p
        .vars
        .iter()
        .map(|(n, v)| {
            (
                n.clone(),
                v.dims().to_vec(),
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            )
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// The engine's drafter matrices, dequantized, by z-lab name (1-D tensors as loaded).
fn dequantized(w: &DrafterWeights) -> std::collections::BTreeMap<String, Tensor> {
    let mut t = std::collections::BTreeMap::new();
    let mut put = |n: String, v: Vec<f32>, shape: Vec<usize>| {
        t.insert(n, Tensor::from_vec(v, shape, &Device::Cpu).unwrap());
    };
    let mat = |m: &dflash_core::quant::QuantMatrix| (m.dequantize(), vec![m.rows, m.cols]);
    let (v, s) = mat(&w.fc);
    put("fc.weight".into(), v, s);
    put(
        "hidden_norm.weight".into(),
        w.hidden_norm.clone(),
        vec![w.hidden_norm.len()],
    );
    put("norm.weight".into(), w.norm.clone(), vec![w.norm.len()]);
    let h = w.config.hidden_size;
    for (i, l) in w.layers.iter().enumerate() {
        for (n, m) in [
            ("self_attn.q_proj", &l.wq),
            ("self_attn.k_proj", &l.wk),
            ("self_attn.v_proj", &l.wv),
            ("self_attn.o_proj", &l.wo),
            ("mlp.gate_proj", &l.w_gate),
            ("mlp.up_proj", &l.w_up),
            ("mlp.down_proj", &l.w_down),
        ] {
            let (v, s) = mat(m);
            put(format!("layers.{i}.{n}.weight"), v, s);
        }
        for (n, v) in [
            ("input_layernorm", &l.input_norm),
            ("post_attention_layernorm", &l.post_norm),
            ("self_attn.q_norm", &l.q_norm),
            ("self_attn.k_norm", &l.k_norm),
        ] {
            put(format!("layers.{i}.{n}.weight"), v.clone(), vec![v.len()]);
        }
        let cv = l.conv.as_ref().unwrap();
        for (n, g) in [("attention_conv", &cv.attention), ("mlp_conv", &cv.mlp)] {
            put(
                format!("layers.{i}.{n}.base_kernel"),
                g.base.clone(),
                vec![2, g.base.len() / (2 * h), h],
            );
            let (v, s) = mat(&g.projection);
            put(format!("layers.{i}.{n}.kernel_projection.weight"), v, s);
        }
    }
    t
}

/// A DFlash2 run started from an exported DFlash drafter (`Init::Drafter`) is, before
/// it trains, the same drafter: its convolutions are the identity and its selector adds
/// nothing to the lm_head's order, so its drafts (and tau, prompt by prompt) are the
/// DFlash drafter's. A run directory refuses a resume with another architecture.
#[test]
fn dflash2_grown_from_dflash_starts_as_the_same_drafter() {
    let dir = tmp("grow");
    let (m, target, samples) = setup(&dir);
    let v = m.config().vocab_size as u32;
    let run1 = dir.join("dflash-run");
    train(
        &target,
        &samples,
        &run1,
        &config(v, None, 60, 1e-2),
        Init::Random,
        true,
    )
    .unwrap();
    let d1 = dir.join("dflash");
    dflash_train::export::export(&run1, &d1).unwrap();
    // One step at learning rate 0: the exported DFlash2 drafter is its initial state.
    let run2 = dir.join("dflash2-run");
    train(
        &target,
        &samples,
        &run2,
        &config(v, Some(sizes()), 1, 0.0),
        Init::Drafter(&d1),
        true,
    )
    .unwrap();
    let d2 = dir.join("dflash2");
    dflash_train::export::export(&run2, &d2).unwrap();
    let w1 = load_drafter_dir(&d1, DrafterPrecision::Q8).unwrap();
    let w2 = load_drafter_dir(&d2, DrafterPrecision::Q8).unwrap();
    assert!(w1.config.dflash2.is_none() && w2.config.dflash2.is_some());
    let cpu = CpuModel::new(&m.weights);
    let prompts: Vec<(String, Vec<u32>)> = samples
        .iter()
        .take(6)
        .map(|s| (s.id.clone(), s.prompt_ids.clone()))
        .collect();
    let r1 = evaluate(
        &m,
        &cpu,
        &CpuDrafter::new(&w1),
        &prompts,
        8,
        24,
        false,
        |_| {},
    )
    .unwrap();
    let r2 = evaluate(
        &m,
        &cpu,
        &CpuDrafter::new(&w2),
        &prompts,
        8,
        24,
        true,
        |_| {},
    )
    .unwrap();
    assert!(
        r1.mean_tau > 1.2,
        "the DFlash drafter learned something (tau {})",
        r1.mean_tau
    );
    for (a, b) in r1.rows.iter().zip(&r2.rows) {
        assert_eq!((a.steps, a.tokens), (b.steps, b.tokens), "prompt {}", a.id);
    }
    assert!(r2.rows.iter().all(|r| r.lossless == Some(true)));
    // The same run directory with DFlash instead: refused.
    assert!(train(
        &target,
        &samples,
        &run2,
        &config(v, None, 2, 0.0),
        Init::Random,
        true
    )
    .is_err());
    // An initial drafter of another shape: refused with a usage error.
    let other = DrafterSpec {
        layers: 2,
        block_size: 8,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: v - 1,
        seed: 1,
    };
    let d3 = dir.join("two-layers");
    dflash_core::testutil::write_dir(
        &d3,
        &dflash_core::testutil::write_drafter(m.config(), &other),
    )
    .unwrap();
    let e = train(
        &target,
        &samples,
        &dir.join("run3"),
        &config(v, Some(sizes()), 1, 0.0),
        Init::Drafter(&d3),
        true,
    )
    .unwrap_err();
    assert!(matches!(e, dflash_train::TrainError::Usage(_)), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A DFlash2 run from scratch: the drafting loss and the selector's loss fall, the
/// selector ends at least as accurate as the lm_head's argmax under teacher forcing
/// (it starts equal to it), the export is `DFlash2DraftModel` with exactly the tensor
/// names of a DFlash2 checkpoint (those the test helper writes after vLLM), and the
/// engine runs it losslessly with a tau above a random DFlash2 drafter's.
#[test]
fn dflash2_run_trains_the_selector_and_exports_a_dflash2_checkpoint() {
    let dir = tmp("run");
    let (m, target, samples) = setup(&dir);
    let c = m.config().clone();
    let v = c.vocab_size as u32;
    let run = dir.join("run");
    let last = train(
        &target,
        &samples,
        &run,
        &config(v, Some(sizes()), 240, 1e-2),
        Init::Random,
        true,
    )
    .unwrap();
    let log = log_of(&run);
    assert_eq!(log.len(), 240);
    let mean = |xs: &[serde_json::Value], k: &str| {
        xs.iter().map(|r| r[k].as_f64().unwrap()).sum::<f64>() / xs.len() as f64
    };
    assert!(mean(&log[230..], "loss") < 0.8 * mean(&log[..5], "loss"));
    assert!(
        mean(&log[230..], "selector_loss") < 0.8 * mean(&log[..5], "selector_loss"),
        "selector loss {} -> {}",
        mean(&log[..5], "selector_loss"),
        mean(&log[230..], "selector_loss")
    );
    let (sel, argmax) = (
        mean(&log[220..], "selector_tau_proxy"),
        mean(&log[220..], "tau_proxy"),
    );
    eprintln!("tau proxies at the end: selector {sel:.3}, argmax {argmax:.3}; last {last:?}");
    assert!(
        sel >= argmax - 0.02,
        "selector tau proxy {sel} vs argmax {argmax}"
    );

    let out = dir.join("exported");
    dflash_train::export::export(&run, &out).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["architectures"][0], "DFlash2DraftModel");
    for (k, want) in [
        ("conv_kernel_size", 2),
        ("conv_group_size", 16),
        ("selector_rank", 32),
        ("selector_top_k", 4),
    ] {
        assert_eq!(cfg["dflash_config"][k], want, "{k}");
    }
    // The tensor names are those of a DFlash2 checkpoint of the same shape.
    let base = DrafterSpec {
        layers: 1,
        block_size: 8,
        target_layer_ids: None,
        block_in_dflash_config: true,
        layer_types: None,
        sliding_window: 0,
        mask_token_id: v - 1,
        seed: 9,
    };
    let spec = DFlash2Spec::new(2, 16, 32, 4);
    let rand_dir = dir.join("random");
    dflash_core::testutil::write_dir(&rand_dir, &write_dflash2_drafter(&c, &base, &spec)).unwrap();
    let names = |d: &std::path::Path| -> Vec<(String, Vec<usize>)> {
        let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut v: Vec<(String, Vec<usize>)> = st
            .tensors()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&out), names(&rand_dir));

    let trained = load_drafter_dir(&out, DrafterPrecision::Q8).unwrap();
    let random = load_drafter_dir(&rand_dir, DrafterPrecision::Q8).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let prompts: Vec<(String, Vec<u32>)> = samples
        .iter()
        .take(8)
        .map(|s| (s.id.clone(), s.prompt_ids.clone()))
        .collect();
    let t = evaluate(
        &m,
        &cpu,
        &CpuDrafter::new(&trained),
        &prompts,
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
        &prompts,
        8,
        32,
        true,
        |_| {},
    )
    .unwrap();
    assert!(t
        .rows
        .iter()
        .chain(&r.rows)
        .all(|row| row.lossless == Some(true)));
    eprintln!(
        "DFlash2 tau trained {:.2} vs random {:.2}",
        t.mean_tau, r.mean_tau
    );
    assert!(
        t.mean_tau > r.mean_tau + 1.0,
        "trained tau {} vs random {}",
        t.mean_tau,
        r.mean_tau
    );
    let _ = std::fs::remove_dir_all(&dir);
}
