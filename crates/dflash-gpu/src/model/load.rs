//! Making a `GpuModel`: its weights uploaded (or already on the GPU, or shared with
//! another model), its KV caches, RoPE table and activations allocated around them.

use super::activations::Activations;
use super::memory_plan::{
    int8_scratch_cols, kv_bytes, plan_buffers, plan_memory, GpuModelOptions, MemoryPlan,
};
use super::weights::{gpu_ffn, gpu_mixer, gpu_weight_bytes, upload_weight, GpuLayer, GpuWeights};
use super::GpuModel;
use crate::blocks::GpuDeltaNet;
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops;
use crate::upload::{f32_buffer, storage_buffer, work_buffer, GpuMatrix};
use dflash_core::config::ModelConfig;
use dflash_core::cpu::ops::rope_cos_sin;
use dflash_core::weights::ModelWeights;
use std::collections::HashMap;
use std::rc::Rc;

/// (cos, sin) of every rotary frequency of `c` at each of `context` positions.
fn rope_table(c: &ModelConfig, context: usize) -> Vec<f32> {
    let inv = c.rope_inv_freq();
    let mut table = Vec::with_capacity(context * inv.len() * 2);
    for pos in 0..context {
        for &f in &inv {
            let (cs, sn) = rope_cos_sin(pos, f);
            table.push(cs);
            table.push(sn);
        }
    }
    table
}

impl GpuModel {
    pub fn new(ctx: Rc<GpuContext>, w: &ModelWeights, opts: &GpuModelOptions) -> Result<Self> {
        let opts = Self::checked_options(&w.config, opts)?;
        let memory = plan_memory(&ctx, w, &opts)?;
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let gw = w.try_map(
            |name, m| upload_weight(&ctx, &w.config, name, m),
            |name, v| Ok::<_, GpuError>(f32_buffer(&ctx, name, v)),
        )?;
        let model = Self::assemble(ctx, gw, &opts, memory)?;
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::OutOfMemory(format!("model buffers: {e}")));
        }
        #[cfg(target_arch = "wasm32")]
        drop(scope);
        model.ctx.check_lost()?;
        Ok(model)
    }

    /// A model whose weights are already on the GPU (streamed in by `StreamLoader`).
    pub fn from_gpu_weights(
        ctx: Rc<GpuContext>,
        w: GpuWeights,
        opts: &GpuModelOptions,
    ) -> Result<Self> {
        let opts = Self::checked_options(&w.config, opts)?;
        let memory = plan_buffers(&ctx, &w.config, gpu_weight_bytes(&w), &opts)?;
        let model = Self::assemble(ctx, w, &opts, memory)?;
        model.ctx.check_lost()?;
        Ok(model)
    }

    pub(crate) fn checked_options(
        c: &ModelConfig,
        opts: &GpuModelOptions,
    ) -> Result<GpuModelOptions> {
        if let Some(&bad) = opts.taps.iter().find(|&&t| t >= c.num_layers) {
            return Err(GpuError::Core(dflash_core::Error::BadConfig(format!(
                "tap layer {bad} >= {} layers",
                c.num_layers
            ))));
        }
        if c.head_dim > 256 {
            return Err(GpuError::Unsupported(format!(
                "head_dim {} > 256",
                c.head_dim
            )));
        }
        let context = opts.context.min(c.max_position_embeddings).max(1);
        Ok(GpuModelOptions {
            context,
            ..opts.clone()
        })
    }

    /// KV cache, RoPE table and activations around uploaded weights.
    fn assemble(
        ctx: Rc<GpuContext>,
        w: GpuWeights,
        opts: &GpuModelOptions,
        memory: MemoryPlan,
    ) -> Result<Self> {
        let c = w.config.clone();
        let kvb = kv_bytes(&c, opts.context, ctx.f16);
        let mut layers = Vec::with_capacity(c.num_layers);
        for (i, l) in w.layers.into_iter().enumerate() {
            let (qkv, wo, qk_norm, delta_net) = gpu_mixer(&ctx, &c, i, l.mixer);
            // A linear layer has no KV cache.
            let kv = if delta_net.is_some() { 16 } else { kvb };
            layers.push(GpuLayer {
                attn_norm: l.attn_norm,
                ffn_norm: l.ffn_norm,
                qkv,
                delta_net,
                wo,
                ffn: gpu_ffn(&ctx, &c, i, l.ffn),
                qk_norm,
                k_cache: work_buffer(&ctx, &format!("k_cache.{i}"), kv),
                v_cache: work_buffer(&ctx, &format!("v_cache.{i}"), kv),
            });
        }
        let head = (w.embed, w.lm_head, w.norm);
        Self::around_layers(ctx, c, head, layers, opts, memory)
    }

    /// A second model over this one's weight buffers (shared, not copied: the stacked
    /// matrices too), with its own KV cache, activations, taps and plans; its memory
    /// plan counts no weights.
    pub fn sharing_weights(&self, opts: &GpuModelOptions) -> Result<Self> {
        let opts = Self::checked_options(&self.config, opts)?;
        let memory = plan_buffers(&self.ctx, &self.config, 0, &opts)?;
        let kvb = kv_bytes(&self.config, opts.context, self.ctx.f16);
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| GpuLayer {
                attn_norm: l.attn_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                qkv: l.qkv.clone(),
                delta_net: l.delta_net.as_ref().map(|dn| GpuDeltaNet {
                    conv_w: dn.conv_w.clone(),
                    dt_bias: dn.dt_bias.clone(),
                    decay: dn.decay.clone(),
                    norm_w: dn.norm_w.clone(),
                    ..GpuDeltaNet::states(&self.ctx, dn.shape)
                }),
                wo: l.wo.clone(),
                ffn: l.ffn.clone(),
                qk_norm: l.qk_norm.clone(),
                k_cache: work_buffer(&self.ctx, &format!("k_cache.{i}"), kvb),
                v_cache: work_buffer(&self.ctx, &format!("v_cache.{i}"), kvb),
            })
            .collect();
        let head = (
            self.embed.clone(),
            self.lm_head.clone(),
            self.out_norm.clone(),
        );
        let config = self.config.clone();
        let model = Self::around_layers(self.ctx.clone(), config, head, layers, &opts, memory)?;
        model.ctx.check_lost()?;
        Ok(model)
    }

    /// The RoPE table, activations and state around a model's layers and head
    /// (embedding, lm_head, final norm).
    fn around_layers(
        ctx: Rc<GpuContext>,
        c: ModelConfig,
        head: (GpuMatrix, Option<GpuMatrix>, wgpu::Buffer),
        layers: Vec<GpuLayer>,
        opts: &GpuModelOptions,
        memory: MemoryPlan,
    ) -> Result<Self> {
        let context = opts.context;
        let table = rope_table(&c, context);
        let act = Activations::new(&ctx, &c, context, opts.taps.len());
        if ctx.tuning.int8_activations {
            ops::dp4a::reserve_scratch(&ctx, int8_scratch_cols(&c, opts.taps.len()));
        }
        Ok(GpuModel {
            embed: head.0,
            lm_head: head.1,
            out_norm: head.2,
            rope_table: storage_buffer(&ctx, "rope_table", bytemuck::cast_slice(&table)),
            layers,
            act,
            plans: HashMap::new(),
            len: 0,
            kv_ids: Vec::new(),
            drafted: 0,
            states_lost: false,
            memory,
            context,
            taps: opts.taps.clone(),
            config: c,
            ctx,
        })
    }
}
