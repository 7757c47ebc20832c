//! Tokenizers as `tokenizers::Tokenizer`: from GGUF metadata (byte-level BPE `gpt2`
//! vocabularies with merges, `llama` SentencePiece vocabularies with scores) or from a
//! Hugging Face `tokenizer.json`.

use crate::check_limit;
use crate::error::{Error, Result};
use crate::formats::gguf::{GgufHeader, Value};
use serde_json::{json, Value as Json};
use tokenizers::Tokenizer;

pub struct TextTokenizer {
    pub inner: Tokenizer,
    pub bos_id: Option<u32>,
    /// Token ids that end generation (EOS, end-of-turn, generation_config's list).
    pub stop_ids: Vec<u32>,
    pub add_bos: bool,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("bos_id", &self.bos_id)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

/// Pre-tokenizer regexes per GGUF `tokenizer.ggml.pre` value (those of the models'
/// own `tokenizer.json` files, as llama.cpp maps them).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Json {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(regex: &str) -> Json {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// (pre_tokenizer, ignore_merges) for a `tokenizer.ggml.pre` value.
fn gpt2_pre_tokenizer(pre: &str) -> Result<(Json, bool)> {
    Ok(match pre {
        "default" | "gpt-2" | "gpt2" => (byte_level(true), false),
        "smollm" => (
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            false,
        ),
        "qwen2" => (json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]}), false),
        "llama3" | "llama-bpe" | "llama-v3" => {
            (json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]}), true)
        }
        other => {
            return Err(Error::UnsupportedTokenizer(format!(
                "GGUF pre-tokenizer {other:?} is not mapped (supported: default, gpt2, smollm, qwen2, llama3)"
            )))
        }
    })
}

const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

fn str_array<'a>(h: &'a GgufHeader, key: &str) -> Result<Vec<&'a str>> {
    let arr = h
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| Error::MissingTokenizer(format!("{key} missing")))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| Error::BadMetadata(format!("{key} holds a non-string")))
        })
        .collect()
}

fn added_tokens(tokens: &[&str], types: &[i64]) -> Vec<Json> {
    let mut out = Vec::new();
    for (id, (&t, &ty)) in tokens.iter().zip(types).enumerate() {
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            if t.is_empty() {
                continue;
            }
            out.push(json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                            "normalized": false, "special": ty == TOKEN_TYPE_CONTROL}));
        }
    }
    out
}

/// A GGUF file's vocabulary: its tokens and their types, one per token.
struct GgufVocab<'a> {
    h: &'a GgufHeader,
    tokens: Vec<&'a str>,
    types: Vec<i64>,
}

impl<'a> GgufVocab<'a> {
    /// `tokenizer.ggml.tokens` and `tokenizer.ggml.token_type` (all normal when absent),
    /// checked to be as many.
    fn read(h: &'a GgufHeader) -> Result<Self> {
        let tokens = str_array(h, "tokenizer.ggml.tokens")?;
        let types: Vec<i64> = match h.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(1.0) as i64).collect(),
            None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(Error::BadMetadata(
                "token_type and tokens differ in length".into(),
            ));
        }
        Ok(GgufVocab { h, tokens, types })
    }

    /// The token id under metadata key `k`, where it names a token of the vocabulary.
    fn id(&self, k: &str) -> Option<u32> {
        self.h
            .get_u64(k)
            .map(|v| v as u32)
            .filter(|&v| (v as usize) < self.tokens.len())
    }

    /// The end-of-sequence, end-of-turn and end-of-message ids, each once, in that order.
    fn stop_ids(&self) -> Vec<u32> {
        let mut stop_ids = Vec::new();
        for k in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(i) = self.id(k) {
                if !stop_ids.contains(&i) {
                    stop_ids.push(i);
                }
            }
        }
        stop_ids
    }

    /// The tokenizer.json of a "gpt2" vocabulary: byte-level BPE with the file's merges
    /// and the pre-tokenizer `tokenizer.ggml.pre` names.
    fn gpt2_spec(&self, vocab: serde_json::Map<String, Json>) -> Result<Json> {
        let h = self.h;
        let merges = str_array(h, "tokenizer.ggml.merges")?;
        let merges: Vec<Json> = merges
            .iter()
            .map(|m| {
                let (a, b) = m
                    .split_once(' ')
                    .ok_or_else(|| Error::BadMetadata(format!("merge {m:?} has no space")))?;
                Ok(json!([a, b]))
            })
            .collect::<Result<_>>()?;
        let pre = h.get_str("tokenizer.ggml.pre").unwrap_or("default");
        let (pre_tok, ignore_merges) = gpt2_pre_tokenizer(pre)?;
        Ok(json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added_tokens(&self.tokens, &self.types),
            "normalizer": null,
            "pre_tokenizer": pre_tok,
            "post_processor": null,
            "decoder": byte_level(true),
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}
        }))
    }

    /// The tokenizer.json of a "llama" vocabulary: SentencePiece BPE, its merges made from
    /// the scores, with byte fallback and the space prefix the file asks for.
    fn llama_spec(&self, vocab: serde_json::Map<String, Json>) -> Result<Json> {
        let (h, tokens) = (self.h, &self.tokens);
        let scores: Vec<f32> = match h.get("tokenizer.ggml.scores").and_then(Value::as_array) {
            Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
            None => {
                return Err(Error::MissingTokenizer(
                    "tokenizer.ggml.scores missing for a llama vocabulary".into(),
                ))
            }
        };
        if scores.len() != tokens.len() {
            return Err(Error::BadMetadata(
                "scores and tokens differ in length".into(),
            ));
        }
        let merges = spm_merges(tokens, &scores, &self.types)?;
        let add_space = h
            .get("tokenizer.ggml.add_space_prefix")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let mut norm = vec![];
        if add_space {
            norm.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
        }
        norm.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
        let unk = self
            .id("tokenizer.ggml.unknown_token_id")
            .map(|i| tokens[i as usize].to_string());
        let mut strip = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if add_space {
            strip.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        Ok(json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added_tokens(tokens, &self.types),
            "normalizer": {"type": "Sequence", "normalizers": norm},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": strip},
            "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                      "ignore_merges": false, "vocab": vocab, "merges": merges}
        }))
    }
}

impl TextTokenizer {
    pub fn from_gguf(h: &GgufHeader) -> Result<Self> {
        let model = h
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| Error::MissingTokenizer("tokenizer.ggml.model missing".into()))?;
        let v = GgufVocab::read(h)?;
        let mut vocab = serde_json::Map::new();
        for (i, t) in v.tokens.iter().enumerate() {
            vocab.insert((*t).to_string(), json!(i));
        }
        let spec = match model {
            "gpt2" => v.gpt2_spec(vocab)?,
            "llama" => v.llama_spec(vocab)?,
            other => {
                return Err(Error::UnsupportedTokenizer(format!(
                    "GGUF tokenizer model {other:?} (supported: gpt2, llama)"
                )))
            }
        };
        let inner = Tokenizer::from_bytes(serde_json::to_vec(&spec).unwrap())
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let stop_ids = v.stop_ids();
        let add_bos = h
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(model == "llama");
        Ok(TextTokenizer {
            inner,
            bos_id: v.id("tokenizer.ggml.bos_token_id"),
            stop_ids,
            add_bos,
        })
    }

    /// From a Hugging Face `tokenizer.json` plus the ids that `tokenizer_config.json` /
    /// `generation_config.json` name.
    pub fn from_hf(
        tokenizer_json: &[u8],
        bos_id: Option<u32>,
        stop_ids: Vec<u32>,
        add_bos: bool,
    ) -> Result<Self> {
        let bad = |e: serde_json::Error| Error::Tokenizer(format!("tokenizer.json: {e}"));
        // Parsed to a JSON value first: `tokenizers` panics (`expect("Helper")`) when a
        // syntax error falls inside the `decoder` object while it reads bytes; from a
        // value the decoder's parse cannot fail that way (found by dflash-fuzz).
        let json: Json = serde_json::from_slice(tokenizer_json).map_err(bad)?;
        let inner: Tokenizer = serde_json::from_value(json).map_err(bad)?;
        Ok(TextTokenizer {
            inner,
            bos_id,
            stop_ids,
            add_bos,
        })
    }

    /// A tokenizer of `vocab` numbered words (`t0`, `t1`, ...; decoded text joins them
    /// with spaces) and no stop ids: the text side of a synthetic model, whose tokens
    /// mean nothing.
    pub fn numbered(vocab: usize) -> Result<Self> {
        let words: serde_json::Map<String, Json> =
            (0..vocab).map(|i| (format!("t{i}"), json!(i))).collect();
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"}
        });
        Self::from_hf(spec.to_string().as_bytes(), None, Vec::new(), false)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, t: &str) -> Option<u32> {
        self.inner.token_to_id(t)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Encodes text; special tokens written in the text (chat markup) are recognised.
    /// With `add_bos`, prepends BOS when the model asks for it.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.add_bos {
            if let Some(b) = self.bos_id {
                if enc.get_ids().first() != Some(&b) {
                    ids.push(b);
                }
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Decodes ids to text; special tokens are kept unless `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }
}

/// Merges of a SentencePiece BPE vocabulary: every split of a piece into two pieces of
/// the vocabulary, ranked by the merged piece's score (highest first), the order in
/// which SentencePiece (and llama.cpp) apply them.
///
/// Each piece's splits are found in time linear in its length (prefix hashes, see
/// [`PieceHashes`]), so a hostile vocabulary of very long pieces costs its own size,
/// not its square; the merges are bounded by `MAX_SPM_MERGES`. Matches are not compared
/// as strings (that would bring the square back): the hash's base is random per
/// process, so two pieces of length n collide with probability below n / 2^61 and no
/// file can be made to collide in advance.
fn spm_merges(tokens: &[&str], scores: &[f32], types: &[i64]) -> Result<Vec<Json>> {
    let mut hashes = PieceHashes::new();
    let mut index = std::collections::HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        index.insert((t.len(), hashes.of(t.as_bytes())), id);
    }
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        if types[id] != TOKEN_TYPE_NORMAL && types[id] != TOKEN_TYPE_USER_DEFINED {
            continue;
        }
        hashes.prefixes(t.as_bytes());
        for (pos, _) in t.char_indices().skip(1) {
            let a = index.get(&(pos, hashes.prefix(pos)));
            let b = index.get(&(t.len() - pos, hashes.suffix(pos)));
            if let (Some(&ia), Some(&ib)) = (a, b) {
                merges.push((scores[id], id, ia, ib));
                check_limit!("SentencePiece merges", merges.len(), MAX_SPM_MERGES);
            }
        }
    }
    merges.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    Ok(merges
        .into_iter()
        .map(|(_, _, a, b)| json!([tokens[a], tokens[b]]))
        .collect())
}

/// Polynomial hashes of byte strings modulo the Mersenne prime 2^61 - 1: the hash of a
/// whole piece, and after [`PieceHashes::prefixes`] the hash of any prefix or suffix of
/// one piece in constant time.
struct PieceHashes {
    /// The polynomial's base, random in [2^32, 2^61 - 1).
    base: u64,
    /// Hashes of the current piece's prefixes (`prefix[i]` of its first `i` bytes).
    prefix: Vec<u64>,
    /// Powers of the base.
    powers: Vec<u64>,
}

impl PieceHashes {
    const MODULUS: u64 = (1 << 61) - 1;

    fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // std's hasher keys are drawn from the OS at random, once per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        PieceHashes {
            base: (1 << 32) + h.finish() % (Self::MODULUS - (1 << 32) - 1),
            prefix: Vec::new(),
            powers: Vec::new(),
        }
    }

    fn mul(a: u64, b: u64) -> u64 {
        let p = a as u128 * b as u128;
        let folded = (p & Self::MODULUS as u128) as u64 + (p >> 61) as u64;
        Self::reduce(folded)
    }

    fn reduce(x: u64) -> u64 {
        let x = (x & Self::MODULUS) + (x >> 61);
        if x >= Self::MODULUS {
            x - Self::MODULUS
        } else {
            x
        }
    }

    fn of(&mut self, bytes: &[u8]) -> u64 {
        bytes.iter().fold(0, |h, &c| {
            Self::reduce(Self::mul(h, self.base) + c as u64 + 1)
        })
    }

    fn prefixes(&mut self, bytes: &[u8]) {
        self.prefix.clear();
        self.prefix.push(0);
        for &c in bytes {
            let h = *self.prefix.last().unwrap();
            self.prefix
                .push(Self::reduce(Self::mul(h, self.base) + c as u64 + 1));
        }
        if self.powers.is_empty() {
            self.powers.push(1);
        }
        while self.powers.len() <= bytes.len() {
            let p = *self.powers.last().unwrap();
            self.powers.push(Self::mul(p, self.base));
        }
    }

    fn prefix(&self, len: usize) -> u64 {
        self.prefix[len]
    }

    /// The hash of the piece's bytes from `start` to its end.
    fn suffix(&self, start: usize) -> u64 {
        let end = self.prefix.len() - 1;
        let shifted = Self::mul(self.prefix[start], self.powers[end - start]);
        Self::reduce(self.prefix[end] + Self::MODULUS - shifted)
    }
}

/// Turns a growing list of generated ids into text pieces, holding back bytes that do
/// not yet form whole UTF-8 characters.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    emitted: usize,
}

impl StreamDecoder {
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = tok.decode(&self.ids, true)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len();
        Ok(new)
    }
    pub fn text(&self, tok: &TextTokenizer) -> Result<String> {
        tok.decode(&self.ids, true)
    }
}

#[cfg(test)]
mod numbered_tests {
    use super::*;

    #[test]
    fn numbered_words_round_trip_and_nothing_stops() {
        let t = TextTokenizer::numbered(1000).unwrap();
        assert_eq!(t.vocab_size(), 1000);
        assert_eq!(t.decode(&[7, 999, 0], false).unwrap(), "t7 t999 t0");
        assert_eq!(t.encode("t12 t3", false).unwrap(), vec![12, 3]);
        assert!((0..1000).all(|i| !t.is_stop(i)));
    }
}
