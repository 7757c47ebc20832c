//! Tensors of a GGUF file as a `TensorSource`.

use crate::error::{Error, Result};
use crate::formats::ggml;
use crate::formats::gguf::{GgufHeader, TensorInfo};
use crate::quant::QuantMatrix;
use crate::weights::TensorSource;

pub struct GgufSource<'a> {
    pub header: GgufHeader,
    pub data: &'a [u8],
}

impl<'a> GgufSource<'a> {
    pub fn new(data: &'a [u8]) -> Result<Self> {
        let header = crate::formats::gguf::parse_header(data, data.len() as u64)?;
        Ok(GgufSource { header, data })
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.header
            .tensor(name)
            .ok_or_else(|| Error::MissingTensor(name.into()))
    }

    fn bytes(&self, t: &TensorInfo) -> Result<&'a [u8]> {
        let (s, e) = (t.offset as usize, (t.offset + t.n_bytes) as usize);
        self.data.get(s..e).ok_or(Error::TensorOutOfBounds {
            tensor: t.name.clone(),
            start: t.offset,
            end: t.offset + t.n_bytes,
            file_len: self.data.len() as u64,
        })
    }
}

impl TensorSource for GgufSource<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.header.tensor(name).map(|t| t.shape())
    }

    fn matrix(&self, name: &str) -> Result<QuantMatrix> {
        let t = self.info(name)?;
        let Some((rows, cols)) = t.matrix_shape() else {
            return Err(Error::BadTensorLayout {
                tensor: name.into(),
                reason: format!("expected 2 or 3 dims, found {:?}", t.dims),
            });
        };
        QuantMatrix::from_ggml(name, t.dtype, self.bytes(t)?, rows, cols)
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        if !t.dtype.is_supported() {
            return Err(Error::UnsupportedTensorType {
                tensor: name.into(),
                dtype: t.dtype.name(),
            });
        }
        Ok(ggml::dequantize(
            t.dtype,
            self.bytes(t)?,
            t.n_elements() as usize,
        ))
    }
}
