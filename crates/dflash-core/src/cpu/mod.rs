//! The CPU reference engine: plain-Rust f32 math, the oracle of every GPU kernel.
//!
//! # Batch invariance in the CPU reference
//!
//! Every reduction has a fixed order per row: `cpu::ops::dot` keeps 8 interleaved partial
//! sums merged by a fixed tree, attention walks keys in position order, RMSNorm and
//! softmax reduce one row at a time. So a position's logits are bit-identical in a
//! one-token step, a 16-row chunk or the whole prompt
//! (`crates/dflash-core/tests/cpu_model.rs`). Threads split output columns, never a
//! reduction.
//!
//! # The quantized CPU engine
//!
//! `cpu::CpuModel::with_kernels(w, CpuKernels::Quantized)` (`--device cpu`, and without
//! `--device` where the only GPU adapter is a software one:
//! `crates/dflash-engine/src/device.rs`; in the browser where there is no hardware WebGPU
//! adapter) runs the same forward as the reference with one difference: each matrix
//! product keeps the weights in their loaded 4/8-bit formats and quantizes its input rows
//! to 8 bits per weight group (`cpu::quant_matmul`: scale amax/127, plus scale * sum(q)
//! for the weights' mins), so that each group is an exact integer dot product. The f32
//! part is defined once (`accumulate`: per group `(scale_w * scale_x) * isum + min_w *
//! sum_x`, two products then a sum, into 8 accumulators by group index mod 8, merged by a
//! fixed tree), and the scalar, AVX2, AVX-VNNI, AVX-512 VNNI and wasm SIMD128 kernels
//! follow it, so their results are bit-identical to each other (checked for every kernel
//! the host has) and independent of the rows sharing the pass: DFlash on this engine is
//! lossless too.
//!
//! Where the CPU has AVX-VNNI or AVX-512 VNNI, and in wasm (SIMD128), matrices in groups
//! of 32 are repacked at load (`cpu::packed`, replacing the loaded copy): natively
//! sixteen weight rows interleaved in 64-byte runs so that one 512-bit `vpdpbusd` of a
//! weight vector with four broadcast activation bytes gives sixteen rows' partial sums in
//! its lanes (no horizontal sums; up to eight input rows per pass over a block, the
//! groups walked by accumulator so that one f32 accumulator per input row is live),
//! AVX-VNNI taking each block as two halves of eight rows (up to four input rows per
//! pass; the same code is also compiled with AVX-512 VL's encoding, `avx512-vnni-256`, so
//! that hosts without AVX-VNNI test it), Q8 stored plus 128 with 128 * sum(q_x) taken
//! back off; in wasm four rows of byte pairs, widened to i16, against one broadcast
//! activation pair by `i32x4.dot_i16x8_s` (scales converted four at a time, exactly as
//! `half` does), two input rows per pass. `DFLASH_CPU_KERNEL` forces a kernel
//! (`Kernel::requested`: one the CPU lacks is a usage error), and `examples/cpu_kernels`
//! prints each kernel's multiply-adds per cycle at 1-64 rows beside the host's `vpdpbusd`
//! peak. The same arithmetic per element, so the same bits (natively `cpu::packed`'s
//! test; in wasm the test-hooks build's `__testPackedKernel`, run by
//! `tests/node/validate.test.mjs`). Q/K/V and gate/up are stacked into one product where
//! their formats agree (each output element unchanged).
//!
//! Natively the whole forward runs on a rayon pool (`quant_matmul::in_pool`) and output
//! rows are split across its threads. In the browser the package has two builds:
//! `pkg/dist/` single-threaded, and `pkg/dist/threads/` (feature `threads`: atomics and a
//! shared, imported memory, std rebuilt by nightly's `-Z build-std`) whose rayon global
//! pool runs on Web Workers (`wasm-bindgen-rayon`, `initThreadPool`); the worker loads it
//! for the CPU engine where the page is cross-origin isolated, and there `in_pool` runs
//! the forward on a pool thread (`rayon::scope`). Attention, norms and RoPE are the
//! reference's f32 code. Its logits stay within 2% of the spread of the reference's on
//! random models (0.6% seen) and agree with llama.cpp at 97.5% teacher-forced on SmolLM2
//! (the reference: 98.75%).
//!
//! # The sampling rule
//!
//! `sampling::random_uniform(seed, position, stream)` (`crate::sampling`) is a hash chain
//! of 32-bit operations (lowbias32), so WGSL computes the same numbers; the draw at a
//! position depends only on (seed, position). Tokens at or above the largest of the
//! top-k, min-p and top-p thresholds (of logit / T, on one order key) are kept; the draw
//! is the first id, in id order, whose running kept mass exceeds u times the total
//! (inverse CDF).

pub mod delta_net;
pub(crate) mod layer;
pub mod matrix;
pub mod model;
pub mod ops;
pub mod packed;
pub mod quant_matmul;

pub use model::{CpuKernels, CpuModel, ForwardOutput, KvCache, LogitRows};
