//! The dispatches of every op, built the same way: kernel (shader, entry, constants),
//! uniform parameters, bindings, workgroup counts. The model's plans and the op tests
//! use these same builders, one file per kernel family under `ops/`, each re-exported
//! here (`ops::gemv_fused`, `ops::GemvParams`, ...).
//!
//! Each kernel's uniform is a `#[repr(C)]` struct named and laid out as the WGSL struct
//! it fills (`*Params`; tests/params_layout.rs checks names, offsets and sizes against
//! the shaders with naga). Bindings are `(index, buffer)` pairs written once, in the one
//! builder that binds the kernel, each index named by its family's `*Binding` constant:
//! the WGSL variable's name in upper case (`GemvBinding::X` is gemv.wgsl's `x`;
//! tests/bindings.rs checks every name and index against the shaders with naga).
//! `Dispatch::new` fails on an index the entry point does not bind, and the op tests
//! check what each kernel computes.

mod argmax;
mod attention;
mod copy;
mod delta_net;
mod dflash2;
pub mod dp4a;
mod elementwise;
mod gemv;
mod gemv_fusion;
mod moe;
mod norm_rope;
mod sample;

pub use argmax::{argmax, argmax_reduce, logprobs, ArgmaxBinding, ArgmaxParams, LOGPROB_TOP};
pub use attention::{
    attention, attention_chunked, attention_chunking, attention_heads_per_workgroup,
    attention_partial_bytes, attention_row_tile, qkv_rope_store, AttentionBinding,
    AttentionChunkBinding, AttentionChunkParams, AttentionParams, AttentionShape,
    ChunkedAttentionBuffers, QkvBinding, QkvBuffers, QkvParams, QkvShape, MAX_ATTENTION_CHUNKS,
};
pub use copy::{copy, submit, CopyBinding, CopyParams};
pub use delta_net::{
    delta_net, delta_net_states, DeltaNetBinding, DeltaNetBuffers, DeltaNetParams, DeltaNetShape,
};
pub use dflash2::{
    grouped_conv, scale, selector_walk, top_k, ConvParams, ConvShape, DFlash2Binding, ScaleParams,
    TopKParams, WalkBuffers, WalkParams,
};
pub use elementwise::{
    add_bias, copy_rows, mask_bytes, mask_logits, sigmoid_gate, store_kv, swiglu,
    ElementwiseBinding, ElementwiseParams,
};
pub use gemv::{gemv, gemv_f32_activations, gemv_fused, greedy_head, GemvBinding, GemvParams};
pub use gemv_fusion::{
    argmax_parts, gemv_lanes, gemv_outputs, gemv_rows_per_workgroup, gemv_threads, norm_out_parts,
    prenorm_bytes, shape_name, GemvFusion, GemvTap, NormOut, Prenormed,
};
pub use moe::{combine_experts, gemv_experts, route_experts, ExpertShape, MoeBinding, MoeParams};
pub use norm_rope::{
    embedding, rmsnorm, rmsnorm_inplace, rope, EmbeddingBinding, EmbeddingParams, RmsNormBinding,
    RmsNormParams, RopeBinding, RopeParams, RopeShape,
};
pub use sample::{
    sample, sample_params, sample_scratch_bytes, verify_rejection, RejectionBuffers, SampleBinding,
    SampleBuffers, SampleParams, SampleScratch, SAMPLE_CHUNK,
};
