//! Adapter and device set-up: asks for shader-f16 where offered, states the limits it
//! runs with, and watches for device loss.

use crate::error::{GpuError, Result};
use crate::pipelines::WORKGROUP_SIZE;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Choose the adapter whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Do not use shader-f16 even where the adapter has it.
    pub no_f16: bool,
    /// Override the per-adapter kernel knobs.
    pub tuning: Option<Tuning>,
    /// Override the GEMV's output rows per thread (1, 2, 4 or 8) for every shape, keeping
    /// the rest of the knobs (`dflash bench --gemv-outputs`: the choice measured on a GPU).
    pub gemv_outputs: Option<usize>,
    /// Override whether decoding keeps the next step in flight (`dflash bench
    /// --pipelined`: the choice measured on this adapter), keeping the rest of the knobs.
    pub pipelined_decode: Option<bool>,
    /// Override whether RMSNorm is fused into the GEMV that follows it (`dflash bench
    /// --fuse-norm`: the choice measured on this adapter), keeping the rest of the knobs.
    pub fuse_norm: Option<bool>,
    /// Override whether the residual GEMV before an RMSNorm does the norm's share
    /// (`dflash bench --norm-in-residual`), keeping the rest of the knobs.
    pub norm_in_residual: Option<bool>,
    /// Override whether GEMVs run on 8-bit activations (`Tuning::int8_activations`;
    /// `dflash bench --int8-activations`); `true` on an adapter without WGSL's
    /// `packed_4x8_integer_dot_product` is an `Unsupported` error.
    pub int8_activations: Option<bool>,
    /// Run within the limits a browser's WebGPU grants (see `browser_limits`), so that a
    /// native run finds what the browser build would.
    pub browser_limits: bool,
    /// Ask for GPU timestamp queries where the adapter has them (`dflash bench --profile`).
    pub profile: bool,
}

/// How the profiler can time dispatches on this device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timestamps {
    /// No timestamp queries: host clock around submissions.
    None,
    /// Timestamps at the beginning and end of compute passes (WebGPU's `timestamp-query`).
    Passes,
    /// Timestamps between dispatches inside one pass (native only).
    InsidePasses,
}

/// The limits Chromium's WebGPU grants on its CPU fallback adapter (SwiftShader) and on
/// typical integrated GPUs when a page asks for the adapter's maximum: 1 GiB storage
/// bindings and buffers, 256 invocations per workgroup, 16 KiB workgroup storage.
pub fn browser_limits(adapter: &wgpu::Limits) -> wgpu::Limits {
    let mut l = adapter.clone();
    l.max_storage_buffer_binding_size = l.max_storage_buffer_binding_size.min(1 << 30);
    l.max_buffer_size = l.max_buffer_size.min(1 << 30);
    l.max_compute_invocations_per_workgroup = l.max_compute_invocations_per_workgroup.min(256);
    l.max_compute_workgroup_size_x = l.max_compute_workgroup_size_x.min(256);
    l.max_compute_workgroup_size_y = l.max_compute_workgroup_size_y.min(256);
    l.max_compute_workgroup_size_z = l.max_compute_workgroup_size_z.min(64);
    l.max_compute_workgroup_storage_size = l.max_compute_workgroup_storage_size.min(16384);
    l.max_storage_buffers_per_shader_stage = l.max_storage_buffers_per_shader_stage.min(10);
    l
}

#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub shader_f16: bool,
    pub subgroups: bool,
    /// WGSL's `packed_4x8_integer_dot_product` (`dot4I8Packed`), which naga lowers to
    /// the device's integer dot product or a bit-field polyfill.
    pub packed_int8_dot: bool,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

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

pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
    /// Whether kernels use f16 storage (KV cache).
    pub f16: bool,
    /// Compiled pipelines, shared by every model on this device.
    pub pipelines: crate::pipelines::Pipelines,
    pub tuning: Tuning,
    /// Timestamp queries granted (only when `GpuOptions::profile` asked for them).
    pub timestamps: Timestamps,
    /// A small read-only storage buffer bound where a kernel variant leaves a binding
    /// unused (its layout still names it).
    pub unused: wgpu::Buffer,
    /// The 8-bit activations every GEMV on them shares (`ops::dp4a::QuantizedActivations::scratch`).
    pub(crate) int8_scratch: std::cell::RefCell<Option<crate::ops::dp4a::Int8Scratch>>,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Option<GpuError>>>,
}

/// What every kernel of dflash-web needs at least.
pub const MIN_INVOCATIONS: u32 = 64;
pub const MIN_WORKGROUP_STORAGE: u32 = 4096 + 1024;
/// The GEMV with the greedy head's partials binds 8 (WebGPU's default limit).
pub const MIN_STORAGE_BUFFERS: u32 = 8;
/// Chunked attention binds 9: adapters with fewer run qkv.wgsl + attention.wgsl.
pub const CHUNKED_ATTENTION_STORAGE_BUFFERS: u32 = 9;
/// A residual GEMV with both a DFlash tap and the next norm's share binds 9: adapters
/// with fewer run that layer's next norm apart (`Tuning::norm_in_residual`).
pub const TAP_NORM_OUT_STORAGE_BUFFERS: u32 = 9;

impl GpuContext {
    pub async fn new_async(opts: &GpuOptions) -> Result<Self> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pick_adapter(&instance, opts).await?;
        let info = adapter.get_info();
        let mut features = adapter.features();
        let mut limits = adapter.limits();
        if opts.browser_limits {
            limits = browser_limits(&limits);
            // wgpu's browser backend offers neither shader-f16 on the fallback adapter nor
            // subgroups at all.
            features.remove(wgpu::Features::SUBGROUP);
        }
        check_minimum_limits(&info, &limits)?;
        let f16 = features.contains(wgpu::Features::SHADER_F16) && !opts.no_f16;
        let (required_features, timestamps) = required_features(features, f16, opts.profile);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("dflash"),
                required_features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let lost = record_device_loss(&device);
        let uncaptured = record_uncaptured_errors(&device);
        let unused = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let mut summary = AdapterSummary::of(&info, features, &limits);
        summary.packed_int8_dot = instance
            .wgsl_language_features()
            .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
        let mut tuning = opts.tuning.unwrap_or_else(|| Tuning::for_adapter(&info));
        tuning.gemv_outputs_override = opts.gemv_outputs.or(tuning.gemv_outputs_override);
        tuning.pipelined_decode = opts.pipelined_decode.unwrap_or(tuning.pipelined_decode);
        tuning.fuse_norm = opts.fuse_norm.unwrap_or(tuning.fuse_norm);
        tuning.norm_in_residual = opts.norm_in_residual.unwrap_or(tuning.norm_in_residual);
        tuning.int8_activations = opts.int8_activations.unwrap_or(tuning.int8_activations);
        if tuning.int8_activations {
            if !summary.packed_int8_dot {
                return Err(GpuError::Unsupported(format!(
                    "8-bit activations on {}: no packed_4x8_integer_dot_product in its WGSL",
                    info.name
                )));
            }
            // The quantize kernel takes the norm; a GEMV on 8-bit activations has no
            // split norm's epilogue. Asked for explicitly, the other plans are refused.
            if opts.fuse_norm == Some(false) || opts.norm_in_residual == Some(true) {
                return Err(GpuError::Unsupported(
                    "8-bit activations take the RMSNorm into their quantize kernel: \
                     not with the norm apart (fuse_norm false) or in the residual GEMVs \
                     (norm_in_residual true)"
                        .into(),
                ));
            }
            tuning.fuse_norm = true;
            tuning.norm_in_residual = false;
        }
        // The limit granted to the device (browser_limits caps it at 10).
        tuning.chunked_attention &= device.limits().max_storage_buffers_per_shader_stage
            >= CHUNKED_ATTENTION_STORAGE_BUFFERS;
        Ok(GpuContext {
            device,
            queue,
            summary,
            f16,
            pipelines: Default::default(),
            tuning,
            timestamps,
            unused,
            int8_scratch: Default::default(),
            lost,
            uncaptured,
        })
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(opts: &GpuOptions) -> Result<Self> {
        pollster::block_on(Self::new_async(opts))
    }

    /// Storage buffers a kernel may bind per stage on this device.
    pub fn storage_buffers(&self) -> u32 {
        self.device.limits().max_storage_buffers_per_shader_stage
    }

    /// Values per row of the 8-bit activations' shared scratch (0 before a model on 8-bit
    /// activations reserved it): a model reserves its widest GEMV input when assembled.
    pub fn int8_scratch_cols(&self) -> usize {
        self.int8_scratch.borrow().as_ref().map_or(0, |s| s.cols())
    }

    /// The largest buffer a kernel may bind.
    pub fn max_binding(&self) -> u64 {
        self.summary
            .max_storage_buffer_binding_size
            .min(self.summary.max_buffer_size)
    }

    /// An error if the device was lost or an operation failed outside an error scope.
    pub fn check_lost(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::Poll); // delivers pending callbacks
        if let Some(m) = self.lost.lock().ok().and_then(|g| g.clone()) {
            return Err(GpuError::DeviceLost(m));
        }
        if let Some(e) = self.uncaptured.lock().ok().and_then(|mut g| g.take()) {
            return Err(e);
        }
        Ok(())
    }

    /// An out-of-memory error scope: allocations until `OomScope::close` that the GPU
    /// refuses are reported there (in the browser a failed allocation is reported only
    /// through a scope, never at the call).
    pub fn oom_scope(&self) -> OomScope {
        OomScope(self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory))
    }

    /// Destroys the device (what a driver reset or `GPUDevice.destroy()` does): every
    /// later call answers `DeviceLost`.
    pub fn destroy_device(&self) {
        self.device.destroy();
        if let Ok(mut g) = self.lost.lock() {
            g.get_or_insert_with(|| "device destroyed".into());
        }
    }

    /// A buffer holding `bytes` (padded to 16): created empty, then written through the
    /// queue, which fails softly on a lost device where mapped creation would panic.
    pub fn buffer_with(
        &self,
        label: &str,
        bytes: &[u8],
        usage: wgpu::BufferUsages,
    ) -> wgpu::Buffer {
        let size = (bytes.len().max(16) as u64).div_ceil(16) * 16;
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: usage | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut data = bytes.to_vec();
        data.resize(size as usize, 0);
        self.queue.write_buffer(&b, 0, &data);
        b
    }

    /// Blocks until submitted work is done (native). Device loss is an error, not a hang.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(&self) -> Result<()> {
        self.wait_for(None)
    }

    /// Blocks until submission `index` (None: the last one) has run.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_for(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        self.check_lost()?;
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: index,
                timeout: None,
            })
            .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
        self.check_lost()
    }

    /// Copies `size` bytes of `src` (from `offset`) to the host (native, blocking).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_back(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, offset, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        self.read_mapped(&staging)
    }

    /// Maps a MAP_READ buffer and returns its bytes (native, blocking).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_mapped(&self, staging: &wgpu::Buffer) -> Result<Vec<u8>> {
        pollster::block_on(self.read_mapped_async(staging))
    }

    /// Maps a MAP_READ buffer and returns its bytes once the GPU is done with it. In the
    /// browser the map callback arrives from the event loop and wakes this future;
    /// natively a blocking poll runs it first.
    pub async fn read_mapped_async(&self, staging: &wgpu::Buffer) -> Result<Vec<u8>> {
        self.read_mapped_after(staging, None).await
    }

    /// `read_mapped_async` of a buffer the submission `after` writes last: natively the
    /// wait ends with that submission, not with later ones (work queued behind it keeps
    /// the GPU busy meanwhile); in the browser the map's callback says when.
    pub async fn read_mapped_after(
        &self,
        staging: &wgpu::Buffer,
        after: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<u8>> {
        self.finish_map(self.begin_map(staging, after)).await
    }

    /// Requests the map of a read-back buffer that submission `after` writes last, now:
    /// in the browser a map completes with the work submitted before it was requested,
    /// so requesting it before the next submission lets that one run meanwhile.
    pub fn begin_map(
        &self,
        staging: &wgpu::Buffer,
        after: Option<wgpu::SubmissionIndex>,
    ) -> PendingMap {
        let slot = Arc::new(Mutex::new(MapWait::default()));
        let filler = slot.clone();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            if let Ok(mut g) = filler.lock() {
                g.result = Some(r);
                if let Some(w) = g.waker.take() {
                    w.wake();
                }
            }
        });
        PendingMap {
            staging: staging.clone(),
            slot,
            after,
        }
    }

    /// The bytes of a map `begin_map` requested (the buffer unmapped again).
    pub async fn finish_map(&self, map: PendingMap) -> Result<Vec<u8>> {
        let PendingMap {
            staging,
            slot,
            after,
        } = map;
        #[cfg(not(target_arch = "wasm32"))]
        let r = {
            self.wait_for(after)?;
            slot.lock().ok().and_then(|mut g| g.result.take())
        };
        #[cfg(target_arch = "wasm32")]
        let _ = after;
        #[cfg(target_arch = "wasm32")]
        let r = Some(MapFuture(slot).await);
        match r {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                self.check_lost()?;
                return Err(GpuError::Readback(e.to_string()));
            }
            None => {
                self.check_lost()?;
                return Err(GpuError::Readback("map callback did not run".into()));
            }
        }
        let bytes = staging
            .get_mapped_range(..)
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .to_vec();
        staging.unmap();
        Ok(bytes)
    }
}

/// The adapter whose name contains `opts.adapter` (case-insensitive), else the
/// high-performance one wgpu offers.
async fn pick_adapter(instance: &wgpu::Instance, opts: &GpuOptions) -> Result<wgpu::Adapter> {
    Ok(match &opts.adapter {
        Some(want) => {
            let want_l = want.to_lowercase();
            let all = instance.enumerate_adapters(wgpu::Backends::all()).await;
            let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
            all.into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&want_l))
                .ok_or_else(|| {
                    GpuError::NoAdapter(format!(" named {want:?} (have: {})", names.join(", ")))
                })?
        }
        None => instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::NoAdapter(format!(": {e}")))?,
    })
}

/// The adapter's `limits` reach what every kernel needs at least.
fn check_minimum_limits(info: &wgpu::AdapterInfo, limits: &wgpu::Limits) -> Result<()> {
    if limits.max_compute_invocations_per_workgroup < MIN_INVOCATIONS
        || limits.max_compute_workgroup_storage_size < MIN_WORKGROUP_STORAGE
        || limits.max_storage_buffers_per_shader_stage < MIN_STORAGE_BUFFERS
    {
        return Err(GpuError::Unsupported(format!(
            "needs {MIN_INVOCATIONS} invocations, {MIN_WORKGROUP_STORAGE} bytes of workgroup storage and {MIN_STORAGE_BUFFERS} storage buffers per stage; adapter {} has {}, {}, {}",
            info.name, limits.max_compute_invocations_per_workgroup, limits.max_compute_workgroup_storage_size, limits.max_storage_buffers_per_shader_stage
        )));
    }
    Ok(())
}

/// The features to ask the device for, out of those offered: shader-f16 when used,
/// subgroups where offered, timestamp queries when profiling; and the timestamps granted.
fn required_features(
    features: wgpu::Features,
    f16: bool,
    profile: bool,
) -> (wgpu::Features, Timestamps) {
    let mut required_features = wgpu::Features::empty();
    if f16 {
        required_features |= wgpu::Features::SHADER_F16;
    }
    // Asked for where offered, so subgroup kernel variants can use it; every kernel
    // has a portable version (the browser backend of wgpu never offers it).
    if features.contains(wgpu::Features::SUBGROUP) {
        required_features |= wgpu::Features::SUBGROUP;
    }
    let mut timestamps = Timestamps::None;
    if profile && features.contains(wgpu::Features::TIMESTAMP_QUERY) {
        required_features |= wgpu::Features::TIMESTAMP_QUERY;
        timestamps = Timestamps::Passes;
        let inside = wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        if features.contains(inside) {
            required_features |= inside;
            timestamps = Timestamps::InsidePasses;
        }
    }
    (required_features, timestamps)
}

/// Where the device's loss is recorded, its reason and message (read by `check_lost`).
fn record_device_loss(device: &wgpu::Device) -> Arc<Mutex<Option<String>>> {
    let lost = Arc::new(Mutex::new(None));
    let l2 = lost.clone();
    device.set_device_lost_callback(move |reason, msg| {
        if let Ok(mut g) = l2.lock() {
            *g = Some(format!("{reason:?}: {msg}"));
        }
    });
    lost
}

/// Where the first error outside an error scope is recorded: reported by `check_lost`,
/// never a panic (wgpu's default handler panics).
fn record_uncaptured_errors(device: &wgpu::Device) -> Arc<Mutex<Option<GpuError>>> {
    let uncaptured = Arc::new(Mutex::new(None));
    let u2 = uncaptured.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        if let Ok(mut g) = u2.lock() {
            if g.is_none() {
                *g = Some(match e {
                    wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory(e.to_string()),
                    _ => GpuError::Validation(e.to_string()),
                });
            }
        }
    }));
    uncaptured
}

impl AdapterSummary {
    /// The adapter as reported: its `features` and `limits` after any browser capping.
    fn of(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
        AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            packed_int8_dot: false,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
        }
    }
}

/// A map requested by `GpuContext::begin_map`, awaited by `finish_map`.
pub struct PendingMap {
    staging: wgpu::Buffer,
    slot: Arc<Mutex<MapWait>>,
    after: Option<wgpu::SubmissionIndex>,
}

/// What a buffer-map callback leaves for the future that waits on it.
#[derive(Default)]
struct MapWait {
    result: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    waker: Option<std::task::Waker>,
}

/// Resolves when the map callback has filled the slot.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
struct MapFuture(Arc<Mutex<MapWait>>);

impl std::future::Future for MapFuture {
    type Output = std::result::Result<(), wgpu::BufferAsyncError>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match g.result.take() {
            Some(r) => std::task::Poll::Ready(r),
            None => {
                g.waker = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

/// An open out-of-memory error scope (`GpuContext::oom_scope`). Scopes nest: one opened
/// inside must be closed (or dropped) first.
pub struct OomScope(wgpu::ErrorScopeGuard);

impl OomScope {
    /// Closes the scope: `OutOfMemory` naming `what` if an allocation failed inside it.
    pub async fn close(self, what: &str) -> Result<()> {
        scope_result(what, self.0.pop().await)
    }
}

/// What an error scope caught, as the engine's error: out of memory is `OutOfMemory`,
/// anything else (a scope of another filter) `Validation`.
pub fn scope_result(what: &str, caught: Option<wgpu::Error>) -> Result<()> {
    match caught {
        None => Ok(()),
        Some(e @ wgpu::Error::OutOfMemory { .. }) => {
            Err(GpuError::OutOfMemory(format!("{what}: {e}")))
        }
        Some(e) => Err(GpuError::Validation(format!("{what}: {e}"))),
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

    /// What the browser's out-of-memory scope catches around a load is `OutOfMemory`
    /// (the JS code of the same name), naming the phase.
    #[test]
    fn an_allocation_refused_in_a_scope_is_out_of_memory() {
        assert!(scope_result("x", None).is_ok());
        let oom = wgpu::Error::OutOfMemory {
            source: Box::new(std::io::Error::other("no memory")),
        };
        match scope_result("loading the model", Some(oom)) {
            Err(GpuError::OutOfMemory(m)) => assert!(m.starts_with("loading the model"), "{m}"),
            other => panic!("{:?}", other.err()),
        }
    }
}
