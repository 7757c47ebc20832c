//! Adapter and device set-up: asks for shader-f16 where offered, states the limits it
//! runs with, and watches for device loss.

use crate::error::{GpuError, Result};
use crate::int8_scratch::Int8Scratch;
use crate::kernel::{Kernel, Shader};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

pub use crate::tuning::{GemvLanes, Tuning, MAX_GEMV_OUTPUTS};

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

pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
    /// Whether kernels use f16 storage (KV cache).
    pub f16: bool,
    /// Compiled pipelines, shared by every model on this device.
    pub pipelines: Pipelines,
    pub tuning: Tuning,
    /// Timestamp queries granted (only when `GpuOptions::profile` asked for them).
    pub timestamps: Timestamps,
    /// A small read-only storage buffer bound where a kernel variant leaves a binding
    /// unused (its layout still names it).
    pub unused: wgpu::Buffer,
    /// The 8-bit activations every GEMV on them shares (`ops::dp4a::QuantizedActivations::scratch`).
    pub(crate) int8_scratch: std::cell::RefCell<Option<Int8Scratch>>,
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

/// The pipeline cache.
#[derive(Default)]
pub struct Pipelines {
    modules: RefCell<HashMap<Shader, Rc<wgpu::ShaderModule>>>,
    pipelines: RefCell<HashMap<String, Rc<wgpu::ComputePipeline>>>,
}

impl Pipelines {
    pub fn get(&self, ctx: &GpuContext, k: &Kernel) -> Result<Rc<wgpu::ComputePipeline>> {
        ctx.check_lost()?;
        let key = k.key(ctx.f16);
        if let Some(p) = self.pipelines.borrow().get(&key) {
            return Ok(p.clone());
        }
        let module = self.module(ctx, k.shader)?;
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let p = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&key),
                layout: None,
                module: &module,
                entry_point: Some(k.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &k.constants,
                    ..Default::default()
                },
                cache: None,
            });
        check_scope(scope)?;
        let p = Rc::new(p);
        self.pipelines.borrow_mut().insert(key, p.clone());
        Ok(p)
    }

    fn module(&self, ctx: &GpuContext, s: Shader) -> Result<Rc<wgpu::ShaderModule>> {
        if let Some(m) = self.modules.borrow().get(&s) {
            return Ok(m.clone());
        }
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let m = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&format!("{s:?}")),
                source: wgpu::ShaderSource::Wgsl(s.source(ctx.f16).into()),
            });
        check_scope(scope)?;
        let m = Rc::new(m);
        self.modules.borrow_mut().insert(s, m.clone());
        Ok(m)
    }

    pub fn len(&self) -> usize {
        self.pipelines.borrow().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub(crate) fn check_scope(scope: wgpu::ErrorScopeGuard) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(crate::error::GpuError::Validation(e.to_string()));
    }
    #[cfg(target_arch = "wasm32")]
    drop(scope);
    Ok(())
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
