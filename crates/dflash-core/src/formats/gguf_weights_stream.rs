//! A GGUF model built tensor by tensor as its bytes stream in: each 2-D tensor is
//! repacked into the engine's formats as soon as its last byte arrives and handed to a
//! sink (kept in host memory for the CPU engine, uploaded and dropped for the GPU), so
//! the host never holds more than the header and one raw tensor. The header is checked
//! (config, tokenizer, chat template) as soon as it has arrived, before the weights.

use crate::chat::ChatTemplate;
use crate::config::{ModelConfig, RopeScaling};
use crate::error::Error;
use crate::formats::ggml;
use crate::formats::gguf_stream::{GgufStream, StreamTensor};
use crate::model_files::gguf_meta;
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
    stream: GgufStream,
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

    pub fn received(&self) -> u64 {
        self.stream.received()
    }

    /// Tensors done so far, of how many (0 until the header has arrived).
    pub fn progress(&self) -> (usize, usize) {
        (
            self.tensors_done,
            self.stream.header().map_or(0, |h| h.tensors.len()),
        )
    }

    /// The next bytes of the file: completes the tensors they finish.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), S::Error> {
        let done = self.stream.push(chunk)?;
        if self.meta.is_none() {
            if let Some(h) = self.stream.header() {
                self.meta = Some(gguf_meta(h)?);
            }
        }
        for t in done {
            self.take(t)?;
        }
        Ok(())
    }

    fn take(&mut self, t: StreamTensor) -> Result<(), S::Error> {
        let info = &t.info;
        match info.dims.len() {
            2 => {
                let m = QuantMatrix::from_ggml(
                    &info.name,
                    info.dtype,
                    &t.bytes,
                    info.dims[1] as usize,
                    info.dims[0] as usize,
                )?;
                let m = self.sink.matrix(&info.name, m)?;
                self.matrices.insert(info.name.clone(), m);
            }
            1 => {
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

    /// Checks the whole file arrived and every tensor the config needs is there with its
    /// shape; returns the weights and the sink.
    pub fn finish(self) -> Result<Finished<S>, S::Error> {
        self.stream.finish()?;
        let (mut config, tokenizer, chat_template) = self
            .meta
            .ok_or_else(|| Error::BadMetadata("no GGUF header".into()))?;
        if let Some(f) = self.rope_freqs {
            config.rope.scaling = RopeScaling::Factors(f);
            config.validate()?;
        }
        let src = Taken {
            header: self.stream.header().expect("finish() checked the header"),
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

/// The completed tensors as a tensor source (each handed out once), with the header's
/// shapes.
struct Taken<'a, M, V> {
    header: &'a crate::formats::gguf::GgufHeader,
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
