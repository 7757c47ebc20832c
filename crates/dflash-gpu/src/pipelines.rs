//! Every GPU op has the same shape: a WGSL source file of `shaders/`, an entry point,
//! override constants (a `Kernel`: kernel.rs, re-exported here with `Shader` and the
//! kernels' sizes), its bindings and a dispatch size. Pipelines are compiled once and
//! cached by a key made of all of these (`Pipelines`, the device's cache in context.rs);
//! bind groups are built once per plan (`Dispatch`).

pub use crate::context::Pipelines;
pub(crate) use crate::kernel::bindings;
pub use crate::kernel::{Bindings, Kernel, Shader, MAX_ROWS, WORKGROUP_SIZE};

use crate::context::{check_scope, GpuContext};
use crate::error::Result;
use std::rc::Rc;

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
