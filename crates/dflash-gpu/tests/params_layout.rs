//! Each typed kernel uniform (`#[repr(C)]` in Rust) has the layout of the WGSL struct it
//! fills: the same member names at the same byte offsets, and the same size, read from
//! the shader by naga (wgpu's own WGSL front end).

use dflash_gpu::ops::{GemvParams, QkvParams};
use dflash_gpu::pipelines::Shader;
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

/// (field name, byte offset) of the named fields of a Rust struct, in order.
macro_rules! fields {
    ($t:ty; $($f:ident),*) => {
        vec![$((stringify!($f).to_string(), offset_of!($t, $f) as u32)),*]
    };
}

#[test]
fn gemv_params_match_the_wgsl_struct() {
    let rust = fields!(GemvParams; n_rows, k, m, out_offset, out_stride, wg_x, eps,
        bias_offset, pair_rows, part_offset, n_parts, pad);
    let (wgsl, span) = wgsl_struct(Shader::Gemv, "Params");
    assert_eq!(wgsl, rust);
    assert_eq!(span as usize, size_of::<GemvParams>());
}

#[test]
fn qkv_params_match_the_wgsl_struct() {
    let rust = fields!(QkvParams; n_rows, n_heads, n_kv_heads, head_dim, rope_dim,
        row_stride, eps, pad);
    let (wgsl, span) = wgsl_struct(Shader::Qkv, "Params");
    assert_eq!(wgsl, rust);
    assert_eq!(span as usize, size_of::<QkvParams>());
}
