//! Every GPU op has the same shape: a WGSL source file of `shaders/`, an entry point,
//! override constants, its bindings and a dispatch size. Pipelines are compiled once and
//! cached by a key made of all of these; bind groups are built once per plan.

use crate::context::GpuContext;
use crate::error::Result;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The op families, one WGSL file each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shader {
    Gemv,
    /// The 8-bit-activation GEMV (integer dot products): adapters with WGSL's
    /// `packed_4x8_integer_dot_product` only (`AdapterSummary::packed_int8_dot`).
    GemvDp4a,
    Embedding,
    RmsNorm,
    Rope,
    Attention,
    AttentionChunks,
    Qkv,
    Elementwise,
    Argmax,
    Sample,
    Copy,
    DFlash,
    DFlash2,
    Moe,
    DeltaNet,
}

/// The workgroup size of every kernel but the single-thread ones: WGSL's `WG`, which
/// `Shader::source` defines from this, and the dispatch sizes of `ops` divide by it.
pub const WORKGROUP_SIZE: u32 = 64;
// The kernels' per-thread arrays are sized for 64 threads (attention's 4 head dims per
// thread for head_dim <= 256, chunked attention's, gemv's workgroup memory within the
// browser's 16 KiB): another size needs them resized first.
const _: () = assert!(WORKGROUP_SIZE == 64);

const COMMON: &str = include_str!("../../../shaders/common.wgsl");
const QUANT: &str = include_str!("../../../shaders/quant.wgsl");
const RANDOM: &str = include_str!("../../../shaders/random.wgsl");

impl Shader {
    /// Every shader that every adapter compiles (`GemvDp4a` needs a WGSL extension).
    pub const ALL: [Shader; 15] = [
        Shader::Qkv,
        Shader::DFlash,
        Shader::DFlash2,
        Shader::Gemv,
        Shader::Embedding,
        Shader::RmsNorm,
        Shader::Rope,
        Shader::Attention,
        Shader::AttentionChunks,
        Shader::Elementwise,
        Shader::Argmax,
        Shader::Sample,
        Shader::Copy,
        Shader::Moe,
        Shader::DeltaNet,
    ];

    fn body(self) -> &'static str {
        match self {
            Shader::Gemv => include_str!("../../../shaders/gemv.wgsl"),
            Shader::GemvDp4a => include_str!("../../../shaders/gemv_dp4a.wgsl"),
            Shader::Embedding => include_str!("../../../shaders/embedding.wgsl"),
            Shader::RmsNorm => include_str!("../../../shaders/rmsnorm.wgsl"),
            Shader::Rope => include_str!("../../../shaders/rope.wgsl"),
            Shader::Attention => include_str!("../../../shaders/attention.wgsl"),
            Shader::AttentionChunks => include_str!("../../../shaders/attention_chunks.wgsl"),
            Shader::Qkv => include_str!("../../../shaders/qkv.wgsl"),
            Shader::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            Shader::Argmax => include_str!("../../../shaders/argmax.wgsl"),
            Shader::Sample => include_str!("../../../shaders/sample.wgsl"),
            Shader::Copy => include_str!("../../../shaders/copy.wgsl"),
            Shader::DFlash => include_str!("../../../shaders/dflash.wgsl"),
            Shader::DFlash2 => include_str!("../../../shaders/dflash2.wgsl"),
            Shader::Moe => include_str!("../../../shaders/moe.wgsl"),
            Shader::DeltaNet => include_str!("../../../shaders/delta_net.wgsl"),
        }
    }

    /// The full WGSL: a prelude (f16 enable and the KV element type where used, `WG`
    /// and the workgroup reductions of `common.wgsl`), the op's file, and the shared
    /// quantized-weight and random helpers where used.
    pub fn source(self, f16: bool) -> String {
        let mut s = String::new();
        if self == Shader::GemvDp4a {
            s.push_str("requires packed_4x8_integer_dot_product;\n");
        }
        if matches!(
            self,
            Shader::Attention | Shader::AttentionChunks | Shader::Elementwise | Shader::Qkv
        ) {
            s.push_str(if f16 {
                "enable f16;\nalias kv_t = f16;\n"
            } else {
                "alias kv_t = f32;\n"
            });
        }
        s.push_str(&format!("const WG: u32 = {WORKGROUP_SIZE}u;\n"));
        s.push_str(COMMON);
        s.push('\n');
        s.push_str(self.body());
        if matches!(self, Shader::Gemv | Shader::GemvDp4a | Shader::Embedding) {
            s.push('\n');
            s.push_str(QUANT);
        }
        if matches!(self, Shader::Sample | Shader::DFlash2) {
            s.push('\n');
            s.push_str(RANDOM);
        }
        s
    }
}

/// One kernel variant: shader, entry point and override constants.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub shader: Shader,
    pub entry: &'static str,
    pub constants: Vec<(&'static str, f64)>,
}

impl Kernel {
    pub fn new(shader: Shader, entry: &'static str) -> Self {
        Kernel {
            shader,
            entry,
            constants: vec![],
        }
    }
    pub fn with(mut self, name: &'static str, v: f64) -> Self {
        self.constants.push((name, v));
        self
    }
    pub fn key(&self, f16: bool) -> String {
        format!(
            "{:?}/{}/{:?}/f16={f16}",
            self.shader, self.entry, self.constants
        )
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

fn check_scope(scope: wgpu::ErrorScopeGuard) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(crate::error::GpuError::Validation(e.to_string()));
    }
    #[cfg(target_arch = "wasm32")]
    drop(scope);
    Ok(())
}

/// What a dispatch is, for the profiler: its op family, its shape in words, and the
/// bytes it is modelled to move (read + written, each unique byte once).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpLabel {
    pub family: String,
    pub shape: String,
    pub bytes: u64,
    /// Bytes moved per visible key (attention: the K and V rows), added by the profiler
    /// at the position it runs.
    pub bytes_per_key: u64,
}

/// `params` of a kernel without a uniform at binding 0.
pub const NO_PARAMS: Option<&()> = None;

/// A recorded dispatch: pipeline, bind group (built once) and workgroup counts.
pub struct Dispatch {
    pub pipeline: Rc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub groups: [u32; 3],
    pub label: OpLabel,
    /// Kept alive with the bind group.
    pub _uniform: Option<wgpu::Buffer>,
}

impl Dispatch {
    /// Builds a dispatch: `params` (the kernel's typed uniform, `ops::*Params`) go into a
    /// uniform buffer at binding 0 (when given), `bufs` are (binding, buffer) pairs.
    pub fn new<P: bytemuck::Pod>(
        ctx: &GpuContext,
        k: &Kernel,
        params: Option<&P>,
        bufs: &[(u32, &wgpu::Buffer)],
        groups: [u32; 3],
    ) -> Result<Dispatch> {
        let pipeline = ctx.pipelines.get(ctx, k)?;
        let uniform = params.map(|p| {
            // Zero-padded to a multiple of 16 bytes.
            let mut data = bytemuck::bytes_of(p).to_vec();
            data.resize(data.len().next_multiple_of(16), 0);
            ctx.buffer_with("params", &data, wgpu::BufferUsages::UNIFORM)
        });
        let mut entries: Vec<wgpu::BindGroupEntry> = Vec::new();
        if let Some(u) = &uniform {
            entries.push(wgpu::BindGroupEntry {
                binding: 0,
                resource: u.as_entire_binding(),
            });
        }
        for (b, buf) in bufs {
            entries.push(wgpu::BindGroupEntry {
                binding: *b,
                resource: buf.as_entire_binding(),
            });
        }
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        check_scope(scope)?;
        let family = if k.entry == "main" {
            format!("{:?}", k.shader).to_lowercase()
        } else {
            k.entry.to_string()
        };
        Ok(Dispatch {
            pipeline,
            bind_group,
            groups,
            label: OpLabel {
                family,
                ..Default::default()
            },
            _uniform: uniform,
        })
    }

    /// The same dispatch with its shape and modelled bytes stated.
    pub fn shaped(mut self, shape: impl Into<String>, bytes: u64) -> Self {
        self.label.shape = shape.into();
        self.label.bytes = bytes;
        self
    }

    /// The same dispatch under another op family name.
    pub fn family(mut self, family: impl Into<String>) -> Self {
        self.label.family = family.into();
        self
    }

    pub fn encode(&self, pass: &mut wgpu::ComputePass) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// Splits `n` workgroups into a grid whose x stays under the 65535 limit: (x, y).
pub fn grid(n: u32) -> (u32, u32) {
    if n <= 65535 {
        (n.max(1), 1)
    } else {
        (65535, n.div_ceil(65535))
    }
}
