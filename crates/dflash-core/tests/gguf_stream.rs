//! Streaming a GGUF file in chunks hands out every tensor with the same bytes as the
//! whole-file parser, holding little; a cut or overlong stream is a typed error.

use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::formats::gguf::parse_header;
use dflash_core::formats::gguf_stream::GgufStream;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf, Rng};
use dflash_core::Error;

#[test]
fn chunked_stream_yields_every_tensor_like_the_whole_file() {
    let c = tiny_config(Arch::Qwen2);
    let file = write_gguf(&c, &random_weights(&c, 3), GgmlType::Q4_1);
    let whole = parse_header(&file, file.len() as u64).unwrap();
    let mut rng = Rng(11);
    for max_chunk in [1usize, 7, 4096, 1 << 20] {
        let mut s = GgufStream::new(file.len() as u64);
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < file.len() {
            let n = (1 + rng.below(max_chunk)).min(file.len() - pos);
            got.extend(s.push(&file[pos..pos + n]).unwrap());
            pos += n;
        }
        s.finish().unwrap();
        assert_eq!(s.header().unwrap().metadata.len(), whole.metadata.len());
        assert_eq!(got.len(), whole.tensors.len());
        for t in &got {
            let w = whole.tensor(&t.info.name).unwrap();
            assert_eq!(t.info.offset, w.offset);
            assert_eq!(
                &t.bytes[..],
                &file[w.offset as usize..(w.offset + w.n_bytes) as usize],
                "{}",
                t.info.name
            );
        }
    }
}

#[test]
fn cut_and_overlong_streams_are_errors() {
    let c = tiny_config(Arch::Llama);
    let file = write_gguf(&c, &random_weights(&c, 4), GgmlType::Q8_0);
    let mut s = GgufStream::new(file.len() as u64);
    s.push(&file[..file.len() - 100]).unwrap();
    assert!(matches!(s.finish(), Err(Error::Truncated { .. })));
    let mut s = GgufStream::new(file.len() as u64 - 10);
    assert!(s.push(&file).is_err());
    let mut bad = file.clone();
    bad[0] = b'X';
    let mut s = GgufStream::new(bad.len() as u64);
    assert!(matches!(s.push(&bad), Err(Error::BadMagic { .. })));
}

#[test]
fn the_header_is_parsed_from_a_prefix() {
    let c = tiny_config(Arch::Qwen3);
    let file = write_gguf(&c, &random_weights(&c, 5), GgmlType::F16);
    assert!(
        file.len() > 3 * 4096,
        "the test needs a file longer than the first parse point"
    );
    let mut s = GgufStream::new(file.len() as u64);
    let mut pos = 0;
    while s.header().is_none() {
        s.push(&file[pos..pos + 1000]).unwrap();
        pos += 1000;
    }
    assert!(pos < file.len(), "header found only at the end");
    let h = parse_header(&file, file.len() as u64).unwrap();
    assert_eq!(s.header().unwrap().data_offset, h.data_offset);
}

/// The CPU engine's streamed weights equal the whole-file loader's, tensor for tensor,
/// and a cut stream is a typed error at `finish`.
#[test]
fn streamed_host_weights_equal_the_whole_file_load() {
    use dflash_core::formats::gguf_weights_stream::{HostSink, WeightStream};
    // qwen3_moe: the experts' 3-D stacks stream as matrices too.
    for arch in [Arch::Llama, Arch::Qwen3Moe] {
        stream_equals_whole(&tiny_config(arch));
    }
    let c = tiny_config(Arch::Llama);
    let file = write_gguf(&c, &random_weights(&c, 9), GgmlType::Q4_1);
    let mut cut = WeightStream::new(HostSink, file.len() as u64);
    cut.push(&file[..file.len() - 10]).unwrap();
    assert!(matches!(cut.finish(), Err(Error::Truncated { .. })));
}

fn stream_equals_whole(c: &dflash_core::config::ModelConfig) {
    use dflash_core::formats::gguf_weights_stream::{HostSink, WeightStream};
    let file = write_gguf(c, &random_weights(c, 9), GgmlType::Q4_1);
    let whole = dflash_core::model_files::load_gguf(&file).unwrap();
    let mut s = WeightStream::new(HostSink, file.len() as u64);
    for chunk in file.chunks(333) {
        s.push(chunk).unwrap();
    }
    let (streamed, _) = s.finish().unwrap();
    let (a, b) = (&streamed.weights, &whole.weights);
    assert_eq!(a.config, b.config);
    assert_eq!(a.embed.qs, b.embed.qs);
    assert_eq!(a.norm, b.norm);
    for (x, y) in a.layers.iter().zip(&b.layers) {
        let mixer = x.mixer_matrices().into_iter().zip(y.mixer_matrices());
        let ffn = x.ffn.matrices().into_iter().zip(y.ffn.matrices());
        for (m, n) in mixer.chain(ffn) {
            assert_eq!((&m.qs, &m.scales, &m.mins), (&n.qs, &n.scales, &n.mins));
        }
        assert_eq!(x.attn_norm, y.attn_norm);
    }
}

/// A model split in parts by `gguf-split` (the metadata in the first part, `output.weight`
/// in a later one) streams part after part into the same weights as the whole file, and
/// `load_path` finds every part from the name of any of them.
#[test]
fn a_split_model_loads_like_the_whole_file() {
    use dflash_core::formats::gguf_weights_stream::{HostSink, WeightStream};
    use dflash_core::testutil::split_gguf;
    let c = tiny_config(Arch::Qwen2);
    let file = write_gguf(&c, &random_weights(&c, 12), GgmlType::Q4_1);
    let whole = dflash_core::model_files::load_gguf(&file).unwrap();
    let parts = split_gguf(&file, 3);
    let last = parse_header(&parts[2], parts[2].len() as u64).unwrap();
    assert!(
        last.tensor("output.weight").is_some() || last.tensor("token_embd.weight").is_some(),
        "the test needs a matrix the config depends on in a later part"
    );
    let mut s = WeightStream::new(HostSink, parts[0].len() as u64);
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.next_part(p.len() as u64).unwrap();
        }
        for chunk in p.chunks(500) {
            s.push(chunk).unwrap();
        }
        assert_eq!(s.parts(), Some(3));
    }
    let (streamed, _) = s.finish().unwrap();
    assert_eq!(streamed.weights.config, whole.weights.config);
    assert!(!streamed.weights.config.tie_word_embeddings);
    assert_eq!(streamed.weights.lm_head().qs, whole.weights.lm_head().qs);
    assert_eq!(streamed.weights.embed.qs, whole.weights.embed.qs);

    let dir = std::env::temp_dir().join(format!("dflash-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = |i: usize| dir.join(format!("tiny-{i:05}-of-00003.gguf"));
    for (i, p) in parts.iter().enumerate() {
        std::fs::write(name(i + 1), p).unwrap();
    }
    let loaded = dflash_core::model_files::load_path(&name(2)).unwrap();
    assert_eq!(loaded.weights.config, whole.weights.config);
    assert_eq!(
        loaded.weights.layers[2].ffn.matrices()[2].qs,
        whole.weights.layers[2].ffn.matrices()[2].qs
    );
    std::fs::remove_file(name(3)).unwrap();
    match dflash_core::model_files::load_path(&name(1)) {
        Err(Error::SplitPart {
            part: 3,
            count: 3,
            reason,
        }) => {
            assert!(reason.contains("tiny-00003-of-00003.gguf"), "{reason}")
        }
        other => panic!("a missing part gave {:?}", other.err()),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parts out of order, one too many, a stream that stops after the first part, and
/// the same part twice: each a `SplitPart` error naming the part.
#[test]
fn split_parts_that_do_not_add_up_are_typed_errors() {
    use dflash_core::formats::gguf_weights_stream::{HostSink, WeightStream};
    use dflash_core::testutil::split_gguf;
    let c = tiny_config(Arch::Llama);
    let file = write_gguf(&c, &random_weights(&c, 13), GgmlType::Q8_0);
    let parts = split_gguf(&file, 3);
    let stream = |order: &[usize]| {
        let mut s = WeightStream::new(HostSink, parts[order[0]].len() as u64);
        for (k, &i) in order.iter().enumerate() {
            if k > 0 {
                s.next_part(parts[i].len() as u64)?;
            }
            s.push(&parts[i])?;
        }
        s.finish().map(|_| ())
    };
    let part_of = |r: Result<(), Error>| match r {
        Err(Error::SplitPart { part, count: 3, .. }) => part,
        other => panic!("expected a SplitPart error, got {other:?}"),
    };
    assert_eq!(part_of(stream(&[0, 2, 1])), 2);
    assert_eq!(part_of(stream(&[0])), 2);
    assert_eq!(part_of(stream(&[0, 1, 1])), 3);
    assert_eq!(part_of(stream(&[0, 1, 2, 2])), 4);
    // A file in one piece has no next part.
    let mut s = WeightStream::new(HostSink, file.len() as u64);
    s.push(&file).unwrap();
    assert!(matches!(
        s.next_part(10),
        Err(Error::SplitPart {
            part: 2,
            count: 1,
            ..
        })
    ));
    stream(&[0, 1, 2]).unwrap();
}
