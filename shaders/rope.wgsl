// RoPE in place on rows of heads, at absolute positions state[0] + row. The cos/sin
// table [context, rope_dim/2] is computed once on the host, identically to the CPU
// reference, so GPU and CPU rotate by the same numbers.
// STYLE 0: interleaved pairs (2i, 2i+1) (llama GGUF); 1: neox pairs (i, i + rope_dim/2).

override STYLE: u32 = 1u;

struct Params {
    n_rows: u32,
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    row_stride: u32, // floats per row of buf
    col_offset: u32, // first float of the heads inside a row
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>; // (cos, sin)
@group(0) @binding(3) var<storage, read_write> buf: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.rope_dim / 2u;
    let i = gid.x % half;
    let h = gid.x / half;
    let r = gid.y;
    if (h >= p.n_heads || r >= p.n_rows) {
        return;
    }
    let pos = state[0] + r;
    let cs = table[pos * half + i];
    let base = r * p.row_stride + p.col_offset + h * p.head_dim;
    var a = base + i;
    var b = base + i + half;
    if (STYLE == 0u) {
        a = base + 2u * i;
        b = a + 1u;
    }
    let x0 = buf[a];
    let x1 = buf[b];
    buf[a] = x0 * cs.x - x1 * cs.y;
    buf[b] = x0 * cs.y + x1 * cs.x;
}
