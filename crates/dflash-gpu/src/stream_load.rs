//! A GGUF model streamed into GPU buffers: each tensor is repacked and uploaded as soon
//! as its last byte arrives and its host copy dropped, so the host never holds more than
//! the header and one tensor (the browser's 2 GB ArrayBuffer and 4 GB wasm limits do not
//! bound the model size). The header is checked (config, tokenizer, chat template) as
//! soon as it has arrived, before the weights download.

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::model::{GpuModel, GpuModelOptions, GpuWeights};
use crate::upload::{f32_buffer, upload_matrix, GpuMatrix};
use dflash_core::chat::ChatTemplate;
use dflash_core::config::{ModelConfig, RopeScaling};
use dflash_core::formats::ggml;
use dflash_core::formats::gguf::GgufHeader;
use dflash_core::formats::gguf_stream::{GgufStream, StreamTensor};
use dflash_core::model_files::gguf_meta;
use dflash_core::quant::QuantMatrix;
use dflash_core::tokenizer::TextTokenizer;
use dflash_core::weights::{ModelWeights, Naming, TensorSource};
use dflash_core::Error;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A model loaded from a stream: on the GPU, with its tokenizer and chat template.
pub struct StreamedModel {
    pub model: GpuModel,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
}

pub struct StreamLoader {
    ctx: Rc<GpuContext>,
    stream: GgufStream,
    meta: Option<(ModelConfig, TextTokenizer, Option<ChatTemplate>)>,
    matrices: HashMap<String, GpuMatrix>,
    vectors: HashMap<String, wgpu::Buffer>,
    rope_freqs: Option<Vec<f32>>,
    tensors_done: usize,
    uploaded_bytes: u64,
}

impl StreamLoader {
    /// A loader for a GGUF file of `total` bytes.
    pub fn new(ctx: Rc<GpuContext>, total: u64) -> Self {
        StreamLoader {
            ctx,
            stream: GgufStream::new(total),
            meta: None,
            matrices: HashMap::new(),
            vectors: HashMap::new(),
            rope_freqs: None,
            tensors_done: 0,
            uploaded_bytes: 0,
        }
    }

    /// The model's config once the header has arrived.
    pub fn config(&self) -> Option<&ModelConfig> {
        self.meta.as_ref().map(|m| &m.0)
    }

    pub fn received(&self) -> u64 {
        self.stream.received()
    }

    /// Tensors uploaded so far, of how many (0 until the header has arrived).
    pub fn progress(&self) -> (usize, usize) {
        (
            self.tensors_done,
            self.stream.header().map_or(0, |h| h.tensors.len()),
        )
    }

    /// The next bytes of the file: completes and uploads the tensors they finish.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        let done = self.stream.push(chunk)?;
        if self.meta.is_none() {
            if let Some(h) = self.stream.header() {
                self.meta = Some(gguf_meta(h)?);
            }
        }
        for t in done {
            self.upload(t)?;
        }
        Ok(())
    }

    fn upload(&mut self, t: StreamTensor) -> Result<()> {
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
                let g = upload_matrix(&self.ctx, &info.name, &m)?;
                self.uploaded_bytes += g.n_bytes;
                self.matrices.insert(info.name.clone(), g);
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
                    self.uploaded_bytes += (v.len() * 4) as u64;
                    self.vectors
                        .insert(info.name.clone(), f32_buffer(&self.ctx, &info.name, &v));
                }
            }
            _ => {}
        }
        self.tensors_done += 1;
        Ok(())
    }

    /// Checks the whole file arrived and every tensor the config needs is there with its
    /// shape; builds the model (KV cache and activations for `opts`).
    pub fn finish(self, opts: &GpuModelOptions) -> Result<StreamedModel> {
        self.stream.finish()?;
        let (mut config, tokenizer, chat_template) = self
            .meta
            .ok_or_else(|| GpuError::Core(Error::BadMetadata("no GGUF header".into())))?;
        if let Some(f) = self.rope_freqs {
            config.rope.scaling = RopeScaling::Factors(f);
            config.validate()?;
        }
        let src = Uploaded {
            header: self.stream.header().expect("finish() checked the header"),
            matrices: RefCell::new(self.matrices),
            vectors: RefCell::new(self.vectors),
        };
        let w: GpuWeights = ModelWeights::load(config, &src, Naming::Gguf)?;
        let model = GpuModel::from_gpu_weights(self.ctx.clone(), w, opts)?;
        Ok(StreamedModel {
            model,
            tokenizer,
            chat_template,
        })
    }
}

/// The uploaded tensors as a tensor source (each handed out once), with the header's
/// shapes.
struct Uploaded<'a> {
    header: &'a GgufHeader,
    matrices: RefCell<HashMap<String, GpuMatrix>>,
    vectors: RefCell<HashMap<String, wgpu::Buffer>>,
}

impl TensorSource<GpuMatrix, wgpu::Buffer> for Uploaded<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.header.tensor(name).map(|t| t.shape())
    }
    fn matrix(&self, name: &str) -> dflash_core::Result<GpuMatrix> {
        self.matrices
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| Error::MissingTensor(name.into()))
    }
    fn vector(&self, name: &str) -> dflash_core::Result<wgpu::Buffer> {
        self.vectors
            .borrow_mut()
            .remove(name)
            .ok_or_else(|| Error::MissingTensor(name.into()))
    }
}
