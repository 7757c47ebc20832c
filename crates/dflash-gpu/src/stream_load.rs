//! A GGUF model streamed into GPU buffers (`dflash_core`'s `WeightStream` with a sink
//! that uploads): each tensor is repacked and uploaded as soon as its last byte arrives
//! and its host copy dropped, so the host never holds more than the header and one
//! tensor (the browser's 2 GB ArrayBuffer and 4 GB wasm limits do not bound the model
//! size). The header is checked as soon as it has arrived, before the weights download.
//!
//! # The streamed loader in the browser
//!
//! For the browser's loader, `formats::gguf_stream::GgufStream` (dflash-core) takes a
//! GGUF file in chunks as a network or cache stream delivers it, parses the header from a
//! prefix, and hands out each tensor as soon as its bytes have arrived, dropping what it
//! has handed out (and the padding between tensors): the file is never whole in memory;
//! `dflash_gpu::StreamLoader` repacks and uploads each tensor and drops the host copy, so
//! the host holds the header and one tensor. A header that needs bytes past the announced
//! length is refused at once, and one longer than `limits::MAX_GGUF_HEADER_BYTES` is
//! never buffered.
//!
//! The worker writes the file to Cache Storage in step with the read (no tee buffering),
//! and its size and sha256 to a second cache under the same URL once the model has
//! loaded: a body that fails, ends short or runs past its Content-Length aborts the copy
//! (`NetworkError`), and a copy that does not load (`BadModelFile`) is deleted, so no
//! partial or unparsable file stays cached. A cached copy whose hash changed, that cannot
//! be read or that does not parse is dropped and fetched once more from the network (the
//! drafter's files likewise). With a `context`, `StreamLoader::with_context` checks as
//! soon as the header has arrived that the KV cache, RoPE table, logits and attention
//! partials fit the adapter's binding limits (`LimitExceeded` naming the limit), before
//! the weights download; the whole load runs inside an out-of-memory error scope
//! (`OomScope`), closed at `Loader.finish`, so a refused allocation is `OutOfMemory` (in
//! the browser an allocation fails only through a scope).

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::model::{plan_buffers, GpuModel, GpuModelOptions};
use crate::upload::{f32_buffer, upload_matrix, upload_stack, GpuMatrix};
use dflash_core::chat::ChatTemplate;
use dflash_core::config::ModelConfig;
use dflash_core::formats::gguf_weights_stream::{StreamedWeights, TensorSink, WeightStream};
use dflash_core::quant::QuantMatrix;
use dflash_core::tokenizer::TextTokenizer;
use std::rc::Rc;

/// A model loaded from a stream: on the GPU, with its tokenizer and chat template.
pub struct StreamedModel {
    pub model: GpuModel,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
}

/// Uploads each tensor as it completes.
struct Upload {
    ctx: Rc<GpuContext>,
}

impl TensorSink for Upload {
    type Matrix = GpuMatrix;
    type Vector = wgpu::Buffer;
    type Error = GpuError;
    fn matrix(&mut self, name: &str, m: QuantMatrix) -> Result<GpuMatrix> {
        upload_matrix(&self.ctx, name, &m)
    }
    fn stacked_matrix(&mut self, name: &str, m: QuantMatrix, parts: usize) -> Result<GpuMatrix> {
        upload_stack(&self.ctx, name, &m, parts)
    }
    fn vector(&mut self, name: &str, v: Vec<f32>) -> Result<wgpu::Buffer> {
        Ok(f32_buffer(&self.ctx, name, &v))
    }
}

pub struct StreamLoader {
    stream: WeightStream<Upload>,
    /// The context to check the buffers' sizes for once the header has arrived (None:
    /// checked only at `finish`).
    context: Option<usize>,
    checked: bool,
}

impl StreamLoader {
    /// A loader for a GGUF file of `total` bytes.
    pub fn new(ctx: Rc<GpuContext>, total: u64) -> Self {
        StreamLoader {
            stream: WeightStream::new(Upload { ctx }, total),
            context: None,
            checked: false,
        }
    }

    /// A loader that checks, as soon as the header has arrived, that the KV cache,
    /// activations and tables of a `context`-token model fit the adapter's limits
    /// (`LimitExceeded` naming the limit), before the bulk of the file downloads.
    pub fn with_context(ctx: Rc<GpuContext>, total: u64, context: usize) -> Self {
        StreamLoader {
            context: Some(context),
            ..Self::new(ctx, total)
        }
    }

    /// The model's config once the header has arrived.
    pub fn config(&self) -> Option<&ModelConfig> {
        self.stream.config()
    }

    pub fn received(&self) -> u64 {
        self.stream.received()
    }

    /// Parts of a split model (1 for one file), once the first header has arrived.
    pub fn parts(&self) -> Option<usize> {
        self.stream.parts()
    }

    /// Tensors uploaded so far, of how many (0 until the header has arrived).
    pub fn progress(&self) -> (usize, usize) {
        self.stream.progress()
    }

    /// The next bytes of the file: completes and uploads the tensors they finish.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        self.stream.push(chunk)?;
        if let (false, Some(context), Some(c)) = (self.checked, self.context, self.stream.config())
        {
            let opts = GpuModel::checked_options(
                c,
                &GpuModelOptions {
                    context,
                    ..Default::default()
                },
            )?;
            // The weights' own chunks are checked as each matrix arrives (upload_matrix).
            plan_buffers(&self.stream.sink.ctx, c, 0, &opts)?;
            self.checked = true;
        }
        Ok(())
    }

    /// Ends the current part of a split model (all of it arrived) and starts the next,
    /// a GGUF file of `total` bytes (see [`WeightStream::next_part`]).
    pub fn next_part(&mut self, total: u64) -> Result<()> {
        self.stream.next_part(total)
    }

    /// Checks the whole file arrived and every tensor the config needs is there with its
    /// shape; builds the model (KV cache and activations for `opts`).
    pub fn finish(self, opts: &GpuModelOptions) -> Result<StreamedModel> {
        let (
            StreamedWeights {
                weights,
                tokenizer,
                chat_template,
            },
            sink,
        ) = self.stream.finish()?;
        if weights.config.arch.has_attention_gate() {
            // Its q_proj's per-head gate rows are split from the queries on the host.
            return Err(GpuError::Unsupported(format!(
                "a {} GGUF streamed to the GPU: load it on the host first",
                weights.config.arch.model_type()
            )));
        }
        let model = GpuModel::from_gpu_weights(sink.ctx, weights, opts)?;
        Ok(StreamedModel {
            model,
            tokenizer,
            chat_template,
        })
    }
}
