//! The CPU engines' weight matrices: which products run (`CpuKernels`), a matrix kept
//! in f32 or in its 4/8-bit format (`Matrix`), and matrices that read the same input
//! applied as one (`Stacked`). The target's layers and the linear-attention layers share
//! them.

use super::ops::matmul_t;
use super::packed::{packed_kernel, PackedMatrix};
use super::quant_matmul::{quant_matmul, Kernel, QuantizedRows};
use crate::quant::{QFormat, QuantMatrix};

/// Which matrix products the CPU engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuKernels {
    /// Weights dequantized to f32, f32 products: the oracle every engine is tested
    /// against.
    #[default]
    Reference,
    /// Weights kept in their 4/8-bit formats, activations quantized to 8 bits per
    /// group, exact integer dot products with SIMD and threads
    /// (`super::quant_matmul`).
    Quantized,
}

impl CpuKernels {
    pub fn name(self) -> &'static str {
        match self {
            CpuKernels::Reference => "reference",
            CpuKernels::Quantized => "quantized",
        }
    }

    /// The `--device` that runs these kernels.
    pub fn device_name(self) -> &'static str {
        match self {
            CpuKernels::Reference => "reference",
            CpuKernels::Quantized => "cpu",
        }
    }
}

/// A weight matrix: dequantized to f32 (from the GPU formats, so both engines see the
/// same values) or kept quantized.
pub(crate) enum Matrix {
    Dense {
        w: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    Quant {
        m: QuantMatrix,
        kernel: Kernel,
    },
    /// Rows interleaved for the VNNI or SIMD128 kernels (`super::packed`): the same
    /// values, bit for bit, as `Quant`'s.
    Packed(PackedMatrix),
}

impl Matrix {
    /// `new` of a matrix the caller gives up (no copy of quantized weights).
    pub(crate) fn owned(m: QuantMatrix, kernels: CpuKernels) -> Self {
        match kernels {
            // An f32 matrix (a full-precision drafter) runs dense on either engine.
            _ if m.format == QFormat::F32 => Self::new(&m, kernels),
            CpuKernels::Reference => Self::new(&m, kernels),
            CpuKernels::Quantized => Self::packed(&m).unwrap_or(Matrix::Quant {
                m,
                kernel: Kernel::detect(),
            }),
        }
    }

    /// `m` interleaved for the packed kernel, where this CPU has it and the format fits.
    fn packed(m: &QuantMatrix) -> Option<Self> {
        packed_kernel(Kernel::detect())
            .then(|| PackedMatrix::from_quant(m))
            .flatten()
            .map(Matrix::Packed)
    }

    pub(crate) fn new(m: &QuantMatrix, kernels: CpuKernels) -> Self {
        match kernels {
            _ if m.format == QFormat::F32 => Matrix::Dense {
                w: m.dequantize(),
                rows: m.rows,
                cols: m.cols,
            },
            CpuKernels::Reference => Matrix::Dense {
                w: m.dequantize(),
                rows: m.rows,
                cols: m.cols,
            },
            CpuKernels::Quantized => Self::packed(m).unwrap_or_else(|| Matrix::Quant {
                m: m.clone(),
                kernel: Kernel::detect(),
            }),
        }
    }

    pub(crate) fn rows(&self) -> usize {
        match self {
            Matrix::Dense { rows, .. } => *rows,
            Matrix::Quant { m, .. } => m.rows,
            Matrix::Packed(p) => p.rows(),
        }
    }

    /// Bytes the matrix occupies (what a one-row product reads).
    pub(crate) fn n_bytes(&self) -> usize {
        match self {
            Matrix::Dense { w, .. } => 4 * w.len(),
            Matrix::Quant { m, .. } => m.n_bytes(),
            Matrix::Packed(p) => p.n_bytes(),
        }
    }

    /// `x` (`[n, cols]`) times the transposed matrix: `[n, rows]`.
    pub(crate) fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        match self {
            Matrix::Dense { w, rows, cols } => matmul_t(x, w, n, *cols, *rows),
            Matrix::Quant { m, kernel } => {
                let xq = QuantizedRows::new(x, n, m.cols, m.format, m.group);
                quant_matmul(m, &xq, *kernel)
            }
            Matrix::Packed(p) => {
                let xq = QuantizedRows::new(x, n, p.cols(), p.format(), p.group());
                p.matmul(&xq)
            }
        }
    }

    /// Rows `ids` of the matrix, in that order.
    pub(crate) fn gather_rows(&self, ids: &[u32]) -> Matrix {
        match self {
            Matrix::Dense { w, cols, .. } => Matrix::Dense {
                w: ids
                    .iter()
                    .flat_map(|&r| &w[r as usize * cols..(r as usize + 1) * cols])
                    .copied()
                    .collect(),
                rows: ids.len(),
                cols: *cols,
            },
            Matrix::Quant { m, kernel } => Matrix::Quant {
                m: m.gather_rows(ids),
                kernel: *kernel,
            },
            Matrix::Packed(p) => {
                Self::packed(&p.quant_rows(ids)).expect("rows of a packed matrix repack")
            }
        }
    }

    /// Appends row `r` in f32 to `out` (embedding lookups).
    pub(crate) fn push_row(&self, r: usize, out: &mut Vec<f32>) {
        match self {
            Matrix::Dense { w, cols, .. } => out.extend_from_slice(&w[r * cols..(r + 1) * cols]),
            Matrix::Quant { m, .. } => {
                let at = out.len();
                out.resize(at + m.cols, 0.0);
                m.dequantize_row(r, &mut out[at..]);
            }
            Matrix::Packed(p) => {
                let at = out.len();
                out.resize(at + p.cols(), 0.0);
                p.dequantize_row(r, &mut out[at..]);
            }
        }
    }
}

/// Matrices that read the same input, applied as one: stacked by rows where their
/// formats agree (one quantization and one pass over the input), else one by one. Each
/// output element is computed exactly as it would be alone.
pub(crate) enum Stacked {
    One { m: Matrix, rows: Vec<usize> },
    Each(Vec<Matrix>),
}

impl Stacked {
    pub(crate) fn new(parts: &[&QuantMatrix], kernels: CpuKernels) -> Self {
        match QuantMatrix::stack_rows(parts) {
            Some(m) => Stacked::One {
                m: Matrix::owned(m, kernels),
                rows: parts.iter().map(|p| p.rows).collect(),
            },
            None => Stacked::Each(parts.iter().map(|p| Matrix::new(p, kernels)).collect()),
        }
    }

    pub(crate) fn n_bytes(&self) -> usize {
        match self {
            Stacked::One { m, .. } => m.n_bytes(),
            Stacked::Each(ms) => ms.iter().map(Matrix::n_bytes).sum(),
        }
    }

    /// Each part's output for `x` (`[n, cols]`): `[n, rows_i]` per part.
    pub(crate) fn apply(&self, x: &[f32], n: usize) -> Vec<Vec<f32>> {
        match self {
            Stacked::Each(ms) => ms.iter().map(|m| m.apply(x, n)).collect(),
            Stacked::One { m, rows } => {
                let y = m.apply(x, n);
                let width: usize = rows.iter().sum();
                let mut at = 0;
                rows.iter()
                    .map(|&r| {
                        let part = (0..n)
                            .flat_map(|t| &y[t * width + at..t * width + at + r])
                            .copied()
                            .collect();
                        at += r;
                        part
                    })
                    .collect()
            }
        }
    }
}
