//! The frozen target in candle: the same weights as the engine (dequantized from the GPU
//! formats to f32), batched for self-distillation and for the hidden-state taps that
//! feed the drafter during training. Never differentiated.

use crate::nn::{rms_norm, RopeTables};
use candle_core::{DType, Device, IndexOp, Tensor, D};
use dflash_core::config::ModelConfig;
use dflash_core::quant::QuantMatrix;
use dflash_core::weights::ModelWeights;

pub type Result<T> = candle_core::Result<T>;

fn matrix(m: &QuantMatrix, dev: &Device) -> Result<Tensor> {
    Tensor::from_vec(m.dequantize(), (m.rows, m.cols), dev)
}

/// The transpose `[cols, rows]`, contiguous: the layout the CPU GEMM reads fastest.
fn matrix_t(m: &QuantMatrix, dev: &Device) -> Result<Tensor> {
    matrix(m, dev)?.t()?.contiguous()
}

/// Rows of `x @ wt` for a pre-transposed weight `wt` `[in, out]`.
fn linear_t(x: &Tensor, wt: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let k = *dims.last().unwrap();
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let y = x.reshape((rows, k))?.matmul(wt)?;
    let mut out = dims;
    *out.last_mut().unwrap() = wt.dim(1)?;
    y.reshape(out)
}

fn vector(v: &[f32], dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(v, v.len(), dev)
}

fn opt_vector(v: &Option<Vec<f32>>, dev: &Device) -> Result<Option<Tensor>> {
    v.as_deref().map(|v| vector(v, dev)).transpose()
}

struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    ffn_norm: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
}

pub struct Target {
    pub config: ModelConfig,
    pub device: Device,
    /// `[vocab, hidden]`.
    pub embed: Tensor,
    /// `[vocab, hidden]` (the embedding when tied).
    pub lm_head: Tensor,
    layers: Vec<Layer>,
    /// The final norm's weight.
    pub norm: Tensor,
    rope: RopeTables,
}

/// Rows of `x @ w^T` for `x` of any leading shape.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let k = *dims.last().unwrap();
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let y = x.reshape((rows, k))?.matmul(&w.t()?)?;
    let mut out = dims;
    *out.last_mut().unwrap() = w.dim(0)?;
    y.reshape(out)
}

fn add_bias(x: Tensor, b: &Option<Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => x.broadcast_add(b),
        None => Ok(x),
    }
}

/// Grouped-query attention: `q` `[S, nh, T, hd]`, `k`/`v` `[S, nkv, K, hd]`, additive
/// `mask` `[S, 1, T, K]` (0 or -inf). Returns `[S, T, nh * hd]`.
pub fn gqa_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (s, nh, t, hd) = q.dims4()?;
    let nkv = k.dim(1)?;
    let rep = nh / nkv;
    // Heads are kv-major (head h uses kv head h / rep), so grouping them keeps K/V unrepeated.
    let qg = q.reshape((s, nkv, rep * t, hd))?;
    let scores = (qg.matmul(&k.t()?.contiguous()?)? * scale)?;
    let mask = if rep > 1 {
        mask.repeat((1, 1, rep, 1))?
    } else {
        mask.clone()
    };
    let p = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
    let o = p.matmul(&v.contiguous()?)?; // [S, nkv, rep*T, hd]
    o.reshape((s, nh, t, hd))?
        .transpose(1, 2)?
        .reshape((s, t, nh * hd))
}

/// What every layer of a forward reads besides its input rows: the rotary tables of the
/// rows' positions and the additive attention mask `[S, 1, T, K]`.
struct RowInputs {
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
}

/// Per-layer keys and values of a batch of sequences that share slot indices (prompts
/// are left-padded).
pub struct BatchCache {
    k: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    /// Left padding of each sequence.
    pub pads: Vec<usize>,
    /// Slots filled so far.
    pub len: usize,
}

impl Target {
    pub fn new(w: &ModelWeights, device: &Device) -> Result<Self> {
        let c = &w.config;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                let (Some(at), Some((gate, up, down))) = (l.attention(), l.ffn.dense()) else {
                    return Err(candle_core::Error::Msg(
                        "the trainer's target runs attention layers with dense feed-forwards only (not experts or linear attention)".into(),
                    ));
                };
                Ok(Layer {
                    attn_norm: vector(&l.attn_norm, device)?,
                    wq: matrix_t(&at.wq, device)?,
                    wk: matrix_t(&at.wk, device)?,
                    wv: matrix_t(&at.wv, device)?,
                    wo: matrix_t(&at.wo, device)?,
                    bq: opt_vector(&at.bq, device)?,
                    bk: opt_vector(&at.bk, device)?,
                    bv: opt_vector(&at.bv, device)?,
                    q_norm: opt_vector(&at.q_norm, device)?,
                    k_norm: opt_vector(&at.k_norm, device)?,
                    ffn_norm: vector(&l.ffn_norm, device)?,
                    w_gate: matrix_t(gate, device)?,
                    w_up: matrix_t(up, device)?,
                    w_down: matrix_t(down, device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = matrix(&w.embed, device)?;
        let lm_head = match &w.lm_head {
            Some(m) => matrix(m, device)?,
            None => embed.clone(),
        };
        Ok(Target {
            config: c.clone(),
            device: device.clone(),
            embed,
            lm_head,
            layers,
            norm: vector(&w.norm, device)?,
            rope: RopeTables::new(
                &c.rope_inv_freq(),
                c.rope.dim,
                c.rope.style,
                c.max_position_embeddings.clamp(1, 1 << 17),
                device,
            )?,
        })
    }

    pub fn new_cache(&self, pads: Vec<usize>) -> BatchCache {
        let n = self.layers.len();
        BatchCache {
            k: vec![None; n],
            v: vec![None; n],
            pads,
            len: 0,
        }
    }

    /// Embedding rows of `tokens` (`[S, T]` u32) as `[S, T, H]`.
    pub fn embed_tokens(&self, tokens: &Tensor) -> Result<Tensor> {
        let (s, t) = tokens.dims2()?;
        self.embed
            .index_select(&tokens.flatten_all()?, 0)?
            .reshape((s, t, self.config.hidden_size))
    }

    /// Runs `tokens` (`[S, T]`) at slots `cache.len..` of every sequence; returns the
    /// final hidden rows `[S, T, H]` (before the final norm) and the taps
    /// `[S, T, taps.len() * H]` (the residual stream after each tapped layer).
    pub fn forward(
        &self,
        tokens: &Tensor,
        cache: &mut BatchCache,
        taps: &[usize],
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (s, t) = tokens.dims2()?;
        let total = cache.len + t;
        let rows = self.row_inputs(&cache.pads, cache.len, s, t)?;
        let mut x = self.embed_tokens(tokens)?;
        let mut tapped: Vec<Option<Tensor>> = vec![None; taps.len()];
        for (li, l) in self.layers.iter().enumerate() {
            let (k_cache, v_cache) = (&mut cache.k[li], &mut cache.v[li]);
            x = self.layer(l, x, k_cache, v_cache, &rows)?;
            for (ti, &tl) in taps.iter().enumerate() {
                if tl == li {
                    // The last layer's tap after the final norm, as the engines give it.
                    tapped[ti] = Some(match li + 1 == self.layers.len() {
                        true => rms_norm(&x, &self.norm, self.config.rms_norm_eps)?,
                        false => x.clone(),
                    });
                }
            }
        }
        cache.len = total;
        let taps = if taps.is_empty() {
            None
        } else {
            let parts: Vec<Tensor> = tapped
                .into_iter()
                .map(|t| t.expect("tap layer below num_layers"))
                .collect();
            Some(Tensor::cat(&parts, D::Minus1)?)
        };
        Ok((x, taps))
    }

    /// The rotary tables and attention mask of `t` new rows at slots `start..` of `s`
    /// sequences left-padded by `pads`.
    fn row_inputs(&self, pads: &[usize], start: usize, s: usize, t: usize) -> Result<RowInputs> {
        let dev = &self.device;
        let total = start + t;
        // Positions (slot minus padding) and the additive mask: causal, padding slots
        // hidden except from themselves (so no row is all -inf).
        let mut pos = Vec::with_capacity(s * t);
        let mut mask = Vec::with_capacity(s * t * total);
        for &pad in pads {
            for i in start..total {
                pos.push(i.saturating_sub(pad) as u32);
                for j in 0..total {
                    let ok = j <= i && (j >= pad || j == i);
                    mask.push(if ok { 0f32 } else { f32::NEG_INFINITY });
                }
            }
        }
        let pos = Tensor::from_vec(pos, (s, t), dev)?;
        let mask = Tensor::from_vec(mask, (s, 1, t, total), dev)?;
        let (cos, sin) = self.rope.gather(&pos)?;
        Ok(RowInputs { cos, sin, mask })
    }

    /// One layer over the residual rows `x` `[S, T, H]`: attention (appending the rows'
    /// keys and values to the layer's cache) and the MLP, each added to `x`.
    fn layer(
        &self,
        l: &Layer,
        x: Tensor,
        k_cache: &mut Option<Tensor>,
        v_cache: &mut Option<Tensor>,
        rows: &RowInputs,
    ) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps;
        let att = self.attention(l, &x, k_cache, v_cache, rows)?;
        let x = (x + linear_t(&att, &l.wo)?)?;
        let h = rms_norm(&x, &l.ffn_norm, eps)?;
        let a = (candle_nn::ops::silu(&linear_t(&h, &l.w_gate)?)? * linear_t(&h, &l.w_up)?)?;
        x + linear_t(&a, &l.w_down)?
    }

    /// A layer's attention of the rows `x` `[S, T, H]` over the cached keys and values
    /// and their own (which join the cache), before the output projection: `[S, T, nh * hd]`.
    fn attention(
        &self,
        l: &Layer,
        x: &Tensor,
        k_cache: &mut Option<Tensor>,
        v_cache: &mut Option<Tensor>,
        rows: &RowInputs,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (s, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let scale = 1.0 / (hd as f64).sqrt();
        let h = rms_norm(x, &l.attn_norm, c.rms_norm_eps)?;
        let q = add_bias(linear_t(&h, &l.wq)?, &l.bq)?
            .reshape((s, t, nh, hd))?
            .transpose(1, 2)?;
        let k = add_bias(linear_t(&h, &l.wk)?, &l.bk)?
            .reshape((s, t, nkv, hd))?
            .transpose(1, 2)?;
        let v = add_bias(linear_t(&h, &l.wv)?, &l.bv)?
            .reshape((s, t, nkv, hd))?
            .transpose(1, 2)?;
        let q = match &l.q_norm {
            Some(w) => rms_norm(&q, w, c.rms_norm_eps)?,
            None => q,
        };
        let k = match &l.k_norm {
            Some(w) => rms_norm(&k, w, c.rms_norm_eps)?,
            None => k,
        };
        let q = self.rope.apply(&q, &rows.cos, &rows.sin)?;
        let k = self.rope.apply(&k, &rows.cos, &rows.sin)?;
        let (k, v) = match (&*k_cache, &*v_cache) {
            (Some(pk), Some(pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
            _ => (k.contiguous()?, v.contiguous()?),
        };
        let att = gqa_attention(&q.contiguous()?, &k, &v, &rows.mask, scale)?;
        *k_cache = Some(k);
        *v_cache = Some(v);
        Ok(att)
    }

    /// Final norm and lm_head of hidden rows of any leading shape.
    pub fn logits(&self, x: &Tensor) -> Result<Tensor> {
        linear(
            &rms_norm(x, &self.norm, self.config.rms_norm_eps)?,
            &self.lm_head,
        )
    }

    /// Taps of one whole sequence: `[n, taps.len() * H]`.
    pub fn taps_of(&self, tokens: &[u32], taps: &[usize]) -> Result<Tensor> {
        let t = Tensor::from_slice(tokens, (1, tokens.len()), &self.device)?;
        let mut cache = self.new_cache(vec![0]);
        let (_, tp) = self.forward(&t, &mut cache, taps)?;
        tp.expect("taps asked for").i(0)
    }

    /// Greedy continuations of a batch of prompts, each stopping at a stop id (kept) or
    /// after `max_new` tokens.
    pub fn generate_greedy(
        &self,
        prompts: &[Vec<u32>],
        max_new: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        let s = prompts.len();
        let lp = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        let pads: Vec<usize> = prompts.iter().map(|p| lp - p.len()).collect();
        let mut toks = Vec::with_capacity(s * lp);
        for p in prompts {
            toks.extend(std::iter::repeat_n(0u32, lp - p.len()));
            toks.extend_from_slice(p);
        }
        let mut cache = self.new_cache(pads);
        let mut input = Tensor::from_vec(toks, (s, lp), &self.device)?;
        let mut out = vec![Vec::new(); s];
        let mut done = vec![false; s];
        for _ in 0..max_new {
            let (x, _) = self.forward(&input, &mut cache, &[])?;
            let last = x.i((.., x.dim(1)? - 1..))?;
            let next: Vec<u32> = self
                .logits(&last)?
                .squeeze(1)?
                .argmax(D::Minus1)?
                .to_dtype(DType::U32)?
                .to_vec1()?;
            for i in 0..s {
                if !done[i] {
                    out[i].push(next[i]);
                    done[i] = is_stop(next[i]);
                }
            }
            if done.iter().all(|&d| d) {
                break;
            }
            input = Tensor::from_vec(next, (s, 1), &self.device)?;
        }
        Ok(out)
    }
}
