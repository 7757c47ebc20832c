//! A drafter's draft vocabulary (`draft_vocab.json` beside its config): the token ids
//! its greedy drafts are chosen among. The drafter's lm_head is the target's, and over a
//! vocabulary of 49,152 to 152,064 tokens it is the largest matrix of a draft pass (for
//! SmolLM2, 28 MB of the drafter's 42 MB per pass); the rows of the ids a target
//! actually writes (the most frequent in its own answers) are a few thousand. Drafting
//! among them (FR-Spec's frequency-ranked draft head) reads a fraction of the head and
//! stays lossless: the target still verifies every draft with its whole head, and a
//! draft outside the list is only a draft that is never proposed.
//!
//! The file (one definition, `DraftVocabFile`): `{"target_vocab_size": V, "token_ids":
//! [...ascending, unique, < V], "source": "how it was made"}`. Ascending ids keep the
//! argmax's tie rule (lowest id) that of the whole head.
//!
//! The same list in the form vLLM reads (EAGLE-3's reduced draft vocabulary), written by
//! the export beside it: `draft_vocab.safetensors` with `d2t` (`[n]` int64, target id =
//! `i + d2t[i]`) and `lm_head.weight` (`[n, hidden]`, the target's head rows of those
//! ids, the drafter's own head there), and `draft_vocab_size: n` in config.json. Its own
//! file (not model.safetensors) so that loaders without a draft vocabulary never see it:
//! llama.cpp's converter reads only `model*.safetensors` (and drops `d2t`), transformers
//! only `model.safetensors`; SGLang ignores both tensors. Our loader reads either form
//! (both must then agree) and drafts with the target's head rows as before.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The file name in a drafter folder.
pub const DRAFT_VOCAB_FILE: &str = "draft_vocab.json";

/// The `d2t` form's file name in a drafter folder.
pub const D2T_FILE: &str = "draft_vocab.safetensors";

/// `draft_vocab.json` as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftVocabFile {
    pub target_vocab_size: usize,
    pub token_ids: Vec<u32>,
    /// How the list was made (free text).
    #[serde(default)]
    pub source: String,
}

/// A validated draft vocabulary: ascending, unique ids below the target's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftVocab {
    ids: Vec<u32>,
}

impl DraftVocab {
    /// `ids` (ascending, unique, each below `vocab_size`, at least one).
    pub fn new(ids: Vec<u32>, vocab_size: usize) -> Result<Self> {
        let bad = |m: String| Err(Error::BadConfig(format!("{DRAFT_VOCAB_FILE}: {m}")));
        if ids.is_empty() {
            return bad("no token ids".into());
        }
        if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
            return bad(format!(
                "token ids not ascending and unique ({} then {})",
                w[0], w[1]
            ));
        }
        let last = *ids.last().expect("not empty") as usize;
        if last >= vocab_size {
            return bad(format!(
                "token id {last} outside the vocabulary of {vocab_size}"
            ));
        }
        Ok(DraftVocab { ids })
    }

    /// Parses and validates the file against the target's vocabulary size.
    pub fn from_json(text: &str, vocab_size: usize) -> Result<Self> {
        let f: DraftVocabFile = serde_json::from_str(text)
            .map_err(|e| Error::BadConfig(format!("{DRAFT_VOCAB_FILE}: {e}")))?;
        if f.target_vocab_size != vocab_size {
            return Err(Error::BadConfig(format!(
                "{DRAFT_VOCAB_FILE}: made for a vocabulary of {}, the target has {vocab_size}",
                f.target_vocab_size
            )));
        }
        Self::new(f.token_ids, vocab_size)
    }

    /// From `d2t` offsets (target id = `i + d2t[i]`), validated as [`DraftVocab::new`].
    pub fn from_d2t(d2t: &[i64], vocab_size: usize) -> Result<Self> {
        let ids = d2t
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                u32::try_from(i as i64 + d).map_err(|_| {
                    Error::BadConfig(format!(
                        "{D2T_FILE}: d2t[{i}] = {d} maps outside the vocabulary"
                    ))
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        Self::new(ids, vocab_size)
            .map_err(|e| Error::BadConfig(e.to_string().replace(DRAFT_VOCAB_FILE, D2T_FILE)))
    }

    /// The `d2t` offsets of this list: `ids[i] - i`.
    pub fn d2t(&self) -> Vec<i64> {
        let offset = |(i, &id): (usize, &u32)| i64::from(id) - i as i64;
        self.ids.iter().enumerate().map(offset).collect()
    }

    /// Reads `draft_vocab.safetensors`: its `d2t` (int64 or int32, one dimension; as long
    /// as `draft_vocab_size` where config.json gives it) and, where present, checks
    /// `lm_head.weight` is `[n, hidden]`.
    pub fn from_d2t_file(
        bytes: &[u8],
        vocab_size: usize,
        hidden: usize,
        draft_vocab_size: Option<usize>,
    ) -> Result<Self> {
        use safetensors::{Dtype, SafeTensors};
        let bad = |m: String| Error::BadConfig(format!("{D2T_FILE}: {m}"));
        let st = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        let t = st.tensor("d2t").map_err(|_| bad("no d2t tensor".into()))?;
        let d2t: Vec<i64> = match (t.dtype(), t.shape()) {
            (Dtype::I64, [_]) => t
                .data()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            (Dtype::I32, [_]) => t
                .data()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()).into())
                .collect(),
            (dt, shape) => {
                return Err(bad(format!(
                    "d2t is {dt:?} {shape:?}, not a list of integers"
                )))
            }
        };
        if let Some(n) = draft_vocab_size.filter(|&n| n != d2t.len()) {
            return Err(bad(format!(
                "{} ids in d2t, config.json's draft_vocab_size is {n}",
                d2t.len()
            )));
        }
        if let Ok(head) = st.tensor("lm_head.weight") {
            if head.shape() != [d2t.len(), hidden] {
                return Err(bad(format!(
                    "lm_head.weight is {:?}, not [{}, {hidden}]",
                    head.shape(),
                    d2t.len()
                )));
            }
        }
        Self::from_d2t(&d2t, vocab_size)
    }

    /// The file's text.
    pub fn to_json(&self, vocab_size: usize, source: &str) -> String {
        let f = DraftVocabFile {
            target_vocab_size: vocab_size,
            token_ids: self.ids.clone(),
            source: source.into(),
        };
        serde_json::to_string(&f).expect("plain data")
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The greedy draft among the list: the largest of `logits` (indexed like the list)
    /// as a token id, ties to the lowest id, NaN never (the whole head's rule).
    pub fn argmax(&self, logits: &[f32]) -> u32 {
        self.ids[crate::cpu::ops::argmax(logits)]
    }
}
