//! The training loop: random anchors inside the responses, blocks [anchor, MASK...]
//! against the frozen target's taps, the position-decayed cross-entropy, AdamW with
//! warmup and cosine decay, checkpoints that a later run resumes from, a progress bar
//! and a JSON-lines log.

use crate::data::Sample;
use crate::draft_model::{DraftParams, DraftTrainer, PendingHits, SeqBatch, SeqLoss};
use crate::head_loss::CandidateHead;
pub use crate::init::{init_from_drafter, init_from_target};
use crate::optim::{schedule, AdamW};
use crate::progress::cpu_seconds;
pub use crate::progress::Progress;
use crate::prompts::Rng;
use crate::target::Target;
use crate::TrainError;
use candle_core::{DType, Device, Tensor, Var};
use dflash_core::config::{ModelConfig, Rope, RopeStyle};
use dflash_core::drafter::{DFlash2Config, DrafterConfig, DrafterFile, LayerKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    pub layers: usize,
    pub block_size: usize,
    pub gamma: f64,
    pub lr: f64,
    pub warmup_frac: f64,
    pub weight_decay: f64,
    pub steps: usize,
    pub seqs_per_step: usize,
    pub anchors_per_seq: usize,
    pub max_seq_len: usize,
    pub checkpoint_every: usize,
    pub mask_token_id: u32,
    pub seed: u64,
    pub grad_clip: f64,
    /// Train a DFlash2 drafter (`DFlash2DraftModel`) with these sizes; None: DFlash.
    #[serde(default)]
    /// DFlash2's sizes (the published release: 2, 16, 256, 16), or plain DFlash.
    pub dflash2: Option<DFlash2Config>,
    /// The loss's softmax over a sample of the vocabulary; None: the whole vocabulary.
    #[serde(default)]
    pub sampled_head: Option<SampledHead>,
    /// Stop (checkpointed) after this step although the schedule spans `steps`: a run
    /// resumed with another step count is reproduced by stopping each part where it was
    /// resumed. Not one of the run's settings (never saved, never compared on resume).
    #[serde(skip)]
    pub stop_at: Option<usize>,
}

/// A cross-entropy whose softmax runs over the tokens of the data's responses (every
/// label is one) and `negatives` random vocabulary ids drawn afresh each step, with the
/// whole vocabulary every `full_every`-th step (0: never). The lm_head's rows are most of
/// a step's work (49,152 of them for SmolLM2 against ~3,500 tokens in the responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampledHead {
    pub negatives: usize,
    pub full_every: usize,
}

/// Where a new run's weights start.
pub enum Init<'a> {
    /// Random matrices (normal(0, 0.02)), norms 1.
    Random,
    /// The drafter's layers from the target's top layers (`init_from_target`).
    Target(&'a dflash_core::weights::ModelWeights),
    /// An exported drafter's tensors (same layers, taps and mask token); a DFlash2 run
    /// started from a DFlash drafter keeps the identity start of its extra tensors.
    Drafter(&'a Path),
}

/// The loss decay the DFlash paper uses for its block sizes (7 at 16, 5 at 10, 4 at 8).
pub fn default_gamma(block: usize) -> f64 {
    match block {
        16.. => 7.0,
        10..=15 => 5.0,
        _ => 4.0,
    }
}

/// The drafter with `layers` layers for target `t`: the target's widths, theta and
/// epsilon, full attention, plain RoPE over whole heads, the default tap formula.
pub fn drafter_config(
    t: &ModelConfig,
    layers: usize,
    block: usize,
    mask_token_id: u32,
) -> DrafterConfig {
    DrafterConfig {
        hidden_size: t.hidden_size,
        intermediate_size: t.intermediate_size,
        num_layers: layers,
        num_heads: t.num_heads,
        num_kv_heads: t.num_kv_heads,
        head_dim: t.head_dim,
        rms_norm_eps: t.rms_norm_eps,
        rope: Rope::plain(t.rope.theta, RopeStyle::Neox, t.head_dim),
        vocab_size: t.vocab_size,
        layer_kinds: vec![LayerKind::Full; layers],
        sliding_window: 0,
        is_causal: None,
        input_embedding_scale: 1.0,
        output_multiplier: 1.0,
        final_logit_softcapping: None,
        num_target_layers: t.num_layers,
        block_size: block,
        mask_token_id,
        target_layer_ids: DrafterConfig::default_target_layer_ids(layers, t.num_layers),
        architecture: "DFlashDraftModel".into(),
        dflash2: None,
    }
}

/// `drafter_config` for the run's architecture: DFlash2 (`DFlash2DraftModel`) with the
/// run's sizes, scales 1, no soft-capping.
pub fn run_drafter_config(t: &ModelConfig, tc: &TrainConfig) -> DrafterConfig {
    let mut c = drafter_config(t, tc.layers, tc.block_size, tc.mask_token_id);
    if let Some(d) = &tc.dflash2 {
        c.architecture = "DFlash2DraftModel".into();
        c.dflash2 = Some(d.clone());
    }
    c
}

/// The z-lab config.json of drafter `c` for target `t` (its context length beside).
pub fn drafter_file(t: &ModelConfig, c: &DrafterConfig) -> DrafterFile {
    DrafterFile {
        max_position_embeddings: Some(t.max_position_embeddings),
        ..DrafterFile::from(c)
    }
}

/// The mask token: a special token the chat never uses, by name, else the last id.
pub fn pick_mask_token(tok: &dflash_core::tokenizer::TextTokenizer, vocab: usize) -> u32 {
    for name in [
        "<|mask|>",
        "<|MASK|>",
        "<mask>",
        "<empty_output>",
        "<jupyter_script>",
        "<|fim_pad|>",
        "<reponame>",
    ] {
        if let Some(id) = tok.token_to_id(name) {
            return id;
        }
    }
    vocab as u32 - 1
}

/// Files of a training run directory.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn drafter_config(&self) -> PathBuf {
        self.0.join("drafter_config.json")
    }
    pub fn train_config(&self) -> PathBuf {
        self.0.join("train_config.json")
    }
    pub fn checkpoint(&self) -> PathBuf {
        self.0.join("checkpoint.safetensors")
    }
    pub fn state(&self) -> PathBuf {
        self.0.join("checkpoint.json")
    }
    pub fn log(&self) -> PathBuf {
        self.0.join("train.log.jsonl")
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    step: usize,
    opt_step: usize,
    trained_tokens: u64,
    cpu_seconds: f64,
}

fn io<E: std::fmt::Display>(e: E) -> TrainError {
    TrainError::Io(e.to_string())
}

/// Writes params and optimizer moments, then the step, each by rename (an interrupted
/// write leaves the previous checkpoint whole).
fn save_checkpoint(
    dir: &RunDir,
    p: &DraftParams,
    opt: &AdamW,
    state: &State,
) -> Result<(), TrainError> {
    let mut t: std::collections::HashMap<String, Tensor> = std::collections::HashMap::new();
    for (n, v) in &p.vars {
        t.insert(format!("param.{n}"), v.as_tensor().clone());
    }
    for (n, m) in &opt.m {
        t.insert(format!("m.{n}"), m.clone());
    }
    for (n, v) in &opt.v {
        t.insert(format!("v.{n}"), v.clone());
    }
    let tmp = dir.0.join("checkpoint.safetensors.tmp");
    candle_core::safetensors::save(&t, &tmp)?;
    std::fs::rename(&tmp, dir.checkpoint()).map_err(io)?;
    let tmp = dir.0.join("checkpoint.json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_string_pretty(state).expect("state serializes"),
    )
    .map_err(io)?;
    std::fs::rename(&tmp, dir.state()).map_err(io)?;
    Ok(())
}

/// Named tensors (Adam's first or second moments).
pub type Moments = BTreeMap<String, Tensor>;

/// Parameters (and moments) of the last checkpoint.
pub fn load_params(
    dir: &RunDir,
    cfg: &DrafterConfig,
    dev: &Device,
) -> Result<(DraftParams, Moments, Moments), TrainError> {
    let all = candle_core::safetensors::load(dir.checkpoint(), dev)
        .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.checkpoint().display())))?;
    let (mut p, mut m, mut v) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (k, t) in all {
        if let Some(n) = k.strip_prefix("param.") {
            p.insert(n.to_string(), t);
        } else if let Some(n) = k.strip_prefix("m.") {
            m.insert(n.to_string(), t);
        } else if let Some(n) = k.strip_prefix("v.") {
            v.insert(n.to_string(), t);
        }
    }
    let params =
        DraftParams::from_tensors(cfg, p).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    Ok((params, m, v))
}

/// Anchors of one sequence: up to `n` distinct positions in `[from, len - 2]`.
pub fn pick_anchors(rng: &mut Rng, from: usize, len: usize, n: usize) -> Vec<usize> {
    if len < 2 || from > len - 2 {
        return vec![];
    }
    let mut all: Vec<usize> = (from..=len - 2).collect();
    rng.shuffle(&mut all);
    all.truncate(n);
    all.sort_unstable();
    all
}

/// Every token that some response of `samples` holds, ascending.
fn response_tokens(samples: &[Sample]) -> Vec<u32> {
    let set: std::collections::BTreeSet<u32> = samples
        .iter()
        .flat_map(|s| s.response_ids.iter().copied())
        .collect();
    set.into_iter().collect()
}

/// The sample for slot `j` of `step`: epochs walk a seeded permutation of the data.
fn sample_index(seed: u64, n: usize, g: usize) -> usize {
    let epoch = g / n;
    let mut perm: Vec<usize> = (0..n).collect();
    Rng(seed ^ (epoch as u64).wrapping_mul(0x9E37)).shuffle(&mut perm);
    perm[g % n]
}

/// Trains (or resumes) the drafter of run directory `dir` on `samples`. A new run starts
/// from `init` (the target's weights) when given, else from random matrices.
pub fn train(
    target: &Target,
    samples: &[Sample],
    dir: &Path,
    tc: &TrainConfig,
    init: Init,
    quiet: bool,
) -> Result<TrainSummary, TrainError> {
    let run = RunDir(dir.to_path_buf());
    std::fs::create_dir_all(dir).map_err(io)?;
    if samples.is_empty() {
        return Err(TrainError::Data("no training samples".into()));
    }
    let dcfg = write_run_configs(&run, &target.config, tc)?;
    let (params, mut opt, mut state) = resume_or_start(&run, &dcfg, &target.device, tc, init)?;
    let inputs = StepInputs::new(target, samples, tc, &dcfg, &params)?;
    let warmup = ((tc.steps as f64 * tc.warmup_frac).round() as usize).max(1);
    let mut log = RunLog::open(&run, tc.steps, quiet, &state)?;
    let mut last = TrainSummary::default();
    let vars = params.all();
    let mut taps_cache: Vec<Option<Tensor>> = vec![None; samples.len()];
    let end = tc.stop_at.map_or(tc.steps, |s| s.min(tc.steps));
    while state.step < end {
        let step = state.step;
        let lr = schedule(step, tc.steps, warmup, tc.lr, 0.05);
        opt.lr = lr;
        let started = std::time::Instant::now();
        let mut sums = inputs.forward_step(step, &mut taps_cache)?;
        let Some(loss) = sums.losses()? else {
            state.step += 1;
            continue;
        };
        let fwd_s = started.elapsed().as_secs_f64();
        let grad_norm = optimizer_step(&loss.total, &vars, &mut opt, tc.grad_clip)?;
        sums.settle()?;
        state.step += 1;
        state.opt_step = opt.step_t;
        state.trained_tokens += sums.tokens;
        let report = StepReport {
            step: state.step,
            lr,
            grad_norm,
            fwd_s,
            started,
            sums: &sums,
            loss: &loss,
        };
        last = log.record(&report, tc.dflash2.is_some())?;
        if state.step % tc.checkpoint_every == 0 || state.step == end {
            state.cpu_seconds = log.clock.cpu_s();
            save_checkpoint(&run, &params, &opt, &state)?;
        }
    }
    log.progress.finish();
    Ok(last)
}

/// Refuses a resume whose settings differ from those the run directory was started
/// with, naming each one; only the step count (a run may be extended) and the checkpoint
/// interval may change.
fn check_same_run(run: &RunDir, tc: &TrainConfig) -> Result<(), TrainError> {
    if !run.train_config().exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(run.train_config()).map_err(io)?;
    let prev: TrainConfig =
        serde_json::from_str(&text).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    let (old, new) = (serde_json::json!(prev), serde_json::json!(tc));
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        return Ok(());
    };
    let differ: Vec<String> = new
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "steps" | "checkpoint_every"))
        .filter(|(k, v)| old.get(k.as_str()) != Some(v))
        .map(|(k, v)| {
            format!(
                "{k} {} (now {v})",
                old.get(k.as_str()).unwrap_or(&serde_json::Value::Null)
            )
        })
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(TrainError::Checkpoint(format!(
        "{} was started with other settings: {}; resume with the run's own settings or train into a new directory",
        run.0.display(),
        differ.join(", ")
    )))
}

/// The run's drafter config, checked against target `tcfg`: fixed at the first run (a
/// resume must agree with it), written with the training config into the run directory.
fn write_run_configs(
    run: &RunDir,
    tcfg: &ModelConfig,
    tc: &TrainConfig,
) -> Result<DrafterConfig, TrainError> {
    let dfile = drafter_file(tcfg, &run_drafter_config(tcfg, tc));
    check_same_run(run, tc)?;
    std::fs::write(run.drafter_config(), dfile.to_json_pretty()).map_err(io)?;
    std::fs::write(
        run.train_config(),
        serde_json::to_string_pretty(tc).expect("json"),
    )
    .map_err(io)?;
    let dcfg = DrafterConfig::try_from(dfile)?;
    dcfg.validate_against(tcfg)?;
    Ok(dcfg)
}

/// The parameters, optimizer and step of the run: the last checkpoint's when there is
/// one, else new parameters (seeded, then set from `init`) at step 0.
fn resume_or_start(
    run: &RunDir,
    dcfg: &DrafterConfig,
    dev: &Device,
    tc: &TrainConfig,
    init: Init,
) -> Result<(DraftParams, AdamW, State), TrainError> {
    let mut opt = AdamW::new(tc.lr, tc.weight_decay);
    if run.checkpoint().exists() && run.state().exists() {
        let st: State = serde_json::from_str(&std::fs::read_to_string(run.state()).map_err(io)?)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let (p, m, v) = load_params(run, dcfg, dev)?;
        opt.m = m;
        opt.v = v;
        opt.step_t = st.opt_step;
        return Ok((p, opt, st));
    }
    let p = DraftParams::init(dcfg, dev, tc.seed)?;
    match init {
        Init::Random => {}
        Init::Target(w) => init_from_target(&p, w, dcfg)?,
        Init::Drafter(d) => init_from_drafter(&p, d, dcfg)?,
    }
    let state = State {
        step: 0,
        opt_step: 0,
        trained_tokens: 0,
        cpu_seconds: 0.0,
    };
    Ok((p, opt, state))
}

/// What every step reads: the frozen target, the data, the run's settings, the drafter's
/// loss and its parameters.
struct StepInputs<'a> {
    target: &'a Target,
    samples: &'a [Sample],
    tc: &'a TrainConfig,
    /// The target layers whose outputs the drafter reads.
    tap_layers: &'a [usize],
    trainer: DraftTrainer<'a>,
    params: &'a DraftParams,
    /// Every token of the data's responses, ascending: the sampled head's fixed part.
    response_tokens: Vec<u32>,
}

impl<'a> StepInputs<'a> {
    /// The inputs of run `tc` of drafter `dcfg` on `target`, with the drafter's loss.
    fn new(
        target: &'a Target,
        samples: &'a [Sample],
        tc: &'a TrainConfig,
        dcfg: &'a DrafterConfig,
        params: &'a DraftParams,
    ) -> Result<Self, TrainError> {
        let trainer = DraftTrainer::new(
            dcfg.clone(),
            &target.embed,
            &target.lm_head,
            tc.gamma,
            tc.max_seq_len + tc.block_size + 1,
        )?;
        Ok(StepInputs {
            target,
            samples,
            tc,
            tap_layers: &dcfg.target_layer_ids,
            trainer,
            params,
            response_tokens: response_tokens(samples),
        })
    }

    /// The softmax rows of step `step`: None (the whole vocabulary) unless the loss is
    /// sampled and this is not one of its full steps.
    fn step_head(&self, step: usize) -> Result<Option<CandidateHead>, TrainError> {
        let Some(sh) = self.tc.sampled_head else {
            return Ok(None);
        };
        if sh.full_every > 0 && step % sh.full_every == sh.full_every - 1 {
            return Ok(None);
        }
        let mut rng = Rng(self.tc.seed ^ 0x4EAD ^ ((step as u64) << 24));
        Ok(Some(CandidateHead::draw(
            self.trainer.lm_head,
            &self.response_tokens,
            sh.negatives,
            &mut rng,
        )?))
    }

    /// The forward of step `step`: its sequences (the data's seeded order), their random
    /// anchors and their losses, summed. A sequence without an anchor is skipped.
    fn forward_step(
        &self,
        step: usize,
        taps_cache: &mut [Option<Tensor>],
    ) -> Result<StepSums, TrainError> {
        let tc = self.tc;
        let mut sums = StepSums::new(tc.block_size);
        let head = self.step_head(step)?;
        sums.head_rows = head.as_ref().map(|h| h.ids.len());
        for j in 0..tc.seqs_per_step {
            let idx = sample_index(tc.seed, self.samples.len(), step * tc.seqs_per_step + j);
            let s = &self.samples[idx];
            let mut toks = s.tokens();
            toks.truncate(tc.max_seq_len);
            let mut rng = Rng(tc.seed ^ ((step as u64) << 20) ^ j as u64);
            let anchors =
                pick_anchors(&mut rng, s.prompt_ids.len(), toks.len(), tc.anchors_per_seq);
            if anchors.is_empty() {
                continue;
            }
            let tt = std::time::Instant::now();
            let taps = self.sample_taps(&mut taps_cache[idx], &toks)?;
            sums.taps_s += tt.elapsed().as_secs_f64();
            let l = self.trainer.sequence_loss(
                self.params,
                &SeqBatch {
                    taps: &taps,
                    tokens: &toks,
                    anchors: &anchors,
                    loss_from: s.prompt_ids.len(),
                    head: head.as_ref(),
                },
            )?;
            sums.add(l, toks.len())?;
        }
        Ok(sums)
    }

    /// The target's taps of `toks`. The target is frozen: each sample's taps are computed
    /// once and kept (f16) in its `cached` slot.
    fn sample_taps(&self, cached: &mut Option<Tensor>, toks: &[u32]) -> Result<Tensor, TrainError> {
        Ok(match &*cached {
            Some(t) if t.dim(0)? == toks.len() => t.to_dtype(DType::F32)?,
            _ => {
                let t = full_f32_products(|| self.target.taps_of(toks, self.tap_layers))?;
                *cached = Some(t.to_dtype(DType::F16)?);
                t
            }
        })
    }
}

/// Runs `f` with CUDA's f32 matrix products at full precision (the target's taps, even
/// where the drafter's own products run on TF32: `dflash-train train --tf32`), then
/// restores the setting. Without CUDA the setting means nothing.
fn full_f32_products<T>(f: impl FnOnce() -> T) -> T {
    let tf32 = candle_core::cuda::gemm_reduced_precision_f32();
    candle_core::cuda::set_gemm_reduced_precision_f32(false);
    let out = f();
    candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
    out
}

/// One step's sequences added up: the weighted losses (tensors of the graph) and their
/// weights, and per slot the counts the log reports.
struct StepSums {
    /// Summed weighted NLL and its weight.
    total: Option<Tensor>,
    wsum: f64,
    /// Per slot: labelled positions, and how many the argmax got right (those still on
    /// the device counted by `settle`).
    counts: Vec<usize>,
    correct: Vec<usize>,
    pending: Vec<PendingHits>,
    /// Tokens of the step's sequences.
    tokens: u64,
    /// Seconds spent getting the target's taps.
    taps_s: f64,
    /// The sampled head's rows, when this step's softmax ran over a sample.
    head_rows: Option<usize>,
    /// DFlash2: the selector's summed weighted NLL and its weight.
    sel_total: Option<Tensor>,
    sel_w: f64,
    /// DFlash2, per slot: labels inside the top-K, and labels the selector picks.
    in_top_k: Vec<usize>,
    sel_correct: Vec<usize>,
}

/// The step's losses: the main mean cross-entropy, DFlash2's selector mean
/// cross-entropy, and their sum, the one differentiated.
struct StepLoss {
    main: Tensor,
    selector: Option<Tensor>,
    total: Tensor,
}

impl StepSums {
    /// Nothing yet, for blocks of `b` slots.
    fn new(b: usize) -> Self {
        StepSums {
            total: None,
            wsum: 0.0,
            counts: vec![0usize; b],
            correct: vec![0usize; b],
            pending: Vec::new(),
            tokens: 0u64,
            taps_s: 0.0,
            head_rows: None,
            sel_total: None,
            sel_w: 0.0,
            in_top_k: vec![0usize; b],
            sel_correct: vec![0usize; b],
        }
    }

    /// Adds the loss `l` of one sequence of `tokens` tokens.
    fn add(&mut self, l: SeqLoss, tokens: usize) -> Result<(), TrainError> {
        self.wsum += l.weight;
        for k in 0..self.counts.len() {
            self.counts[k] += l.counts[k];
            self.correct[k] += l.correct[k];
            self.in_top_k[k] += l.in_top_k[k];
            self.sel_correct[k] += l.selector_correct[k];
        }
        self.pending.extend(l.pending);
        self.sel_w += l.selector_weight;
        if let Some(sn) = l.selector_nll {
            self.sel_total = Some(match self.sel_total.take() {
                Some(t) => (t + sn)?,
                None => sn,
            });
        }
        self.tokens += tokens as u64;
        self.total = Some(match self.total.take() {
            Some(t) => (t + l.weighted_nll)?,
            None => l.weighted_nll,
        });
        Ok(())
    }

    /// Counts the hits of the argmaxes still on the device: called once the step's
    /// kernels are queued, so that reading them waits once, not once per sequence.
    fn settle(&mut self) -> Result<(), TrainError> {
        for p in self.pending.drain(..) {
            p.count_into(&mut self.correct)?;
        }
        Ok(())
    }

    /// The step's mean losses (taking the sums); None when no sequence had a label.
    fn losses(&mut self) -> Result<Option<StepLoss>, TrainError> {
        let Some(total) = self.total.take().filter(|_| self.wsum > 0.0) else {
            return Ok(None);
        };
        let main = (total / self.wsum)?;
        // DFlash2: the selector's mean cross-entropy is added (its gradient reaches only
        // the selector's tensors).
        let selector = match self.sel_total.take().filter(|_| self.sel_w > 0.0) {
            Some(t) => Some((t / self.sel_w)?),
            None => None,
        };
        let total = match &selector {
            Some(s) => (&main + s)?,
            None => main.clone(),
        };
        Ok(Some(StepLoss {
            main,
            selector,
            total,
        }))
    }
}

/// Backpropagates `loss`, scales the gradients down to global norm `clip` when their
/// norm is above it, and takes one AdamW step; returns the norm before clipping.
fn optimizer_step(
    loss: &Tensor,
    vars: &[(&String, &Var)],
    opt: &mut AdamW,
    clip: f64,
) -> Result<f64, TrainError> {
    let mut grads = loss.backward()?;
    // Each gradient's sum of squares on the device, read in one go (one wait for the
    // backward pass, not one per tensor), added up in f64 in the tensors' order.
    let sums = vars
        .iter()
        .filter_map(|(_, v)| grads.get(v.as_tensor()))
        .map(|g| g.sqr()?.sum_all())
        .collect::<candle_core::Result<Vec<_>>>()?;
    let sq: f64 = if sums.is_empty() {
        0.0
    } else {
        Tensor::stack(&sums, 0)?
            .to_vec1::<f32>()?
            .iter()
            .map(|&s| s as f64)
            .sum()
    };
    let norm = sq.sqrt();
    if norm > clip {
        let f = clip / norm;
        for (_, v) in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * f)?);
            }
        }
    }
    opt.step(vars, &grads)?;
    Ok(norm)
}

/// The CPU and wall time of a run, counting the earlier runs it resumes.
struct Clock {
    /// This process's CPU seconds when the run started.
    cpu0: f64,
    /// CPU seconds of the runs before this one (from the checkpoint).
    cpu_before: f64,
    started: std::time::Instant,
}

impl Clock {
    /// Starts counting now, after `cpu_before` CPU seconds of earlier runs.
    fn start(cpu_before: f64) -> Self {
        Clock {
            cpu0: cpu_seconds(),
            cpu_before,
            started: std::time::Instant::now(),
        }
    }

    /// CPU seconds of the whole run so far.
    fn cpu_s(&self) -> f64 {
        self.cpu_before + cpu_seconds() - self.cpu0
    }

    /// Wall seconds of this process's part of the run.
    fn wall_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// A finished optimizer step, as the log reports it.
struct StepReport<'a> {
    /// Steps done, this one included.
    step: usize,
    lr: f64,
    grad_norm: f64,
    /// Seconds of the forward (taps included).
    fwd_s: f64,
    started: std::time::Instant,
    sums: &'a StepSums,
    loss: &'a StepLoss,
}

/// Where a run reports: the JSON-lines log (appended to across resumes), the progress
/// bar and the run's clock.
struct RunLog {
    file: std::fs::File,
    progress: Progress,
    clock: Clock,
}

/// Rewrites the log at `path` without the lines of steps after `step` (a missing log is
/// left alone; a line that does not parse is kept).
fn drop_lines_after(path: &Path, step: usize) -> Result<(), TrainError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let after = |line: &str| {
        let v: Option<serde_json::Value> = serde_json::from_str(line).ok();
        v.and_then(|v| v["step"].as_u64())
            .is_some_and(|s| s as usize > step)
    };
    if !text.lines().any(after) {
        return Ok(());
    }
    let kept: String = text
        .lines()
        .filter(|l| !after(l))
        .map(|l| format!("{l}\n"))
        .collect();
    // By rename, as checkpoints are written: an interruption leaves one log or the other.
    let tmp = path.with_extension("jsonl.tmp");
    std::fs::write(&tmp, kept).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

impl RunLog {
    /// Opens the log of `run` at the checkpoint's `state` (the lines of steps after it, which
    /// an interrupted run logged but did not keep, are dropped: they run again), a bar of
    /// `steps` (hidden when `quiet`), and starts the clock.
    fn open(run: &RunDir, steps: usize, quiet: bool, state: &State) -> Result<Self, TrainError> {
        drop_lines_after(&run.log(), state.step)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run.log())
            .map_err(io)?;
        let mut progress = Progress::new(steps as u64, "train");
        if quiet {
            progress
                .bar
                .set_draw_target(indicatif::ProgressDrawTarget::hidden());
            progress.tty = true;
        }
        Ok(RunLog {
            file,
            progress,
            clock: Clock::start(state.cpu_seconds),
        })
    }

    /// Writes the log line of step `r` and updates the bar; returns the step's summary.
    fn record(&mut self, r: &StepReport, dflash2: bool) -> Result<TrainSummary, TrainError> {
        let s = r.sums;
        let loss_v = r.loss.main.to_scalar::<f32>()? as f64;
        let acc = slot_rates(&s.correct, &s.counts);
        let proxy = tau_proxy(&acc);
        let dt = r.started.elapsed().as_secs_f64();
        let mut rec = serde_json::json!({
            "step": r.step, "lr": r.lr, "loss": loss_v, "grad_norm": r.grad_norm, "acc": acc, "tau_proxy": proxy,
            "labels": s.counts.iter().sum::<usize>(), "tokens": s.tokens, "step_s": dt, "taps_s": s.taps_s, "fwd_s": r.fwd_s,
            "cpu_s": self.clock.cpu_s(), "wall_s": self.clock.wall_s(),
        });
        if let Some(rows) = s.head_rows {
            // The loss and acc of this step are over the sampled rows, not the vocabulary.
            rec["head_rows"] = serde_json::json!(rows);
        }
        if dflash2 {
            add_selector_fields(&mut rec, r.loss.selector.as_ref(), s)?;
        }
        writeln!(self.file, "{rec}").map_err(io)?;
        self.progress.update(
            r.step as u64,
            format!(
                "loss {loss_v:.3} acc1 {:.2} acc4 {:.2} tau~{:.2} {:.1}s/step",
                acc[0],
                acc.get(3).copied().unwrap_or(0.0),
                proxy,
                dt
            ),
        );
        Ok(TrainSummary {
            step: r.step,
            loss: loss_v,
            acc,
            tau_proxy: proxy,
            selector_loss: rec.get("selector_loss").and_then(|v| v.as_f64()),
            selector_tau_proxy: rec.get("selector_tau_proxy").and_then(|v| v.as_f64()),
        })
    }
}

/// DFlash2's fields of a log line: the selector's loss, the slot accuracy of the walk
/// under teacher forcing (label in the top-K and ranked first by the selector), its tau
/// proxy, and the top-K recall.
fn add_selector_fields(
    rec: &mut serde_json::Value,
    selector_loss: Option<&Tensor>,
    s: &StepSums,
) -> Result<(), TrainError> {
    let sel_acc = slot_rates(&s.sel_correct, &s.counts);
    rec["selector_loss"] = match selector_loss {
        Some(l) => (l.to_scalar::<f32>()? as f64).into(),
        None => serde_json::Value::Null,
    };
    rec["selector_acc"] = serde_json::json!(sel_acc);
    rec["top_k_recall"] = serde_json::json!(slot_rates(&s.in_top_k, &s.counts));
    rec["selector_tau_proxy"] = tau_proxy(&sel_acc).into();
    Ok(())
}

/// `hits` per labelled position of each slot 1..B (0 for a slot without labels).
fn slot_rates(hits: &[usize], counts: &[usize]) -> Vec<f64> {
    (1..counts.len())
        .map(|k| {
            if counts[k] > 0 {
                hits[k] as f64 / counts[k] as f64
            } else {
                0.0
            }
        })
        .collect()
}

/// 1 + expected accepted drafts if the slot accuracies were independent: a
/// training-time proxy of tau.
fn tau_proxy(acc: &[f64]) -> f64 {
    let mut run_p = 1.0;
    1.0 + acc
        .iter()
        .map(|&a| {
            run_p *= a;
            run_p
        })
        .sum::<f64>()
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct TrainSummary {
    pub step: usize,
    pub loss: f64,
    pub acc: Vec<f64>,
    pub tau_proxy: f64,
    /// DFlash2 only.
    pub selector_loss: Option<f64>,
    pub selector_tau_proxy: Option<f64>,
}
