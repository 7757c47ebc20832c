//! The per-adapter kernel knobs (`Tuning`): one table keyed by the adapter and, for the
//! GEMV, by the matrix's shape (`GemvLanes`).
//!
//! # The table
//!
//! Per-adapter knobs live in one table, `Tuning` (this module, re-exported as
//! `context::Tuning`), keyed by the adapter (`Tuning::for_adapter`: CPU adapters, Intel
//! by PCI vendor id or name, other GPUs) and, for the GEMV, by the matrix's shape
//! (`Tuning::gemv`: the first `GemvLanes` rule the matrix's rows and columns meet), never
//! by the row count. `Tuning::gpu()` has 16 GEMV lanes for every shape (what the H200
//! ran) with 4 output rows per thread (not yet measured on a GPU), the fused RMSNorm and
//! chunked attention; `Tuning::intel_xe2()` takes llama.cpp's Vulkan choices for Intel
//! (16 lanes and 4 rows per thread where a matrix has at most 8192 rows and 1024 columns
//! or more, 4 lanes and one row per thread elsewhere: the lm_head and narrow matrices);
//! `Tuning::cpu()` has 1 lane and 8 rows per thread (in 32-thread workgroups for matrices
//! of at most 640 rows; `Tuning::swiftshader()` 2 rows per thread in 16-thread
//! workgroups), no norm in a GEMV's prologue and one workgroup per (row, query heads of a
//! KV head), because on CPU adapters a barrier makes a kernel coroutines and a
//! barrier-free fused norm repeats the row's sums in all 64 threads (`dflash bench
//! --fuse-norm true` on lavapipe: 183 dispatches per step but 15.8 against 17.1 tok/s by
//! median, `results/lavapipe-engine-profile.jsonl`). The norm split into the residual
//! GEMVs (`--norm-in-residual`) costs lavapipe nothing (184 dispatches, the same tok/s)
//! and SwiftShader 8% of decode (every thread sums 288 partials there), so
//! `Tuning::cpu()` has it and `Tuning::swiftshader()` not. `dflash bench --tuning
//! gpu|intel-xe2|cpu` runs any entry on any adapter, and the tests run the Intel entry on
//! lavapipe. The knobs enter pipeline keys through override constants and never depend on
//! the row count. What each knob does to a kernel: the crate docs' kernel choices
//! (`crates/dflash-gpu/src/lib.rs`).

use crate::kernel::WORKGROUP_SIZE;

/// One rule of a GEMV lane table: a matrix with at most `max_rows` output rows and at
/// least `min_cols` columns gets `lanes` threads per output row (a power of two, 1..=64),
/// `outputs` output rows per thread (1, 2, 4 or 8: each activation load serves them
/// all) and `threads` threads per workgroup (16, 32 or 64, at least `lanes`: gemv.wgsl
/// needs a thread per x row, at most 16); a workgroup then covers `outputs * threads /
/// lanes` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvLanes {
    pub max_rows: usize,
    pub min_cols: usize,
    pub lanes: usize,
    pub outputs: usize,
    pub threads: usize,
}

/// The most output rows one GEMV thread owns (gemv.wgsl's `MAX_OUTS`).
pub const MAX_GEMV_OUTPUTS: usize = 8;

impl GemvLanes {
    /// A rule every matrix meets.
    pub const fn all(lanes: usize, outputs: usize) -> Self {
        GemvLanes {
            max_rows: usize::MAX,
            min_cols: 0,
            lanes,
            outputs,
            threads: WORKGROUP_SIZE as usize,
        }
    }
}

/// One single-rule table per (lanes, outputs): `[log2 lanes][log2 outputs]`.
const UNIFORM_LANES: [[[GemvLanes; 1]; 4]; 7] = {
    let mut t = [[[GemvLanes::all(1, 1)]; 4]; 7];
    let mut l = 0;
    while l < 7 {
        let mut o = 0;
        while o < 4 {
            t[l][o] = [GemvLanes::all(1 << l, 1 << o)];
            o += 1;
        }
        l += 1;
    }
    t
};

/// GPUs but Intel's: 16 lanes per row (measured on the H200 before threads owned several
/// rows) and 4 rows per thread, so that a 16-row verify pass requests each activation
/// a quarter as often (not yet measured on a GPU: `dflash bench --profile` decides).
const GPU_GEMV: [GemvLanes; 1] = [GemvLanes::all(16, 4)];

/// CPU adapters (lavapipe, SwiftShader): a thread per row, no barrier, and several rows
/// per thread, since each activation load is dear there (a per-lane loop, not a vector
/// load) and serves every row the thread owns. On lavapipe (`examples/gemv_probe`,
/// LANES=1) 4 rows per thread made the 16-row GEMV of SmolLM2's lm_head 96 ms against
/// 242 ms with one, a 1536 x 576 one 3.2 ms against 6.3 ms; 8 rows per thread then took
/// a 3072 x 576 GEMV at 1 / 2 / 16 rows from 465 / 636 / 3502 us to 409 / 547 / 2599 us
/// and the 49152-row lm_head from 8.5 / 11.9 / 55.7 ms to 7.8 / 9.8 / 42.8 ms (SwiftShader:
/// 20% less at each). 16 rows per thread spill (3x slower). A matrix of at most 640 rows
/// has 8 in workgroups of 32 threads: 64-thread workgroups of 512 rows would leave one of
/// two cores a 64-row tail, and with 4 rows per thread (the same 256-row workgroups) a
/// 576 x 1536 GEMV took 310 / 469 / 2856 us at 1 / 2 / 16 rows against 250 / 364 / 2203.
const CPU_GEMV: [GemvLanes; 2] = [
    GemvLanes {
        max_rows: 640,
        min_cols: 0,
        lanes: 1,
        outputs: 8,
        threads: 32,
    },
    GemvLanes::all(1, 8),
];

/// SwiftShader (Chrome's CPU WebGPU, and its Vulkan ICD natively): one lane per row as on
/// lavapipe, but 2 rows (or one gate/up pair) per thread in 16-thread workgroups, through
/// gemv.wgsl `accumulate_one_row`, whose sums live in function variables. Its JIT keeps
/// the kernel's private arrays in memory and runs a workgroup on one core, so more rows
/// per thread through those arrays cost more than the shared activation loads save, and
/// small workgroups split SmolLM2's 576- and 960-row matrices evenly over two cores. In
/// the decode step (`dflash bench --profile`, SmolLM2, 1 row) against one row per
/// thread in 32-thread workgroups: 576 x 1536 2.51 ms against 3.10, 960 x 576 1.64
/// against 1.99, 576 x 576 0.99 against 1.22, the 49152-row q8 lm_head 107 ms against
/// 111 with 8 rows per thread through the arrays (130 with one row per thread); the
/// 16-row GEMVs 30-40% less (576 x 1536 9.9 ms against 16.6). One row per thread in
/// 64-thread workgroups had made the paired 3072 x 576 GEMV 5.39 ms against 7.33 with
/// 4 pairs per thread through the arrays. Decode 1.68 tok/s (8 rows per thread but for
/// matrices of at most 640 rows, 64 threads) -> 2.01 (one row, 32 threads) -> 2.16.
const SWIFTSHADER_GEMV: [GemvLanes; 1] = [GemvLanes {
    max_rows: usize::MAX,
    min_cols: 0,
    lanes: 1,
    outputs: 2,
    threads: 16,
}];

/// Intel Xe2 (Arc B-series, Lunar Lake), after llama.cpp's Vulkan choices for Intel: 4
/// rows per 64-thread workgroup where a matrix has at most 8192 rows and 1024 columns or
/// more (its large workgroup with `rm_stdq = 2`), else a subgroup's 16 threads per 4
/// rows, i.e. 4 lanes per row (16 rows per workgroup); each thread owns 4 rows where
/// llama.cpp's threads do (`NUM_ROWS = 2 rm_stdq` for its legacy quants), 1 elsewhere.
const INTEL_XE2_GEMV: [GemvLanes; 2] = [
    GemvLanes {
        max_rows: 8192,
        min_cols: 1024,
        lanes: 16,
        outputs: 4,
        threads: WORKGROUP_SIZE as usize,
    },
    GemvLanes::all(4, 1),
];

/// Per-adapter kernel knobs: one table keyed by the adapter (`Tuning::for_adapter`) and,
/// for the GEMV, by the matrix's shape, never by the row count. They reach the kernels as
/// override constants (so pipeline keys) and through the plan's choice of kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Threads sharing one GEMV output row, by shape: the first rule the matrix meets
    /// (the last rule of a table meets every matrix).
    pub gemv: &'static [GemvLanes],
    /// RMSNorm fused into the prologue of the GEMV that follows it. Every workgroup
    /// then computes the row's norm: cheap on GPUs; on CPU adapters it is either
    /// barriers (which make a kernel coroutines there) or 64 threads repeating the same
    /// sums, both slower than the separate one-workgroup kernel. Measured again at
    /// 300bfac on lavapipe (SmolLM2, 96 tokens after 64, 4 alternations): 12.7-14.5
    /// tok/s apart against 11.8-13.6 fused, although fused makes 6 dispatches per layer
    /// (183 per step) instead of 8 (244); and at d58640e with 8 GEMV rows per thread
    /// (`dflash bench --fuse-norm`, 64 tokens after 64, 6 alternations): 17.1 tok/s
    /// apart against 15.8 fused by median (prefill 60.5 against 58.8). A barrier-free
    /// prologue (each thread summing the row in the shared order, vec4 loads) measured
    /// no better, and a barrier-free separate kernel of that kind far worse there. At
    /// c380b0b a norm streamed by each one-lane thread (x^2 summed as it reads x, x
    /// scaled by the weight only, 1/rms applied to its sums at the end: no prologue, no
    /// barrier) made each fused GEMV about 15% slower (3072x576: 664 against 589 us;
    /// lm_head 11.5 against 9.9 ms) and decoded 14.6-16.8 tok/s against 16.3-17.4
    /// apart (3 alternations): the per-thread x and weight loads cost more there than
    /// the 61 dispatches they save. At 2159a5b each workgroup normalising x once into
    /// its workgroup memory (the prologue's barriers and one more; each thread then
    /// reading normalised x) decoded 13.9-14.4 tok/s against 14.9-15.7 apart (3
    /// alternations): 3072x576 613 against 517 us, lm_head 13.2 against 10.1 ms, its 96
    /// workgroups each ~32 us dearer; the norms apart cost 2.4 ms per step in all.
    pub fuse_norm: bool,
    /// RMSNorm split between the residual GEMV that writes the residual stream and the
    /// GEMVs that read the norm (gemv.wgsl main_norm_out and NORM_SUMS): the first writes x *
    /// weight and each thread's sum of x^2 over its rows, the others sum those partials
    /// for 1/rms and scale their sums by it at the end. No norm kernel and no workgroup
    /// walking x where a residual GEMV precedes the norm (each layer's two norms and the
    /// final one); elsewhere (the first layer's, DFlash2's convolved sublayers, after
    /// a mixture of experts) `fuse_norm` decides. On lavapipe (SmolLM2, 8 rows per
    /// thread: 96 partials per row, read as vec4 by each thread alone) it makes 184
    /// dispatches per step instead of 244 at the same speed (3 alternations: 64 tokens
    /// after 64 at 13.3-14.7 tok/s against 13.8-14.3 apart, prefill of 256 at 34.3-38.8
    /// against 36.3-38.0; one pass of one row 61.4 against 62.0 ms, of 16 rows 447.6
    /// against 449.8 ms). On SwiftShader (2 rows per thread in 16-thread workgroups: 288
    /// partials per row) it costs 8% of decode and a fifth of prefill (1.68-1.69
    /// against 1.83-1.84 tok/s, 5.8 against 7.4), so it keeps the norms apart. GPUs
    /// keep the prologue until a profile says otherwise (`scripts/device-check.sh`
    /// measures both; there the workgroup shares the partials' sum).
    pub norm_in_residual: bool,
    /// Attention in chunks of keys (attention_chunks.wgsl: many workgroups per row, the
    /// query heads of a KV head served together, q/k norms + RoPE + KV store inside)
    /// instead of qkv.wgsl + one workgroup per (row, query heads of a KV head) walking
    /// every key (attention.wgsl), which CPU adapters run faster.
    pub chunked_attention: bool,
    /// Decoding with the next step submitted before the previous one is read, plain
    /// (the token stays on the GPU as the next input) and DFlash (the GPU keeps the
    /// positions, anchor and drafter context; `Speculative::decode_steps`): on GPUs the
    /// GPU never waits for the host. On lavapipe it is about 5% slower (48
    /// tokens of SmolLM2 alternated 6 times: the host's work in flight competes with the
    /// CPU that runs the kernels), so CPU adapters read each token before the next step.
    pub pipelined_decode: bool,
    /// The sampler in chunks of ids with radix selection (many workgroups per row, 20
    /// dispatches) instead of one workgroup per row bisecting over the whole vocabulary
    /// (~33 passes, ~3 ms per token on the H200 at T = 0.8 with top-p).
    pub chunked_sampler: bool,
    /// Output rows per GEMV thread for every shape, in place of the table's.
    pub gemv_outputs_override: Option<usize>,
    /// Every GEMV over a q4 / q8 matrix on activations quantized to 8 bits per weight
    /// group, with exact integer dot products (`ops::dp4a`: the CPU engine's arithmetic,
    /// `CpuKernels::Quantized`, so the model's numbers are that engine's, within the
    /// GPU's tolerance), where the adapter has WGSL's `packed_4x8_integer_dot_product`.
    /// A 16-row verify pass of a large model is compute-bound in f32 (qwen3-8b: ~256
    /// GFLOP against ~1 ms of weight reads on an H200); packed int8 dot products do four
    /// multiply-adds per instruction. The norm goes into the quantize kernel (`fuse_norm`
    /// then means that; `norm_in_residual` is off), the greedy head is the lm_head's
    /// logits then argmax.wgsl. A mixture's routed experts keep f32 activations (no
    /// 8-bit expert kernel yet: there the model is neither engine's arithmetic exactly,
    /// still batch-invariant and lossless). Off in every entry until a real GPU measures it
    /// (`dflash bench --int8-activations true`, `scripts/device-check.sh`): on lavapipe,
    /// which emulates the dot products, SmolLM2's GEMVs run 0.41-0.92x the f32 ones at one
    /// row and 0.35-0.90x at 16, decode 0.53x (`results/lavapipe-int8-activations-smollm2.json`).
    pub int8_activations: bool,
}

/// PCI vendor id of Intel.
const INTEL: u32 = 0x8086;

impl Tuning {
    /// The table's entry for an adapter: CPU adapters (lavapipe, SwiftShader), Intel
    /// (by PCI vendor id or name), other GPUs. In a browser the adapter's name is often
    /// hidden and its type is Cpu exactly when it is the fallback adapter, which is
    /// Chrome's SwiftShader (the only browser with a software WebGPU adapter).
    pub fn for_adapter(info: &wgpu::AdapterInfo) -> Self {
        if info.backend == wgpu::Backend::BrowserWebGpu && info.device_type == wgpu::DeviceType::Cpu
        {
            return Tuning::swiftshader();
        }
        let name = format!("{} {}", info.name, info.driver);
        Tuning::for_device(info.device_type, info.vendor, &name)
    }

    /// `for_adapter` from the adapter's type, PCI vendor id and name.
    pub fn for_device(device_type: wgpu::DeviceType, vendor: u32, name: &str) -> Self {
        match device_type {
            // Barriers are dear there: one thread per row, the norms and attention apart.
            wgpu::DeviceType::Cpu if name.to_lowercase().contains("swiftshader") => {
                Tuning::swiftshader()
            }
            wgpu::DeviceType::Cpu => Tuning::cpu(),
            _ if vendor == INTEL || name.to_lowercase().contains("intel") => Tuning::intel_xe2(),
            _ => Tuning::gpu(),
        }
    }

    /// The knobs of a GPU: 16 lanes per row for every shape (measured on the H200).
    pub fn gpu() -> Self {
        Tuning {
            gemv: &GPU_GEMV,
            fuse_norm: true,
            norm_in_residual: false,
            chunked_attention: true,
            pipelined_decode: true,
            chunked_sampler: true,
            gemv_outputs_override: None,
            int8_activations: false,
        }
    }

    /// The knobs of an Intel GPU (Xe2): `gpu()` with the lanes of `INTEL_XE2_GEMV`.
    pub fn intel_xe2() -> Self {
        Tuning {
            gemv: &INTEL_XE2_GEMV,
            ..Tuning::gpu()
        }
    }

    /// The knobs of a CPU adapter.
    pub fn cpu() -> Self {
        Tuning {
            gemv: &CPU_GEMV,
            fuse_norm: false,
            norm_in_residual: true,
            chunked_attention: false,
            pipelined_decode: false,
            chunked_sampler: false,
            gemv_outputs_override: None,
            int8_activations: false,
        }
    }

    /// The knobs of SwiftShader: `cpu()` with the GEMV of `SWIFTSHADER_GEMV` and the
    /// norms apart (`norm_in_residual`).
    pub fn swiftshader() -> Self {
        Tuning {
            gemv: &SWIFTSHADER_GEMV,
            norm_in_residual: false,
            ..Tuning::cpu()
        }
    }

    /// These knobs with `lanes` (a power of two, 1..=64) threads per row and `outputs`
    /// (1, 2, 4 or 8) rows per thread for every GEMV shape.
    pub fn with_uniform_lanes(self, lanes: usize, outputs: usize) -> Self {
        let l = lanes.clamp(1, 64).ilog2() as usize;
        let o = outputs.clamp(1, MAX_GEMV_OUTPUTS).ilog2() as usize;
        Tuning {
            gemv: &UNIFORM_LANES[l][o],
            ..self
        }
    }

    /// The rule a `rows` x `cols` matrix meets.
    fn gemv_rule(&self, rows: usize, cols: usize) -> GemvLanes {
        self.gemv
            .iter()
            .find(|r| rows <= r.max_rows && cols >= r.min_cols)
            .or(self.gemv.last())
            .copied()
            .unwrap_or(GemvLanes::all(1, 1))
    }

    /// Threads per output row of a GEMV over a `rows` x `cols` matrix.
    pub fn gemv_lanes(&self, rows: usize, cols: usize) -> usize {
        self.gemv_rule(rows, cols).lanes
    }

    /// Threads per workgroup of a GEMV over a `rows` x `cols` matrix.
    pub fn gemv_threads(&self, rows: usize, cols: usize) -> usize {
        self.gemv_rule(rows, cols).threads
    }

    /// Output rows per thread of a GEMV over a `rows` x `cols` matrix.
    pub fn gemv_outputs(&self, rows: usize, cols: usize) -> usize {
        let outputs = self.gemv_outputs_override;
        outputs
            .unwrap_or(self.gemv_rule(rows, cols).outputs)
            .clamp(1, MAX_GEMV_OUTPUTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_keys_on_the_adapter_and_the_matrix_shape() {
        use wgpu::DeviceType::*;
        let cpu = Tuning::for_device(Cpu, 0x10005, "llvmpipe");
        assert_eq!(cpu, Tuning::cpu());
        let swiftshader = Tuning::for_device(Cpu, 0x1ae0, "SwiftShader Device (Subzero)");
        assert_eq!(swiftshader, Tuning::swiftshader());
        assert_eq!(swiftshader.gemv_outputs(576, 1536), 2);
        assert_eq!(swiftshader.gemv_threads(49_152, 576), 16);
        // A browser's fallback adapter, its name hidden, is Chrome's SwiftShader.
        let browser = |device_type| wgpu::AdapterInfo {
            name: String::new(),
            vendor: 0,
            device: 0,
            device_type,
            device_pci_bus_id: String::new(),
            driver: String::new(),
            driver_info: String::new(),
            backend: wgpu::Backend::BrowserWebGpu,
            subgroup_min_size: 4,
            subgroup_max_size: 128,
            transient_saves_memory: None,
            limit_bucket: None,
        };
        assert_eq!(Tuning::for_adapter(&browser(Cpu)), Tuning::swiftshader());
        assert_eq!(Tuning::for_adapter(&browser(Other)), Tuning::gpu());
        let b70 = Tuning::for_device(DiscreteGpu, INTEL, "Intel(R) Arc(TM) Pro B70");
        assert_eq!(b70, Tuning::intel_xe2());
        let h200 = Tuning::for_device(DiscreteGpu, 0x10de, "NVIDIA H200");
        assert_eq!(h200, Tuning::gpu());
        // Intel: 4 rows per workgroup for the layers of an 8B model, 16 for a lm_head or
        // a narrow matrix.
        assert_eq!(b70.gemv_lanes(4096, 4096), 16);
        assert_eq!(b70.gemv_lanes(151_936, 4096), 4);
        assert_eq!(b70.gemv_lanes(576, 576), 4);
        assert_eq!(h200.gemv_lanes(151_936, 4096), 16);
        assert_eq!(cpu.gemv_lanes(4096, 4096), 1);
        // CPU adapters: 8 rows per thread; 32 threads where 64 would leave a core a tail.
        assert_eq!(
            (cpu.gemv_outputs(576, 1536), cpu.gemv_threads(576, 1536)),
            (8, 32)
        );
        assert_eq!(
            (cpu.gemv_outputs(3072, 576), cpu.gemv_threads(3072, 576)),
            (8, 64)
        );
        assert_eq!(h200.gemv_threads(576, 1536), 64);
        let uniform = Tuning::gpu().with_uniform_lanes(8, 2);
        assert_eq!(
            (uniform.gemv_lanes(1, 1), uniform.gemv_outputs(1, 1)),
            (8, 2)
        );
        // Threads own 4 rows (a 16-row pass shares each activation load among them),
        // never more than the kernel's MAX_OUTS.
        assert_eq!(h200.gemv_outputs(576, 576), 4);
        assert_eq!(b70.gemv_outputs(4096, 4096), 4);
        assert_eq!(cpu.gemv_outputs(4096, 4096), 8);
        assert_eq!(
            Tuning::gpu().with_uniform_lanes(1, 64).gemv_outputs(1, 1),
            8
        );
    }
}
