//! DFlash on the CPU reference: drafter loading in every z-lab variant, a typed error per
//! drafter/target mismatch, and the speculative loop's output equal to plain decoding
//! token for token (greedy and sampled), at every block size and in auto mode.

use dflash_core::cpu::{CpuKernels, CpuModel, LogitRows};
use dflash_core::drafter::{
    load_drafter_dir, CpuDrafter, DraftVocab, DrafterConfig, DrafterPrecision, DrafterWeights,
    LayerKind, DRAFT_VOCAB_FILE,
};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::{generate_cpu, GenerateRequest, Piece};
use dflash_core::model_files::{load_gguf, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::speculative::{
    generate_speculative_cpu, generate_speculative_with, BlockSize, DFlashCpu, Proposer,
};
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_drafter, write_gguf, DrafterSpec, Rng,
};
use dflash_core::Error;
use std::collections::BTreeMap;

fn target() -> LoadedModel {
    let c = tiny_drafter_target();
    load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap()
}

fn spec(seed: u64) -> DrafterSpec {
    let c = tiny_drafter_target();
    DrafterSpec::new(&c, 2, seed)
}

fn load(files: &BTreeMap<String, Vec<u8>>) -> dflash_core::Result<DrafterWeights> {
    let cfg = std::str::from_utf8(&files["config.json"]).unwrap();
    DrafterWeights::load(
        cfg,
        vec![("model.safetensors", &files["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
}

fn prompts() -> Vec<Vec<u32>> {
    let mut r = Rng(77);
    (0..4)
        .map(|i| (0..5 + 7 * i).map(|_| r.below(260) as u32).collect())
        .collect()
}

fn req(prompt: &[u32], sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_new_tokens: 40,
        sampling,
        stop_strings: vec![],
        context: 256,
        interrupt: Default::default(),
        grammar: None,
    }
}

fn samplings() -> Vec<SamplingParams> {
    vec![
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 11,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            seed: 12,
            ..Default::default()
        },
    ]
}

fn blocks() -> Vec<BlockSize> {
    vec![
        BlockSize::Fixed(1),
        BlockSize::Fixed(2),
        BlockSize::Fixed(4),
        BlockSize::Fixed(8),
        BlockSize::Fixed(16),
        BlockSize::auto_linear(16, 1.0),
        BlockSize::auto_linear(16, 0.02),
    ]
}

#[test]
fn a_random_drafter_is_lossless_at_every_block_size() {
    let t = target();
    let w = load(&write_drafter(t.config(), &spec(5))).unwrap();
    for kernels in [CpuKernels::Reference, CpuKernels::Quantized] {
        lossless_with(&t, &w, kernels);
    }
}

fn lossless_with(t: &LoadedModel, w: &DrafterWeights, kernels: CpuKernels) {
    let cpu = CpuModel::with_kernels(&t.weights, kernels);
    let d = CpuDrafter::with_kernels(w, kernels);
    for sp in samplings() {
        for p in prompts() {
            let plain = generate_cpu(
                &cpu,
                &t.tokenizer,
                &req(&p, sp.clone()),
                &|| 0.0,
                &mut |_| {},
            )
            .unwrap();
            for b in blocks() {
                let s = generate_speculative_cpu(
                    &cpu,
                    &d,
                    &t.tokenizer,
                    &req(&p, sp.clone()),
                    &b,
                    &|| 0.0,
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(
                    s.result.tokens, plain.tokens,
                    "{kernels:?} {b:?} T={}",
                    sp.temperature
                );
                assert_eq!(s.result.text, plain.text);
                assert_eq!(s.result.finish_reason, plain.finish_reason);
            }
        }
    }
}

/// Proposes the plain continuation for the first `good` drafts of every block and wrong
/// tokens after, so steps accept drafts and roll back the rest.
struct Oracle {
    plain: Vec<u32>, // prompt + plain continuation
    good: Vec<usize>,
    step: usize,
    vocab: u32,
}

impl Proposer for Oracle {
    fn tap_layers(&self) -> Vec<usize> {
        vec![1, 4]
    }
    fn max_block(&self) -> usize {
        8
    }
    fn commit(&mut self, _taps: &[f32]) {}
    fn draft(&mut self, _anchor: u32, pos: usize, b: usize) -> dflash_core::Result<Vec<u32>> {
        let good = self.good[self.step % self.good.len()];
        self.step += 1;
        Ok((1..b)
            .map(|j| {
                let truth = self.plain.get(pos + j).copied().unwrap_or(0);
                if j <= good {
                    truth
                } else {
                    (truth + 1) % self.vocab
                }
            })
            .collect())
    }
}

#[test]
fn accepted_drafts_and_rollback_keep_the_output_equal_to_plain_decoding() {
    let t = target();
    let cpu = CpuModel::new(&t.weights);
    for sp in samplings() {
        for p in prompts() {
            let plain = generate_cpu(
                &cpu,
                &t.tokenizer,
                &req(&p, sp.clone()),
                &|| 0.0,
                &mut |_| {},
            )
            .unwrap();
            let mut seq = p.clone();
            seq.extend(&plain.tokens);
            for b in [
                BlockSize::Fixed(8),
                BlockSize::Fixed(3),
                BlockSize::auto_linear(8, 0.1),
            ] {
                let mut o = Oracle {
                    plain: seq.clone(),
                    good: vec![7, 0, 3, 5, 1],
                    step: 0,
                    vocab: t.config().vocab_size as u32,
                };
                let s = generate_speculative_with(
                    &cpu,
                    &mut o,
                    &t.tokenizer,
                    &req(&p, sp.clone()),
                    &b,
                    &|| 0.0,
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(s.result.tokens, plain.tokens, "{b:?} T={}", sp.temperature);
                if plain.tokens.len() == 40 && b == BlockSize::Fixed(8) {
                    assert!(s.mean_tau() > 2.5, "tau {}", s.mean_tau());
                }
            }
        }
    }
}

/// The pieces a generation streams, gathered: their text, their ids and how many ended
/// on an accepted draft.
#[derive(Default)]
struct Pieces {
    text: String,
    ids: Vec<u32>,
    drafted: usize,
}

impl Pieces {
    fn take(&mut self, p: Piece<'_>) {
        assert!(!p.ids.is_empty(), "{p:?}");
        self.text.push_str(p.text);
        self.ids.extend_from_slice(p.ids);
        self.drafted += p.drafted as usize;
    }
}

#[test]
fn pieces_carry_every_token_once_and_flag_accepted_drafts() {
    let t = target();
    let cpu = CpuModel::new(&t.weights);
    for p in prompts() {
        let sp = SamplingParams::default();
        let mut plain_pieces = Pieces::default();
        let plain = generate_cpu(
            &cpu,
            &t.tokenizer,
            &req(&p, sp.clone()),
            &|| 0.0,
            &mut |x| plain_pieces.take(x),
        )
        .unwrap();
        assert_eq!(
            plain_pieces.ids, plain.tokens,
            "no stop string: every token"
        );
        assert_eq!(plain_pieces.text, plain.text);
        assert_eq!(plain_pieces.drafted, 0, "plain decoding drafts nothing");
        let mut seq = p.clone();
        seq.extend(&plain.tokens);
        let mut o = Oracle {
            plain: seq,
            good: vec![7, 0, 3, 5, 1],
            step: 0,
            vocab: t.config().vocab_size as u32,
        };
        let mut pieces = Pieces::default();
        let s = generate_speculative_with(
            &cpu,
            &mut o,
            &t.tokenizer,
            &req(&p, sp),
            &BlockSize::Fixed(8),
            &|| 0.0,
            &mut |x| pieces.take(x),
        )
        .unwrap();
        assert_eq!(pieces.ids, plain.tokens);
        assert_eq!(pieces.text, plain.text);
        let accepted: usize = s.taus.iter().map(|t| t - 1).sum();
        assert!(
            pieces.drafted <= accepted,
            "{} > {accepted}",
            pieces.drafted
        );
        if accepted >= 7 {
            assert!(pieces.drafted > 0, "accepted drafts are flagged");
        }
    }
}

#[test]
fn drafter_variants_load() {
    let t = tiny_drafter_target();
    // block_size at top level; default tap ids (6 target layers, 2 draft layers: 1 and 3).
    let mut s = spec(1);
    s.block_in_dflash_config = false;
    let w = load(&write_drafter(&t, &s)).unwrap();
    assert_eq!(w.config.block_size, 16);
    assert_eq!(w.config.target_layer_ids, vec![1, 3]);
    // More tap layers than draft layers, sliding and full layers.
    let mut s = spec(2);
    s.target_layer_ids = Some(vec![0, 1, 2, 4, 5]);
    s.layer_types = Some(vec!["sliding_attention".into(), "full_attention".into()]);
    s.sliding_window = 4;
    let w = load(&write_drafter(&t, &s)).unwrap();
    assert_eq!(w.config.n_taps(), 5);
    assert_eq!(w.fc.cols, 5 * t.hidden_size);
    assert_eq!(
        w.config.layer_kinds,
        vec![LayerKind::Sliding, LayerKind::Full]
    );
    // The published Qwen3-8B drafter's default: 36 target layers, 5 draft layers.
    assert_eq!(
        DrafterConfig::default_target_layer_ids(5, 36),
        vec![1, 9, 17, 25, 33]
    );
    assert_eq!(DrafterConfig::default_target_layer_ids(1, 36), vec![18]);
    // A sliding drafter is lossless too, with a context longer than its window.
    let tm = target();
    let cpu = CpuModel::new(&tm.weights);
    let d = CpuDrafter::new(&w);
    let p = &prompts()[3];
    let plain = generate_cpu(
        &cpu,
        &tm.tokenizer,
        &req(p, SamplingParams::default()),
        &|| 0.0,
        &mut |_| {},
    )
    .unwrap();
    let sp = generate_speculative_cpu(
        &cpu,
        &d,
        &tm.tokenizer,
        &req(p, SamplingParams::default()),
        &BlockSize::Fixed(16),
        &|| 0.0,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(sp.result.tokens, plain.tokens);
    // 4-bit drafter weights at load.
    let files = write_drafter(&t, &spec(3));
    let cfg = std::str::from_utf8(&files["config.json"]).unwrap();
    let q4 = DrafterWeights::load(
        cfg,
        vec![("model.safetensors", &files["model.safetensors"][..])],
        DrafterPrecision::Q4,
    )
    .unwrap();
    assert_eq!(q4.fc.format, dflash_core::quant::QFormat::Q4);
}

#[test]
fn each_drafter_target_mismatch_has_its_error() {
    let t = target();
    let tc = t.config().clone();
    let check = |edit: &dyn Fn(&mut serde_json::Value), field: &str| {
        let mut files = write_drafter(&tc, &spec(4));
        let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
        edit(&mut cfg);
        files.insert("config.json".into(), cfg.to_string().into_bytes());
        let r = load(&files).and_then(|w| w.config.validate_against(&tc));
        match r {
            Err(Error::DrafterMismatch { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected DrafterMismatch, got {:?}", other.err()),
        }
    };
    check(&|c| c["vocab_size"] = 999.into(), "vocab_size");
    check(&|c| c["num_target_layers"] = 12.into(), "num_target_layers");
    check(
        &|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 6]),
        "target_layer_ids",
    );
    check(
        &|c| c["dflash_config"]["mask_token_id"] = 5000.into(),
        "mask_token_id",
    );
    check(&|c| c["rope_theta"] = 0.into(), "rope settings");
    // Fields that also change the tensors' shapes, checked on the config alone.
    let validate = |edit: &dyn Fn(&mut serde_json::Value)| {
        let files = write_drafter(&tc, &spec(4));
        let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
        edit(&mut cfg);
        DrafterConfig::from_json(&cfg.to_string())
            .unwrap()
            .validate_against(&tc)
    };
    assert!(validate(&|_| {}).is_ok());
    assert!(matches!(
        validate(&|c| c["hidden_size"] = 128.into()),
        Err(Error::DrafterMismatch {
            field: "hidden_size",
            ..
        })
    ));
    assert!(matches!(
        validate(&|c| c["head_dim"] = 512.into()),
        Err(Error::DrafterMismatch {
            field: "rope settings",
            ..
        })
    ));
    // A hidden size that differs is caught by the tensor shapes first, or by validation.
    let mut files = write_drafter(&tc, &spec(4));
    let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    cfg["hidden_size"] = 128.into();
    files.insert("config.json".into(), cfg.to_string().into_bytes());
    assert!(matches!(load(&files), Err(Error::ShapeMismatch { .. })));
    // Not a drafter at all, and a missing mask token.
    let files = write_drafter(&tc, &spec(4));
    let mut cfg: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    cfg.as_object_mut().unwrap().remove("dflash_config");
    cfg["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
    assert!(matches!(
        DrafterConfig::from_json(&cfg.to_string()),
        Err(Error::NotADrafter(_))
    ));
    cfg["architectures"] = serde_json::json!(["DFlashDraftModel"]);
    assert!(matches!(
        DrafterConfig::from_json(&cfg.to_string()),
        Err(Error::NotADrafter(_))
    ));
}

#[test]
fn context_rows_fed_one_at_a_time_equal_all_at_once() {
    let t = target();
    let cpu = CpuModel::new(&t.weights);
    let w = load(&write_drafter(t.config(), &spec(6))).unwrap();
    let d = CpuDrafter::new(&w);
    let toks = &prompts()[2];
    let mut cache = cpu.new_cache(64);
    let taps = cpu
        .forward(
            toks,
            &mut cache,
            LogitRows::None,
            &w.config.target_layer_ids,
        )
        .unwrap()
        .taps;
    let row = taps.len() / toks.len();
    let (mut a, mut b) = (d.new_context(), d.new_context());
    d.extend_context(&mut a, &taps);
    for r in 0..toks.len() {
        d.extend_context(&mut b, &taps[r * row..(r + 1) * row]);
    }
    let mask = w.config.mask_token_id;
    let block = cpu.embed(&[3, mask, mask, mask]).unwrap();
    assert_eq!(
        d.forward_block(&mut a, &block),
        d.forward_block(&mut b, &block)
    );
}

/// Auto mode drafts when the measured acceptance pays for the extra rows, stops drafting
/// (a block of one row) when it does not, and then probes once every PROBE_EVERY steps.
#[test]
fn auto_mode_stops_drafting_when_drafts_do_not_pay_and_probes() {
    use dflash_core::speculative::{choose_block, Acceptance, PROBE_EVERY};
    let costs = BlockSize::auto_linear(16, 0.3);
    let mut bad = Acceptance::default();
    for _ in 0..50 {
        bad.record_step(4, 0);
    }
    assert_eq!(choose_block(&costs, &bad, 16, 0), 1);
    assert_eq!(choose_block(&costs, &bad, 16, PROBE_EVERY - 1), 1);
    let probe = choose_block(&costs, &bad, 16, PROBE_EVERY);
    assert!(probe > 1, "a probe step drafts: {probe}");
    let mut good = Acceptance::default();
    for _ in 0..50 {
        good.record_step(15, 15);
    }
    assert!(
        choose_block(&costs, &good, 16, 0) >= 8,
        "all drafts accepted: a long block"
    );
    // On a device where rows are free (a GPU), even a poor drafter is worth a block.
    let free = BlockSize::auto_linear(16, 0.0);
    let mut some = Acceptance::default();
    for _ in 0..50 {
        some.record_step(4, 1);
    }
    assert!(choose_block(&free, &some, 16, 0) > 1);
    assert_eq!(choose_block(&BlockSize::Fixed(4), &bad, 16, 0), 4);
}

/// Where rows are dear (lavapipe: a block of 2 costs 2.15 one-row steps) a probe waits
/// until its extra cost is at most PROBE_BUDGET of the idle steps before it, so a
/// drafter that cannot pay slows decoding by at most that share.
#[test]
fn auto_mode_probes_within_its_budget_where_rows_are_dear() {
    use dflash_core::speculative::{choose_block, probe_interval, Acceptance, PROBE_BUDGET};
    let dear = BlockSize::auto_linear(16, 1.15);
    let BlockSize::Auto { verify_cost } = &dear else {
        unreachable!()
    };
    let wait = probe_interval(verify_cost, 2);
    assert_eq!(wait, 58, "1.15 extra steps at 2%");
    assert!((verify_cost[2] - 1.0) / wait as f64 <= PROBE_BUDGET + 1e-12);
    // Before any draft is tried, a probe at once; after drafts that failed, the wait.
    let fresh = Acceptance::default();
    assert_eq!(choose_block(&dear, &fresh, 16, 0), 2, "the first probe");
    let mut bad = Acceptance::default();
    for _ in 0..4 {
        bad.record_step(1, 0);
    }
    assert_eq!(choose_block(&dear, &bad, 16, wait - 1), 1);
    assert_eq!(
        choose_block(&dear, &bad, 16, wait),
        2,
        "the probe: the cheapest block"
    );
    // Refined costs share a scale that need not make a one-row step 1: the budget is
    // relative to it (0.7 and 1.4: the probe costs one extra step, 50 idle steps).
    assert_eq!(probe_interval(&[1.0, 0.7, 1.4], 2), 50);
    // A cost table without the probe's block never probes.
    assert_eq!(probe_interval(&[1.0, 1.0], 2), usize::MAX);
}

/// A slot no step has reached takes the rate of the slot before it: after blocks of 3
/// whose drafts were all right, auto mode tries a longer block (counting the third slot
/// as failed in steps that never tried it kept it at 3 rows).
#[test]
fn auto_mode_grows_past_the_blocks_it_has_tried() {
    use dflash_core::speculative::{choose_block, Acceptance};
    let cheap = BlockSize::auto_linear(16, 0.1);
    let mut right = Acceptance::default();
    for _ in 0..10 {
        right.record_step(2, 2);
    }
    assert_eq!(right.reached, vec![10, 10]);
    assert!(choose_block(&cheap, &right, 16, 0) >= 8);
    // Where the second slot fails (often enough to outweigh the neighbour's prior,
    // NEIGHBOUR_WEIGHT steps), the slots after it are not trusted either.
    let mut second_wrong = Acceptance::default();
    for _ in 0..20 {
        second_wrong.record_step(2, 1);
    }
    assert_eq!(choose_block(&cheap, &second_wrong, 16, 0), 2);
}

/// Auto mode's costs follow the running generation: a prior measured on a busy machine
/// (blocks 4x dearer than they are) keeps the policy from drafting; once steps of one
/// row and of a probe's block have run, their measured times replace the prior, the
/// sizes not yet run are scaled to the measured speed, and the policy drafts. The first
/// step of each size (it may compile) and clock-less steps (0 s) are not counted.
#[test]
fn auto_costs_are_refined_by_the_measured_steps() {
    use dflash_core::speculative::{choose_block, Acceptance, StepCosts};
    // Prior: b rows cost 1 + 1.2 (b - 1); truly they cost 1 + 0.1 (b - 1) seconds.
    let prior = BlockSize::auto_linear(16, 1.2);
    let truth = |b: usize| 1.0 + 0.1 * (b - 1) as f64;
    let mut half = Acceptance::default();
    for _ in 0..50 {
        half.record_step(15, 1);
    }
    assert_eq!(
        choose_block(&prior, &half, 16, 0),
        1,
        "the prior says drafting does not pay"
    );
    let mut c = StepCosts::new(&prior).unwrap();
    assert_eq!(c.policy(), prior, "nothing measured yet");
    c.record(1, 50.0); // a first step: skipped (compile)
    c.record(1, 0.0); // no clock: ignored
    assert_eq!(c.policy(), prior);
    for _ in 0..4 {
        c.record(1, truth(1));
        c.record(4, truth(4));
    }
    c.record(4, 50.0); // the first of size 4 was a normal step; one outlier moves the mean by ALPHA only
    let BlockSize::Auto { verify_cost } = c.policy() else {
        panic!()
    };
    assert!(
        (verify_cost[4] / verify_cost[1] - (0.8 * truth(4) + 0.2 * 50.0) / truth(1)).abs() < 1e-9
    );
    for _ in 0..40 {
        c.record(4, truth(4));
    }
    let BlockSize::Auto { verify_cost } = c.policy() else {
        panic!()
    };
    assert!(
        (verify_cost[4] / verify_cost[1] - truth(4)).abs() < 0.01,
        "measured: {}",
        verify_cost[4] / verify_cost[1]
    );
    // Sizes not run keep the prior's cost at the measured speed: relative to the
    // measured one-row step, below their prior ratio.
    assert!(verify_cost[8] / verify_cost[1] < prior_cost(&prior, 8) / prior_cost(&prior, 1));
    assert!(
        choose_block(&c.policy(), &half, 16, 0) > 1,
        "with the measured costs drafting pays"
    );
    assert!(StepCosts::new(&BlockSize::Fixed(4)).is_none());
}

/// A prior that calls drafting cheap where it is dear (lavapipe's probe once measured a
/// 4-row step at 1.25 one-row steps; it costs 2.4) and a drafter whose first slot is
/// accepted one step in three: the loop drafts, times its blocks, then times one-row
/// steps of its own before drafting again, learns the block's true cost and settles on
/// plain decoding (with rare probes), so that it decodes at least 0.95x as fast as
/// plain decoding, also when it chooses each block before the step ahead of it is
/// recorded (the pipelined GPU loop). Without the one-row steps it would draft blocks
/// of 4 throughout at about 0.55x. A drafter that clearly pays is never held back, and
/// a clock that cannot time a one-row step (0 s) forces at most BASELINE_MAX_FORCED.
#[test]
fn auto_mode_times_its_own_one_row_steps_before_trusting_a_marginal_block() {
    use dflash_core::speculative::{BlockLoop, BASELINE_MARGIN, BASELINE_MAX_FORCED};
    // The costs auto measured in that run (results/lavapipe-run-sh-bench-smollm2.jsonl).
    let cheap_prior = BlockSize::Auto {
        verify_cost: vec![
            1.0, 1.0, 1.361, 1.307, 1.254, 1.592, 1.930, 2.268, 2.606, 2.968, 3.330, 3.691, 4.053,
            4.415, 4.776, 5.138, 5.499,
        ],
    };
    let truth = |b: usize| 1.0 + 0.47 * (b - 1) as f64;
    // 400 steps: (tokens per one-row second, drafting steps); `pipelined`: each block
    // chosen before the step ahead of it is recorded; `clock`: the seconds recorded.
    let run =
        |accepts: &dyn Fn(usize, usize) -> usize, pipelined: bool, clock: &dyn Fn(usize) -> f64| {
            let mut blocks = BlockLoop::new(&cheap_prior, 16);
            let (mut seconds, mut tokens, mut drafted) = (0.0, 0usize, 0usize);
            let mut next = blocks.next_block(usize::MAX, usize::MAX);
            for step in 0..400 {
                let b = next;
                if pipelined {
                    next = blocks.next_block(usize::MAX, usize::MAX);
                }
                let accepted = accepts(step, b).min(b - 1);
                blocks.record(b, clock(b), accepted);
                if !pipelined {
                    next = blocks.next_block(usize::MAX, usize::MAX);
                }
                seconds += truth(b);
                tokens += accepted + 1;
                drafted += usize::from(b > 1);
            }
            (tokens as f64 / seconds, drafted)
        };
    let poor = |step: usize, _b: usize| usize::from(step.is_multiple_of(3));
    for pipelined in [false, true] {
        let (tok_s, drafted) = run(&poor, pipelined, &truth);
        assert!(
            tok_s >= 0.95 && drafted < 40,
            "pipelined {pipelined}: {tok_s} tokens per one-row second, {drafted} drafting steps of 400"
        );
    }
    // A drafter whose blocks are all accepted pays more than BASELINE_MARGIN times plain
    // decoding even at the true costs: it drafts from its first step to its last.
    let all = |_: usize, b: usize| b - 1;
    let (tok_s, drafted) = run(&all, false, &truth);
    assert_eq!(drafted, 400);
    assert!(tok_s > BASELINE_MARGIN, "{tok_s}");
    // One-row steps that read 0 s are never timed: the baseline is forced a few times,
    // then the loop goes on with the costs it has.
    let coarse = |b: usize| if b == 1 { 0.0 } else { truth(b) };
    let (_, drafted) = run(&poor, false, &coarse);
    assert!(drafted >= 400 - BASELINE_MAX_FORCED, "{drafted}");
}

fn prior_cost(p: &BlockSize, b: usize) -> f64 {
    match p {
        BlockSize::Auto { verify_cost } => verify_cost[b],
        BlockSize::Fixed(_) => unreachable!(),
    }
}

/// An interrupt set while text streams ends generation before the next token, plain and
/// speculative, with `FinishReason::Interrupted`; the tokens so far equal plain
/// decoding's.
#[test]
fn an_interrupt_ends_generation_before_the_next_token() {
    use dflash_core::generate::FinishReason;
    let t = target();
    let cpu = CpuModel::with_kernels(&t.weights, CpuKernels::Quantized);
    let d = CpuDrafter::with_kernels(
        &load(&write_drafter(t.config(), &spec(5))).unwrap(),
        CpuKernels::Quantized,
    );
    let p = &prompts()[2];
    let full = generate_cpu(
        &cpu,
        &t.tokenizer,
        &req(p, Default::default()),
        &|| 0.0,
        &mut |_| {},
    )
    .unwrap();
    for speculative in [false, true] {
        let r = req(p, Default::default());
        let switch = r.interrupt.clone();
        let mut pieces = 0;
        let mut on_text = |_: Piece<'_>| {
            pieces += 1;
            if pieces == 3 {
                switch.set();
            }
        };
        let out = if speculative {
            generate_speculative_cpu(
                &cpu,
                &d,
                &t.tokenizer,
                &r,
                &BlockSize::Fixed(4),
                &|| 0.0,
                &mut on_text,
            )
            .unwrap()
            .result
        } else {
            generate_cpu(&cpu, &t.tokenizer, &r, &|| 0.0, &mut on_text).unwrap()
        };
        assert_eq!(
            out.finish_reason,
            FinishReason::Interrupted,
            "speculative {speculative}"
        );
        assert!(
            out.tokens.len() < full.tokens.len(),
            "speculative {speculative}"
        );
        assert_eq!(out.tokens, full.tokens[..out.tokens.len()]);
    }
}

/// The stepwise loop (what the browser worker drives, yielding between steps) gives
/// `generate_speculative_cpu`'s tokens and steps; an interrupt set between two steps ends
/// generation at the next one, with the tokens so far.
#[test]
fn stepwise_speculation_equals_the_loop_and_stops_between_steps() {
    use dflash_core::generate::FinishReason;
    use dflash_core::speculative::{DFlashCpu, SpeculativeGeneration};
    let t = target();
    let cpu = CpuModel::with_kernels(&t.weights, CpuKernels::Quantized);
    let d = CpuDrafter::with_kernels(
        &load(&write_drafter(t.config(), &spec(5))).unwrap(),
        CpuKernels::Quantized,
    );
    let p = &prompts()[1];
    let block = BlockSize::Fixed(4);
    let r = req(p, Default::default());
    let whole =
        generate_speculative_cpu(&cpu, &d, &t.tokenizer, &r, &block, &|| 0.0, &mut |_| {}).unwrap();
    for interrupt_after in [None, Some(2)] {
        let r = req(p, Default::default());
        let switch = r.interrupt.clone();
        let mut proposer = DFlashCpu::new(&d, &cpu).unwrap();
        let mut on_text = |_: Piece<'_>| {};
        let mut session = dflash_core::generate::CpuSession::default();
        let mut g = SpeculativeGeneration::start(
            &mut session,
            &cpu,
            &mut proposer,
            &t.tokenizer,
            &r,
            &block,
            &|| 0.0,
            &mut on_text,
        )
        .unwrap();
        let mut steps = 0;
        while !g.step(&|| 0.0).unwrap() {
            steps += 1;
            if Some(steps) == interrupt_after {
                switch.set();
            }
        }
        let out = g.finish(&|| 0.0);
        match interrupt_after {
            None => {
                assert_eq!(out.result.tokens, whole.result.tokens);
                assert_eq!(out.taus, whole.taus);
            }
            Some(n) => {
                assert_eq!(out.result.finish_reason, FinishReason::Interrupted);
                assert_eq!(out.taus.len(), n + 1, "one more step, then the stop");
                let k = out.result.tokens.len();
                assert_eq!(out.result.tokens, whole.result.tokens[..k]);
            }
        }
    }
}

/// A DFlash proposer that records every block it drafts (position and drafts).
struct Recording<'a> {
    inner: dflash_core::speculative::DFlashCpu<'a>,
    drafts: Vec<(usize, Vec<u32>)>,
}

impl Proposer for Recording<'_> {
    fn tap_layers(&self) -> Vec<usize> {
        self.inner.tap_layers()
    }
    fn max_block(&self) -> usize {
        self.inner.max_block()
    }
    fn block_capacity(&self) -> usize {
        self.inner.block_capacity()
    }
    fn commit(&mut self, taps: &[f32]) {
        self.inner.commit(taps)
    }
    fn context_rows(&self) -> usize {
        self.inner.context_rows()
    }
    fn truncate(&mut self, len: usize) {
        self.inner.truncate(len)
    }
    fn settle(&mut self, keep: usize) {
        self.inner.settle(keep)
    }
    fn draft(&mut self, anchor: u32, pos: usize, b: usize) -> dflash_core::Result<Vec<u32>> {
        let d = self.inner.draft(anchor, pos, b)?;
        self.drafts.push((pos, d.clone()));
        Ok(d)
    }
}

/// What the loop asked of a DFlash proposer, and when its clock was read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    /// Committed rows.
    Commit(usize),
    Settle(usize),
    Clock,
    /// A block of b rows drafted.
    Draft(usize),
}

/// A DFlash proposer that logs every call into `log` (which the loop's clock writes to
/// as well), forwarding `settle` or not.
struct Logging<'a> {
    inner: DFlashCpu<'a>,
    settles: bool,
    log: std::rc::Rc<std::cell::RefCell<Vec<Event>>>,
    drafts: Vec<Vec<u32>>,
}

impl Proposer for Logging<'_> {
    fn tap_layers(&self) -> Vec<usize> {
        self.inner.tap_layers()
    }
    fn max_block(&self) -> usize {
        self.inner.max_block()
    }
    fn commit(&mut self, taps: &[f32]) {
        let before = self.inner.context_rows();
        self.inner.commit(taps);
        let rows = self.inner.context_rows() - before;
        self.log.borrow_mut().push(Event::Commit(rows));
    }
    fn settle(&mut self, keep: usize) {
        if self.settles {
            self.inner.settle(keep);
        }
        self.log.borrow_mut().push(Event::Settle(keep));
    }
    fn draft(&mut self, anchor: u32, pos: usize, b: usize) -> dflash_core::Result<Vec<u32>> {
        self.log.borrow_mut().push(Event::Draft(b));
        let d = self.inner.draft(anchor, pos, b)?;
        self.drafts.push(d.clone());
        Ok(d)
    }
}

/// Auto mode times a step that drafts without the drafter's backlog (the prompt's rows
/// and those of one-row steps that drafted nothing, which it takes into its context
/// only when it next drafts): before the step's clock starts the loop has the proposer
/// take them in, keeping back only the rows the last step committed, as many as a step
/// right after a drafting step takes in. Otherwise a probe after 40 idle steps on the
/// CPU engine measured a 2-row step at 1.95 one-row steps where it costs 1.35, and
/// auto stopped drafting where it paid. Taking the rows in early changes no draft.
#[test]
fn a_drafting_step_is_timed_without_the_drafters_backlog() {
    use dflash_core::generate::CpuSession;
    use dflash_core::speculative::{SpeculativeGeneration, PROBE_EVERY};
    let t = target();
    let cpu = CpuModel::with_kernels(&t.weights, CpuKernels::Quantized);
    let d = CpuDrafter::with_kernels(
        &load(&write_drafter(t.config(), &spec(8))).unwrap(),
        CpuKernels::Quantized,
    );
    let mut r = req(&prompts()[3], SamplingParams::default());
    r.max_new_tokens = 3 * PROBE_EVERY;
    // Rows too dear to draft but for the probes: idle steps between drafting ones.
    let dear = BlockSize::auto_linear(4, 0.25);
    let run = |settles: bool| {
        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut p = Logging {
            inner: DFlashCpu::new(&d, &cpu).unwrap(),
            settles,
            log: log.clone(),
            drafts: vec![],
        };
        let mut session = CpuSession::default();
        let mut on_text = |_: Piece<'_>| {};
        // Each reading a second later: every step is timed.
        let clock = || {
            let mut log = log.borrow_mut();
            log.push(Event::Clock);
            log.len() as f64
        };
        let mut g = SpeculativeGeneration::start(
            &mut session,
            &cpu,
            &mut p,
            &t.tokenizer,
            &r,
            &dear,
            &clock,
            &mut on_text,
        )
        .unwrap();
        while !g.step(&clock).unwrap() {}
        let tokens = g.finish(&clock).result.tokens;
        let events = log.borrow().clone();
        (tokens, p.drafts, events)
    };
    let (tokens, drafts, events) = run(true);
    let (tokens_late, drafts_late, _) = run(false);
    assert_eq!(tokens, tokens_late);
    assert_eq!(
        drafts, drafts_late,
        "the context taken in early drafts the same"
    );
    let drafting: Vec<usize> = (0..events.len())
        .filter(|&i| matches!(events[i], Event::Draft(_)))
        .collect();
    assert!(drafting.len() >= 2, "probes: {events:?}");
    let mut probes_after_idle = 0;
    for &i in &drafting {
        let commits: Vec<usize> = events[..i]
            .iter()
            .filter_map(|e| match e {
                Event::Commit(rows) => Some(*rows),
                _ => None,
            })
            .collect();
        // The rows the last step committed (1 for the first step, after the prompt's).
        let last_step = if commits.len() > 1 {
            commits[commits.len() - 1]
        } else {
            1
        };
        // settle(those rows), the step's clock, then the draft.
        assert_eq!(
            events[i - 2],
            Event::Settle(last_step),
            "at {i}: {events:?}"
        );
        assert_eq!(events[i - 1], Event::Clock);
        let idle = commits.iter().rev().take_while(|&&rows| rows == 1).count();
        probes_after_idle += usize::from(idle >= PROBE_EVERY);
    }
    assert!(probes_after_idle >= 1, "{events:?}");
}

/// A speculative generation run step by step in `session` with proposer `p`.
fn run_in_session(
    session: &mut dflash_core::generate::CpuSession,
    cpu: &CpuModel,
    p: &mut dyn Proposer,
    t: &LoadedModel,
    r: &GenerateRequest,
    block: &BlockSize,
) -> dflash_core::speculative::SpeculativeResult {
    use dflash_core::speculative::SpeculativeGeneration;
    let mut on_text = |_: Piece<'_>| {};
    let mut g = SpeculativeGeneration::start(
        session,
        cpu,
        p,
        &t.tokenizer,
        r,
        block,
        &|| 0.0,
        &mut on_text,
    )
    .unwrap();
    while !g.step(&|| 0.0).unwrap() {}
    g.finish(&|| 0.0)
}

/// One turn of a conversation on the CPU engine, in `session` (and the drafter's `draft`
/// context with DFlash), as the browser worker and `dflash serve` run it; with the blocks
/// the drafter proposed.
fn turn_in_session(
    session: &mut dflash_core::generate::CpuSession,
    draft: &mut dflash_core::speculative::DraftState,
    cpu: &CpuModel,
    d: Option<&CpuDrafter>,
    t: &LoadedModel,
    r: &GenerateRequest,
) -> (
    dflash_core::generate::GenerateResult,
    Vec<(usize, Vec<u32>)>,
) {
    use dflash_core::generate::CpuGeneration;
    use dflash_core::speculative::DFlashCpu;
    let block = BlockSize::Fixed(4);
    let mut on_text = |_: Piece<'_>| {};
    match d {
        Some(d) => {
            let mut p = Recording {
                inner: DFlashCpu::resume(d, cpu, std::mem::take(draft)).unwrap(),
                drafts: vec![],
            };
            let out = run_in_session(session, cpu, &mut p, t, r, &block);
            *draft = p.inner.into_state();
            (out.result, p.drafts)
        }
        None => {
            let mut g =
                CpuGeneration::start(session, cpu, &t.tokenizer, r, &|| 0.0, &mut on_text).unwrap();
            while !g.step().unwrap() {}
            (g.finish(&|| 0.0), vec![])
        }
    }
}

/// Multi-turn KV reuse on the CPU engine: five turns in one session, each prompt the last
/// prompt, its reply and a few new tokens, give the tokens of the same turns prefilled
/// from an empty cache, with DFlash on, off and switched between turns, greedy and seeded
/// sampling; each turn keeps at least the whole previous prompt. An edited history keeps
/// exactly the rows before the edit, and a reset session keeps none.
#[test]
fn a_conversation_that_reuses_its_kv_rows_equals_one_prefilled_every_turn() {
    use dflash_core::generate::CpuSession;
    use dflash_core::speculative::DraftState;
    let t = target();
    let cpu = CpuModel::with_kernels(&t.weights, CpuKernels::Quantized);
    let d = CpuDrafter::with_kernels(
        &load(&write_drafter(t.config(), &spec(5))).unwrap(),
        CpuKernels::Quantized,
    );
    let patterns: [[bool; 5]; 3] = [[true; 5], [false; 5], [true, false, false, true, true]];
    for sp in samplings().into_iter().take(2) {
        for dflash in patterns {
            let (mut session, mut draft) = (CpuSession::default(), DraftState::default());
            let mut rng = Rng(9);
            let mut prompt: Vec<u32> = (0..7).map(|_| rng.below(260) as u32).collect();
            for (turn, &on) in dflash.iter().enumerate() {
                let mut r = req(&prompt, sp.clone());
                r.max_new_tokens = 10;
                let d = on.then_some(&d);
                let (mut s0, mut d0) = (CpuSession::default(), DraftState::default());
                let (fresh, fresh_drafts) = turn_in_session(&mut s0, &mut d0, &cpu, d, &t, &r);
                let (reused, drafts) = turn_in_session(&mut session, &mut draft, &cpu, d, &t, &r);
                let what = format!("T={} turn {turn} dflash {dflash:?}", sp.temperature);
                assert_eq!(reused.tokens, fresh.tokens, "{what}");
                // The same drafts: the drafter's kept context is the one it rebuilds.
                assert_eq!(drafts, fresh_drafts, "{what}");
                assert_eq!(reused.text, fresh.text, "{what}");
                assert_eq!(fresh.cached_tokens, 0);
                // The last prompt and every token of its reply fed back (all but the last).
                let kept_at_least = match turn {
                    0 => 0,
                    // A DFlash turn after a plain one keeps the rows the drafter saw last.
                    _ if on && !dflash[turn - 1] => 7,
                    _ => prompt.len() - 4,
                };
                let kept = reused.cached_tokens;
                assert!(kept >= kept_at_least, "{what}: {kept} < {kept_at_least}");
                assert!(kept < prompt.len(), "{what}");
                prompt.extend(&reused.tokens);
                prompt.extend((0..3).map(|_| rng.below(260) as u32));
            }
            // An edit at position 4: the rows before it are kept, the rest prefilled.
            let mut edited = prompt.clone();
            edited[4] = (edited[4] + 1) % 260;
            let r = req(&edited, sp.clone());
            let last = dflash[4].then_some(&d);
            let (mut s0, mut d0) = (CpuSession::default(), DraftState::default());
            let (fresh, fresh_drafts) = turn_in_session(&mut s0, &mut d0, &cpu, last, &t, &r);
            let (reused, drafts) = turn_in_session(&mut session, &mut draft, &cpu, last, &t, &r);
            assert_eq!(reused.tokens, fresh.tokens);
            assert_eq!(drafts, fresh_drafts);
            assert_eq!(reused.cached_tokens, 4);
            session.reset();
            let (again, _) = turn_in_session(&mut session, &mut draft, &cpu, None, &t, &r);
            assert_eq!(again.cached_tokens, 0);
        }
    }
}

/// A fixed block longer than the drafter's own runs at its length, as z-lab's reference
/// runs any `block_size` over a drafter (found by tests/zlab.rs: we clamped it to the
/// drafter's block), and stays lossless; `auto` still stops at the drafter's block.
#[test]
fn a_fixed_block_longer_than_the_drafters_own_runs_at_its_length() {
    use dflash_core::speculative::DFlashCpu;
    let t = target();
    let cpu = CpuModel::with_kernels(&t.weights, CpuKernels::Quantized);
    let mut s = spec(5);
    s.block_size = 4;
    let d = CpuDrafter::with_kernels(
        &load(&write_drafter(t.config(), &s)).unwrap(),
        CpuKernels::Quantized,
    );
    let p = &prompts()[1];
    let r = req(p, Default::default());
    let plain = generate_cpu(&cpu, &t.tokenizer, &r, &|| 0.0, &mut |_| {}).unwrap();
    for (block, longest) in [
        (BlockSize::Fixed(8), 7),
        (BlockSize::auto_linear(4, 0.01), 3),
    ] {
        let mut p = Recording {
            inner: DFlashCpu::new(&d, &cpu).unwrap(),
            drafts: vec![],
        };
        let mut session = dflash_core::generate::CpuSession::default();
        let out = run_in_session(&mut session, &cpu, &mut p, &t, &r, &block);
        assert_eq!(out.result.tokens, plain.tokens, "{block:?}: lossless");
        let most = p.drafts.iter().map(|(_, d)| d.len()).max().unwrap();
        assert_eq!(most, longest, "{block:?}: the longest block's drafts");
    }
}

/// Every third token id, and the whole vocabulary, as draft vocabularies.
fn vocabularies(vocab: usize) -> (DraftVocab, DraftVocab) {
    let third = (0..vocab as u32).filter(|i| i % 3 != 1).collect();
    let all = (0..vocab as u32).collect();
    (
        DraftVocab::new(third, vocab).unwrap(),
        DraftVocab::new(all, vocab).unwrap(),
    )
}

/// A drafter with a draft vocabulary drafts among it: the whole vocabulary as a list
/// gives the drafts of no list; a subset gives ids in it, and the drafts of no list
/// wherever those are in it (the largest logit, lowest id on ties, of a subset that
/// holds the overall one); and speculation stays lossless.
#[test]
fn a_draft_vocabulary_drafts_among_its_ids_and_stays_lossless() {
    let t = target();
    let w = load(&write_drafter(t.config(), &spec(9))).unwrap();
    let (third, all) = vocabularies(t.config().vocab_size);
    for kernels in [CpuKernels::Reference, CpuKernels::Quantized] {
        let cpu = CpuModel::with_kernels(&t.weights, kernels);
        let with = |v: Option<&DraftVocab>| {
            let mut w = w.clone();
            w.draft_vocab = v.cloned();
            CpuDrafter::with_kernels(&w, kernels)
        };
        let (none, sub, whole) = (with(None), with(Some(&third)), with(Some(&all)));
        let mut agreed = 0;
        for p in prompts() {
            let mut cache = cpu.new_cache(64);
            let taps = cpu
                .forward(&p, &mut cache, LogitRows::None, &w.config.target_layer_ids)
                .unwrap()
                .taps;
            let draft = |d: &CpuDrafter| {
                let mut s = DFlashCpu::new(d, &cpu).unwrap();
                s.commit(&taps);
                s.draft(p[0], p.len(), 8).unwrap()
            };
            let (a, b, c) = (draft(&none), draft(&sub), draft(&whole));
            assert_eq!(c, a, "{kernels:?}: the whole vocabulary as a list");
            for (x, y) in a.iter().zip(&b) {
                assert!(third.ids().binary_search(y).is_ok(), "{y} outside the list");
                if third.ids().binary_search(x).is_ok() {
                    assert_eq!(x, y);
                    agreed += 1;
                }
            }
        }
        assert!(agreed > 0, "no draft of the whole head fell in the list");
        let mut w3 = w.clone();
        w3.draft_vocab = Some(third.clone());
        lossless_with(&t, &w3, kernels);
    }
}

/// `draft_vocab.json` beside a drafter's config is read with it; a file that is not
/// ascending, holds an id outside the vocabulary, is empty, was made for another
/// vocabulary or has an unknown field is a `BadConfig` naming the file.
#[test]
fn the_draft_vocabulary_file_is_read_and_checked() {
    let t = target();
    let vocab = t.config().vocab_size;
    let dir = std::env::temp_dir().join(format!("dflash-draft-vocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in write_drafter(t.config(), &spec(9)) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let path = dir.join(DRAFT_VOCAB_FILE);
    let good = DraftVocab::new(vec![2, 5, 9], vocab).unwrap();
    std::fs::write(&path, good.to_json(vocab, "test")).unwrap();
    let w = load_drafter_dir(&dir, DrafterPrecision::Q8).unwrap();
    assert_eq!(w.draft_vocab, Some(good));
    let bad = [
        format!(r#"{{"target_vocab_size":{vocab},"token_ids":[5,2]}}"#),
        format!(r#"{{"target_vocab_size":{vocab},"token_ids":[2,2]}}"#),
        format!(r#"{{"target_vocab_size":{vocab},"token_ids":[2,{vocab}]}}"#),
        format!(r#"{{"target_vocab_size":{vocab},"token_ids":[]}}"#),
        format!(r#"{{"target_vocab_size":{},"token_ids":[2]}}"#, vocab + 1),
        format!(r#"{{"target_vocab_size":{vocab},"token_ids":[2],"extra":1}}"#),
        "[1, 2".to_string(),
    ];
    for text in bad {
        std::fs::write(&path, &text).unwrap();
        match load_drafter_dir(&dir, DrafterPrecision::Q8) {
            Err(Error::BadConfig(m)) => assert!(m.contains(DRAFT_VOCAB_FILE), "{m}"),
            other => panic!("{text}: {:?}", other.map(|_| ())),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The CPU engine's prior follows the target's weight stream: at the two measured shapes
/// it is within 0.2 one-row steps of what `measure_step_costs` gave at b = 2, 4 and 8
/// (SmolLM2-135M Q4_1, 98 MB; synthetic qwen3-4b, 3.4 GB), a model between them lies
/// between them, and rows are cheaper beside the larger stream.
#[test]
fn cpu_engine_prior_follows_the_weight_stream() {
    use dflash_core::speculative::StepCostPrior;
    let prior = |bytes: u64| {
        StepCostPrior::CpuEngine {
            weight_bytes: bytes,
        }
        .costs(16)
    };
    let (small, large, mid) = (prior(98_000_000), prior(3_400_000_000), prior(600_000_000));
    for (costs, measured) in [(&small, [1.49, 1.84, 2.83]), (&large, [1.38, 1.50, 2.21])] {
        for (b, m) in [2, 4, 8].into_iter().zip(measured) {
            assert!(
                (costs[b] - m).abs() <= 0.2,
                "b = {b}: {} against {m}",
                costs[b]
            );
        }
    }
    for b in 2..=16 {
        assert!(large[b] < small[b] && large[b] <= mid[b] && mid[b] <= small[b]);
    }
    assert_eq!((small[1], large[1]), (1.0, 1.0));
}
