//! The CPU engines' speculative driver: a whole generation, or one step at a time
//! (`SpeculativeGeneration`) for hosts that yield between steps.

use super::block_loop::*;
use super::policy::*;
use super::proposer::*;
use crate::cpu::{CpuModel, LogitRows};
use crate::drafter::CpuDrafter;
use crate::error::{Error, Result};
use crate::generate::{
    commit_token, next_mask, prepare, CpuSession, GenerateRequest, OnPiece, TokenSink,
};
use crate::grammar::{Constraint, TokenMask};
use crate::rejection::{verify, Proposed, Verdict};
use crate::sampling::{kept_weights_masked, sample_masked, token_logprob, TokenLogprob};
use crate::tokenizer::TextTokenizer;

/// A step's block, its proposals (rejection sampling) and its rows' masks (a grammar).
type Drafted = (Vec<u32>, Vec<Proposed>, Option<Vec<TokenMask>>);

/// A step's accepted drafts, bonus token and committed tokens' log-probabilities.
type Accepted = (usize, u32, Vec<TokenLogprob>);

/// A verified block: the target's logits of its rows, its ids, the proposals and the
/// rows' masks.
struct Rows<'a> {
    logits: &'a [f32],
    ids: &'a [u32],
    proposed: &'a [Proposed],
    masks: Option<&'a [TokenMask]>,
}

/// Speculative generation with the DFlash drafter on the CPU reference models.
pub fn generate_speculative_cpu(
    target: &CpuModel,
    drafter: &CpuDrafter,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    block: &BlockSize,
    clock: &dyn Fn() -> f64,
    on_piece: &mut OnPiece<'_>,
) -> Result<SpeculativeResult> {
    let mut p = DFlashCpu::new(drafter, target)?;
    generate_speculative_with(target, &mut p, tok, req, block, clock, on_piece)
}

/// The speculative loop on the CPU reference target with any proposer.
pub fn generate_speculative_with(
    target: &CpuModel,
    proposer: &mut dyn Proposer,
    tok: &TextTokenizer,
    req: &GenerateRequest,
    block: &BlockSize,
    clock: &dyn Fn() -> f64,
    on_piece: &mut OnPiece<'_>,
) -> Result<SpeculativeResult> {
    let mut session = CpuSession::default();
    let mut g = SpeculativeGeneration::start(
        &mut session,
        target,
        proposer,
        tok,
        req,
        block,
        clock,
        on_piece,
    )?;
    while !g.step(clock)? {}
    Ok(g.finish(clock))
}

/// `generate_speculative_with` one step at a time, for hosts that must yield between
/// steps (the browser worker, so that an interrupt can arrive while DFlash runs on the
/// CPU engine).
pub struct SpeculativeGeneration<'a> {
    target: &'a CpuModel,
    proposer: &'a mut dyn Proposer,
    req: &'a GenerateRequest,
    context: usize,
    taps: Vec<usize>,
    session: &'a mut CpuSession,
    cached_tokens: usize,
    history: Vec<u32>,
    /// The grammar's state after the committed tokens (the anchor included).
    grammar: Option<Constraint>,
    anchor: u32,
    sink: TokenSink<'a>,
    blocks: BlockLoop,
    /// Rows the last step committed (1 after the prefill): what a drafting step takes
    /// into the drafter's context within its timed part (`Proposer::settle`).
    last_committed: usize,
    done: bool,
    /// Start and end of the prefill.
    times: (f64, f64),
}

impl<'a> SpeculativeGeneration<'a> {
    /// Checks the request, runs the prefill of the prompt past the rows `session` and
    /// the proposer already hold (its taps to the proposer) and takes the first token.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        session: &'a mut CpuSession,
        target: &'a CpuModel,
        proposer: &'a mut dyn Proposer,
        tok: &'a TextTokenizer,
        req: &'a GenerateRequest,
        block: &BlockSize,
        clock: &dyn Fn() -> f64,
        on_piece: &'a mut OnPiece<'a>,
    ) -> Result<Self> {
        let (context, budget) = prepare(req, &target.config)?;
        let taps = proposer.tap_layers();
        let capacity = proposer.block_capacity().max(1);
        let t0 = clock();
        let k = session
            .keep_prefix(target, &req.prompt_ids, context, true)
            .min(proposer.context_rows());
        session.truncate(k);
        proposer.truncate(k);
        let out = session.forward(target, &req.prompt_ids[k..], LogitRows::Last, &taps)?;
        proposer.commit(&out.taps);
        session.drafted = session.len();
        let history = req.prompt_ids.clone();
        let mut grammar = req.grammar.clone();
        let mask = next_mask(&mut grammar)?;
        let anchor = sample_masked(
            &out.logits,
            &req.sampling,
            &history,
            history.len(),
            mask.as_ref(),
        );
        commit_token(&mut grammar, anchor)?;
        let sp = &req.sampling;
        let lp = sp
            .logprobs
            .map(|n| token_logprob(&out.logits, sp, &history, mask.as_ref(), anchor, n));
        let t1 = clock();
        let mut sink = TokenSink::new(tok, req, budget, on_piece);
        let done = budget == 0 || sink.push_scored(anchor, false, lp.as_ref())?;
        Ok(SpeculativeGeneration {
            target,
            proposer,
            req,
            context,
            taps,
            session,
            cached_tokens: k,
            history,
            grammar,
            anchor,
            sink,
            blocks: BlockLoop::new(block, capacity),
            last_committed: 1,
            done,
            times: (t0, t1),
        })
    }

    /// One draft + verify step; true when generation has ended.
    pub fn step(&mut self, clock: &dyn Fn() -> f64) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let target = self.target;
        let vocab = target.config.vocab_size;
        let tap_w = self.taps.len() * target.config.hidden_size;
        let pos = self.session.len();
        let b = self
            .blocks
            .next_block(self.context - pos, self.sink.remaining());
        if b > 1 {
            self.proposer.settle(self.last_committed);
        }
        let t_step = clock();
        let (block_ids, proposed, masks) = self.draft(pos, b)?;
        let b = block_ids.len();
        // Verify: one target pass over the block, with taps.
        let out = self
            .session
            .forward(target, &block_ids, LogitRows::All, &self.taps)?;
        self.history.push(self.anchor);
        let rows = Rows {
            logits: &out.logits,
            ids: &block_ids,
            proposed: &proposed,
            masks: masks.as_deref(),
        };
        let (acc, bonus, logprobs) = self.accept(&rows, pos, vocab)?;
        // Commit anchor + acc drafts; roll back the rest; feed the drafter their taps.
        self.session.truncate(pos + acc + 1);
        self.proposer.commit(&out.taps[..(acc + 1) * tap_w]);
        self.session.drafted = pos + acc + 1;
        self.last_committed = acc + 1;
        let committed = block_ids[1..=acc].iter().copied().chain([bonus]);
        let sink = &mut self.sink;
        let mut scores = logprobs.iter();
        self.done = self
            .blocks
            .commit_step(b, clock() - t_step, acc, committed, |t, d| {
                sink.push_scored(t, d, scores.next())
            })?;
        self.anchor = bonus;
        Ok(self.done)
    }

    /// The block `[anchor, drafts]` of `b` rows at `pos`, the proposals drawn
    /// (rejection sampling) or none, and under a grammar each row's mask (the drafts cut
    /// where the grammar refuses one; with exact-match verification a draft the grammar
    /// forces made that token: `Constraint::block_masks`).
    fn draft(&mut self, pos: usize, b: usize) -> Result<Drafted> {
        let mut drafts = Vec::new();
        let mut proposed = Vec::new();
        let sampling = &self.req.sampling;
        let rejection = sampling.speculative_rejection && !sampling.is_greedy();
        if b > 1 {
            drafts = if rejection {
                proposed = self.proposer.propose(self.anchor, pos, b, sampling)?;
                proposed.iter().map(|p| p.token).collect()
            } else {
                self.proposer.draft(self.anchor, pos, b)?
            };
            let vocab = self.target.config.vocab_size;
            if drafts.len() != b - 1 || drafts.iter().any(|&d| d as usize >= vocab) {
                return Err(Error::Internal(format!(
                    "the proposer returned {} drafts for a block of {b}",
                    drafts.len()
                )));
            }
        }
        let masks = match self.grammar.as_mut() {
            Some(g) => Some(g.block_masks(&mut drafts, !rejection)?),
            None => None,
        };
        proposed.truncate(drafts.len());
        let block_ids = [self.anchor].into_iter().chain(drafts).collect();
        Ok((block_ids, proposed, masks))
    }

    /// The accepted drafts and the bonus token of a verified block: exact match against
    /// the position-keyed sample, or rejection sampling against the proposals; each row
    /// under the grammar's mask after the tokens before it (committed as they are
    /// accepted).
    fn accept(&mut self, rows: &Rows<'_>, pos: usize, vocab: usize) -> Result<Accepted> {
        let sampling = &self.req.sampling;
        let (block_ids, proposed) = (rows.ids, rows.proposed);
        let b = block_ids.len();
        let mut logprobs = Vec::new();
        for j in 0..b {
            let row = &rows.logits[j * vocab..(j + 1) * vocab];
            let mask = rows.masks.map(|m| &m[j]);
            let (drawn, rejected) = if !proposed.is_empty() && j + 1 < b {
                // Rejection sampling against the proposal: the committed token has the
                // target's distribution.
                let (w, total) = kept_weights_masked(row, sampling, &self.history, mask);
                let p: Vec<f32> = w.iter().map(|x| x / total).collect();
                match verify(&p, &proposed[j], sampling.seed, (pos + j + 1) as u32) {
                    Verdict::Accept => (block_ids[j + 1], false),
                    Verdict::Reject(t) => (t, true),
                }
            } else {
                let t = sample_masked(row, sampling, &self.history, pos + j + 1, mask);
                (t, false)
            };
            commit_token(&mut self.grammar, drawn)?;
            if let Some(n) = sampling.logprobs {
                logprobs.push(token_logprob(row, sampling, &self.history, mask, drawn, n));
            }
            if !rejected && j + 1 < b && block_ids[j + 1] == drawn {
                self.history.push(drawn);
            } else {
                return Ok((j, drawn, logprobs));
            }
        }
        Err(Error::Internal(
            "the last row of a block gave no bonus token".into(),
        ))
    }

    /// The result: tokens, text, finish reason, timings and acceptance.
    pub fn finish(self, clock: &dyn Fn() -> f64) -> SpeculativeResult {
        let (t0, t1) = self.times;
        let n = self.req.prompt_ids.len();
        let mut r = self.sink.finish(n, t1 - t0, clock() - t1);
        r.cached_tokens = self.cached_tokens;
        self.blocks.result(r)
    }
}
