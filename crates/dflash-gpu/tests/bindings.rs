//! Each named binding index (`ops::*Binding`, listed by its `Bindings::ALL`) is the
//! `@binding` of the WGSL variable of that name in its shader, read by naga (wgpu's own
//! WGSL front end), and that variable a buffer (storage or uniform: what `Dispatch`
//! binds). And every binding of the shader but its uniform at 0 has its name, so that
//! no builder pairs a buffer with a bare index.

use dflash_gpu::ops::dp4a::Dp4aBinding;
use dflash_gpu::ops::{
    ArgmaxBinding, AttentionBinding, AttentionChunkBinding, CopyBinding, DFlash2Binding,
    DeltaNetBinding, ElementwiseBinding, EmbeddingBinding, GemvBinding, MoeBinding, QkvBinding,
    RmsNormBinding, RopeBinding, SampleBinding,
};
use dflash_gpu::pipelines::{Bindings, Shader};

/// (name, index) of each `@group(0)` variable of the shader, every one a buffer.
fn wgsl_bindings(shader: Shader) -> Vec<(String, u32)> {
    let module = naga::front::wgsl::parse_str(&shader.source(false))
        .unwrap_or_else(|e| panic!("{shader:?}: {e}"));
    module
        .global_variables
        .iter()
        .filter_map(|(_, g)| {
            let b = g.binding.as_ref()?;
            assert_eq!(b.group, 0, "{shader:?} {:?}", g.name);
            let buffer = matches!(
                g.space,
                naga::AddressSpace::Uniform | naga::AddressSpace::Storage { .. }
            );
            assert!(buffer, "{shader:?} {:?}: {:?}", g.name, g.space);
            Some((g.name.clone().unwrap_or_default(), b.binding))
        })
        .collect()
}

fn check<B: Bindings>() {
    let shader = B::SHADER;
    let wgsl = wgsl_bindings(shader);
    for &(name, index) in B::ALL {
        let wanted = name.to_lowercase();
        let Some((_, at)) = wgsl.iter().find(|(n, _)| *n == wanted) else {
            panic!("{shader:?} has no binding named {wanted}");
        };
        assert_eq!(*at, index, "{shader:?} {wanted}");
    }
    for (name, index) in wgsl.iter().filter(|(_, i)| *i != 0) {
        let upper = name.to_uppercase();
        assert!(
            B::ALL.contains(&(upper.as_str(), *index)),
            "{shader:?} binds {name} at {index}, not named in Rust"
        );
    }
}

#[test]
fn every_named_binding_is_the_shaders() {
    check::<GemvBinding>();
    check::<Dp4aBinding>();
    check::<ArgmaxBinding>();
    check::<QkvBinding>();
    check::<AttentionBinding>();
    check::<AttentionChunkBinding>();
    check::<EmbeddingBinding>();
    check::<RmsNormBinding>();
    check::<RopeBinding>();
    check::<ElementwiseBinding>();
    check::<SampleBinding>();
    check::<CopyBinding>();
    check::<DFlash2Binding>();
    check::<MoeBinding>();
    check::<DeltaNetBinding>();
}

/// Each shader of `ops` has its bindings named (dflash.wgsl is the speculative step's
/// bookkeeping, bound in `speculative`).
#[test]
fn every_ops_shader_has_named_bindings() {
    let named = [
        GemvBinding::SHADER,
        Dp4aBinding::SHADER,
        ArgmaxBinding::SHADER,
        QkvBinding::SHADER,
        AttentionBinding::SHADER,
        AttentionChunkBinding::SHADER,
        EmbeddingBinding::SHADER,
        RmsNormBinding::SHADER,
        RopeBinding::SHADER,
        ElementwiseBinding::SHADER,
        SampleBinding::SHADER,
        CopyBinding::SHADER,
        DFlash2Binding::SHADER,
        MoeBinding::SHADER,
        DeltaNetBinding::SHADER,
    ];
    for s in Shader::ALL.into_iter().chain([Shader::GemvDp4a]) {
        assert!(
            s == Shader::DFlash || named.contains(&s),
            "{s:?} has no named bindings"
        );
    }
}
