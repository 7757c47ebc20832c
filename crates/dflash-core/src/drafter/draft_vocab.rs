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

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The file name in a drafter folder.
pub const DRAFT_VOCAB_FILE: &str = "draft_vocab.json";

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
