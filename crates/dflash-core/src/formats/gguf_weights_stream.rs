//! A GGUF model built tensor by tensor as its bytes stream in: each 2-D tensor is
//! repacked into the engine's formats as soon as its last byte arrives and handed to a
//! sink (kept in host memory for the CPU engine, uploaded and dropped for the GPU), so
//! the host never holds more than the header and one raw tensor. The header is checked
//! (config, tokenizer, chat template) as soon as it has arrived, before the weights.
//! A model split in several files by llama.cpp's `gguf-split` streams part after part
//! ([`WeightStream::next_part`]): the first part's header holds the metadata, each part
//! its own tensors.

use crate::chat::ChatTemplate;
use crate::config::{ModelConfig, RopeScaling};
use crate::error::Error;
use crate::formats::ggml;
use crate::formats::gguf::GgufHeader;
use crate::formats::gguf_stream::{GgufStream, StreamTensor};
use crate::model_meta::gguf_meta;
use crate::quant::QuantMatrix;
use crate::tokenizer::TextTokenizer;
use crate::weights::{ModelWeights, Naming, TensorSource};
use std::cell::RefCell;
use std::collections::HashMap;

/// Where the repacked tensors go.
pub trait TensorSink {
    type Matrix;
    type Vector;
    type Error: From<Error>;
    fn matrix(&mut self, name: &str, m: QuantMatrix) -> Result<Self::Matrix, Self::Error>;
    /// A stack of `parts` matrices of equal rows (a 3-D tensor: a mixture's experts),
    /// kept whole: a sink that splits matrices splits this one between parts only.
    fn stacked_matrix(
        &mut self,
        name: &str,
        m: QuantMatrix,
        parts: usize,
    ) -> Result<Self::Matrix, Self::Error> {
        let _ = parts;
        self.matrix(name, m)
    }
    fn vector(&mut self, name: &str, v: Vec<f32>) -> Result<Self::Vector, Self::Error>;
}

/// Keeps the tensors in host memory (the CPU engine's weights).
pub struct HostSink;

impl TensorSink for HostSink {
    type Matrix = QuantMatrix;
    type Vector = Vec<f32>;
    type Error = Error;
    fn matrix(&mut self, _: &str, m: QuantMatrix) -> Result<QuantMatrix, Error> {
        Ok(m)
    }
    fn vector(&mut self, _: &str, v: Vec<f32>) -> Result<Vec<f32>, Error> {
        Ok(v)
    }
}

/// The weights of a streamed model, with its tokenizer and chat template.
pub struct StreamedWeights<M, V> {
    pub weights: ModelWeights<M, V>,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
}

/// A finished stream: the weights in the sink's types, and the sink.
pub type Finished<S> = (
    StreamedWeights<<S as TensorSink>::Matrix, <S as TensorSink>::Vector>,
    S,
);

pub struct WeightStream<S: TensorSink> {
    pub sink: S,
    /// The part streaming now, and the headers of the parts before it.
    stream: GgufStream,
    parts_done: Vec<GgufHeader>,
    received_before: u64,
    /// `split.count` and `split.tensors.count` of the first part's header (1 and its own
    /// tensor count for a file in one piece).
    split: Option<Split>,
    meta: Option<(ModelConfig, TextTokenizer, Option<ChatTemplate>)>,
    matrices: HashMap<String, S::Matrix>,
    vectors: HashMap<String, S::Vector>,
    rope_freqs: Option<Vec<f32>>,
    tensors_done: usize,
}

impl<S: TensorSink> WeightStream<S> {
    /// A stream over a GGUF file of `total` bytes.
    pub fn new(sink: S, total: u64) -> Self {
        WeightStream {
            sink,
            stream: GgufStream::new(total),
            parts_done: Vec::new(),
            received_before: 0,
            split: None,
            meta: None,
            matrices: HashMap::new(),
            vectors: HashMap::new(),
            rope_freqs: None,
            tensors_done: 0,
        }
    }

    /// The model's config once the header has arrived.
    pub fn config(&self) -> Option<&ModelConfig> {
        self.meta.as_ref().map(|m| &m.0)
    }

    /// Bytes received, over every part so far.
    pub fn received(&self) -> u64 {
        self.received_before + self.stream.received()
    }

    /// Tensors done so far, of how many (0 until the header has arrived).
    pub fn progress(&self) -> (usize, usize) {
        (self.tensors_done, self.split.map_or(0, |s| s.tensors))
    }

    /// Parts of the model (`split.count`; 1 for a file in one piece), once the first
    /// header has arrived.
    pub fn parts(&self) -> Option<usize> {
        self.split.map(|s| s.count)
    }

    /// The next bytes of the current part: completes the tensors they finish.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), S::Error> {
        let had_header = self.stream.header().is_some();
        let done = self.stream.push(chunk)?;
        if !had_header {
            if let Some(h) = self.stream.header() {
                check_part_header(&mut self.split, self.parts_done.len() + 1, h)?;
                if self.meta.is_none() {
                    self.meta = Some(gguf_meta(h)?);
                }
            }
        }
        for t in done {
            self.take(t)?;
        }
        Ok(())
    }

    /// Ends the current part (all of it must have arrived) and starts the next one, a
    /// GGUF file of `total` bytes: the model is split and has more parts.
    pub fn next_part(&mut self, total: u64) -> Result<(), S::Error> {
        self.stream.finish()?;
        let count = self.split.map_or(1, |s| s.count);
        let part = self.parts_done.len() + 2;
        if part > count {
            return Err(Error::SplitPart {
                part,
                count,
                reason: format!("the model has {count} part(s), there is no part {part}"),
            }
            .into());
        }
        let stream = std::mem::replace(&mut self.stream, GgufStream::new(total));
        self.received_before += stream.received();
        self.parts_done
            .push(stream.into_header().expect("finish() checked the header"));
        Ok(())
    }

    fn take(&mut self, t: StreamTensor) -> Result<(), S::Error> {
        let info = &t.info;
        // A 2-D tensor whose rows are no whole number of weight groups is a vector of
        // its values (a convolution's taps, `ssm_conv1d`).
        let matrix = matches!(info.dims.len(), 2 | 3) && info.dims[0].is_multiple_of(32);
        match info.dims.len() {
            _ if matrix => {
                let (rows, cols) = info.matrix_shape().expect("2 or 3 dims");
                let m = QuantMatrix::from_ggml(&info.name, info.dtype, &t.bytes, rows, cols)?;
                let m = match info.dims.get(2) {
                    Some(&parts) => self.sink.stacked_matrix(&info.name, m, parts as usize)?,
                    None => self.sink.matrix(&info.name, m)?,
                };
                self.matrices.insert(info.name.clone(), m);
            }
            1..=3 => {
                if !info.dtype.is_supported() {
                    return Err(Error::UnsupportedTensorType {
                        tensor: info.name.clone(),
                        dtype: info.dtype.name(),
                    }
                    .into());
                }
                let v = ggml::dequantize(info.dtype, &t.bytes, info.n_elements() as usize);
                if info.name == "rope_freqs.weight" {
                    self.rope_freqs = Some(v);
                } else {
                    let v = self.sink.vector(&info.name, v)?;
                    self.vectors.insert(info.name.clone(), v);
                }
            }
            _ => {}
        }
        self.tensors_done += 1;
        Ok(())
    }

    /// Checks the whole file (every part) arrived and every tensor the config needs is
    /// there with its shape; returns the weights and the sink.
    pub fn finish(self) -> Result<Finished<S>, S::Error> {
        self.stream.finish()?;
        let mut parts = self.parts_done;
        parts.push(
            self.stream
                .into_header()
                .expect("finish() checked the header"),
        );
        let split = self
            .split
            .ok_or_else(|| Error::BadMetadata("the GGUF header did not parse".into()))?;
        let header = merged_header(parts, split)?;
        let (mut config, tokenizer, chat_template) = match self.meta {
            // The first part's header may lack the tensors of the later ones
            // (`output.weight`, which says whether the head is tied): read it again whole.
            Some(_) if self.split.is_some_and(|s| s.count > 1) => gguf_meta(&header)?,
            Some(meta) => meta,
            None => return Err(Error::BadMetadata("no GGUF header".into()).into()),
        };
        if let Some(f) = self.rope_freqs {
            config.rope.scaling = RopeScaling::Factors(f);
            config.validate()?;
        }
        let src = Taken {
            header: &header,
            matrices: RefCell::new(self.matrices),
            vectors: RefCell::new(self.vectors),
        };
        let weights = ModelWeights::load(config, &src, Naming::Gguf)?;
        let streamed = StreamedWeights {
            weights,
            tokenizer,
            chat_template,
        };
        Ok((streamed, self.sink))
    }
}

/// `gguf-split`'s fields of one part's header.
#[derive(Clone, Copy)]
struct Split {
    /// 1-based, as in the file names (`split.no` is 0-based).
    no: usize,
    count: usize,
    tensors: usize,
}

impl Split {
    /// The split fields of part `part` (1-based); a file without them is one whole part.
    fn of(h: &GgufHeader, part: usize) -> Result<Split, Error> {
        let field = |key: &str| h.get(key).map(|v| v.as_u64());
        match (
            field("split.no"),
            field("split.count"),
            field("split.tensors.count"),
        ) {
            (None, None, None) => Ok(Split {
                no: 1,
                count: 1,
                tensors: h.tensors.len(),
            }),
            (Some(Some(no)), Some(Some(count)), Some(Some(tensors)))
                if count >= 1 && no < count && count <= MAX_SPLIT_PARTS =>
            {
                Ok(Split {
                    no: no as usize + 1,
                    count: count as usize,
                    tensors: tensors.min(MAX_TENSORS) as usize,
                })
            }
            _ => Err(Error::SplitPart {
                part,
                count: 0,
                reason: "split.no, split.count and split.tensors.count must all be set, \
                         as integers with split.no < split.count"
                    .into(),
            }),
        }
    }
}

/// The split fields of part `part`'s header (1-based) against the first part's (`split`,
/// set from it when it is the first).
fn check_part_header(split: &mut Option<Split>, part: usize, h: &GgufHeader) -> Result<(), Error> {
    let here = Split::of(h, part)?;
    let first = *split.get_or_insert(here);
    if here.count != first.count || here.no != part || here.tensors != first.tensors {
        return Err(Error::SplitPart {
            part,
            count: first.count,
            reason: format!(
                "its header says part {} of {} ({} tensors in all), expected part {part} of {} ({})",
                here.no, here.count, here.tensors, first.count, first.tensors
            ),
        });
    }
    Ok(())
}

/// Most parts a split model may have (`gguf-split` numbers them with five digits).
const MAX_SPLIT_PARTS: u64 = 99_999;
/// More tensors than any header may hold (`split.tensors.count` is checked against the
/// parts' own counts, which their parsing bounds).
const MAX_TENSORS: u64 = u32::MAX as u64;

/// One header for a model whose parts have all arrived: the first part's metadata and
/// every part's tensors. A missing part, a tensor in two parts or a count that differs
/// from `split.tensors.count` is a `SplitPart` error.
fn merged_header(mut parts: Vec<GgufHeader>, split: Split) -> Result<GgufHeader, Error> {
    let count = split.count;
    if parts.len() < count {
        return Err(Error::SplitPart {
            part: parts.len() + 1,
            count,
            reason: "this part is missing (the stream ended after the part before it)".into(),
        });
    }
    let mut merged = parts.remove(0);
    for p in parts {
        merged.tensors.extend(p.tensors);
    }
    let mut names: Vec<&str> = merged.tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::SplitPart {
            part: count,
            count,
            reason: format!("tensor {} is in two parts", w[0]),
        });
    }
    if merged.tensors.len() != split.tensors {
        return Err(Error::SplitPart {
            part: count,
            count,
            reason: format!(
                "the parts hold {} tensors, split.tensors.count says {}",
                merged.tensors.len(),
                split.tensors
            ),
        });
    }
    Ok(merged)
}

/// The completed tensors as a tensor source (each handed out once), with the header's
/// shapes.
struct Taken<'a, M, V> {
    header: &'a GgufHeader,
    matrices: RefCell<HashMap<String, M>>,
    vectors: RefCell<HashMap<String, V>>,
}

impl<M, V> TensorSource<M, V> for Taken<'_, M, V> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.header.tensor(name).map(|t| t.shape())
    }
    fn matrix(&self, name: &str) -> crate::Result<M> {
        self.matrices
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| Error::MissingTensor(name.into()))
    }
    fn vector(&self, name: &str) -> crate::Result<V> {
        self.vectors
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| Error::MissingTensor(name.into()))
    }
}
