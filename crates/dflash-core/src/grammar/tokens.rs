//! The token table llguidance masks over, built from our own tokenizers: each id's
//! bytes (byte-level BPE pieces through GPT-2's byte-to-character map, SentencePiece
//! pieces with `▁` as a space and `<0xNN>` byte-fallback pieces as their byte, added
//! tokens as their text, special ones behind llguidance's 0xFF marker), padded with
//! empty entries (never allowed) to the model's logits width.

use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use std::collections::HashMap;

/// How a vocabulary's pieces spell their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-level BPE: every byte is one printable character.
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xNN>` for a byte.
    SentencePiece,
    /// Pieces are their text (word-level vocabularies, such as the synthetic models').
    Plain,
}

fn spelling(tok: &TextTokenizer) -> Result<Spelling> {
    let decoder = serde_json::to_value(tok.inner.get_decoder())
        .map_err(|e| Error::Internal(format!("the tokenizer's decoder: {e}")))?;
    let text = decoder.to_string();
    Ok(if decoder.is_null() {
        Spelling::Plain
    } else if text.contains("\"ByteLevel\"") {
        Spelling::ByteLevel
    } else if text.contains("\"ByteFallback\"") || text.contains('▁') {
        Spelling::SentencePiece
    } else {
        return Err(Error::UnsupportedTokenizer(format!(
            "grammars need a byte-level BPE or SentencePiece vocabulary, not the decoder {text}"
        )));
    })
}

/// GPT-2's `bytes_to_unicode`, inverted: the byte each piece character stands for.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("a code point below 512")
        };
        map.insert(c, b);
    }
    map
}

/// The bytes of one vocabulary piece.
fn piece_bytes(piece: &str, spelling: Spelling, chars: &HashMap<char, u8>) -> Result<Vec<u8>> {
    match spelling {
        Spelling::Plain => Ok(piece.as_bytes().to_vec()),
        Spelling::SentencePiece => {
            let hex = piece
                .strip_prefix("<0x")
                .and_then(|h| h.strip_suffix('>'))
                .filter(|h| h.len() == 2);
            match hex.map(|h| u8::from_str_radix(h, 16)) {
                Some(Ok(b)) => Ok(vec![b]),
                _ => Ok(piece.replace('▁', " ").into_bytes()),
            }
        }
        Spelling::ByteLevel => piece
            .chars()
            .map(|c| {
                chars.get(&c).copied().ok_or_else(|| {
                    Error::UnsupportedTokenizer(format!(
                        "byte-level piece {piece:?} has the character {c:?}, which stands for no byte"
                    ))
                })
            })
            .collect(),
    }
}

/// Spells token ids as their bytes.
pub struct TokenSpeller<'a> {
    tok: &'a TextTokenizer,
    spelling: Spelling,
    chars: HashMap<char, u8>,
    added: HashMap<u32, tokenizers::AddedToken>,
}

impl<'a> TokenSpeller<'a> {
    pub fn new(tok: &'a TextTokenizer) -> Result<Self> {
        Ok(TokenSpeller {
            tok,
            spelling: spelling(tok)?,
            chars: byte_level_chars(),
            added: tok.inner.get_added_tokens_decoder().into_iter().collect(),
        })
    }

    /// The bytes of `id` (an added token's text; empty for an id the tokenizer lacks),
    /// and whether it is a special token.
    pub fn spell(&self, id: u32) -> Result<(Vec<u8>, bool)> {
        if let Some(a) = self.added.get(&id) {
            return Ok((a.content.as_bytes().to_vec(), a.special));
        }
        match self.tok.id_to_token(id) {
            Some(piece) => Ok((piece_bytes(&piece, self.spelling, &self.chars)?, false)),
            None => Ok((Vec::new(), false)),
        }
    }
}

/// Every id's bytes, `width` entries (the model's logits width; ids the tokenizer does
/// not have are empty), special tokens behind llguidance's marker.
pub fn token_bytes(tok: &TextTokenizer, width: usize) -> Result<Vec<Vec<u8>>> {
    let speller = TokenSpeller::new(tok)?;
    let mut words = Vec::with_capacity(width);
    for id in 0..width as u32 {
        let (mut word, special) = speller.spell(id)?;
        if special {
            word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
        // The trie is walked recursively, one level per byte.
        crate::check_limit!(format!("bytes of token {id}"), word.len(), MAX_TOKEN_BYTES);
        words.push(word);
    }
    Ok(words)
}

/// llguidance's view of a tokenizer: the trie of its token bytes, and the tokenizer
/// itself for the text a grammar forces.
pub struct TokenTable {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenTable {
    /// The table of `tok` over `width` ids, with the tokenizer's stop ids as the
    /// end-of-sequence tokens (a grammar allows them only where it may end).
    pub fn new(tok: &TextTokenizer, width: usize) -> Result<Self> {
        let words = token_bytes(tok, width)?;
        let stops: Vec<TokenId> = tok
            .stop_ids
            .iter()
            .copied()
            .filter(|&s| (s as usize) < width)
            .collect();
        let eos = stops
            .first()
            .copied()
            .unwrap_or(llguidance::toktrie::INVALID_TOKEN);
        let mut trie = TokTrie::from(&TokRxInfo::new(width as u32, eos), &words);
        if !stops.is_empty() {
            trie = trie.with_eos_tokens(&stops);
        }
        Ok(TokenTable {
            trie,
            tokenizer: tok.inner.clone(),
        })
    }
}

impl TokenizerEnv for TokenTable {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}
