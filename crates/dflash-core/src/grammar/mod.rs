//! Grammars that constrain generation (structured output, tool calls), through
//! llguidance: a request's JSON schema, Lark grammar or regex becomes a [`Constraint`]
//! that gives, at each position, the [`TokenMask`] of the tokens the grammar allows
//! there (the stop tokens only where the grammar may end).
//!
//! # The definition, and why speculation stays exact
//!
//! Constrained plain decoding is the definition: at each position the sampler
//! (`sampling::sample_masked`) takes the logits, applies the penalties, then the mask of
//! the grammar state after every token before it (disallowed logits become -inf), then
//! temperature and the filters, then the position-keyed draw. A speculative step keeps
//! that: the drafts are cut at the first one the grammar refuses (`Constraint::
//! valid_prefix`; a refused draft could never equal the target's token), and each
//! verify row is drawn under the mask of the committed state advanced by the drafts
//! before it, which equal plain decoding's tokens for every row that is kept (rows after
//! the first mismatch are dropped). The target's logits are batch invariant, so every
//! kept row's token is plain decoding's.
//!
//! The [`Grammars`] of a model (its token table and llguidance's parser factory) are
//! built once, on the first constrained request.

mod tokens;

use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::TokEnv;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value as Json;
use std::sync::Arc;

pub use tokens::{token_bytes, TokenSpeller, TokenTable};

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a schema (`response_format: {"type": "json_schema"}`). Strict:
    /// a schema keyword llguidance does not implement is an error; not strict: ignored.
    JsonSchema { schema: Json, strict: bool },
    /// A Lark grammar (llguidance's dialect: `%json{...}`, special tokens, lazy lexemes).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

impl GrammarSpec {
    /// Checks the sizes against `limits` before anything compiles.
    fn check_limits(&self) -> Result<()> {
        let bytes = match self {
            GrammarSpec::JsonObject => 0,
            GrammarSpec::JsonSchema { schema, .. } => {
                crate::check_limit!("schema depth", json_depth(schema), MAX_SCHEMA_DEPTH);
                schema.to_string().len()
            }
            GrammarSpec::Lark(s) | GrammarSpec::Regex(s) => s.len(),
        };
        crate::check_limit!("grammar bytes", bytes, MAX_GRAMMAR_BYTES);
        Ok(())
    }

    /// llguidance's grammar.
    fn top_level(&self) -> Result<TopLevelGrammar> {
        let json = |schema: &Json, strict: bool| -> Result<TopLevelGrammar> {
            let mut schema = schema.clone();
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(Error::BadGrammar(format!(
                    "a JSON schema is an object or a boolean, not {}",
                    short(&schema.to_string())
                )));
            }
            if let Some(obj) = schema.as_object_mut() {
                let options = serde_json::to_value(json_options(strict))
                    .map_err(|e| Error::Internal(e.to_string()))?;
                obj.insert("x-guidance".into(), options);
            }
            Ok(TopLevelGrammar::from_json_schema(schema))
        };
        Ok(match self {
            GrammarSpec::JsonObject => json(&serde_json::json!({"type": "object"}), true)?,
            GrammarSpec::JsonSchema { schema, strict } => json(schema, *strict)?,
            GrammarSpec::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_grammar(GrammarWithLexer::from_regex(r)),
        })
    }
}

/// The JSON layout we generate: compact separators as Python's `json.dumps` writes
/// them, no free whitespace (a model cannot pad its answer with newlines for ever).
fn json_options(strict: bool) -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        lenient: !strict,
        ..JsonCompileOptions::default()
    }
}

/// Nesting depth of a JSON value (a scalar is 0).
fn json_depth(v: &Json) -> usize {
    match v {
        Json::Array(a) => 1 + a.iter().map(json_depth).max().unwrap_or(0),
        Json::Object(o) => 1 + o.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// At most 200 characters of `s`, for error messages.
fn short(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// A model's grammar compiler: its token table and llguidance's parser factory.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    stop_ids: Vec<u32>,
}

impl Grammars {
    /// The compiler for `tok` over `width` logits (the model's vocabulary width).
    pub fn new(tok: &TextTokenizer, width: usize) -> Result<Self> {
        let table: TokEnv = Arc::new(TokenTable::new(tok, width)?);
        let mut factory = ParserFactory::new_simple(&table)
            .map_err(|e| Error::Internal(format!("llguidance's parser factory: {e}")))?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
            stop_ids: tok.stop_ids.clone(),
        })
    }

    /// A fresh constraint for `spec`, or `BadGrammar` naming what is wrong with it.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        spec.check_limits()?;
        let parser = self
            .factory
            .create_parser(spec.top_level()?)
            .map_err(|e| Error::BadGrammar(short(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::BadGrammar(short(&e)));
        }
        let warnings = matcher.grammar_warnings();
        Ok(Constraint {
            matcher,
            stop_ids: self.stop_ids.clone(),
            consumed: 0,
            warnings,
        })
    }
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

/// The tokens allowed at one position: a bit per id (1 allowed), 32 ids per word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    pub words: Vec<u32>,
}

impl TokenMask {
    /// The mask that allows every id of a vocabulary of `n`.
    pub fn all(n: usize) -> Self {
        TokenMask {
            words: vec![u32::MAX; n.div_ceil(32)],
        }
    }

    pub fn allows(&self, t: u32) -> bool {
        self.words
            .get(t as usize / 32)
            .is_some_and(|w| w >> (t % 32) & 1 == 1)
    }

    /// The one id it allows, if it allows exactly one.
    pub fn only(&self) -> Option<u32> {
        let mut found = None;
        for (i, &w) in self.words.iter().enumerate() {
            if w == 0 {
                continue;
            }
            if found.is_some() || w.count_ones() > 1 {
                return None;
            }
            found = Some(i as u32 * 32 + w.trailing_zeros());
        }
        found
    }

    /// How many ids it allows.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets every disallowed logit to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let w = self.words.get(i).copied().unwrap_or(0);
            for (j, l) in chunk.iter_mut().enumerate() {
                if w >> j & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// One request's grammar state: the tokens committed so far, and what it allows next.
/// Cloning gives an independent state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    stop_ids: Vec<u32>,
    /// Tokens consumed (stop tokens are never consumed: they end generation).
    consumed: usize,
    /// What the compiler left unenforced (a JSON schema's keywords it lacks, compiled
    /// not strict): the answer reports them, so that it is never taken for valid against
    /// what it was not held to.
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("consumed", &self.consumed)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The mask of the next position: what the grammar allows after the tokens
    /// committed, the stop tokens included only where it may end (only they once it
    /// has ended).
    pub fn mask(&mut self) -> Result<TokenMask> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.broken("computing a mask", e))?;
        let mask = TokenMask {
            words: vob.as_slice().to_vec(),
        };
        if mask.count() == 0 {
            return Err(Error::Internal(
                "the grammar allows no token and cannot end".into(),
            ));
        }
        Ok(mask)
    }

    /// Commits token `t`, which the last mask allowed (a stop token ends generation and
    /// changes nothing here).
    pub fn commit(&mut self, t: u32) -> Result<()> {
        if self.stop_ids.contains(&t) {
            return Ok(());
        }
        self.matcher
            .consume_token(t)
            .map_err(|e| self.broken("committing a token", e))?;
        self.consumed += 1;
        Ok(())
    }

    /// How many leading `drafts` the grammar could take from here, stopping at the first
    /// it refuses (or at a stop token): a superset test (it accepts tokenizations the
    /// mask may not), enough to cut drafts that could never be accepted. The state does
    /// not change.
    pub fn valid_prefix(&mut self, drafts: &[u32]) -> usize {
        let n = drafts
            .iter()
            .position(|t| self.stop_ids.contains(t))
            .unwrap_or(drafts.len());
        self.matcher.validate_tokens(&drafts[..n]).unwrap_or(0)
    }

    /// The masks of a block's verify rows, computed before the pass: row 0's from the
    /// committed state, row i's after drafts 1..i. The drafts are cut at the first one
    /// row's mask refuses (it could never be the target's token), and with `force` a
    /// draft where the mask allows one token only is that token (a JSON key, a
    /// bracket: it is the target's token there, so it is accepted). The state ends where
    /// it began. A row's mask is plain decoding's wherever the drafts before it are
    /// plain decoding's tokens, the only rows a verify pass keeps.
    pub fn block_masks(&mut self, drafts: &mut Vec<u32>, force: bool) -> Result<Vec<TokenMask>> {
        let mut masks = vec![self.mask()?];
        let mut kept = 0;
        while kept < drafts.len() {
            let mask = &masks[kept];
            if force {
                if let Some(only) = mask.only() {
                    drafts[kept] = only;
                }
            }
            let d = drafts[kept];
            if !mask.allows(d) || self.stop_ids.contains(&d) {
                break;
            }
            self.matcher
                .consume_token(d)
                .map_err(|e| self.broken("taking a draft", e))?;
            kept += 1;
            masks.push(self.mask()?);
        }
        drafts.truncate(kept);
        self.matcher
            .rollback(kept)
            .map_err(|e| self.broken("rolling drafts back", e))?;
        Ok(masks)
    }

    /// Whether the grammar has ended: only a stop token may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a whole sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    fn broken(&self, doing: &str, e: impl std::fmt::Display) -> Error {
        Error::Internal(format!(
            "the grammar failed {doing} after {} tokens: {}",
            self.consumed,
            short(&e.to_string())
        ))
    }
}
