//! A DFlash bench's results: each block size's summary line and JSON, and the run's.

use super::*;

/// A DFlash bench's results: the block sizes, each one's run over the prompts, the
/// plain totals (tokens after the first, decode seconds) and the load time.
pub(super) struct DflashResults {
    pub(super) blocks: Blocks,
    pub(super) runs: Vec<BlockRun>,
    pub(super) plain: (usize, f64),
    pub(super) load_s: f64,
}

/// Each block size's line (unless --json; `device` in front, `suffix` after) and JSON
/// (its summary, the step costs where it is `auto`, and `fields`), then as
/// `finish_dflash`.
pub(super) fn report_dflash(
    args: &BenchArgs,
    results: DflashResults,
    device: &str,
    suffix: &str,
    fields: &serde_json::Value,
) -> Result<(), CliError> {
    let mut all_lossless = true;
    let mut out = Vec::new();
    let blocks = &results.blocks;
    for (block, run) in blocks.names.iter().zip(results.runs) {
        all_lossless &= run.lossless;
        let mut summary = run.summary(args, block, results.plain, results.load_s);
        // Auto's costs as measured before the prompts, and as the last prompt's steps
        // left them (each prompt starts from the costs the one before refined), both
        // relative to a one-row step.
        let auto = block == "auto";
        let refined = run.step_costs.as_ref().map(|c| {
            let one = c.get(1).copied().unwrap_or(1.0).max(1e-12);
            c.iter().map(|x| x / one).collect::<Vec<f64>>()
        });
        summary["step_costs"] = serde_json::json!(blocks.costs.as_ref().filter(|_| auto));
        summary["step_costs_refined"] = serde_json::json!(refined.filter(|_| auto));
        if let (Some(entries), Some(extra)) = (summary.as_object_mut(), fields.as_object()) {
            entries.extend(extra.clone());
        }
        if !args.json {
            outln!("{}{suffix}", run.line(device, block, results.plain))?;
        }
        out.push(summary);
    }
    finish_dflash(args, out, all_lossless)
}

/// Prints the JSON of every block size (one object, or an array of several); an error
/// where DFlash's output differed from plain decoding.
pub(super) fn finish_dflash(
    a: &BenchArgs,
    mut out: Vec<serde_json::Value>,
    all_lossless: bool,
) -> Result<(), CliError> {
    if a.json {
        let v = if out.len() == 1 {
            out.pop().unwrap()
        } else {
            serde_json::Value::Array(out)
        };
        outln!("{}", serde_json::to_string_pretty(&v).unwrap())?;
    }
    if !all_lossless && !a.rejection_sampling {
        return Err(CliError::Usage(
            "DFlash output differed from plain decoding".into(),
        ));
    }
    Ok(())
}

/// One block size's totals over the prompts of a DFlash benchmark.
pub(super) struct BlockRun {
    pub(super) tokens: usize,
    pub(super) seconds: f64,
    pub(super) acceptance: dflash_core::speculative::Acceptance,
    pub(super) taus: Vec<usize>,
    pub(super) lossless: bool,
    pub(super) rows: Vec<serde_json::Value>,
    /// In auto mode, the step costs as the last prompt's steps refined them.
    pub(super) step_costs: Option<Vec<f64>>,
}

impl BlockRun {
    /// Adds one prompt's plain tokens (decoded in `plain_s` after the first) and DFlash
    /// run in one round: the totals, and the prompt's row (the prompt file's fields but
    /// the text, its token count and the round).
    pub(super) fn add(
        &mut self,
        (fields, prompt_tokens, round): (&serde_json::Value, usize, usize),
        plain: &[u32],
        plain_s: f64,
        s: IdsRun,
    ) {
        let lossless = plain == s.tokens.as_slice();
        self.lossless &= lossless;
        // Decode speed: tokens after the first over the decode time (prefill excluded).
        let p_tok_s = plain.len().saturating_sub(1) as f64 / plain_s.max(1e-9);
        let st = s.tokens.len();
        let s_tok_s = st.saturating_sub(1) as f64 / s.decode_s.max(1e-9);
        self.tokens += st.saturating_sub(1);
        self.seconds += s.decode_s;
        self.acceptance.add(&s.acceptance);
        self.taus.extend(&s.taus);
        let mut row = fields.clone();
        if let Some(o) = row.as_object_mut() {
            o.remove("chat");
            o.remove("prompt");
            let extra = serde_json::json!({
                "prompt_tokens": prompt_tokens,
                "round": round,
                "tokens": plain.len(),
                "plain_tok_s": p_tok_s,
                "dflash_tok_s": s_tok_s,
                "speedup": s_tok_s / p_tok_s.max(1e-9),
                "mean_tau": s.mean_tau(),
                "acceptance_by_position": s.acceptance.rates(),
                "lossless": lossless,
                // Raw totals, so that slices of a sweep add up exactly.
                "plain_decode_s": plain_s,
                "dflash_tokens": st,
                "dflash_decode_s": s.decode_s,
                "steps": s.taus.len(),
                "tau_sum": s.taus.iter().sum::<usize>(),
                "accepted_by_position": s.acceptance.accepted,
                "tried_by_position": s.acceptance.tried,
                "reached_by_position": s.acceptance.reached,
            });
            o.extend(extra.as_object().cloned().unwrap_or_default());
        }
        self.rows.push(row);
    }

    pub(super) fn mean_tau(&self) -> f64 {
        dflash_core::speculative::mean_tau(&self.taus)
    }

    /// The JSON of this block size over every prompt, beside the plain totals (tokens
    /// after the first, seconds).
    pub(super) fn summary(
        &self,
        a: &BenchArgs,
        block: &str,
        (plain_tokens, plain_s): (usize, f64),
        load_s: f64,
    ) -> serde_json::Value {
        let plain_tok_s = plain_tokens as f64 / plain_s.max(1e-9);
        let dflash_tok_s = self.tokens as f64 / self.seconds.max(1e-9);
        serde_json::json!({
            "model": model_label(a),
            "drafter": a.drafter.as_ref().map(|d| d.display().to_string()),
            "block": block,
            "temperature": a.temperature,
            "top_p": a.top_p,
            "seed": a.seed,
            "rejection_sampling": a.rejection_sampling,
            "sampled_drafts": a.sampled_drafts,
            "draft_vocab": a.draft_vocab,
            "synthetic_draft_vocab": a.synthetic_draft_vocab,
            "max_new_tokens": a.max_new_tokens,
            "prompts": self.rows.len() / usize::from(a.rounds),
            "rounds": a.rounds,
            "plain_tok_s": plain_tok_s,
            "dflash_tok_s": dflash_tok_s,
            "speedup": dflash_tok_s / plain_tok_s.max(1e-9),
            "mean_tau": self.mean_tau(),
            "steps": self.taus.len(),
            "acceptance_by_position": self.acceptance.rates(),
            "plain_tokens": plain_tokens,
            "plain_decode_s": plain_s,
            "dflash_tokens": self.tokens,
            "dflash_decode_s": self.seconds,
            "accepted_by_position": self.acceptance.accepted,
            "tried_by_position": self.acceptance.tried,
            "reached_by_position": self.acceptance.reached,
            "skip": a.skip,
            "lossless": self.lossless,
            "load_s": load_s,
            "rows": self.rows,
        })
    }

    /// The one-line text summary.
    pub(super) fn line(
        &self,
        device: &str,
        block: &str,
        (plain_tokens, plain_s): (usize, f64),
    ) -> String {
        let plain_tok_s = plain_tokens as f64 / plain_s.max(1e-9);
        let dflash_tok_s = self.tokens as f64 / self.seconds.max(1e-9);
        format!(
            "{device} block {block}: plain {plain_tok_s:.2} tok/s, DFlash {dflash_tok_s:.2} tok/s ({:.2}x), mean tau {:.2}, lossless {}",
            dflash_tok_s / plain_tok_s.max(1e-9),
            self.mean_tau(),
            self.lossless
        )
    }
}

impl Default for BlockRun {
    fn default() -> Self {
        BlockRun {
            tokens: 0,
            seconds: 0.0,
            acceptance: Default::default(),
            taus: Vec::new(),
            lossless: true,
            rows: Vec::new(),
            step_costs: None,
        }
    }
}
