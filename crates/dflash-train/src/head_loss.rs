//! Cross-entropy through the target's frozen lm_head as one op: forward gives each row's
//! negative log-likelihood (and keeps the softmax and the argmax), backward gives the
//! gradient of the hidden rows only. candle's matmul backward would also compute the
//! gradient of the frozen `[vocab, hidden]` matrix, a third of the step's work for
//! nothing, and the composed log-softmax makes a dozen passes over the logits.

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct HeadStats {
    /// Row-major softmax of the last forward, kept for the backward.
    probs: Option<Vec<f32>>,
    /// Argmax of each row's logits.
    pub argmax: Vec<u32>,
    /// With `with_top_k(k)`, k > 0: each row's k largest logits (id, logit), descending.
    pub top: Vec<Vec<(u32, f32)>>,
}

pub struct FrozenHeadNll {
    /// `[vocab, hidden]`, f32, contiguous.
    lm_head: Tensor,
    labels: Vec<u32>,
    top_k: usize,
    pub stats: Arc<Mutex<HeadStats>>,
}

impl FrozenHeadNll {
    pub fn new(lm_head: Tensor, labels: Vec<u32>) -> Self {
        FrozenHeadNll {
            lm_head,
            labels,
            top_k: 0,
            stats: Arc::new(Mutex::new(HeadStats::default())),
        }
    }

    /// Also keep each row's `k` largest logits (DFlash2's selector candidates).
    pub fn with_top_k(mut self, k: usize) -> Self {
        self.top_k = k;
        self
    }
}

fn rows_in_parallel(data: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(16);
    let rows = data.len() / width;
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (ci, chunk) in data.chunks_mut(per * width).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (ri, row) in chunk.chunks_mut(width).enumerate() {
                    f(ci * per + ri, row);
                }
            });
        }
    });
}

impl CustomOp1 for FrozenHeadNll {
    fn name(&self) -> &'static str {
        "frozen-head-nll"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, h) = layout.shape().dims2()?;
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("frozen-head-nll: hidden rows must be contiguous")
        };
        let x = Tensor::from_slice(&storage.as_slice::<f32>()?[a..b], (n, h), &Device::Cpu)?;
        let mut p: Vec<f32> = x.matmul(&self.lm_head.t()?)?.flatten_all()?.to_vec1()?;
        let v = self.lm_head.dim(0)?;
        if self.labels.len() != n || self.labels.iter().any(|&l| l as usize >= v) {
            candle_core::bail!(
                "frozen-head-nll: {} labels for {n} rows of a {v} vocabulary",
                self.labels.len()
            );
        }
        let mut nll = vec![0f32; n];
        let mut argmax = vec![0u32; n];
        let mut top = vec![Vec::new(); if self.top_k > 0 { n } else { 0 }];
        let out = Mutex::new((&mut nll, &mut argmax, &mut top));
        rows_in_parallel(&mut p, v, |r, row| {
            let (mut m, mut am) = (f32::NEG_INFINITY, 0usize);
            for (i, &z) in row.iter().enumerate() {
                if z > m {
                    m = z;
                    am = i;
                }
            }
            let label_logit = row[self.labels[r] as usize];
            let top_r = if self.top_k > 0 {
                dflash_core::drafter::top_k(row, self.top_k)
            } else {
                Vec::new()
            };
            let mut sum = 0f32;
            for z in row.iter_mut() {
                *z = (*z - m).exp();
                sum += *z;
            }
            let inv = 1.0 / sum;
            for z in row.iter_mut() {
                *z *= inv;
            }
            let mut o = out.lock().expect("stats lock");
            o.0[r] = m + sum.ln() - label_logit;
            o.1[r] = am as u32;
            if self.top_k > 0 {
                o.2[r] = top_r;
            }
        });
        let mut st = self.stats.lock().expect("stats lock");
        st.probs = Some(p);
        st.argmax = argmax;
        st.top = top;
        Ok((CpuStorage::F32(nll), Shape::from(n)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let (n, _) = arg.dims2()?;
        let v = self.lm_head.dim(0)?;
        let g: Vec<f32> = grad_res.flatten_all()?.to_vec1()?;
        let mut p = self
            .stats
            .lock()
            .expect("stats lock")
            .probs
            .take()
            .ok_or_else(|| {
                candle_core::Error::Msg("frozen-head-nll: backward without forward".into())
            })?;
        // d nll / d logits = softmax - onehot(label), times the row's upstream gradient.
        rows_in_parallel(&mut p, v, |r, row| {
            row[self.labels[r] as usize] -= 1.0;
            for z in row.iter_mut() {
                *z *= g[r];
            }
        });
        let dlogits = Tensor::from_vec(p, (n, v), arg.device())?;
        Ok(Some(dlogits.matmul(&self.lm_head)?))
    }
}

/// The rows of the lm_head one step's softmax runs over when the loss is sampled
/// (`SampledHead`): the tokens of the data's responses (so every label is one) and some
/// random others, drawn afresh each step, that keep the rest of the vocabulary down.
pub struct CandidateHead {
    /// Vocabulary id of each candidate row, ascending.
    pub ids: Vec<u32>,
    /// `[ids.len(), hidden]`: the lm_head's rows of `ids`.
    pub rows: Tensor,
    /// Candidate row of each vocabulary id; `u32::MAX` where it is none.
    local: Vec<u32>,
}

impl CandidateHead {
    /// The candidates `always` plus `negatives` random vocabulary ids drawn by `rng`,
    /// with their rows of `lm_head` (`[vocab, hidden]`).
    pub fn draw(
        lm_head: &Tensor,
        always: &[u32],
        negatives: usize,
        rng: &mut dflash_core::rng::Rng,
    ) -> Result<Self> {
        let vocab = lm_head.dim(0)?;
        let mut chosen = vec![false; vocab];
        for &t in always {
            if (t as usize) < vocab {
                chosen[t as usize] = true;
            }
        }
        for _ in 0..negatives {
            chosen[rng.below(vocab)] = true;
        }
        let ids: Vec<u32> = (0..vocab as u32).filter(|&t| chosen[t as usize]).collect();
        let mut local = vec![u32::MAX; vocab];
        for (i, &t) in ids.iter().enumerate() {
            local[t as usize] = i as u32;
        }
        let index = Tensor::from_vec(ids.clone(), ids.len(), lm_head.device())?;
        Ok(CandidateHead {
            rows: lm_head.index_select(&index, 0)?,
            ids,
            local,
        })
    }

    /// `labels` as candidate rows; an error names a label that is not a candidate.
    pub fn local_labels(&self, labels: &[u32]) -> Result<Vec<u32>> {
        labels
            .iter()
            .map(|&t| match self.local.get(t as usize) {
                Some(&i) if i != u32::MAX => Ok(i),
                _ => candle_core::bail!("label {t} is not a candidate of the sampled head"),
            })
            .collect()
    }
}
