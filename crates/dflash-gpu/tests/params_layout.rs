//! Each typed kernel uniform (`#[repr(C)]` in Rust) has the layout of the WGSL struct it
//! fills: the same member names at the same byte offsets, and the same size, read from
//! the shader by naga (wgpu's own WGSL front end).

use dflash_gpu::ops::dp4a::Dp4aParams;
use dflash_gpu::ops::{
    ArgmaxParams, AttentionChunkParams, AttentionParams, ConvParams, CopyParams, DeltaNetParams,
    ElementwiseParams, EmbeddingParams, GemvParams, MoeParams, QkvParams, RmsNormParams,
    RopeParams, SampleParams, ScaleParams, TopKParams, WalkParams,
};
use dflash_gpu::pipelines::Shader;
use dflash_gpu::speculative::BookkeepingParams;
use std::mem::{offset_of, size_of};

/// (member name, byte offset) of struct `name` in the shader, and its size.
fn wgsl_struct(shader: Shader, name: &str) -> (Vec<(String, u32)>, u32) {
    let module = naga::front::wgsl::parse_str(&shader.source(false))
        .unwrap_or_else(|e| panic!("{shader:?}: {e}"));
    for (_, ty) in module.types.iter() {
        if ty.name.as_deref() != Some(name) {
            continue;
        }
        if let naga::TypeInner::Struct { members, span } = &ty.inner {
            let m = members
                .iter()
                .map(|m| (m.name.clone().unwrap_or_default(), m.offset))
                .collect();
            return (m, *span);
        }
    }
    panic!("{shader:?} has no struct {name}");
}

/// Asserts that Rust struct `$t`, whose fields are listed in order, has the members,
/// offsets and size of WGSL struct `$name` of `$shader`.
macro_rules! assert_layout {
    ($shader:expr, $name:expr, $t:ty; $($f:ident),* $(,)?) => {{
        let rust: Vec<(String, u32)> =
            vec![$((stringify!($f).to_string(), offset_of!($t, $f) as u32)),*];
        let (wgsl, span) = wgsl_struct($shader, $name);
        assert_eq!(wgsl, rust, "{:?} {}", $shader, $name);
        assert_eq!(span as usize, size_of::<$t>(), "{:?} {}", $shader, $name);
    }};
}

#[test]
fn gemv_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Gemv, "Params", GemvParams; n_rows, k, m, out_offset,
        out_stride, wg_x, eps, bias_offset, pair_rows, part_offset, n_parts, tap_offset,
        tap_stride, expert_lo, zero, norm_parts);
}

#[test]
fn gemv_dp4a_params_match_the_wgsl_struct() {
    assert_layout!(Shader::GemvDp4a, "Params", Dp4aParams; n_rows, k, m, out_offset,
        out_stride, wg_x, eps, bias_offset, pair_rows, tap_offset, tap_stride, pad);
}

#[test]
fn delta_net_params_match_the_wgsl_struct() {
    assert_layout!(Shader::DeltaNet, "Params", DeltaNetParams; n_rows, conv_dim, kernel,
        proj_stride, key_heads, value_heads, key_head_dim, value_head_dim, eps, tiled, pad1,
        pad2);
}

#[test]
fn moe_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Moe, "Params", MoeParams; n_rows, n_experts, normalize, hidden,
        tap_offset, tap_stride, pad0, pad1);
}

#[test]
fn qkv_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Qkv, "Params", QkvParams; n_rows, n_heads, n_kv_heads,
        head_dim, rope_dim, row_stride, eps, pad);
}

#[test]
fn argmax_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Argmax, "Params", ArgmaxParams; len, stride, out_offset, top);
}

#[test]
fn embedding_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Embedding, "Params", EmbeddingParams; n_rows, cols, row_lo,
        row_hi);
}

#[test]
fn rmsnorm_params_match_the_wgsl_struct() {
    assert_layout!(Shader::RmsNorm, "Params", RmsNormParams; len, eps);
}

#[test]
fn rope_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Rope, "Params", RopeParams; n_rows, n_heads, head_dim,
        rope_dim, row_stride, col_offset);
}

#[test]
fn elementwise_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Elementwise, "Params", ElementwiseParams; n_rows, len,
        src_stride, dst_stride, src_offset, dst_offset, use_state, pad);
}

#[test]
fn copy_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Copy, "Params", CopyParams; n, wg_x);
}

/// The sampler's uniform is read by sample.wgsl and by dflash2.wgsl's walk.
#[test]
fn sample_params_match_the_wgsl_structs() {
    for (shader, name) in [
        (Shader::Sample, "Params"),
        (Shader::DFlash2, "SampleParams"),
    ] {
        assert_layout!(shader, name, SampleParams; len, stride, top_k, pos_offset,
            inv_temp, top_p, min_p, seed_lo, seed_hi, out_offset, pad0, pad1);
    }
}

#[test]
fn bookkeeping_params_match_the_wgsl_struct() {
    assert_layout!(Shader::DFlash, "Params", BookkeepingParams; block, mask, host_drafts,
        keep_context);
}

#[test]
fn dflash2_params_match_the_wgsl_structs() {
    assert_layout!(Shader::DFlash2, "ScaleParams", ScaleParams; n, scale);
    assert_layout!(Shader::DFlash2, "ConvParams", ConvParams; n_rows, hidden, taps, group,
        coef_stride, coef_offset, base_offset, accumulate);
    assert_layout!(Shader::DFlash2, "TopKParams", TopKParams; vocab, stride, k, first_row,
        multiplier, cap);
    assert_layout!(Shader::DFlash2, "WalkParams", WalkParams; slots, k, rank, hp_first,
        sampled);
}

#[test]
fn attention_params_match_the_wgsl_struct() {
    assert_layout!(Shader::Attention, "Params", AttentionParams; n_rows, n_heads, group,
        head_dim, kv_dim, q_stride, scale, window, causal, pad0, pad1, pad2);
}

#[test]
fn chunked_attention_params_match_the_wgsl_struct() {
    assert_layout!(Shader::AttentionChunks, "Params", AttentionChunkParams; n_rows, n_heads,
        n_kv_heads, head_dim, rope_dim, row_stride, chunk, n_chunks, window, causal, scale, eps);
}

/// Storage buffers each entry point of `shader` binds (those its code reaches, which is
/// what an automatic pipeline layout holds, whatever the override constants say).
fn storage_buffers_by_entry(shader: Shader) -> Vec<(String, usize)> {
    let module = naga::front::wgsl::parse_str(&shader.source(false)).unwrap();
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{shader:?}: {e:?}"));
    let storage: Vec<_> = module
        .global_variables
        .iter()
        .filter(|(_, g)| matches!(g.space, naga::AddressSpace::Storage { .. }))
        .map(|(h, _)| h)
        .collect();
    (module.entry_points.iter().enumerate())
        .map(|(i, ep)| {
            let uses = info.get_entry_point(i);
            let n = storage.iter().filter(|&&h| !uses[h].is_empty()).count();
            (ep.name.clone(), n)
        })
        .collect()
}

/// Every GEMV entry binds at most WebGPU's default 8 storage buffers (the engine's
/// floor), but the residual GEMV with both a tap and the next norm's share, which binds
/// the 9 its plan checks for.
#[test]
fn gemv_entries_stay_within_the_storage_buffers_the_engine_asks_for() {
    use dflash_gpu::context::{MIN_STORAGE_BUFFERS, TAP_NORM_OUT_STORAGE_BUFFERS};
    let entries = storage_buffers_by_entry(Shader::Gemv);
    assert_eq!(entries.len(), 6, "{entries:?}");
    for (name, n) in entries {
        let limit = match name.as_str() {
            "main_tap_norm_out" => TAP_NORM_OUT_STORAGE_BUFFERS,
            _ => MIN_STORAGE_BUFFERS,
        };
        assert!(n <= limit as usize, "{name} binds {n} > {limit}");
    }
}
