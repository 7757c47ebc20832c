//! Hugging Face safetensors (single file or sharded via `model.safetensors.index.json`):
//! F32/F16/BF16 tensors and packed-int4 GPTQ / AWQ / AutoRound linear layers.

use crate::error::{Error, Result};
use crate::formats::ggml::{self, GgmlType};
use crate::quant::QuantMatrix;
use crate::weights::TensorSource;
use half::f16;
use safetensors::Dtype;
use serde::Deserialize;
use std::collections::HashMap;

/// The packed-int4 layout of a quantized checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Packing {
    /// GPTQ: `qweight [in/8, out]` packed along the input; `qzeros [groups, out/8]`.
    /// `zero_offset` is 1 for the original GPTQ format (zeros stored minus one).
    Gptq { zero_offset: i32 },
    /// AWQ (GEMM): `qweight [in, out/8]` packed along the output in the order
    /// 0,2,4,6,1,3,5,7; `qzeros [groups, out/8]` likewise.
    Awq,
}

#[derive(Debug, Clone, Copy)]
pub struct Int4Config {
    pub packing: Int4Packing,
    /// Group size along the input; None means one group per row.
    pub group_size: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct QuantizationConfig {
    quant_method: Option<String>,
    bits: Option<u32>,
    group_size: Option<i64>,
    desc_act: Option<bool>,
    checkpoint_format: Option<String>,
    version: Option<String>,
    packing_format: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ConfigWithQuant {
    quantization_config: Option<QuantizationConfig>,
}

/// Reads `quantization_config` of a `config.json`: None for float checkpoints.
pub fn int4_config(config_json: &str) -> Result<Option<Int4Config>> {
    let c: ConfigWithQuant = serde_json::from_str(config_json)
        .map_err(|e| Error::BadConfig(format!("config.json: {e}")))?;
    let Some(q) = c.quantization_config else {
        return Ok(None);
    };
    let method = q.quant_method.clone().unwrap_or_default().to_lowercase();
    if q.bits.unwrap_or(4) != 4 {
        return Err(Error::UnsupportedQuantization(format!(
            "{method} with {} bits (only 4-bit packing is supported)",
            q.bits.unwrap_or(0)
        )));
    }
    let group_size = match q.group_size.unwrap_or(128) {
        g if g <= 0 => None,
        g if g % 32 == 0 => Some(g as usize),
        g => {
            return Err(Error::UnsupportedQuantization(format!(
                "group size {g} is not a multiple of 32"
            )))
        }
    };
    let packing = match method.as_str() {
        "gptq" => Int4Packing::Gptq {
            zero_offset: gptq_zero_offset(q.checkpoint_format.as_deref()),
        },
        "awq" => {
            if let Some(v) = q.version.as_deref() {
                if !v.eq_ignore_ascii_case("gemm") {
                    return Err(Error::UnsupportedQuantization(format!(
                        "AWQ version {v:?} (only GEMM packing)"
                    )));
                }
            }
            Int4Packing::Awq
        }
        "auto-round" | "autoround" | "intel/auto-round" => match q
            .packing_format
            .as_deref()
            .unwrap_or("auto_round:auto_gptq")
        {
            f if f.contains("awq") => Int4Packing::Awq,
            f if f.contains("gptq") => Int4Packing::Gptq {
                zero_offset: gptq_zero_offset(q.checkpoint_format.as_deref()),
            },
            f => {
                return Err(Error::UnsupportedQuantization(format!(
                    "AutoRound packing format {f:?}"
                )))
            }
        },
        other => {
            return Err(Error::UnsupportedQuantization(format!(
                "quant_method {other:?}"
            )))
        }
    };
    if q.desc_act == Some(true) {
        // Act-order checkpoints are accepted only when g_idx turns out sequential; the
        // check happens per tensor at load.
    }
    Ok(Some(Int4Config {
        packing,
        group_size,
    }))
}

fn gptq_zero_offset(format: Option<&str>) -> i32 {
    match format {
        Some("gptq_v2") => 0,
        _ => 1,
    }
}

#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// The tensors of one or more safetensors files, by name.
pub struct SafeTensorsSource<'a> {
    files: Vec<(&'a str, &'a [u8])>,
    entries: HashMap<String, Entry>,
    int4: Option<Int4Config>,
    /// Float matrices kept as f32 (`QFormat::F32`) instead of repacked into 8 bits.
    full_precision: bool,
}

impl<'a> SafeTensorsSource<'a> {
    /// `files` are (file name, bytes) pairs; every tensor must be in exactly one.
    pub fn new(files: Vec<(&'a str, &'a [u8])>, int4: Option<Int4Config>) -> Result<Self> {
        let mut entries = HashMap::new();
        for (fi, (fname, bytes)) in files.iter().enumerate() {
            let err = |reason: String| Error::SafeTensors {
                file: fname.to_string(),
                reason,
            };
            if bytes.len() < 8 {
                return Err(Error::Truncated {
                    offset: 0,
                    needed: 8,
                    len: bytes.len() as u64,
                });
            }
            let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            if header_len > bytes.len() as u64 - 8 {
                return Err(Error::AbsurdSize {
                    field: "safetensors header length",
                    value: header_len,
                    limit: bytes.len() as u64 - 8,
                });
            }
            let (n, meta) =
                safetensors::SafeTensors::read_metadata(bytes).map_err(|e| err(e.to_string()))?;
            let base = 8 + n;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                let (start, end) = (base + s, base + e);
                if end > bytes.len() || start > end {
                    return Err(Error::TensorOutOfBounds {
                        tensor: name,
                        start: start as u64,
                        end: end as u64,
                        file_len: bytes.len() as u64,
                    });
                }
                if entries
                    .insert(
                        name.clone(),
                        Entry {
                            file: fi,
                            dtype: info.dtype,
                            shape: info.shape.clone(),
                            start,
                            end,
                        },
                    )
                    .is_some()
                {
                    return Err(err(format!("tensor {name} appears in more than one file")));
                }
            }
        }
        // A multimodal checkpoint (Qwen3.5's ForConditionalGeneration) keeps the text
        // model under `model.language_model.`: read as `model.` (the vision tower, under
        // `model.visual.`, is not loaded).
        let aliases: Vec<(String, Entry)> = entries
            .iter()
            .filter_map(|(name, e)| {
                let rest = name.strip_prefix("model.language_model.")?;
                Some((format!("model.{rest}"), e.clone()))
            })
            .collect();
        for (name, e) in aliases {
            entries.entry(name).or_insert(e);
        }
        Ok(SafeTensorsSource {
            files,
            entries,
            int4,
            full_precision: false,
        })
    }

    /// The same source, handing out float matrices as f32 (`QFormat::F32`: the CPU
    /// engines only), not repacked into 8 bits.
    pub fn full_precision(self) -> Self {
        SafeTensorsSource {
            full_precision: true,
            ..self
        }
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.into()))
    }

    fn data(&self, e: &Entry) -> &'a [u8] {
        &self.files[e.file].1[e.start..e.end]
    }

    fn file_name(&self, e: &Entry) -> &str {
        self.files[e.file].0
    }

    /// Float tensor as f32 values, checking the byte length against the shape.
    fn floats(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let e = self.entry(name)?;
        let t = match e.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            d => {
                return Err(Error::UnsupportedTensorType {
                    tensor: name.into(),
                    dtype: format!("{d:?}"),
                })
            }
        };
        let n: usize = e.shape.iter().product();
        let bytes = self.data(e);
        if bytes.len() != n * t.block_size().1 {
            return Err(Error::SafeTensors {
                file: self.file_name(e).into(),
                reason: format!("{name}: byte length does not match shape"),
            });
        }
        Ok((e.shape.clone(), ggml::dequantize(t, bytes, n)))
    }

    fn i32s(&self, name: &str) -> Result<(Vec<usize>, Vec<i32>)> {
        let e = self.entry(name)?;
        if e.dtype != Dtype::I32 && e.dtype != Dtype::U32 {
            return Err(Error::UnsupportedTensorType {
                tensor: name.into(),
                dtype: format!("{:?}", e.dtype),
            });
        }
        let n: usize = e.shape.iter().product();
        let bytes = self.data(e);
        if bytes.len() != n * 4 || e.shape.len() != 2 {
            return Err(Error::SafeTensors {
                file: self.file_name(e).into(),
                reason: format!("{name}: bad int32 tensor"),
            });
        }
        Ok((
            e.shape.clone(),
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ))
    }

    fn prefix(name: &str) -> Option<&str> {
        name.strip_suffix(".weight")
    }

    /// (out, in) of a packed-int4 linear layer.
    fn int4_shape(&self, prefix: &str, cfg: &Int4Config) -> Option<Vec<usize>> {
        let e = self.entries.get(&format!("{prefix}.qweight"))?;
        if e.shape.len() != 2 {
            return None;
        }
        Some(match cfg.packing {
            Int4Packing::Gptq { .. } => vec![e.shape[1], e.shape[0] * 8],
            Int4Packing::Awq => vec![e.shape[1] * 8, e.shape[0]],
        })
    }

    fn int4_matrix(&self, prefix: &str, cfg: &Int4Config) -> Result<QuantMatrix> {
        let name = format!("{prefix}.qweight");
        let shape = self
            .int4_shape(prefix, cfg)
            .ok_or_else(|| Error::MissingTensor(name.clone()))?;
        let (out, inp) = (shape[0], shape[1]);
        let group = cfg.group_size.unwrap_or(inp);
        let bad = |reason: String| Error::BadTensorLayout {
            tensor: name.clone(),
            reason,
        };
        if inp % group != 0 || inp % 32 != 0 || out % 8 != 0 {
            return Err(bad(format!(
                "[{out}, {inp}] does not split into groups of {group}"
            )));
        }
        let groups = inp / group;
        let (_, qw) = self.i32s(&name)?;
        let (zs, qz) = self.i32s(&format!("{prefix}.qzeros"))?;
        let (ss, sc) = self.floats(&format!("{prefix}.scales"))?;
        if ss != [groups, out] {
            return Err(Error::ShapeMismatch {
                tensor: format!("{prefix}.scales"),
                expected: vec![groups, out],
                found: ss,
            });
        }
        if zs != [groups, out / 8] {
            return Err(Error::ShapeMismatch {
                tensor: format!("{prefix}.qzeros"),
                expected: vec![groups, out / 8],
                found: zs,
            });
        }
        if let Ok((_, g_idx)) = self.g_idx(prefix) {
            if g_idx.len() != inp
                || g_idx
                    .iter()
                    .enumerate()
                    .any(|(i, &g)| g as usize != i / group)
            {
                return Err(Error::UnsupportedQuantization(format!(
                    "{prefix}: act-order (non-sequential g_idx) checkpoints"
                )));
            }
        }
        // Scales are f16 in the checkpoint: `floats` returns them exactly.
        let scale = |o: usize, g: usize| sc[g * out + o];
        Ok(match cfg.packing {
            Int4Packing::Gptq { zero_offset } => {
                let q = |o: usize, i: usize| (qw[(i / 8) * out + o] >> (4 * (i % 8))) & 0xF;
                let z = |o: usize, g: usize| {
                    (((qz[g * (out / 8) + o / 8] >> (4 * (o % 8))) & 0xF) + zero_offset) as f32
                };
                QuantMatrix::from_int4_zero_scale(out, inp, group, q, scale, z)
            }
            Int4Packing::Awq => {
                const INV: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                let q = |o: usize, i: usize| (qw[i * (out / 8) + o / 8] >> (4 * INV[o % 8])) & 0xF;
                let z = |o: usize, g: usize| {
                    ((qz[g * (out / 8) + o / 8] >> (4 * INV[o % 8])) & 0xF) as f32
                };
                QuantMatrix::from_int4_zero_scale(out, inp, group, q, scale, z)
            }
        })
    }

    fn g_idx(&self, prefix: &str) -> Result<(Vec<usize>, Vec<i32>)> {
        let e = self.entry(&format!("{prefix}.g_idx"))?;
        let bytes = self.data(e);
        Ok((
            e.shape.clone(),
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ))
    }
}

impl TensorSource for SafeTensorsSource<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        if let Some(e) = self.entries.get(name) {
            return Some(e.shape.clone());
        }
        match (&self.int4, Self::prefix(name)) {
            (Some(cfg), Some(p)) => self.int4_shape(p, cfg),
            _ => None,
        }
    }

    fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        if self.entries.contains_key(name) {
            let (shape, v) = self.floats(name)?;
            if shape.len() != 2 || shape[1] % 32 != 0 {
                return Err(Error::BadTensorLayout {
                    tensor: name.into(),
                    reason: format!("shape {shape:?} is not [rows, 32k]"),
                });
            }
            if self.full_precision {
                return Ok(QuantMatrix::from_f32(&v, shape[0], shape[1]));
            }
            return Ok(QuantMatrix::quantize_q8(&v, shape[0], shape[1]));
        }
        match (&self.int4, Self::prefix(name)) {
            (Some(cfg), Some(p)) => self.int4_matrix(p, cfg),
            _ => Err(Error::MissingTensor(name.into())),
        }
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.floats(name)?.1)
    }

    fn stacked_matrix(&self, names: &[String]) -> Result<QuantMatrix> {
        let parts = names
            .iter()
            .map(|n| self.matrix(n))
            .collect::<Result<Vec<_>>>()?;
        QuantMatrix::stack_rows(&parts.iter().collect::<Vec<_>>()).ok_or_else(|| {
            Error::BadTensorLayout {
                tensor: names.first().cloned().unwrap_or_default(),
                reason: "the experts of one layer differ in format".into(),
            }
        })
    }
}

/// Writes a safetensors file; used by test helpers and the trainer's export.
pub fn write_safetensors(tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("tensor view"),
            )
        })
        .collect();
    safetensors::serialize(views, None).expect("serialize safetensors")
}

/// f32 values as f16 bytes (little endian).
pub fn f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect()
}
