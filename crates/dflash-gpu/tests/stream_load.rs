//! A GGUF model streamed into GPU buffers in chunks (as the browser loads it) generates
//! exactly what the same file loaded whole generates; a cut stream, a corrupt header and
//! a tensor of the wrong shape are typed errors.

mod common;

use common::contexts;
use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::GenerateRequest;
use dflash_core::model_files::load_gguf;
use dflash_core::sampling::SamplingParams;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf, Rng};
use dflash_core::Error;
use dflash_gpu::{GpuError, GpuModel, GpuModelOptions, StreamLoader};

fn stream(
    ctx: &std::rc::Rc<dflash_gpu::GpuContext>,
    file: &[u8],
    max_chunk: usize,
    seed: u64,
) -> Result<StreamLoader, GpuError> {
    stream_part(ctx, file, file.len(), max_chunk, seed)
}

/// The first `upto` bytes of `file` arrive, of the whole length announced.
fn stream_part(
    ctx: &std::rc::Rc<dflash_gpu::GpuContext>,
    file: &[u8],
    upto: usize,
    max_chunk: usize,
    seed: u64,
) -> Result<StreamLoader, GpuError> {
    let mut l = StreamLoader::new(ctx.clone(), file.len() as u64);
    let file = &file[..upto];
    let mut rng = Rng(seed);
    let mut pos = 0;
    while pos < file.len() {
        let n = (1 + rng.below(max_chunk)).min(file.len() - pos);
        l.push(&file[pos..pos + n])?;
        pos += n;
    }
    Ok(l)
}

fn request(
    prompt_ids: Vec<u32>,
    max_new_tokens: usize,
    sampling: SamplingParams,
    context: usize,
) -> GenerateRequest {
    GenerateRequest {
        prompt_ids,
        max_new_tokens,
        sampling,
        stop_strings: vec![],
        context,
        interrupt: Default::default(),
        grammar: None,
    }
}

/// The streamed model generates what the model loaded whole generates for `req`.
fn same_generation(
    whole: &mut GpuModel,
    m: &dflash_core::model_files::LoadedModel,
    streamed: &mut dflash_gpu::StreamedModel,
    req: &GenerateRequest,
    what: &str,
) {
    let a = whole
        .generate(&m.tokenizer, req, &|| 0.0, &mut |_| {})
        .unwrap();
    let b = streamed
        .model
        .generate(&streamed.tokenizer, req, &|| 0.0, &mut |_| {})
        .unwrap();
    assert_eq!(a.tokens, b.tokens, "{what}");
    assert_eq!(a.text, b.text, "{what}");
}

#[test]
fn a_streamed_model_generates_what_the_whole_file_generates() {
    for (arch, t) in [
        (Arch::Llama, GgmlType::Q4_1),
        (Arch::Qwen3, GgmlType::Q8_0),
        (Arch::Qwen2, GgmlType::Q4_0),
    ] {
        let c = tiny_config(arch);
        let file = write_gguf(&c, &random_weights(&c, 21), t);
        let m = load_gguf(&file).unwrap();
        let opts = GpuModelOptions {
            context: 64,
            taps: vec![0, c.num_layers - 1],
            ..Default::default()
        };
        for ctx in contexts() {
            let mut whole = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
            let l = stream(&ctx, &file, 5000, 3).unwrap();
            assert_eq!(l.progress().0, l.progress().1);
            let mut s = l.finish(&opts).unwrap();
            assert_eq!(s.model.memory, whole.memory, "{arch:?}");
            assert_eq!(s.tokenizer.vocab_size(), m.tokenizer.vocab_size());
            for sp in [
                SamplingParams::default(),
                SamplingParams {
                    temperature: 0.9,
                    top_p: 0.9,
                    seed: 5,
                    ..Default::default()
                },
            ] {
                let req = request(vec![1, 5, 9, 3, 7], 12, sp, 64);
                same_generation(&mut whole, &m, &mut s, &req, &format!("{arch:?} {t:?}"));
            }
        }
    }
}

/// A model split in three GGUF parts (`gguf-split`; the untied head in the last one)
/// streams part after part into the GPU and generates what the whole file generates; a
/// stream that stops after two parts is a `SplitPart` error.
#[test]
fn a_split_model_streams_part_after_part() {
    use dflash_core::testutil::split_gguf;
    let c = tiny_config(Arch::Qwen3);
    let file = write_gguf(&c, &random_weights(&c, 23), GgmlType::Q8_0);
    let m = load_gguf(&file).unwrap();
    let parts = split_gguf(&file, 3);
    let opts = GpuModelOptions {
        context: 32,
        ..Default::default()
    };
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    let load = |n: usize| -> Result<StreamLoader, GpuError> {
        let mut l = StreamLoader::with_context(ctx.clone(), parts[0].len() as u64, 32);
        for (i, p) in parts[..n].iter().enumerate() {
            if i > 0 {
                l.next_part(p.len() as u64)?;
            }
            for chunk in p.chunks(777) {
                l.push(chunk)?;
            }
        }
        Ok(l)
    };
    let mut s = load(3).unwrap().finish(&opts).unwrap();
    let mut whole = GpuModel::new(ctx.clone(), &m.weights, &opts).unwrap();
    let req = request(vec![2, 4, 6], 8, SamplingParams::default(), 32);
    same_generation(&mut whole, &m, &mut s, &req, "split");
    match load(2).unwrap().finish(&opts) {
        Err(GpuError::Core(Error::SplitPart {
            part: 3, count: 3, ..
        })) => {}
        other => panic!("a missing last part gave {:?}", other.err()),
    }
}

#[test]
fn cut_corrupt_and_misshapen_streams_are_typed_errors() {
    let c = tiny_config(Arch::Llama);
    let file = write_gguf(&c, &random_weights(&c, 22), GgmlType::Q8_0);
    let opts = GpuModelOptions {
        context: 32,
        ..Default::default()
    };
    for ctx in contexts().into_iter().take(1) {
        // Cut: every byte but the last 100 arrives.
        // A file whose announced size does not hold its tensors: refused at the header.
        assert!(matches!(
            stream(&ctx, &file[..file.len() - 100], 4096, 1).err(),
            Some(GpuError::Core(Error::TensorOutOfBounds { .. }))
        ));
        let l = stream_part(&ctx, &file, file.len() - 100, 4096, 1);
        let l = l.unwrap_or_else(|e| panic!("a cut stream is only known at the end: {e}"));
        assert!(matches!(
            l.finish(&opts),
            Err(GpuError::Core(Error::Truncated { .. }))
        ));
        // Corrupt magic: refused as soon as the header is parsed, before the weights.
        let mut bad = file.clone();
        bad[0] = b'X';
        let mut l = StreamLoader::new(ctx.clone(), bad.len() as u64);
        let e = bad.chunks(4096).try_for_each(|ch| l.push(ch)).unwrap_err();
        assert!(
            matches!(
                e,
                GpuError::Core(Error::BadMagic { .. }) | GpuError::Core(Error::BadMetadata(_))
            ),
            "{e}"
        );
        // A matrix of the wrong shape: the model of another config.
        let mut c2 = c.clone();
        c2.intermediate_size += 32;
        let mut w = random_weights(&c, 22);
        let other = random_weights(&c2, 22);
        w.insert(
            "blk.0.ffn_up.weight".into(),
            other["blk.0.ffn_up.weight"].clone(),
        );
        let f2 = write_gguf(&c, &w, GgmlType::Q8_0);
        let e = stream(&ctx, &f2, 4096, 2)
            .unwrap()
            .finish(&opts)
            .err()
            .expect("a misshapen tensor is refused");
        assert!(
            matches!(e, GpuError::Core(Error::ShapeMismatch { .. })),
            "{e}"
        );
    }
}

/// A model whose buffers cannot fit the adapter (here a KV cache of one layer larger
/// than a binding may be) is refused as soon as its header has arrived, naming the
/// limit, before its weights download; without the context given, only at `finish`.
#[test]
fn a_model_over_the_adapters_limits_is_refused_at_its_header() {
    for ctx in contexts() {
        let mut c = tiny_config(Arch::Llama);
        // Four KV heads: a token's K row large enough that SwiftShader's 1 GiB binding is
        // passed within MAX_CONTEXT_TOKENS (which the header check would name first).
        c.num_kv_heads = 4;
        // One token of one layer's K (or V) cache is kv_dim f32s (f16 at most halves it).
        let per_token = (c.kv_dim() * 2) as u64;
        let context = (ctx.max_binding() / per_token + 1).min(u32::MAX as u64) as usize;
        c.max_position_embeddings = context;
        let file = write_gguf(&c, &random_weights(&c, 23), GgmlType::Q8_0);
        let mut l = StreamLoader::with_context(ctx.clone(), file.len() as u64, context);
        let mut sent = 0;
        let e = file
            .chunks(256)
            .try_for_each(|ch| {
                sent += ch.len();
                l.push(ch)
            })
            .unwrap_err();
        match e {
            GpuError::LimitExceeded { limit_name, .. } => {
                assert_eq!(limit_name, "max_storage_buffer_binding_size")
            }
            e => panic!("{e}"),
        }
        assert!(
            sent < file.len() / 2,
            "refused after {sent} of {} bytes",
            file.len()
        );
    }
}
