//! Host-side model weights in the GPU's formats, built from any tensor source
//! (GGUF or Hugging Face safetensors) with every shape checked against the config.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::quant::QuantMatrix;

/// A file format that can hand out named tensors, already repacked: `M` a 2-D weight
/// (host `QuantMatrix`, or a matrix already in GPU buffers when a stream uploaded it),
/// `V` a 1-D tensor (host f32, or a GPU buffer).
pub trait TensorSource<M = QuantMatrix, V = Vec<f32>> {
    /// Row-major shape (outermost first), or None when the tensor is absent.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// A 2-D tensor repacked into a GPU weight format.
    fn matrix(&self, name: &str) -> Result<M>;
    /// A 1-D tensor as f32 (norm weights, biases).
    fn vector(&self, name: &str) -> Result<V>;
    /// The 2-D tensors `names`, of one shape, stacked by rows into one matrix (a
    /// mixture's experts where the file keeps each apart). Sources whose files never
    /// do that (GGUF keeps them in one 3-D tensor) refuse.
    fn stacked_matrix(&self, names: &[String]) -> Result<M> {
        Err(Error::BadTensorLayout {
            tensor: names.first().cloned().unwrap_or_default(),
            reason: "this format keeps a layer's experts in one tensor".into(),
        })
    }
}

/// Checks that tensor `name` is present with shape `expected`.
pub fn check_shape<M, V>(
    src: &dyn TensorSource<M, V>,
    name: &str,
    expected: &[usize],
) -> Result<()> {
    let shape = src
        .shape(name)
        .ok_or_else(|| Error::MissingTensor(name.into()))?;
    if shape != expected {
        return Err(Error::ShapeMismatch {
            tensor: name.into(),
            expected: expected.to_vec(),
            found: shape,
        });
    }
    Ok(())
}

/// A 2-D tensor whose shape must be `[rows, cols]`, repacked.
pub fn checked_matrix<M, V>(
    src: &dyn TensorSource<M, V>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<M> {
    check_shape(src, name, &[rows, cols])?;
    src.matrix(name)
}

/// A 1-D tensor whose length must be `len`, as f32.
pub fn checked_vector<M, V>(src: &dyn TensorSource<M, V>, name: &str, len: usize) -> Result<V> {
    check_shape(src, name, &[len])?;
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
                    "ffn_gate_inp.weight" => "mlp.gate.weight",
                    "ffn_gate_shexp.weight" => "mlp.shared_expert.gate_proj.weight",
                    "ffn_up_shexp.weight" => "mlp.shared_expert.up_proj.weight",
                    "ffn_down_shexp.weight" => "mlp.shared_expert.down_proj.weight",
                    "ffn_gate_inp_shexp.weight" => "mlp.shared_expert_gate.weight",
                    "attn_qkv.weight" => "linear_attn.in_proj_qkv.weight",
                    "attn_gate.weight" => "linear_attn.in_proj_z.weight",
                    "ssm_beta.weight" => "linear_attn.in_proj_b.weight",
                    "ssm_alpha.weight" => "linear_attn.in_proj_a.weight",
                    "ssm_conv1d.weight" => "linear_attn.conv1d.weight",
                    "ssm_dt.bias" => "linear_attn.dt_bias",
                    "ssm_a" => "linear_attn.A_log",
                    "ssm_norm.weight" => "linear_attn.norm.weight",
                    "ssm_out.weight" => "linear_attn.out_proj.weight",
                    _ => unreachable!("unknown layer tensor {what}"),
                };
                format!("model.layers.{i}.{hf}")
            }
        }
    }
}

/// A layer's feed-forward: one SwiGLU MLP, or a mixture of experts.
#[derive(Debug, Clone)]
pub enum FeedForward<M = QuantMatrix> {
    Dense { gate: M, up: M, down: M },
    Moe(MoeWeights<M>),
}

/// A mixture-of-experts feed-forward (`config::MoeConfig`): the router and every
/// expert's SwiGLU matrices stacked by rows, expert `e`'s rows at `e * rows_per_expert`.
#[derive(Debug, Clone)]
pub struct MoeWeights<M = QuantMatrix> {
    /// `[num_experts, hidden]`.
    pub router: M,
    /// `[num_experts * expert_intermediate, hidden]`.
    pub gate: M,
    pub up: M,
    /// `[num_experts * hidden, expert_intermediate]`.
    pub down: M,
    pub shared: Option<SharedExpert<M>>,
}

/// A mixture's shared expert (Qwen3.5-MoE): a SwiGLU MLP every token runs, its output
/// weighed by `sigmoid(weigh x)`.
#[derive(Debug, Clone)]
pub struct SharedExpert<M = QuantMatrix> {
    pub gate: M,
    pub up: M,
    pub down: M,
    /// `[1, hidden]`.
    pub weigh: M,
}

impl<M> FeedForward<M> {
    /// The matrices, in a fixed order (dense: gate, up, down; mixture: router, gate,
    /// up, down).
    pub fn matrices(&self) -> Vec<&M> {
        match self {
            FeedForward::Dense { gate, up, down } => vec![gate, up, down],
            FeedForward::Moe(m) => {
                let shared = m
                    .shared
                    .iter()
                    .flat_map(|s| [&s.gate, &s.up, &s.down, &s.weigh]);
                [&m.router, &m.gate, &m.up, &m.down]
                    .into_iter()
                    .chain(shared)
                    .collect()
            }
        }
    }

    /// The dense MLP's gate, up and down, or None for a mixture.
    pub fn dense(&self) -> Option<(&M, &M, &M)> {
        match self {
            FeedForward::Dense { gate, up, down } => Some((gate, up, down)),
            FeedForward::Moe(_) => None,
        }
    }

    pub fn try_map<M2, E>(
        &self,
        mut mat: impl FnMut(&str, &M) -> std::result::Result<M2, E>,
    ) -> std::result::Result<FeedForward<M2>, E> {
        Ok(match self {
            FeedForward::Dense { gate, up, down } => FeedForward::Dense {
                gate: mat("w_gate", gate)?,
                up: mat("w_up", up)?,
                down: mat("w_down", down)?,
            },
            FeedForward::Moe(m) => FeedForward::Moe(MoeWeights {
                router: mat("router", &m.router)?,
                gate: mat("experts_gate", &m.gate)?,
                up: mat("experts_up", &m.up)?,
                down: mat("experts_down", &m.down)?,
                shared: match &m.shared {
                    Some(s) => Some(SharedExpert {
                        gate: mat("shared_gate", &s.gate)?,
                        up: mat("shared_up", &s.up)?,
                        down: mat("shared_down", &s.down)?,
                        weigh: mat("shared_weigh", &s.weigh)?,
                    }),
                    None => None,
                },
            }),
        })
    }
}

/// Layer `i`'s router and experts: GGUF's 3-D `ffn_{gate,up,down}_exps` (`[experts,
/// rows, cols]`, read as one matrix of `experts * rows` rows), or Hugging Face's
/// `mlp.experts.{e}.{gate,up,down}_proj` stacked in expert order. A missing expert is
/// `MissingTensor` naming it.
fn load_experts<M, V>(
    src: &dyn TensorSource<M, V>,
    naming: Naming,
    i: usize,
    moe: &crate::config::MoeConfig,
    h: usize,
) -> Result<MoeWeights<M>> {
    let (e, ff) = (moe.num_experts, moe.expert_intermediate_size);
    let router = checked_matrix(src, &naming.layer(i, "ffn_gate_inp.weight"), e, h)?;
    let stack = |gguf: &str, hf: &str, rows: usize, cols: usize| -> Result<M> {
        match naming {
            Naming::Gguf => {
                let name = naming.layer(i, gguf);
                check_shape(src, &name, &[e, rows, cols])?;
                src.matrix(&name)
            }
            Naming::HuggingFace => {
                let names: Vec<String> = (0..e)
                    .map(|x| format!("model.layers.{i}.mlp.experts.{x}.{hf}"))
                    .collect();
                for name in &names {
                    check_shape(src, name, &[rows, cols])?;
                }
                src.stacked_matrix(&names)
            }
        }
    };
    let shared = match moe.shared_expert_intermediate_size {
        Some(sf) => {
            let mat = |w: &str, rows, cols| checked_matrix(src, &naming.layer(i, w), rows, cols);
            Some(SharedExpert {
                gate: mat("ffn_gate_shexp.weight", sf, h)?,
                up: mat("ffn_up_shexp.weight", sf, h)?,
                down: mat("ffn_down_shexp.weight", h, sf)?,
                weigh: mat("ffn_gate_inp_shexp.weight", 1, h)?,
            })
        }
        None => None,
    };
    Ok(MoeWeights {
        router,
        gate: stack("ffn_gate_exps.weight", "gate_proj.weight", ff, h)?,
        up: stack("ffn_up_exps.weight", "up_proj.weight", ff, h)?,
        down: stack("ffn_down_exps.weight", "down_proj.weight", h, ff)?,
        shared,
    })
}

/// Layer `i`'s Gated DeltaNet. GGUF names as llama.cpp's qwen3next / qwen35 converter
/// writes them; Hugging Face's `linear_attn.*` (`conv1d.weight` `[conv_dim, 1,
/// kernel]`).
fn load_delta_net<M, V>(
    src: &dyn TensorSource<M, V>,
    naming: Naming,
    i: usize,
    hy: &crate::config::HybridConfig,
    h: usize,
) -> Result<DeltaNetWeights<M, V>> {
    let (nv, conv_dim) = (hy.value_heads, hy.conv_dim());
    let mat = |w: &str, rows, cols| checked_matrix(src, &naming.layer(i, w), rows, cols);
    let vec = |w: &str, len| checked_vector(src, &naming.layer(i, w), len);
    let conv_name = naming.layer(i, "ssm_conv1d.weight");
    let conv_shape = match naming {
        Naming::Gguf => vec![conv_dim, hy.conv_kernel],
        Naming::HuggingFace => vec![conv_dim, 1, hy.conv_kernel],
    };
    check_shape(src, &conv_name, &conv_shape)?;
    Ok(DeltaNetWeights {
        qkv: mat("attn_qkv.weight", conv_dim, h)?,
        z: mat("attn_gate.weight", hy.value_dim(), h)?,
        b: mat("ssm_beta.weight", nv, h)?,
        a: mat("ssm_alpha.weight", nv, h)?,
        conv: src.vector(&conv_name)?,
        dt_bias: vec("ssm_dt.bias", nv)?,
        decay: vec("ssm_a", nv)?,
        norm: vec("ssm_norm.weight", hy.value_head_dim)?,
        out: mat("ssm_out.weight", h, hy.value_dim())?,
    })
}

/// One layer's weights: host tensors by default, GPU buffers once uploaded.
#[derive(Debug, Clone)]
pub struct LayerWeights<M = QuantMatrix, V = Vec<f32>> {
    pub attn_norm: V,
    pub mixer: Mixer<M, V>,
    pub ffn_norm: V,
    pub ffn: FeedForward<M>,
}

/// A layer's token mixer: softmax attention over the KV cache, or a Gated DeltaNet
/// (linear attention over a recurrent state, `config::HybridConfig`).
#[derive(Debug, Clone)]
pub enum Mixer<M = QuantMatrix, V = Vec<f32>> {
    Attention(AttentionWeights<M, V>),
    DeltaNet(DeltaNetWeights<M, V>),
}

/// Attention's projections. With an output gate (Qwen3.5) `gate` (`[q_dim, hidden]`)
/// gives each head's gate: checkpoints interleave it with the queries per head in
/// q_proj, which the loader splits (`model_files::qwen35_from_hf`; until then `wq` has
/// both).
#[derive(Debug, Clone)]
pub struct AttentionWeights<M = QuantMatrix, V = Vec<f32>> {
    pub wq: M,
    pub gate: Option<M>,
    pub wk: M,
    pub wv: M,
    pub wo: M,
    pub bq: Option<V>,
    pub bk: Option<V>,
    pub bv: Option<V>,
    pub q_norm: Option<V>,
    pub k_norm: Option<V>,
}

/// A Gated DeltaNet layer (`config::HybridConfig`).
#[derive(Debug, Clone)]
pub struct DeltaNetWeights<M = QuantMatrix, V = Vec<f32>> {
    /// `[conv_dim, hidden]`: q, k and v before the convolution.
    pub qkv: M,
    /// `[value_dim, hidden]`: the read-out's gate.
    pub z: M,
    /// `[value_heads, hidden]`: beta's and the decay's inputs.
    pub b: M,
    pub a: M,
    /// The depthwise convolution, `[conv_dim, kernel]`.
    pub conv: V,
    /// `[value_heads]`: the decay's bias, and its rate `A = -exp(A_log)` (GGUF's
    /// `ssm_a`; a Hugging Face checkpoint's `A_log` is converted at load).
    pub dt_bias: V,
    pub decay: V,
    /// `[value_head_dim]`: the read-out's RMSNorm (gated by `silu(z)`).
    pub norm: V,
    /// `[hidden, value_dim]`.
    pub out: M,
}

impl<M, V> LayerWeights<M, V> {
    /// The layer's attention, None for a linear-attention layer.
    pub fn attention(&self) -> Option<&AttentionWeights<M, V>> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        }
    }

    /// The mixer's matrices.
    pub fn mixer_matrices(&self) -> Vec<&M> {
        match &self.mixer {
            Mixer::Attention(a) => [&a.wq, &a.wk, &a.wv, &a.wo]
                .into_iter()
                .chain(a.gate.as_ref())
                .collect(),
            Mixer::DeltaNet(d) => vec![&d.qkv, &d.z, &d.b, &d.a, &d.out],
        }
    }

    /// The mixer's vectors (biases and norms where present).
    pub fn mixer_vectors(&self) -> Vec<&V> {
        match &self.mixer {
            Mixer::Attention(a) => [&a.bq, &a.bk, &a.bv, &a.q_norm, &a.k_norm]
                .into_iter()
                .flatten()
                .collect(),
            Mixer::DeltaNet(d) => vec![&d.conv, &d.dt_bias, &d.decay, &d.norm],
        }
    }
}

impl<M, V> Mixer<M, V> {
    fn try_map<M2, V2, E>(
        &self,
        mut mat: impl FnMut(&str, &M) -> std::result::Result<M2, E>,
        mut vec: impl FnMut(&str, &V) -> std::result::Result<V2, E>,
    ) -> std::result::Result<Mixer<M2, V2>, E> {
        Ok(match self {
            Mixer::Attention(a) => {
                let mut opt =
                    |name: &str, v: &Option<V>| v.as_ref().map(|v| vec(name, v)).transpose();
                Mixer::Attention(AttentionWeights {
                    bq: opt("bq", &a.bq)?,
                    bk: opt("bk", &a.bk)?,
                    bv: opt("bv", &a.bv)?,
                    q_norm: opt("q_norm", &a.q_norm)?,
                    k_norm: opt("k_norm", &a.k_norm)?,
                    wq: mat("wq", &a.wq)?,
                    gate: a.gate.as_ref().map(|g| mat("attn_gate", g)).transpose()?,
                    wk: mat("wk", &a.wk)?,
                    wv: mat("wv", &a.wv)?,
                    wo: mat("wo", &a.wo)?,
                })
            }
            Mixer::DeltaNet(d) => Mixer::DeltaNet(DeltaNetWeights {
                qkv: mat("linear_qkv", &d.qkv)?,
                z: mat("linear_z", &d.z)?,
                b: mat("linear_b", &d.b)?,
                a: mat("linear_a", &d.a)?,
                conv: vec("linear_conv", &d.conv)?,
                dt_bias: vec("linear_dt_bias", &d.dt_bias)?,
                decay: vec("linear_decay", &d.decay)?,
                norm: vec("linear_norm", &d.norm)?,
                out: mat("linear_out", &d.out)?,
            }),
        })
    }
}

#[derive(Debug, Clone)]
pub struct ModelWeights<M = QuantMatrix, V = Vec<f32>> {
    pub config: ModelConfig,
    /// `[vocab, hidden]`.
    pub embed: M,
    pub layers: Vec<LayerWeights<M, V>>,
    pub norm: V,
    /// `[vocab, hidden]`; None when tied to the embedding.
    pub lm_head: Option<M>,
}

impl<M, V> ModelWeights<M, V> {
    pub fn lm_head(&self) -> &M {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Loads and checks every tensor the config calls for.
    pub fn load(config: ModelConfig, src: &dyn TensorSource<M, V>, naming: Naming) -> Result<Self> {
        let c = &config;
        let (h, q, kv, ff, v) = (
            c.hidden_size,
            c.q_dim(),
            c.kv_dim(),
            c.intermediate_size,
            c.vocab_size,
        );
        let mat = |name: &str, rows: usize, cols: usize| checked_matrix(src, name, rows, cols);
        let vec = |name: &str, len: usize| checked_vector(src, name, len);
        let opt_vec = |name: String, len: usize, wanted: bool| -> Result<Option<V>> {
            if wanted {
                vec(&name, len).map(Some)
            } else {
                Ok(None)
            }
        };
        let embed = mat(naming.global("embed"), v, h)?;
        let norm = vec(naming.global("norm"), h)?;
        let lm_name = naming.global("lm_head");
        let lm_head = if src.shape(lm_name).is_some() {
            Some(mat(lm_name, v, h)?)
        } else {
            None
        };
        if lm_head.is_none() && !c.tie_word_embeddings && matches!(naming, Naming::HuggingFace) {
            return Err(Error::MissingTensor(lm_name.into()));
        }
        let mut layers = Vec::with_capacity(c.num_layers);
        // With an output gate q_proj gives each head's query and gate.
        let q_rows = if c.arch.has_attention_gate() {
            2 * q
        } else {
            q
        };
        for i in 0..c.num_layers {
            let n = |w: &str| naming.layer(i, w);
            let mixer = match c.hybrid.as_ref().filter(|hy| hy.is_linear(i)) {
                Some(hy) => Mixer::DeltaNet(load_delta_net(src, naming, i, hy, h)?),
                None => Mixer::Attention(AttentionWeights {
                    wq: mat(&n("attn_q.weight"), q_rows, h)?,
                    gate: None,
                    wk: mat(&n("attn_k.weight"), kv, h)?,
                    wv: mat(&n("attn_v.weight"), kv, h)?,
                    wo: mat(&n("attn_output.weight"), h, q)?,
                    bq: opt_vec(n("attn_q.bias"), q, c.qkv_bias)?,
                    bk: opt_vec(n("attn_k.bias"), kv, c.qkv_bias)?,
                    bv: opt_vec(n("attn_v.bias"), kv, c.qkv_bias)?,
                    q_norm: opt_vec(n("attn_q_norm.weight"), c.head_dim, c.qk_norm)?,
                    k_norm: opt_vec(n("attn_k_norm.weight"), c.head_dim, c.qk_norm)?,
                }),
            };
            layers.push(LayerWeights {
                attn_norm: vec(&n("attn_norm.weight"), h)?,
                mixer,
                ffn_norm: vec(&n("ffn_norm.weight"), h)?,
                ffn: match c.moe.as_ref().filter(|m| m.is_sparse(i)) {
                    Some(moe) => FeedForward::Moe(load_experts(src, naming, i, moe, h)?),
                    None => FeedForward::Dense {
                        gate: mat(&n("ffn_gate.weight"), ff, h)?,
                        up: mat(&n("ffn_up.weight"), ff, h)?,
                        down: mat(&n("ffn_down.weight"), h, ff)?,
                    },
                },
            });
        }
        Ok(ModelWeights {
            config,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// The same weights with every tensor converted (uploaded, for instance).
    pub fn try_map<M2, V2, E>(
        &self,
        mut mat: impl FnMut(&str, &M) -> std::result::Result<M2, E>,
        mut vec: impl FnMut(&str, &V) -> std::result::Result<V2, E>,
    ) -> std::result::Result<ModelWeights<M2, V2>, E> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(LayerWeights {
                attn_norm: vec("attn_norm", &l.attn_norm)?,
                mixer: l.mixer.try_map(&mut mat, &mut vec)?,
                ffn_norm: vec("ffn_norm", &l.ffn_norm)?,
                ffn: l.ffn.try_map(&mut mat)?,
            });
        }
        Ok(ModelWeights {
            config: self.config.clone(),
            embed: mat("embed", &self.embed)?,
            layers,
            norm: vec("norm", &self.norm)?,
            lm_head: self
                .lm_head
                .as_ref()
                .map(|m| mat("lm_head", m))
                .transpose()?,
        })
    }
}

impl ModelWeights {
    /// Bytes of all weights in the GPU formats.
    pub fn n_bytes(&self) -> usize {
        let v = |x: &Vec<f32>| x.len() * 4;
        let mut n =
            self.embed.n_bytes() + self.lm_head.as_ref().map_or(0, |m| m.n_bytes()) + v(&self.norm);
        for l in &self.layers {
            n += v(&l.attn_norm) + v(&l.ffn_norm);
            n += l.mixer_vectors().into_iter().map(v).sum::<usize>();
            n += l
                .mixer_matrices()
                .into_iter()
                .chain(l.ffn.matrices())
                .map(|m| m.n_bytes())
                .sum::<usize>();
        }
        n
    }
}
