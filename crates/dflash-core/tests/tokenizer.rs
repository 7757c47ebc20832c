//! Tokenizers built from GGUF metadata: SentencePiece (`llama`) vocabularies with byte
//! fallback, and streaming decode / stop strings.

use dflash_core::formats::gguf::{parse_header, writer, Value};
use dflash_core::generate::StopMatcher;
use dflash_core::tokenizer::{StreamDecoder, TextTokenizer};

fn spm_tokenizer() -> TextTokenizer {
    let pieces = [
        ("\u{2581}", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("he", -3.0),
        ("ll", -3.0),
        ("hell", -4.0),
        ("hello", -5.0),
        ("\u{2581}hello", -6.0),
        ("\u{2581}w", -3.5),
        ("or", -3.0),
        ("\u{2581}wor", -4.5),
        ("ld", -3.2),
        ("\u{2581}world", -7.0),
    ];
    let pieces: Vec<(String, f32)> = pieces.iter().map(|(p, s)| (p.to_string(), *s)).collect();
    spm_vocabulary(&pieces).unwrap()
}

/// A SentencePiece vocabulary: id 0 <unk>, 1 <s>, 2 </s>, 3..259 bytes, then `pieces`
/// (normal tokens) with their scores.
fn spm_vocabulary(pieces: &[(String, f32)]) -> dflash_core::Result<TextTokenizer> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    let mut scores = vec![0f32; 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, s) in pieces {
        tokens.push(p.clone());
        types.push(1);
        scores.push(*s);
    }
    let md = vec![
        (
            "general.architecture".to_string(),
            Value::String("llama".into()),
        ),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(scores.iter().map(|&s| Value::F32(s)).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(0)),
    ];
    let f = writer::write(&md, &[]);
    TextTokenizer::from_gguf(&parse_header(&f, f.len() as u64).unwrap())
}

#[test]
fn sentencepiece_vocabulary_merges_by_score_and_falls_back_to_bytes() {
    let t = spm_tokenizer();
    let ids = t.encode("hello world", true).unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| t.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces, ["<s>", "\u{2581}hello", "\u{2581}world"]);
    assert_eq!(t.decode(&ids, true).unwrap(), "hello world");
    // é is not in the vocabulary: its UTF-8 bytes become byte tokens, and decode restores it.
    let ids = t.encode("hé", false).unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| t.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces, ["\u{2581}", "h", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&ids, true).unwrap(), "hé");
    assert!(t.is_stop(2));
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let t = spm_tokenizer();
    let ids = t.encode("hé", false).unwrap();
    let mut s = StreamDecoder::default();
    let pieces: Vec<String> = ids.iter().map(|&i| s.push(&t, i).unwrap()).collect();
    assert_eq!(pieces.concat(), "hé");
    assert_eq!(pieces[2], "", "half a character is held back");
}

#[test]
fn stop_strings_cut_the_text_even_across_pieces() {
    let mut m = StopMatcher::new(&["</end>".to_string()]);
    let mut out = String::new();
    for piece in ["Hello <", "/en", "d> more"] {
        let (emit, stop) = m.push(piece);
        out.push_str(&emit);
        if stop {
            break;
        }
    }
    assert_eq!(out, "Hello ");
    assert_eq!(m.text(), "Hello ");
    // A held-back prefix that never completes is released at the end.
    let mut m = StopMatcher::new(&["STOP".to_string()]);
    let (a, _) = m.push("abc ST");
    assert_eq!(a, "abc ");
    assert_eq!(m.flush(), "ST");
}

#[test]
fn a_600k_character_piece_builds_in_linear_time() {
    // Was quadratic: every split of a piece hashed both halves (over 60 s for this one).
    let long = "ab".repeat(300_000);
    let half = "ab".repeat(150_000);
    let pieces = vec![
        ("a".to_string(), -1.0),
        ("b".to_string(), -1.0),
        ("ab".to_string(), -2.0),
        (half, -3.0),
        (long.clone(), -4.0),
    ];
    let t0 = std::time::Instant::now();
    let t = spm_vocabulary(&pieces).unwrap();
    // A hang guard, far above the time it takes (well under a second), not a benchmark.
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    // The vocabulary works: "ab" (id 261, after the specials and bytes) is the merge of
    // "a" and "b"; the space prefix's "\u{2581}" falls back to its three bytes.
    let ids = t.encode("ab", false).unwrap();
    assert_eq!(ids.last(), Some(&261), "{ids:?}");
}

#[test]
fn a_vocabulary_past_the_merge_limit_names_it() {
    use dflash_core::limits::MAX_SPM_MERGES;
    // "a", "aa", ..., a^k: piece a^n splits n - 1 ways, k^2 / 2 merges in all.
    let k = ((2 * MAX_SPM_MERGES) as f64).sqrt() as usize + 8;
    let pieces: Vec<(String, f32)> = (1..=k).map(|n| ("a".repeat(n), -(n as f32))).collect();
    match spm_vocabulary(&pieces) {
        Err(dflash_core::Error::LimitExceeded { limit, .. }) => assert_eq!(limit, "MAX_SPM_MERGES"),
        other => panic!("expected LimitExceeded, got {:?}", other.err()),
    }
}

/// The grammar token table of a SentencePiece vocabulary: `▁` spelled as a space,
/// `<0xNN>` pieces as their byte, the control tokens marked special; a grammar over it
/// allows the pieces that spell what it takes.
#[test]
fn sentencepiece_pieces_spell_their_bytes_for_grammars() {
    use dflash_core::grammar::{token_bytes, GrammarSpec, Grammars};
    let t = spm_tokenizer();
    let width = t.vocab_size() + 5;
    let words = token_bytes(&t, width).unwrap();
    assert_eq!(words.len(), width, "padded to the logits' width");
    assert!(words[t.vocab_size()..].iter().all(|w| w.is_empty()));
    for text in ["hello world", "héllo wörld ✓", "hello\n\tworld"] {
        let ids = t.encode(text, false).unwrap();
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&i| words[i as usize].clone())
            .collect();
        assert_eq!(
            String::from_utf8(spelled).unwrap().trim_start(),
            text,
            "{ids:?}"
        );
    }
    assert_eq!(words[2], b"\xff</s>", "the control tokens are special");
    let g = Grammars::new(&t, width).unwrap();
    let mut c = g
        .compile(&GrammarSpec::Regex("(hello|world)+".into()))
        .unwrap();
    let mask = c.mask().unwrap();
    let id = |p: &str| t.token_to_id(p).unwrap();
    assert!(mask.allows(id("hello")) && mask.allows(id("h")));
    assert!(!mask.allows(id("\u{2581}hello")) && !mask.allows(id("o")));
    assert!(!mask.allows(2), "</s> only where the grammar may end");
    c.commit(id("hello")).unwrap();
    assert!(c.mask().unwrap().allows(2));
}
