//! Host-side model weights in the GPU's formats, built from any tensor source
//! (GGUF or Hugging Face safetensors) with every shape checked against the config.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::QuantMatrix;

/// A file format that can hand out named tensors, already repacked.
pub trait TensorSource {
    /// Row-major shape (outermost first), or None when the tensor is absent.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// A 2-D tensor repacked into a GPU weight format.
    fn matrix(&self, name: &str) -> Result<QuantMatrix>;
    /// A 1-D tensor as f32 (norm weights, biases).
    fn vector(&self, name: &str) -> Result<Vec<f32>>;
}

/// A 2-D tensor whose shape must be `[rows, cols]`, repacked.
pub fn checked_matrix(src: &dyn TensorSource, name: &str, rows: usize, cols: usize) -> Result<QuantMatrix> {
    let shape = src.shape(name).ok_or_else(|| Error::MissingTensor(name.into()))?;
    if shape != [rows, cols] {
        return Err(Error::ShapeMismatch { tensor: name.into(), expected: vec![rows, cols], found: shape });
    }
    src.matrix(name)
}

/// A 1-D tensor whose length must be `len`, as f32.
pub fn checked_vector(src: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<f32>> {
    let shape = src.shape(name).ok_or_else(|| Error::MissingTensor(name.into()))?;
    if shape != [len] {
        return Err(Error::ShapeMismatch { tensor: name.into(), expected: vec![len], found: shape });
    }
    src.vector(name)
}

/// Tensor names of one source family.
#[derive(Debug, Clone, Copy)]
pub enum Naming {
    Gguf,
    HuggingFace,
}

impl Naming {
    fn global(self, what: &str) -> &'static str {
        match (self, what) {
            (Naming::Gguf, "embed") => "token_embd.weight",
            (Naming::Gguf, "norm") => "output_norm.weight",
            (Naming::Gguf, "lm_head") => "output.weight",
            (Naming::HuggingFace, "embed") => "model.embed_tokens.weight",
            (Naming::HuggingFace, "norm") => "model.norm.weight",
            (Naming::HuggingFace, "lm_head") => "lm_head.weight",
            _ => unreachable!(),
        }
    }
    /// Name of a per-layer tensor; `what` is the GGUF short name.
    pub fn layer(self, i: usize, what: &str) -> String {
        match self {
            Naming::Gguf => format!("blk.{i}.{what}"),
            Naming::HuggingFace => {
                let hf = match what {
                    "attn_norm.weight" => "input_layernorm.weight",
                    "ffn_norm.weight" => "post_attention_layernorm.weight",
                    "attn_q.weight" => "self_attn.q_proj.weight",
                    "attn_k.weight" => "self_attn.k_proj.weight",
                    "attn_v.weight" => "self_attn.v_proj.weight",
                    "attn_output.weight" => "self_attn.o_proj.weight",
                    "attn_q.bias" => "self_attn.q_proj.bias",
                    "attn_k.bias" => "self_attn.k_proj.bias",
                    "attn_v.bias" => "self_attn.v_proj.bias",
                    "attn_q_norm.weight" => "self_attn.q_norm.weight",
                    "attn_k_norm.weight" => "self_attn.k_norm.weight",
                    "ffn_gate.weight" => "mlp.gate_proj.weight",
                    "ffn_up.weight" => "mlp.up_proj.weight",
                    "ffn_down.weight" => "mlp.down_proj.weight",
                    _ => unreachable!("unknown layer tensor {what}"),
                };
                format!("model.layers.{i}.{hf}")
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QuantMatrix,
    pub wk: QuantMatrix,
    pub wv: QuantMatrix,
    pub wo: QuantMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: QuantMatrix,
    pub w_up: QuantMatrix,
    pub w_down: QuantMatrix,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// `[vocab, hidden]`.
    pub embed: QuantMatrix,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    /// `[vocab, hidden]`; None when tied to the embedding.
    pub lm_head: Option<QuantMatrix>,
}

impl ModelWeights {
    pub fn lm_head(&self) -> &QuantMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of all weights in the GPU formats.
    pub fn n_bytes(&self) -> usize {
        let v = |x: &Vec<f32>| x.len() * 4;
        let o = |x: &Option<Vec<f32>>| x.as_ref().map_or(0, |x| x.len() * 4);
        let mut n = self.embed.n_bytes() + self.lm_head.as_ref().map_or(0, |m| m.n_bytes()) + v(&self.norm);
        for l in &self.layers {
            n += v(&l.attn_norm) + v(&l.ffn_norm) + o(&l.bq) + o(&l.bk) + o(&l.bv) + o(&l.q_norm) + o(&l.k_norm);
            n += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down].iter().map(|m| m.n_bytes()).sum::<usize>();
        }
        n
    }

    /// Loads and checks every tensor the config calls for.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, naming: Naming) -> Result<Self> {
        let c = &config;
        let (h, q, kv, ff, v) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size, c.vocab_size);
        let mat = |name: &str, rows: usize, cols: usize| checked_matrix(src, name, rows, cols);
        let vec = |name: &str, len: usize| checked_vector(src, name, len);
        let opt_vec = |name: String, len: usize, wanted: bool| -> Result<Option<Vec<f32>>> {
            if wanted {
                vec(&name, len).map(Some)
            } else {
                Ok(None)
            }
        };
        let embed = mat(naming.global("embed"), v, h)?;
        let norm = vec(naming.global("norm"), h)?;
        let lm_name = naming.global("lm_head");
        let lm_head = if src.shape(lm_name).is_some() { Some(mat(lm_name, v, h)?) } else { None };
        if lm_head.is_none() && !c.tie_word_embeddings && matches!(naming, Naming::HuggingFace) {
            return Err(Error::MissingTensor(lm_name.into()));
        }
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let n = |w: &str| naming.layer(i, w);
            layers.push(LayerWeights {
                attn_norm: vec(&n("attn_norm.weight"), h)?,
                wq: mat(&n("attn_q.weight"), q, h)?,
                wk: mat(&n("attn_k.weight"), kv, h)?,
                wv: mat(&n("attn_v.weight"), kv, h)?,
                wo: mat(&n("attn_output.weight"), h, q)?,
                bq: opt_vec(n("attn_q.bias"), q, c.qkv_bias)?,
                bk: opt_vec(n("attn_k.bias"), kv, c.qkv_bias)?,
                bv: opt_vec(n("attn_v.bias"), kv, c.qkv_bias)?,
                q_norm: opt_vec(n("attn_q_norm.weight"), c.head_dim, c.qk_norm)?,
                k_norm: opt_vec(n("attn_k_norm.weight"), c.head_dim, c.qk_norm)?,
                ffn_norm: vec(&n("ffn_norm.weight"), h)?,
                w_gate: mat(&n("ffn_gate.weight"), ff, h)?,
                w_up: mat(&n("ffn_up.weight"), ff, h)?,
                w_down: mat(&n("ffn_down.weight"), h, ff)?,
            });
        }
        Ok(ModelWeights { config, embed, layers, norm, lm_head })
    }
}
