//! Self-distillation data: the target answers every prompt greedily through its own chat
//! template; each answered prompt is one JSON line of token ids. Appending line by line
//! makes the run resumable: prompts already in the file are skipped.

use crate::prompts::Prompt;
use crate::target::Target;
use crate::TrainError;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::model_files::LoadedModel;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub id: String,
    pub source: String,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

impl Sample {
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.prompt_ids.clone();
        t.extend_from_slice(&self.response_ids);
        t
    }
}

pub fn read_samples(path: &Path) -> Result<Vec<Sample>, TrainError> {
    let f = std::fs::File::open(path)
        .map_err(|e| TrainError::Io(format!("{}: {e}", path.display())))?;
    let lines: Vec<String> = std::io::BufReader::new(f)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|e| TrainError::Io(e.to_string()))?;
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Sample>(line) {
            Ok(s) => out.push(s),
            // A line cut by an interruption of `data` can only be the last one (`data`
            // drops it when it resumes); anything else is corrupt.
            Err(_) if i + 1 == lines.len() && !line.ends_with('}') => {}
            Err(e) => {
                return Err(TrainError::Data(format!(
                    "{} line {}: {e}",
                    path.display(),
                    i + 1
                )))
            }
        }
    }
    Ok(out)
}

/// What answers the prompts greedily: each answer ends at (and includes) the first stop
/// token, or has `max_new` tokens.
pub trait Answerer {
    fn answer(
        &self,
        prompts: &[Vec<u32>],
        max_new: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<Vec<u32>>, TrainError>;
}

/// candle's f32 target, the prompts of a batch together (padded).
impl Answerer for Target {
    fn answer(
        &self,
        prompts: &[Vec<u32>],
        max_new: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<Vec<u32>>, TrainError> {
        Ok(self.generate_greedy(prompts, max_new, is_stop)?)
    }
}

/// The quantized CPU engine, one prompt at a time (its products use every core).
impl Answerer for CpuModel {
    fn answer(
        &self,
        prompts: &[Vec<u32>],
        max_new: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<Vec<u32>>, TrainError> {
        prompts
            .iter()
            .map(|p| {
                let mut cache = self.new_cache(p.len() + max_new);
                let mut out = Vec::new();
                let mut logits = self.forward(p, &mut cache, LogitRows::Last, &[])?.logits;
                while out.len() < max_new {
                    let t = self.argmax_last(&logits);
                    out.push(t);
                    if is_stop(t) || out.len() == max_new {
                        break;
                    }
                    logits = self.forward(&[t], &mut cache, LogitRows::Last, &[])?.logits;
                }
                Ok(out)
            })
            .collect()
    }
}

pub struct DataOptions {
    pub batch: usize,
    pub max_new_tokens: usize,
    pub max_prompt_tokens: usize,
}

/// The ids of the samples in `out` (none when it does not exist), after dropping a last
/// line cut by an interruption, so that appending continues a whole file.
pub fn existing_ids(out: &Path) -> Result<HashSet<String>, TrainError> {
    let mut done = HashSet::new();
    if !out.exists() {
        return Ok(done);
    }
    let text = std::fs::read_to_string(out).map_err(|e| TrainError::Io(e.to_string()))?;
    let mut keep = String::new();
    for line in text.lines() {
        if let Ok(s) = serde_json::from_str::<Sample>(line) {
            done.insert(s.id);
            keep.push_str(line);
            keep.push('\n');
        }
    }
    if keep.len() != text.len() {
        std::fs::write(out, keep).map_err(|e| TrainError::Io(e.to_string()))?;
    }
    Ok(done)
}

/// Answers the prompts not yet in `out`, `opts.batch` at a time (sorted by length so a
/// batch pads little), appending each batch's lines.
pub fn distill(
    model: &LoadedModel,
    target: &dyn Answerer,
    prompts: &[Prompt],
    out: &Path,
    opts: &DataOptions,
    progress: &indicatif::ProgressBar,
) -> Result<usize, TrainError> {
    let done = existing_ids(out)?;
    let mut todo: Vec<(Prompt, Vec<u32>)> = Vec::new();
    for p in prompts {
        if done.contains(&p.id) {
            continue;
        }
        let ids = model.chat_ids(None, &p.text)?;
        if ids.len() <= opts.max_prompt_tokens {
            todo.push((p.clone(), ids));
        }
    }
    progress.set_length((done.len() + todo.len()) as u64);
    progress.set_position(done.len() as u64);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|e| TrainError::Io(e.to_string()))?;
    let mut written = 0;
    // Batches in prompt order (so an interrupted run has a prefix of the mix), each
    // sorted by length inside.
    for chunk in todo.chunks(opts.batch.max(1)) {
        let ids: Vec<Vec<u32>> = chunk.iter().map(|(_, i)| i.clone()).collect();
        let answers = target.answer(&ids, opts.max_new_tokens, &|t| model.tokenizer.is_stop(t))?;
        for ((p, ids), resp) in chunk.iter().zip(answers) {
            let s = Sample {
                id: p.id.clone(),
                source: p.source.to_string(),
                prompt_ids: ids.clone(),
                response_ids: resp,
            };
            writeln!(
                f,
                "{}",
                serde_json::to_string(&s).expect("sample serializes")
            )
            .map_err(|e| TrainError::Io(e.to_string()))?;
            written += 1;
        }
        f.flush().map_err(|e| TrainError::Io(e.to_string()))?;
        progress.inc(chunk.len() as u64);
    }
    Ok(written)
}

/// A draft vocabulary of `size` ids for a target of `vocab_size` tokens, ranked by how
/// often the target wrote them in `samples`' responses, then how often its prompts
/// hold them, then by id (a tokenizer's early merges are its frequent pieces); `always`
/// (the target's stop tokens) first, so that a draft can end an answer.
pub fn draft_vocab(
    samples: &[Sample],
    vocab_size: usize,
    size: usize,
    always: &[u32],
) -> Result<dflash_core::drafter::DraftVocab, TrainError> {
    let mut response = vec![0u64; vocab_size];
    let mut prompt = vec![0u64; vocab_size];
    for s in samples {
        for (ids, counts) in [
            (&s.response_ids, &mut response),
            (&s.prompt_ids, &mut prompt),
        ] {
            for &t in ids.iter().filter(|&&t| (t as usize) < vocab_size) {
                counts[t as usize] += 1;
            }
        }
    }
    let mut ranked: Vec<u32> = (0..vocab_size as u32).collect();
    ranked.sort_by_key(|&t| {
        let t = t as usize;
        (
            std::cmp::Reverse(response[t]),
            std::cmp::Reverse(prompt[t]),
            t,
        )
    });
    let mut ids: Vec<u32> = always
        .iter()
        .copied()
        .filter(|&t| (t as usize) < vocab_size)
        .collect();
    ids.extend(ranked.into_iter().filter(|t| !always.contains(t)));
    ids.truncate(size.clamp(1, vocab_size));
    ids.sort_unstable();
    ids.dedup();
    Ok(dflash_core::drafter::DraftVocab::new(ids, vocab_size)?)
}
