//! What a kernel is, before any device: the WGSL of each op family (`Shader`), one
//! variant of it (`Kernel`: entry point and override constants, whose key names its
//! compiled pipeline) and the sizes every kernel is written for (`WORKGROUP_SIZE`,
//! `MAX_ROWS`).

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

/// Rows one pass computes at most: the small-N GEMV keeps this many accumulators.
pub const MAX_ROWS: usize = 16;

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

/// A kernel family's `@binding` indices, each named as the WGSL variable it binds, in
/// upper case (`ops::GemvBinding::X` is gemv.wgsl's `x`): what the builders of `ops`
/// pair their buffers with. tests/bindings.rs checks every name and index against the
/// shader with naga.
pub trait Bindings {
    /// The shader whose bindings these are.
    const SHADER: Shader;
    /// Each binding as (name, index).
    const ALL: &'static [(&'static str, u32)];
}

/// Declares a kernel family's bindings: a unit struct with a `u32` constant per binding
/// and its `Bindings`.
macro_rules! bindings {
    ($(#[$doc:meta])* $name:ident($shader:ident) { $($var:ident = $n:literal),* $(,)? }) => {
        $(#[$doc])*
        pub struct $name;

        impl $name {
            $(pub const $var: u32 = $n;)*
        }

        impl $crate::kernel::Bindings for $name {
            const SHADER: $crate::kernel::Shader = $crate::kernel::Shader::$shader;
            const ALL: &'static [(&'static str, u32)] = &[$((stringify!($var), $n)),*];
        }
    };
}
pub(crate) use bindings;

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
