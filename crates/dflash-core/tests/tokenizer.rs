//! Tokenizers built from GGUF metadata: SentencePiece (`llama`) vocabularies with byte
//! fallback, and streaming decode / stop strings.

use dflash_core::formats::gguf::{parse_header, writer, Value};
use dflash_core::generate::StopMatcher;
use dflash_core::tokenizer::{StreamDecoder, TextTokenizer};

fn spm_tokenizer() -> TextTokenizer {
    // id: 0 <unk>, 1 <s>, 2 </s>, 3..259 bytes, then pieces with scores.
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    let mut scores = vec![0f32; 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
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
    for (p, s) in pieces {
        tokens.push(p.into());
        types.push(1);
        scores.push(s);
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
    TextTokenizer::from_gguf(&parse_header(&f, f.len() as u64).unwrap()).unwrap()
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
