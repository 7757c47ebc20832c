//! A drafter's weights: the safetensors of a z-lab folder checked against its config,
//! quantized or kept as the file has them (`DrafterPrecision`).

use super::*;
use crate::error::{Error, Result};
use crate::formats::hf::SafeTensorsSource;
use crate::quant::{QFormat, QuantMatrix};
use crate::weights::{check_shape, checked_matrix, checked_vector, TensorSource};

/// How to store the drafter's matrices (loading quantizes float weights on request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrafterPrecision {
    /// 8-bit groups (float checkpoints are quantized like target weights).
    Q8,
    /// 4-bit groups, the default (`Default`): a little over half the bytes a step reads
    /// for ~1% of tau (`results/drafter-q4-vs-q8-lavapipe.jsonl`).
    #[default]
    Q4,
    /// The file's values unquantized (f32, `QFormat::F32`), every matrix: the drafts of
    /// z-lab's reference itself. The CPU engines only (the GPU refuses it).
    F32,
}

impl DrafterPrecision {
    /// The format of a layer's or `fc`'s matrix at this precision.
    pub fn matrix_format(self) -> QFormat {
        match self {
            DrafterPrecision::Q8 => QFormat::Q8,
            DrafterPrecision::Q4 => QFormat::Q4,
            DrafterPrecision::F32 => QFormat::F32,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DrafterLayer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub wq: QuantMatrix,
    pub wk: QuantMatrix,
    pub wv: QuantMatrix,
    pub wo: QuantMatrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub w_gate: QuantMatrix,
    pub w_up: QuantMatrix,
    pub w_down: QuantMatrix,
    /// DFlash2: the dynamic convolutions around attention and the MLP.
    pub conv: Option<LayerConvs>,
}

/// One grouped dynamic depthwise convolution: `base_kernel` `[2, taps, H]` (side 0 before
/// the sublayer, side 1 after), `kernel_projection` `[2 * taps * groups, H]`.
#[derive(Debug, Clone)]
pub struct GroupedConv {
    pub base: Vec<f32>,
    pub projection: QuantMatrix,
}

#[derive(Debug, Clone)]
pub struct LayerConvs {
    pub attention: GroupedConv,
    pub mlp: GroupedConv,
}

/// DFlash2's candidate selector: `hidden_projection` `[rank, H]` and the predecessor /
/// successor codebooks `[V, rank]` (row-gathered by token id).
#[derive(Debug, Clone)]
pub struct Selector {
    pub hidden_projection: QuantMatrix,
    pub predecessor: QuantMatrix,
    pub successor: QuantMatrix,
}

#[derive(Debug, Clone)]
pub struct DrafterWeights {
    pub config: DrafterConfig,
    /// `[H, n_ids * H]`.
    pub fc: QuantMatrix,
    pub hidden_norm: Vec<f32>,
    pub norm: Vec<f32>,
    pub layers: Vec<DrafterLayer>,
    pub selector: Option<Selector>,
    /// The ids its greedy drafts are chosen among (`draft_vocab.json`; None: all).
    pub draft_vocab: Option<super::DraftVocab>,
}

impl DrafterWeights {
    /// Loads a drafter from its config.json text and safetensors files.
    pub fn load(
        config_json: &str,
        files: Vec<(&str, &[u8])>,
        precision: DrafterPrecision,
    ) -> Result<Self> {
        let c = DrafterConfig::from_json(config_json)?;
        let src = SafeTensorsSource::new(files, None)?;
        let r = DrafterReader {
            src: &src,
            c: &c,
            precision,
        };
        let h = c.hidden_size;
        let mut layers = Vec::new();
        for i in 0..c.num_layers {
            layers.push(r.layer(i)?);
        }
        let selector = match &c.dflash2 {
            Some(d) => Some(r.selector(d)?),
            None => None,
        };
        Ok(DrafterWeights {
            selector,
            fc: r.mat("fc.weight", h, c.n_taps() * h)?,
            hidden_norm: r.vec("hidden_norm.weight", h)?,
            norm: r.vec("norm.weight", h)?,
            layers,
            draft_vocab: None,
            config: c,
        })
    }

    pub fn format(&self) -> QFormat {
        self.fc.format
    }
}

/// Reads a drafter's tensors out of its safetensors, each checked against the config,
/// stored at the precision asked for.
struct DrafterReader<'a> {
    src: &'a SafeTensorsSource<'a>,
    c: &'a DrafterConfig,
    precision: DrafterPrecision,
}

impl DrafterReader<'_> {
    /// The convolutions' and the selector's matrices: 8 bits, or f32 for F32.
    fn full(&self, name: &str, rows: usize, cols: usize) -> Result<QuantMatrix> {
        if self.precision != DrafterPrecision::F32 {
            return checked_matrix(self.src, name, rows, cols);
        }
        // The shape checked as for any matrix, then the values as the file has them.
        check_shape(self.src, name, &[rows, cols])?;
        Ok(QuantMatrix::from_f32(&self.src.vector(name)?, rows, cols))
    }

    /// A layer's or `fc`'s matrix: as `full`, then 4 bits for Q4.
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<QuantMatrix> {
        let m = self.full(name, rows, cols)?;
        Ok(match self.precision {
            DrafterPrecision::Q8 | DrafterPrecision::F32 => m,
            DrafterPrecision::Q4 => QuantMatrix::quantize_q4(&m.dequantize(), rows, cols),
        })
    }

    /// A vector of `len` values (a norm's weights).
    fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        checked_vector(self.src, name, len)
    }

    /// A DFlash2 convolution under `prefix`: its base kernel `[2, taps, H]`, then its
    /// kernel projection.
    fn conv(&self, prefix: String, d: &DFlash2Config) -> Result<GroupedConv> {
        let h = self.c.hidden_size;
        let name = format!("{prefix}.base_kernel");
        let want = vec![2, d.conv_kernel_size, h];
        let shape = self
            .src
            .shape(&name)
            .ok_or_else(|| Error::MissingTensor(name.clone()))?;
        if shape != want {
            return Err(Error::ShapeMismatch {
                tensor: name,
                expected: want,
                found: shape,
            });
        }
        Ok(GroupedConv {
            base: self.src.vector(&name)?,
            projection: self.full(
                &format!("{prefix}.kernel_projection.weight"),
                d.projection_rows(h),
                h,
            )?,
        })
    }

    /// Layer `i`: its convolutions (DFlash2) first, then its norms and matrices.
    fn layer(&self, i: usize) -> Result<DrafterLayer> {
        let c = self.c;
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let n = |s: &str| format!("layers.{i}.{s}");
        let convs = match &c.dflash2 {
            Some(d) => Some(LayerConvs {
                attention: self.conv(n("attention_conv"), d)?,
                mlp: self.conv(n("mlp_conv"), d)?,
            }),
            None => None,
        };
        Ok(DrafterLayer {
            conv: convs,
            input_norm: self.vec(&n("input_layernorm.weight"), h)?,
            post_norm: self.vec(&n("post_attention_layernorm.weight"), h)?,
            wq: self.mat(&n("self_attn.q_proj.weight"), q, h)?,
            wk: self.mat(&n("self_attn.k_proj.weight"), kv, h)?,
            wv: self.mat(&n("self_attn.v_proj.weight"), kv, h)?,
            wo: self.mat(&n("self_attn.o_proj.weight"), h, q)?,
            q_norm: self.vec(&n("self_attn.q_norm.weight"), c.head_dim)?,
            k_norm: self.vec(&n("self_attn.k_norm.weight"), c.head_dim)?,
            w_gate: self.mat(&n("mlp.gate_proj.weight"), ff, h)?,
            w_up: self.mat(&n("mlp.up_proj.weight"), ff, h)?,
            w_down: self.mat(&n("mlp.down_proj.weight"), h, ff)?,
        })
    }

    /// The selector's codebooks: z-lab's published files name them without `.weight`;
    /// the reference's `save_pretrained` of a freshly built model adds it.
    fn codebook(&self, which: &str, rank: usize) -> Result<QuantMatrix> {
        let bare = format!("candidate_selector.{which}_codebook");
        let named = format!("{bare}.weight");
        let name = if self.src.shape(&bare).is_none() && self.src.shape(&named).is_some() {
            named
        } else {
            bare
        };
        self.full(&name, self.c.vocab_size, rank)
    }

    /// DFlash2's candidate selector: its hidden projection, then the two codebooks.
    fn selector(&self, d: &DFlash2Config) -> Result<Selector> {
        Ok(Selector {
            hidden_projection: self.full(
                "candidate_selector.hidden_projection.weight",
                d.selector_rank,
                self.c.hidden_size,
            )?,
            predecessor: self.codebook("predecessor", d.selector_rank)?,
            successor: self.codebook("successor", d.selector_rank)?,
        })
    }
}

/// Loads a drafter folder from the file system.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_drafter_dir(
    dir: &std::path::Path,
    precision: DrafterPrecision,
) -> Result<DrafterWeights> {
    let io = |p: &std::path::Path, e| Error::Io {
        path: p.display().to_string(),
        source: e,
    };
    use crate::model_files::require_regular_file;
    let cfg_path = dir.join("config.json");
    require_regular_file(&cfg_path)?;
    let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| io(&cfg_path, e))?;
    let index = dir.join("model.safetensors.index.json");
    let index_bytes = if index.exists() {
        require_regular_file(&index)?;
        Some(std::fs::read(&index).map_err(|e| io(&index, e))?)
    } else {
        None
    };
    let names = crate::model_files::hf_weight_files(index_bytes.as_deref())?;
    let mut blobs = Vec::new();
    for n in &names {
        let p = dir.join(n);
        require_regular_file(&p)?;
        blobs.push((n.clone(), std::fs::read(&p).map_err(|e| io(&p, e))?));
    }
    let mut w = DrafterWeights::load(
        &cfg,
        blobs.iter().map(|(n, b)| (n.as_str(), &b[..])).collect(),
        precision,
    )?;
    w.draft_vocab = read_draft_vocab(dir, &cfg, &w.config)?;
    Ok(w)
}

/// A drafter folder's draft vocabulary: `draft_vocab.json`, or its `d2t` form
/// (`draft_vocab.safetensors`), or both where they list the same ids; None without either.
#[cfg(not(target_arch = "wasm32"))]
fn read_draft_vocab(
    dir: &std::path::Path,
    cfg_json: &str,
    c: &DrafterConfig,
) -> Result<Option<super::DraftVocab>> {
    use super::{DraftVocab, D2T_FILE, DRAFT_VOCAB_FILE};
    use crate::model_files::require_regular_file;
    let read = |name: &str| -> Result<Option<Vec<u8>>> {
        let p = dir.join(name);
        if !p.exists() {
            return Ok(None);
        }
        require_regular_file(&p)?;
        std::fs::read(&p).map(Some).map_err(|e| Error::Io {
            path: p.display().to_string(),
            source: e,
        })
    };
    let json = match read(DRAFT_VOCAB_FILE)? {
        Some(b) => Some(DraftVocab::from_json(
            &String::from_utf8_lossy(&b),
            c.vocab_size,
        )?),
        None => None,
    };
    let d2t = match read(D2T_FILE)? {
        Some(b) => {
            let n = super::DrafterFile::from_json(cfg_json)?.draft_vocab_size;
            Some(DraftVocab::from_d2t_file(
                &b,
                c.vocab_size,
                c.hidden_size,
                n,
            )?)
        }
        None => None,
    };
    match (json, d2t) {
        (Some(a), Some(b)) if a != b => Err(Error::BadConfig(format!(
            "{DRAFT_VOCAB_FILE} ({} ids) and {D2T_FILE} ({} ids) list different ids",
            a.len(),
            b.len()
        ))),
        (a, b) => Ok(a.or(b)),
    }
}
