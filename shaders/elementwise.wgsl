// Element-wise ops over rows: SwiGLU, bias add, and row copies (KV-cache stores at the
// positions in `state`, hidden-state taps).

struct Params {
    n_rows: u32,
    len: u32,        // elements per row
    src_stride: u32,
    dst_stride: u32,
    src_offset: u32,
    dst_offset: u32,
    use_state: u32,  // 1: destination row = state[0] + row
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> kv_out: array<kv_t>;

// out[r, i] = silu(a[r, i]) * b[r, i]
@compute @workgroup_size(WG)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.len || r >= p.n_rows) {
        return;
    }
    let k = r * p.len + i;
    let g = a[k];
    out[k] = (g / (1.0 + exp(-g))) * b[k];
}

// out[r, dst_offset + i] += a[i]  (bias of row length len, rows of dst_stride)
@compute @workgroup_size(WG)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.len || r >= p.n_rows) {
        return;
    }
    let k = r * p.dst_stride + p.dst_offset + i;
    out[k] = out[k] + a[i];
}

// out[r, i] *= sigmoid(a[r, src_offset + i])  (attention's output gate, rows of len)
@compute @workgroup_size(WG)
fn sigmoid_gate(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.len || r >= p.n_rows) {
        return;
    }
    let k = r * p.len + i;
    out[k] = out[k] * (1.0 / (1.0 + exp(-a[r * p.src_stride + p.src_offset + i])));
}

// out[dst_row, dst_offset + i] = a[r, src_offset + i]
@compute @workgroup_size(WG)
fn copy_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.len || r >= p.n_rows) {
        return;
    }
    var dr = r;
    if (p.use_state == 1u) {
        dr = state[0] + r;
    }
    out[dr * p.dst_stride + p.dst_offset + i] = a[r * p.src_stride + p.src_offset + i];
}

// KV-cache store: kv_out[state[0] + r, i] = a[r, src_offset + i], converted to kv_t.
@compute @workgroup_size(WG)
fn store_kv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.len || r >= p.n_rows) {
        return;
    }
    let dr = state[0] + r;
    kv_out[dr * p.dst_stride + i] = kv_t(a[r * p.src_stride + p.src_offset + i]);
}

// A grammar's mask over rows of logits: out[r * dst_stride + i] = -inf where bit i of
// the mask row (u32 words in `state`, src_stride words a row; src_stride 0: every row
// takes row 0) is 0. The CPU sampler's definition (sampling::TokenMask::apply).
@compute @workgroup_size(WG)
fn mask_logits(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.len || r >= p.n_rows) {
        return;
    }
    let w = state[r * p.src_stride + i / 32u];
    if (((w >> (i % 32u)) & 1u) == 0u) {
        out[r * p.dst_stride + i] = bitcast<f32>(0xff800000u);
    }
}
