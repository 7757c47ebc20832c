//! Opening what users have: a `.gguf` file or a Hugging Face folder, into weights in the
//! GPU formats, a tokenizer and the model's own chat template.

use crate::chat::ChatTemplate;
use crate::config::{ModelConfig, RopeScaling};
use crate::error::{Error, Result};
use crate::formats::gguf_source::GgufSource;
use crate::formats::hf::{int4_config, SafeTensorsSource};
use crate::model_meta::{check_vocab, gguf_meta};
use crate::quant::QuantMatrix;
use crate::tokenizer::TextTokenizer;
use crate::weights::{ModelWeights, Naming, TensorSource};
use std::collections::BTreeMap;

pub struct LoadedModel {
    pub weights: ModelWeights,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// "gguf" or "hf".
    pub format: &'static str,
    /// What of the file was left out (a multimodal checkpoint's vision tower), for the
    /// host to tell the user.
    pub notes: Vec<String>,
}

impl LoadedModel {
    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    /// Token ids of a user message (after an optional system message) rendered through
    /// the model's own chat template, with the generation prompt added.
    pub fn chat_ids(&self, system: Option<&str>, user: &str) -> Result<Vec<u32>> {
        let mut msgs = Vec::new();
        if let Some(s) = system {
            msgs.push(crate::chat::Message::new("system", s));
        }
        msgs.push(crate::chat::Message::new("user", user));
        self.conversation_ids(&msgs)
    }

    /// Token ids of a conversation rendered through the model's own chat template, with
    /// the generation prompt added.
    pub fn conversation_ids(&self, messages: &[crate::chat::Message]) -> Result<Vec<u32>> {
        let tpl = self
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::ChatTemplate("the model has no chat template".into()))?;
        self.tokenizer.encode(&tpl.render(messages, true)?, true)
    }
}

/// Loads a GGUF file held in memory (a memory map natively).
pub fn load_gguf(bytes: &[u8]) -> Result<LoadedModel> {
    let src = GgufSource::new(bytes)?;
    let (mut config, tokenizer, chat_template) = gguf_meta(&src.header)?;
    if src.shape("rope_freqs.weight").is_some() {
        config.rope.scaling = RopeScaling::Factors(src.vector("rope_freqs.weight")?);
        config.validate()?;
    }
    let mut weights = ModelWeights::load(config, &src, Naming::Gguf)?;
    if weights.config.arch.has_attention_gate() {
        // llama.cpp's converter already wrote the norms as 1 + w and A as -exp(A_log).
        split_attention_gates(&mut weights);
    }
    Ok(LoadedModel {
        weights,
        tokenizer,
        chat_template,
        format: "gguf",
        notes: vec![],
    })
}

/// The files of a Hugging Face model folder, by file name.
pub type HfFiles<'a> = BTreeMap<String, &'a [u8]>;

fn json_file<'a>(files: &HfFiles<'a>, name: &str) -> Result<Option<serde_json::Value>> {
    match files.get(name) {
        None => Ok(None),
        Some(b) => serde_json::from_slice(b)
            .map(Some)
            .map_err(|e| Error::BadConfig(format!("{name}: {e}"))),
    }
}

/// A token given as a string or as `{"content": ...}` in tokenizer_config.json.
fn token_field(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

fn ids_field(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

/// A relative path of plain names only (no root, drive, `.` or `..`): a weight file the
/// index names stays inside the model folder.
fn is_plain_file_name(name: &str) -> bool {
    let p = std::path::Path::new(name);
    !name.is_empty()
        && !name.contains('\\')
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Checks that `path` is a regular file (following links) before it is opened: a FIFO,
/// socket or device would block the open or the read, or be no file at all.
#[cfg(not(target_arch = "wasm32"))]
pub fn require_regular_file(path: &std::path::Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    if meta.is_file() {
        Ok(())
    } else {
        Err(Error::NotAModel(format!(
            "{} is not a regular file (a FIFO, socket or device?)",
            path.display()
        )))
    }
}

/// Names of the safetensors files of a folder: the shards an index lists, or
/// `model.safetensors`.
pub fn hf_weight_files(index_json: Option<&[u8]>) -> Result<Vec<String>> {
    match index_json {
        None => Ok(vec!["model.safetensors".into()]),
        Some(b) => {
            let v: serde_json::Value = serde_json::from_slice(b)
                .map_err(|e| Error::BadConfig(format!("model.safetensors.index.json: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::BadConfig("index has no weight_map".into()))?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
            if let Some(bad) = files.iter().find(|f| !is_plain_file_name(f)) {
                return Err(Error::BadConfig(format!(
                    "model.safetensors.index.json: weight_map names {bad:?}, which is not a file inside the model folder (absolute paths and `..` are refused)"
                )));
            }
            files.sort();
            files.dedup();
            Ok(files)
        }
    }
}

/// Loads a Hugging Face model from its files (config.json, safetensors, tokenizer files).
pub fn load_hf(files: &HfFiles) -> Result<LoadedModel> {
    load_hf_with(files, false)
}

/// `load_hf` with the float matrices kept as the files have them (f32, `QFormat::F32`):
/// the full-precision path that conformance tests hold against float references. The
/// CPU engines only (the GPU refuses f32 matrices).
pub fn load_hf_full_precision(files: &HfFiles) -> Result<LoadedModel> {
    load_hf_with(files, true)
}

/// The tokenizer of a Hugging Face folder (`tokenizer.json`), its BOS and stop ids from
/// the tokenizer's, generation and model configs (`bos`, `eos`: the tokenizer config's
/// token texts).
fn hf_tokenizer(
    files: &HfFiles,
    (tok_json, tok_cfg, cfg_json): (&[u8], &serde_json::Value, &serde_json::Value),
    (bos, eos): (Option<&str>, Option<&str>),
) -> Result<crate::tokenizer::TextTokenizer> {
    let gen_cfg = json_file(files, "generation_config.json")?.unwrap_or_default();
    let mut tokenizer = crate::tokenizer::TextTokenizer::from_hf(tok_json, None, vec![], false)?;
    let bos_id = bos
        .and_then(|b| tokenizer.token_to_id(b))
        .or_else(|| ids_field(gen_cfg.get("bos_token_id")).first().copied());
    let mut stop_ids = ids_field(gen_cfg.get("eos_token_id"));
    if stop_ids.is_empty() {
        stop_ids = ids_field(cfg_json.get("eos_token_id"));
    }
    if let Some(e) = eos.and_then(|e| tokenizer.token_to_id(e)) {
        if !stop_ids.contains(&e) {
            stop_ids.push(e);
        }
    }
    tokenizer.bos_id = bos_id;
    tokenizer.stop_ids = stop_ids;
    tokenizer.add_bos = tok_cfg
        .get("add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    Ok(tokenizer)
}

/// The chat template's source: `chat_template.jinja`, else the tokenizer config's (its
/// `default` entry where it lists several).
fn hf_chat_template(files: &HfFiles, tok_cfg: &serde_json::Value) -> Option<String> {
    match files.get("chat_template.jinja") {
        Some(b) => Some(String::from_utf8_lossy(b).into_owned()),
        None => match tok_cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template").and_then(|s| s.as_str()).map(String::from)),
            _ => None,
        },
    }
}

/// The safetensors files the folder's index names (or its one file), as (name, bytes).
fn hf_weight_bytes<'m, 'a>(files: &'m HfFiles<'a>) -> Result<Vec<(&'m str, &'a [u8])>> {
    let names = hf_weight_files(files.get("model.safetensors.index.json").copied())?;
    names
        .iter()
        .map(|n| {
            files
                .get_key_value(n.as_str())
                .map(|(k, b)| (k.as_str(), *b))
                .ok_or_else(|| Error::NotAModel(format!("weight file {n} not found")))
        })
        .collect()
}

fn load_hf_with(files: &HfFiles, full_precision: bool) -> Result<LoadedModel> {
    let config_bytes = files
        .get("config.json")
        .ok_or_else(|| Error::NotAModel("no config.json".into()))?;
    let config_text = std::str::from_utf8(config_bytes)
        .map_err(|_| Error::BadConfig("config.json is not UTF-8".into()))?;
    let config = ModelConfig::from_hf_json(config_text)?;
    let int4 = int4_config(config_text)?;
    let tok_json = files
        .get("tokenizer.json")
        .ok_or_else(|| Error::MissingTokenizer("tokenizer.json not found".into()))?;
    let tok_cfg = json_file(files, "tokenizer_config.json")?.unwrap_or_default();
    let cfg_json: serde_json::Value = serde_json::from_str(config_text).unwrap_or_default();
    let bos = token_field(tok_cfg.get("bos_token"));
    let eos = token_field(tok_cfg.get("eos_token"));
    let tokenizer = hf_tokenizer(
        files,
        (tok_json, &tok_cfg, &cfg_json),
        (bos.as_deref(), eos.as_deref()),
    )?;
    check_vocab(&config, &tokenizer)?;
    let template_src = hf_chat_template(files, &tok_cfg);
    let chat_template = match template_src {
        Some(t) => Some(ChatTemplate::new(
            &t,
            bos.as_deref().unwrap_or(""),
            eos.as_deref().unwrap_or(""),
        )?),
        None => None,
    };
    let st = hf_weight_bytes(files)?;
    let mut src = SafeTensorsSource::new(st, int4)?;
    if full_precision {
        src = src.full_precision();
    }
    let mut weights = ModelWeights::load(config, &src, Naming::HuggingFace)?;
    if weights.config.arch.is_hybrid() {
        qwen35_from_hf(&mut weights);
    }
    let notes = match cfg_json.get("vision_config") {
        Some(_) => vec!["the checkpoint's vision tower is not loaded: text only".into()],
        None => vec![],
    };
    Ok(LoadedModel {
        weights,
        tokenizer,
        chat_template,
        format: "hf",
        notes,
    })
}

/// A Qwen3.5 checkpoint as the engine reads it: its zero-centred RMSNorm weights as
/// `1 + w` (the gated norm of the linear layers is not zero-centred), `A_log` as the
/// decay rate `-exp(A_log)` (what llama.cpp's converter writes), q_proj's gate rows split
/// off.
fn qwen35_from_hf(w: &mut ModelWeights) {
    let plus_one = |v: &mut Vec<f32>| v.iter_mut().for_each(|x| *x += 1.0);
    plus_one(&mut w.norm);
    for l in &mut w.layers {
        plus_one(&mut l.attn_norm);
        plus_one(&mut l.ffn_norm);
        match &mut l.mixer {
            crate::weights::Mixer::Attention(a) => {
                a.q_norm
                    .iter_mut()
                    .chain(a.k_norm.iter_mut())
                    .for_each(plus_one);
            }
            crate::weights::Mixer::DeltaNet(d) => {
                d.decay.iter_mut().for_each(|x| *x = -crate::math::exp(*x));
            }
        }
    }
    split_attention_gates(w);
}

/// q_proj's rows per head (query, gate), as checkpoints and GGUF files of Qwen3.5 keep
/// them, split into the queries and the gate projection.
fn split_attention_gates(w: &mut ModelWeights) {
    let hd = w.config.head_dim;
    for l in &mut w.layers {
        let crate::weights::Mixer::Attention(a) = &mut l.mixer else {
            continue;
        };
        let heads = a.wq.rows / hd;
        let rows = |first: usize| {
            let part: Vec<QuantMatrix> = (first..heads)
                .step_by(2)
                .map(|i| a.wq.row_range(i * hd, hd))
                .collect();
            QuantMatrix::stack_rows(&part.iter().collect::<Vec<_>>()).expect("rows of one matrix")
        };
        (a.wq, a.gate) = (rows(0), Some(rows(1)));
    }
}

/// Loads from the file system: a `.gguf` file or a Hugging Face folder.
///
/// Files are read, never mapped: a file truncated or rewritten while it loads is a
/// typed error (`Truncated`, `Io`), where a map would fault (SIGBUS) on the lost pages.
/// A GGUF file streams through [`WeightStream`] in chunks, so the host holds its header
/// and one raw tensor at a time, as the browser's loader does.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_path(path: &std::path::Path) -> Result<LoadedModel> {
    load_path_with(path, false)
}

/// `load_path` of a Hugging Face folder with its float matrices kept in f32
/// (`load_hf_full_precision`); a GGUF file (already quantized) is refused.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_path_full_precision(path: &std::path::Path) -> Result<LoadedModel> {
    load_path_with(path, true)
}

#[cfg(not(target_arch = "wasm32"))]
fn load_path_with(path: &std::path::Path, full_precision: bool) -> Result<LoadedModel> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    if !meta.is_dir() {
        if full_precision {
            return Err(Error::UnsupportedQuantization(format!(
                "{}: full precision needs a Hugging Face folder of float weights, not a GGUF file",
                path.display()
            )));
        }
        return load_gguf_file(path);
    }
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
        "model.safetensors.index.json",
    ] {
        let p = path.join(name);
        if p.exists() {
            files.push((name.into(), read_regular_file(&p)?));
        }
    }
    let index = files
        .iter()
        .find(|(n, _)| n == "model.safetensors.index.json")
        .map(|(_, b)| b.clone());
    for n in hf_weight_files(index.as_deref())? {
        let p = path.join(&n);
        if p.exists() {
            let bytes = read_regular_file(&p)?;
            files.push((n, bytes));
        }
    }
    let files: HfFiles = files.iter().map(|(n, b)| (n.clone(), &b[..])).collect();
    load_hf_with(&files, full_precision)
}

#[cfg(not(target_arch = "wasm32"))]
fn io_error(path: &std::path::Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// The whole of a regular file (not a FIFO or device, which could block forever).
#[cfg(not(target_arch = "wasm32"))]
fn read_regular_file(path: &std::path::Path) -> Result<Vec<u8>> {
    require_regular_file(path)?;
    std::fs::read(path).map_err(|e| io_error(path, e))
}

/// A GGUF model read in chunks through the streaming loader: one file, or every part of
/// a model split by llama.cpp's `gguf-split` when `path` is named as one of its parts
/// (`NAME-00001-of-00003.gguf`; any part names them all). Each file's length is taken
/// when it opens.
#[cfg(not(target_arch = "wasm32"))]
fn load_gguf_file(path: &std::path::Path) -> Result<LoadedModel> {
    let paths = split_part_paths(path).unwrap_or_else(|| vec![path.to_path_buf()]);
    let mut parts = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        if paths.len() > 1 && !p.exists() {
            return Err(Error::SplitPart {
                part: i + 1,
                count: paths.len(),
                reason: format!("{} does not exist", p.display()),
            });
        }
        let (file, len) = open_regular_file(p)?;
        parts.push((file, len, p.display().to_string()));
    }
    load_gguf_parts(parts)
}

/// An open regular file and its length.
#[cfg(not(target_arch = "wasm32"))]
fn open_regular_file(path: &std::path::Path) -> Result<(std::fs::File, u64)> {
    require_regular_file(path)?;
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    // Again on the open file: the path may have been replaced since the check.
    if !meta.is_file() {
        return Err(Error::NotAModel(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok((file, meta.len()))
}

/// The paths of every part when `path` is named as a part of a split GGUF
/// (`NAME-00002-of-00003.gguf`), in order; None for any other name.
pub fn split_part_paths(path: &std::path::Path) -> Option<Vec<std::path::PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (base, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || base.is_empty() {
        return None;
    }
    let (no, count): (usize, usize) = (no.parse().ok()?, count.parse().ok()?);
    if no == 0 || no > count {
        return None;
    }
    Some(
        (1..=count)
            .map(|i| path.with_file_name(format!("{base}-{i:05}-of-{count:05}.gguf")))
            .collect(),
    )
}

/// A GGUF model of `total` bytes read from `reader` in chunks through the streaming
/// loader: a reader that ends early is `Truncated`, one that gives more is refused.
pub fn load_gguf_reader(reader: impl std::io::Read, total: u64) -> Result<LoadedModel> {
    load_gguf_parts([(reader, total, "GGUF stream".to_string())])
}

/// A GGUF model in one or more parts (`gguf-split`), each a reader, its length and the
/// name an I/O error on it gives.
pub fn load_gguf_parts<R: std::io::Read>(
    parts: impl IntoIterator<Item = (R, u64, String)>,
) -> Result<LoadedModel> {
    use crate::formats::gguf_weights_stream::{HostSink, WeightStream};
    let mut stream: Option<WeightStream<HostSink>> = None;
    for (reader, total, name) in parts {
        match &mut stream {
            None => stream = Some(WeightStream::new(HostSink, total)),
            Some(s) => s.next_part(total)?,
        }
        stream_part(stream.as_mut().expect("set above"), reader, &name)?;
    }
    let stream = stream.ok_or_else(|| Error::NotAModel("no GGUF file".into()))?;
    let (mut streamed, HostSink) = stream.finish()?;
    if streamed.weights.config.arch.has_attention_gate() {
        split_attention_gates(&mut streamed.weights);
    }
    Ok(LoadedModel {
        weights: streamed.weights,
        tokenizer: streamed.tokenizer,
        chat_template: streamed.chat_template,
        format: "gguf",
        notes: vec![],
    })
}

/// One GGUF file's bytes into `stream`, in 8 MiB chunks; its magic is checked first.
/// An I/O error names the file `name`.
fn stream_part<S: crate::formats::gguf_weights_stream::TensorSink>(
    stream: &mut crate::formats::gguf_weights_stream::WeightStream<S>,
    mut reader: impl std::io::Read,
    name: &str,
) -> std::result::Result<(), S::Error> {
    const CHUNK: usize = 8 << 20;
    let io = |e| Error::Io {
        path: name.into(),
        source: e,
    };
    let mut magic = [0u8; 4];
    let got = read_up_to(&mut reader, &mut magic).map_err(io)?;
    if got < 4 || &magic != crate::formats::gguf::GGUF_MAGIC {
        return Err(Error::BadMagic {
            expected: "GGUF",
            found: magic[..got].to_vec(),
        }
        .into());
    }
    stream.push(&magic)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e).into()),
        };
        stream.push(&buf[..n])?;
    }
}

/// Reads until `buf` is full or the reader ends; the bytes read.
fn read_up_to(reader: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
