//! Hostile inputs of issue 18, each one the exact input that used to panic, hang or
//! allocate without bound, now a typed error: overlapping and retyped tensors and flipped
//! bits in the tensor table (whole-file parser and streaming loader), element counts
//! whose byte size overflows, metadata sizes against their limits and the stream's
//! length, runaway chat templates, non-finite sampling parameters, `weight_map` paths
//! that leave the model folder, and a FIFO as the model.

use dflash_core::chat::{ChatTemplate, Message};
use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::formats::gguf::{parse_header, writer, GgufHeader, Value};
use dflash_core::formats::gguf_stream::GgufStream;
use dflash_core::limits;
use dflash_core::model_files::{hf_weight_files, load_gguf, load_path};
use dflash_core::sampling::SamplingParams;
use dflash_core::testutil::{gguf_metadata, random_weights, tiny_config, write_gguf, Rng};
use dflash_core::Error;
use std::path::PathBuf;
use std::time::{Duration, Instant};

// ---------- generators ----------

/// The tiny model in Q4_1, the type of the real SmolLM2 file.
fn tiny_q4_1() -> Vec<u8> {
    let c = tiny_config(Arch::Llama);
    write_gguf(&c, &random_weights(&c, 7), GgmlType::Q4_1)
}

/// Where one tensor's entry of the tensor table lies in the file.
struct Entry {
    name: String,
    start: usize,
    /// Byte position of its ggml type id (u32) and of its offset (u64).
    type_at: usize,
    offset_at: usize,
    end: usize,
}

/// The tensor table's entries, in table order (the order of `parse_header`'s tensors).
fn tensor_entries(file: &[u8], h: &GgufHeader) -> Vec<Entry> {
    let first = &h.tensors[0];
    let mut key = (first.name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(first.name.as_bytes());
    let head = &file[..h.data_offset as usize];
    let mut at = head
        .windows(key.len())
        .rposition(|w| w == key)
        .expect("first tensor entry");
    h.tensors
        .iter()
        .map(|t| {
            let start = at;
            let type_at = start + 8 + t.name.len() + 4 + 8 * t.dims.len();
            at = type_at + 4 + 8;
            Entry {
                name: t.name.clone(),
                start,
                type_at,
                offset_at: type_at + 4,
                end: at,
            }
        })
        .collect()
}

/// `file` with the tensor `name`'s type id replaced.
fn retyped(file: &[u8], name: &str, type_id: u32) -> Vec<u8> {
    let h = parse_header(file, file.len() as u64).unwrap();
    let e = tensor_entries(file, &h)
        .into_iter()
        .find(|e| e.name == name)
        .unwrap();
    let mut f = file.to_vec();
    f[e.type_at..e.type_at + 4].copy_from_slice(&type_id.to_le_bytes());
    f
}

/// `file` with the second tensor's (relative) offset set to the first's: two tensors
/// over the same bytes.
fn aliased_offsets(file: &[u8]) -> Vec<u8> {
    let h = parse_header(file, file.len() as u64).unwrap();
    let e = tensor_entries(file, &h);
    let mut f = file.to_vec();
    let first: [u8; 8] = f[e[0].offset_at..e[0].offset_at + 8].try_into().unwrap();
    f[e[1].offset_at..e[1].offset_at + 8].copy_from_slice(&first);
    f
}

/// Streams `file` in chunks of `chunk` bytes: the tensors handed out, or the error.
fn stream(file: &[u8], chunk: usize) -> Result<usize, Error> {
    let mut s = GgufStream::new(file.len() as u64);
    let mut n = 0;
    for c in file.chunks(chunk) {
        n += s.push(c)?.len();
    }
    s.finish()?;
    Ok(n)
}

/// A GGUF file of the given metadata and one small F32 tensor.
fn with_metadata(md: Vec<(String, Value)>) -> Vec<u8> {
    writer::write(
        &md,
        &[writer::TensorData {
            name: "t".into(),
            dims: vec![8],
            dtype: GgmlType::F32,
            bytes: vec![0; 32],
        }],
    )
}

/// A header declaring one string value of `len` bytes, followed by `have` bytes.
fn string_header(len: u64, have: usize) -> Vec<u8> {
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes());
    h.extend_from_slice(&1u64.to_le_bytes());
    h.extend_from_slice(&1u64.to_le_bytes());
    h.push(b'k');
    h.extend_from_slice(&8u32.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.resize(h.len() + have, b'a');
    h
}

fn smollm2() -> Option<Vec<u8>> {
    let p = dflash_core::testutil::cached_model("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    Some(std::fs::read(p).unwrap())
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dflash-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---------- (1) tensor ranges and types ----------

#[test]
fn overlapping_tensor_ranges_are_a_typed_error_in_both_loaders() {
    let f = aliased_offsets(&tiny_q4_1());
    assert!(
        matches!(
            parse_header(&f, f.len() as u64),
            Err(Error::TensorOverlap { .. })
        ),
        "{:?}",
        parse_header(&f, f.len() as u64).err()
    );
    assert!(matches!(load_gguf(&f), Err(Error::TensorOverlap { .. })));
    for chunk in [1, 7, 4096, 1 << 20] {
        assert!(
            matches!(stream(&f, chunk), Err(Error::TensorOverlap { .. })),
            "chunk {chunk}"
        );
    }
}

#[test]
fn a_tensor_retyped_to_q3_k_is_a_typed_error_in_both_loaders() {
    let good = tiny_q4_1();
    let f = retyped(&good, "blk.0.attn_q.weight", 11); // Q3_K
    let is_unsupported = |r: &Result<_, Error>| {
        matches!(r, Err(Error::UnsupportedTensorType { tensor, dtype })
            if tensor == "blk.0.attn_q.weight" && dtype == "ggml type 11")
    };
    assert!(is_unsupported(
        &parse_header(&f, f.len() as u64).map(|_| ())
    ));
    assert!(is_unsupported(&load_gguf(&f).map(|_| ())));
    for chunk in [1, 4096, 1 << 20] {
        assert!(
            is_unsupported(&stream(&f, chunk).map(|_| ())),
            "chunk {chunk}"
        );
    }
}

/// Every bit of the tiny model's tensor table flipped in turn: each file parses (and
/// then streams and loads) or is a typed error, never a panic.
#[test]
fn every_bit_flip_of_the_tensor_table_is_a_typed_error_or_a_clean_load() {
    let good = tiny_q4_1();
    let h = parse_header(&good, good.len() as u64).unwrap();
    let e = tensor_entries(&good, &h);
    let (lo, hi) = (e[0].start, e.last().unwrap().end);
    let (mut parsed, mut refused) = (0, 0);
    for bit in 0..(hi - lo) * 8 {
        let mut f = good.clone();
        f[lo + bit / 8] ^= 1 << (bit % 8);
        let whole = parse_header(&f, f.len() as u64);
        let streamed = stream(&f, 4096);
        match whole {
            Ok(h) => {
                parsed += 1;
                assert_eq!(
                    streamed.as_ref().ok(),
                    Some(&h.tensors.len()),
                    "bit {bit}: {:?}",
                    streamed.as_ref().err()
                );
                let _ = load_gguf(&f);
            }
            Err(_) => {
                refused += 1;
                assert!(
                    streamed.is_err(),
                    "bit {bit}: the stream took what the parser refused"
                );
            }
        }
    }
    assert!(
        parsed > 0 && refused > 0,
        "{parsed} parsed, {refused} refused"
    );
}

#[test]
fn the_real_smollm2_retyped_or_bit_flipped_is_a_typed_error_or_a_clean_parse() {
    let Some(good) = smollm2() else { return };
    let h = parse_header(&good, good.len() as u64).unwrap();
    let e = tensor_entries(&good, &h);
    // Retyped to Q3_K: refused as soon as the header is in (the stream does not wait for
    // the rest of the file).
    let first_in_file = h.tensors.iter().min_by_key(|t| t.offset).unwrap();
    let f = retyped(&good, &first_in_file.name, 11);
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::UnsupportedTensorType { .. })
    ));
    let mut s = GgufStream::new(f.len() as u64);
    let chunk = 1 << 16;
    let r = f.chunks(chunk).try_for_each(|c| s.push(c).map(|_| ()));
    assert!(
        matches!(r, Err(Error::UnsupportedTensorType { .. })),
        "{r:?}"
    );
    // (The header is parsed again each time the buffer doubles.)
    assert!(s.received() <= 2 * (h.data_offset + chunk as u64));
    // Two tensors over the same bytes.
    let f = aliased_offsets(&good);
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::TensorOverlap { .. })
    ));
    assert!(matches!(
        stream(&f, 1 << 20),
        Err(Error::TensorOverlap { .. })
    ));
    // Single bit flips spread over the tensor table: the header parses or is refused;
    // a few of those that parse stream to the end.
    let (lo, hi) = (e[0].start, e.last().unwrap().end);
    let bits = (hi - lo) * 8;
    let mut streamed = 0;
    let head = &good[..h.data_offset as usize];
    for bit in (0..bits).step_by(bits / 400 + 1) {
        let mut f = head.to_vec();
        f[lo + bit / 8] ^= 1 << (bit % 8);
        if let Ok(h) = parse_header(&f, good.len() as u64) {
            if streamed < 4 {
                streamed += 1;
                let mut whole = good.clone();
                whole[..f.len()].copy_from_slice(&f);
                assert_eq!(
                    stream(&whole, 1 << 20).ok(),
                    Some(h.tensors.len()),
                    "bit {bit}"
                );
            }
        }
    }
}

// ---------- (4) byte sizes that overflow ----------

#[test]
fn element_counts_whose_byte_size_overflows_are_a_typed_error() {
    // 2^62 F32 elements are 2^64 bytes: the product wrapped to 0 and the tensor looked
    // empty, then dequantizing it asked for 2^62 floats ("capacity overflow").
    for (dims, dtype) in [
        (vec![1u64 << 62], GgmlType::F32),
        (vec![1u64 << 63], GgmlType::F16),
        (vec![1u64 << 61, 2], GgmlType::F32),
    ] {
        let f = writer::write(
            &[("general.architecture".into(), Value::String("llama".into()))],
            &[writer::TensorData {
                name: "rope_freqs.weight".into(),
                dims: dims.clone(),
                dtype,
                bytes: vec![0; 64],
            }],
        );
        assert!(
            matches!(
                parse_header(&f, f.len() as u64),
                Err(Error::BadTensorLayout { .. })
            ),
            "{dims:?}: {:?}",
            parse_header(&f, f.len() as u64).err()
        );
        assert!(matches!(
            stream(&f, 4096),
            Err(Error::BadTensorLayout { .. })
        ));
    }
    // The same as a real model's rope_freqs.weight.
    let c = tiny_config(Arch::Llama);
    let mut w = random_weights(&c, 1);
    w.insert(
        "rope_freqs.weight".into(),
        (vec![1usize << 62], vec![0.0; 8]),
    );
    let f = write_gguf(&c, &w, GgmlType::Q8_0);
    assert!(matches!(load_gguf(&f), Err(Error::BadTensorLayout { .. })));
}

// ---------- (5) header-driven memory ----------

fn limit_of(e: &Error) -> Option<&'static str> {
    match e {
        Error::LimitExceeded { limit, .. } => Some(limit),
        _ => None,
    }
}

#[test]
fn one_byte_metadata_arrays_are_bounded_by_their_limit() {
    // 5 M one-byte items cost 160 MB as values: over MAX_GGUF_ARRAY_ITEMS.
    let n = limits::MAX_GGUF_ARRAY_ITEMS as usize + 1;
    let f = with_metadata(vec![("a".into(), Value::Array(vec![Value::U8(1); n]))]);
    let e = parse_header(&f, f.len() as u64).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_ARRAY_ITEMS"), "{e}");
    assert!(e
        .to_string()
        .contains(&limits::MAX_GGUF_ARRAY_ITEMS.to_string()));
    let e = stream(&f, 1 << 16).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_ARRAY_ITEMS"), "{e}");
    // Two arrays under the limit each, over it together.
    let half = n / 2 + 1;
    let f = with_metadata(vec![
        ("a".into(), Value::Array(vec![Value::U8(1); half])),
        ("b".into(), Value::Array(vec![Value::U8(1); half])),
    ]);
    let e = parse_header(&f, f.len() as u64).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_ARRAY_ITEMS"), "{e}");
    // An array that claims more items than the file has bytes for.
    let mut f = with_metadata(vec![("a".into(), Value::Array(vec![Value::U32(1); 4]))]);
    let at = f.windows(8).position(|w| w == 4u64.to_le_bytes()).unwrap();
    f[at..at + 8].copy_from_slice(&1_000_000u64.to_le_bytes());
    assert!(matches!(
        parse_header(&f, f.len() as u64),
        Err(Error::Truncated { .. })
    ));
    assert!(matches!(stream(&f, 64), Err(Error::Truncated { .. })));
}

#[test]
fn metadata_strings_are_bounded_by_their_limit() {
    let n = limits::MAX_GGUF_STRING_BYTES + 1;
    let f = string_header(n, n as usize);
    let e = parse_header(&f, f.len() as u64).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_STRING_BYTES"), "{e}");
    let e = stream(&f, 1 << 16).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_STRING_BYTES"), "{e}");
    // 2 GiB used to count as "plausible" and made the stream wait for (and buffer) it.
    let e = parse_header(&string_header(1 << 31, 64), 1 << 40).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_STRING_BYTES"), "{e}");
}

#[test]
fn a_stream_refuses_a_header_that_needs_bytes_past_its_end_at_once() {
    // A string of 8 MB (under the limit) in a stream that announces 1 MB: the header
    // can never complete, so the first parse refuses it instead of buffering to the end.
    let f = string_header(8 << 20, 1 << 20);
    let mut s = GgufStream::new(f.len() as u64);
    let r = s.push(&f[..8192]);
    assert!(matches!(r, Err(Error::AbsurdSize { .. })), "{:?}", r.err());
    assert!(s.buffered() <= 8192);
    // A tensor count that the announced length cannot hold.
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&60_000u64.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes());
    h.resize(8192, 0);
    let mut s = GgufStream::new(100_000);
    assert!(matches!(s.push(&h), Err(Error::AbsurdSize { .. })));
    let e = parse_header(&h[..24], 1 << 40).unwrap_err();
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    h[8..16].copy_from_slice(&(limits::MAX_GGUF_TENSORS + 1).to_le_bytes());
    let e = parse_header(&h, 1 << 40).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_TENSORS"), "{e}");
    h[8..16].copy_from_slice(&0u64.to_le_bytes());
    h[16..24].copy_from_slice(&(limits::MAX_GGUF_KEYS + 1).to_le_bytes());
    let e = parse_header(&h, 1 << 40).unwrap_err();
    assert_eq!(limit_of(&e), Some("MAX_GGUF_KEYS"), "{e}");
}

#[test]
fn a_stream_holds_no_padding_before_a_far_tensor() {
    // One small tensor 16 MB into the data (a header that places it there): the stream
    // drops the padding as it passes instead of buffering up to the tensor.
    let f = writer::write(
        &[("general.architecture".into(), Value::String("llama".into()))],
        &[writer::TensorData {
            name: "t".into(),
            dims: vec![8],
            dtype: GgmlType::F32,
            bytes: vec![1; 32],
        }],
    );
    let h = parse_header(&f, f.len() as u64).unwrap();
    let e = tensor_entries(&f, &h);
    let pad = 16u64 << 20;
    let mut far = f[..h.data_offset as usize].to_vec();
    far[e[0].offset_at..e[0].offset_at + 8].copy_from_slice(&pad.to_le_bytes());
    far.resize(h.data_offset as usize + pad as usize, 0);
    far.extend_from_slice(&[1; 32]);
    let mut s = GgufStream::new(far.len() as u64);
    let mut got = 0;
    let mut most = 0;
    for c in far.chunks(1 << 16) {
        got += s.push(c).unwrap().len();
        most = most.max(s.buffered());
    }
    s.finish().unwrap();
    assert_eq!(got, 1);
    assert!(most <= 1 << 16, "the stream held {most} bytes");
}

// ---------- (3) chat templates ----------

#[test]
fn a_nested_loop_template_ends_with_a_typed_error_quickly() {
    let msgs = [Message::new("user", "hi")];
    for src in [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    ] {
        let t = ChatTemplate::new(src, "", "").unwrap();
        let start = Instant::now();
        let e = t.render(&msgs, true).unwrap_err();
        assert!(
            matches!(&e, Error::ChatTemplate(m) if m.contains("CHAT_TEMPLATE_FUEL")),
            "{e}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }
    // Output that grows fast: the prompt's byte limit ends it.
    let t = ChatTemplate::new(
        "{% for i in range(100000) %}{{ 'x' * 10000000 }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let e = t.render(&msgs, true).unwrap_err();
    assert!(
        matches!(&e, Error::ChatTemplate(m) if m.contains("MAX_CHAT_PROMPT_BYTES")),
        "{e}"
    );
    // A real template over a long conversation stays well inside both.
    let t = ChatTemplate::new(dflash_core::testutil::CHATML_TEMPLATE, "", "").unwrap();
    let long: Vec<Message> = (0..5000)
        .map(|i| {
            Message::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                &"word ".repeat(100),
            )
        })
        .collect();
    assert!(t.render(&long, true).unwrap().len() > 5000 * 500);
}

// ---------- (7) sampling, weight_map, FIFO ----------

#[test]
fn non_finite_sampling_parameters_are_typed_errors() {
    for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for field in ["temperature", "top_p", "min_p", "repetition_penalty"] {
            let mut p = SamplingParams {
                temperature: 0.7,
                ..Default::default()
            };
            match field {
                "temperature" => p.temperature = v,
                "top_p" => p.top_p = v,
                "min_p" => p.min_p = v,
                _ => p.repetition_penalty = v,
            }
            assert!(
                matches!(p.validate(), Err(Error::BadSampling(_))),
                "{field} = {v}"
            );
        }
    }
}

#[test]
fn weight_map_paths_must_stay_inside_the_model_folder() {
    for bad in [
        "/etc/passwd",
        "../outside.safetensors",
        "shards/../../outside.safetensors",
        "./model.safetensors",
        "",
        "..\\outside.safetensors",
    ] {
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": bad}});
        let r = hf_weight_files(Some(index.to_string().as_bytes()));
        assert!(matches!(r, Err(Error::BadConfig(_))), "{bad:?}: {r:?}");
    }
    let index = serde_json::json!({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "sub/model-00002-of-00002.safetensors"}});
    assert_eq!(
        hf_weight_files(Some(index.to_string().as_bytes()))
            .unwrap()
            .len(),
        2
    );
    // A folder whose index points at a real file outside it: refused, nothing opened.
    let c = tiny_config(Arch::Qwen2);
    let root = tmp("weight-map");
    let model = root.join("model");
    let mut files =
        dflash_core::testutil::write_hf(&c, &random_weights(&c, 1), safetensors::Dtype::F32, 1);
    let weights = files.remove("model.safetensors").unwrap();
    std::fs::write(root.join("outside.safetensors"), weights).unwrap();
    files.insert(
        "model.safetensors.index.json".into(),
        serde_json::to_vec(&serde_json::json!({"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}}))
            .unwrap(),
    );
    dflash_core::testutil::write_dir(&model, &files).unwrap();
    assert!(matches!(load_path(&model), Err(Error::BadConfig(_))));
    let _ = std::fs::remove_dir_all(&root);
}

/// `load_path(path)`'s error message, or a failure when it takes over 20 s (a hang).
fn load_error_within_20s(path: PathBuf) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let shown = path.display().to_string();
    std::thread::spawn(move || {
        let _ = tx.send(load_path(&path).err().map(|e| e.to_string()));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("loading {shown} hung"))
}

#[cfg(unix)]
#[test]
fn a_fifo_as_the_model_is_a_typed_error_not_a_hang() {
    let dir = tmp("fifo");
    let folder = dir.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    let fifos = [dir.join("model.gguf"), folder.join("config.json")];
    for f in &fifos {
        let made = std::process::Command::new("mkfifo").arg(f).status();
        if !made.map(|s| s.success()).unwrap_or(false) {
            eprintln!("skipping: mkfifo is not available");
            return;
        }
    }
    // The FIFO as the model, and as a file inside a model folder.
    for p in [fifos[0].clone(), folder] {
        let got = load_error_within_20s(p.clone());
        assert!(
            got.as_deref()
                .is_some_and(|m| m.contains("not a regular file")),
            "{}: {got:?}",
            p.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tiny_model_still_loads_and_streams() {
    // The checks above refuse nothing a real writer produces.
    let f = tiny_q4_1();
    assert!(load_gguf(&f).is_ok());
    let n = parse_header(&f, f.len() as u64).unwrap().tensors.len();
    let mut rng = Rng(3);
    for _ in 0..3 {
        let chunk = 1 + rng.below(5000);
        assert_eq!(stream(&f, chunk).unwrap(), n);
    }
    let md = gguf_metadata(&tiny_config(Arch::Qwen3));
    let f = with_metadata(md);
    assert!(parse_header(&f, f.len() as u64).is_ok());
}

/// A model's dimensions and context, and a request's context, past `dflash_core::limits`:
/// a GGUF whose header declares them loads to `LimitExceeded` naming the limit (before
/// any weight is read), and so does a request for a larger context.
#[test]
fn dimensions_and_contexts_past_the_limits_name_the_limit() {
    let c = tiny_config(Arch::Llama);
    let good = write_gguf(&c, &random_weights(&c, 3), GgmlType::Q8_0);
    for (key, value, want) in [
        ("llama.embedding_length", 1u64 << 20, "MAX_HIDDEN_SIZE"),
        (
            "llama.feed_forward_length",
            1 << 30,
            "MAX_INTERMEDIATE_SIZE",
        ),
        ("llama.block_count", 1 << 20, "MAX_LAYERS"),
        ("llama.context_length", 1 << 40, "MAX_CONTEXT_TOKENS"),
    ] {
        let mut meta = gguf_metadata(&c);
        meta.retain(|(k, _)| k != key);
        meta.push((key.to_string(), Value::U64(value)));
        let file = with_metadata(meta);
        let header = parse_header(&file, file.len() as u64).unwrap();
        match dflash_core::model_meta::gguf_meta(&header) {
            Err(Error::LimitExceeded {
                limit, value: v, ..
            }) => {
                assert_eq!((limit, v), (want, value), "{key}");
            }
            other => panic!(
                "{key} = {value}: expected LimitExceeded {want}, got {:?}",
                other.err()
            ),
        }
    }
    let m = load_gguf(&good).unwrap();
    let req = dflash_core::generate::GenerateRequest {
        prompt_ids: vec![1, 2, 3],
        max_new_tokens: 4,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        context: 1 << 30,
        interrupt: Default::default(),
        grammar: None,
    };
    match dflash_core::generate::prepare(&req, m.config()) {
        Err(Error::LimitExceeded { limit, .. }) => assert_eq!(limit, "MAX_CONTEXT_TOKENS"),
        other => panic!("context 2^30: expected LimitExceeded, got {other:?}"),
    }
}

// ---------- (7) a model file that changes while it loads ----------

/// Reads a file; after the magic, truncates it to `keep` bytes through a second handle
/// (as another process rewriting the model would), then goes on reading.
struct ShrinksAfterMagic {
    file: std::fs::File,
    path: PathBuf,
    keep: u64,
    reads: usize,
}

impl std::io::Read for ShrinksAfterMagic {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reads += 1;
        if self.reads == 2 {
            let other = std::fs::OpenOptions::new().write(true).open(&self.path)?;
            other.set_len(self.keep)?;
        }
        let n = buf.len().min(if self.reads == 1 { 4 } else { buf.len() });
        self.file.read(&mut buf[..n])
    }
}

#[test]
fn a_gguf_file_truncated_while_it_loads_is_a_typed_error_not_a_fault() {
    use dflash_core::model_files::load_gguf_reader;
    let f = tiny_q4_1();
    let dir = tmp("shrinks");
    let path = dir.join("model.gguf");
    std::fs::write(&path, &f).unwrap();
    // The file system path reads (never maps) the file and gives what memory gives.
    let (read, in_memory) = (load_path(&path).unwrap(), load_gguf(&f).unwrap());
    assert_eq!(
        format!("{:?}", read.weights),
        format!("{:?}", in_memory.weights)
    );
    assert_eq!(read.format, "gguf");
    // Shrunk to the header's middle, to the tensor data's middle and to nothing, after
    // the loader took its length: Truncated (a mapped file would SIGBUS instead).
    for keep in [64, f.len() as u64 / 2, 0] {
        let reader = ShrinksAfterMagic {
            file: std::fs::File::open(&path).unwrap(),
            path: path.clone(),
            keep,
            reads: 0,
        };
        let e = load_gguf_reader(reader, f.len() as u64)
            .err()
            .expect("a shrunk file loaded");
        assert!(matches!(e, Error::Truncated { .. }), "kept {keep}: {e}");
        std::fs::write(&path, &f).unwrap();
    }
    // A reader longer than announced is refused too.
    let e = load_gguf_reader(&f[..], f.len() as u64 - 1)
        .err()
        .expect("a longer stream loaded");
    assert!(!matches!(e, Error::Truncated { .. }), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

// ---------- (2) found by dflash-fuzz ----------

#[test]
fn a_tokenizer_json_with_a_syntax_error_in_its_decoder_is_a_typed_error() {
    // tokenizers 0.23 reads the decoder through `expect("Helper")`: a syntax error met
    // there panicked (dflash-fuzz, hf-folder target).
    use dflash_core::model_files::{load_hf, HfFiles};
    let c = tiny_config(Arch::Qwen3);
    let mut files =
        dflash_core::testutil::write_hf(&c, &random_weights(&c, 3), safetensors::Dtype::F16, 1);
    let good = String::from_utf8(files["tokenizer.json"].clone()).unwrap();
    for broken in [
        r#""decoder":{"trim":tru,"#,
        "\"decoder\":{\"x\":\"\u{1}\",",
        r#""decoder":{,,"#,
    ] {
        let bad = good.replacen(r#""decoder":{"#, broken, 1);
        assert_ne!(bad, good);
        files.insert("tokenizer.json".into(), bad.into_bytes());
        let view: HfFiles = files.iter().map(|(n, b)| (n.clone(), &b[..])).collect();
        let e = load_hf(&view)
            .err()
            .expect("a broken tokenizer.json loaded");
        assert!(matches!(e, Error::Tokenizer(_)), "{e}");
    }
}

#[test]
fn a_drafter_with_ten_billion_layers_is_a_limit_not_an_abort() {
    // The default taps were sized by num_hidden_layers before its limit was checked: a
    // 343 GB allocation aborted the process (dflash-fuzz, drafter target).
    use dflash_core::drafter::DrafterConfig;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/zlab/qwen3_dflash_b16/drafter");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    v["dflash_config"]
        .as_object_mut()
        .unwrap()
        .remove("target_layer_ids");
    for (field, value, limit) in [
        ("num_hidden_layers", 42_949_672_963u64, "MAX_LAYERS"),
        ("num_target_layers", 1 << 40, "MAX_LAYERS"),
    ] {
        let mut c = v.clone();
        c[field] = value.into();
        let e = DrafterConfig::from_json(&c.to_string()).unwrap_err();
        assert_eq!(limit_of(&e), Some(limit), "{field}: {e}");
    }
}
