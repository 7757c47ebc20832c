// The step after the fused QKV GEMV, one workgroup per (head slot, row): slots
// 0..n_heads are query heads, the rest KV heads. A query or key head gets its per-head
// RMSNorm (QK_NORM: qwen3; rmsnorm.wgsl's order) and RoPE at position state[0] + row
// (the host's cos/sin table, rope.wgsl's formula); the query is written back in place,
// the key and the value go into the KV cache at that position (converted to kv_t).
// Replaces q/k norms, two RoPE and two KV-store dispatches with the same arithmetic.
// The cache element type kv_t is declared by the host in a one-line prelude.

override STYLE: u32 = 1u; // 0: interleaved pairs (2i, 2i+1); 1: neox pairs (i, i + rope_dim/2)
override QK_NORM: bool = false;

struct Params {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    row_stride: u32, // floats per row of qkv: (n_heads + 2 n_kv_heads) head_dim
    eps: f32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>; // (cos, sin)
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(4) var<storage, read> q_norm: array<f32>;
@group(0) @binding(5) var<storage, read> k_norm: array<f32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<kv_t>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<kv_t>;

var<workgroup> hv: array<f32, 256>; // head_dim <= 256

// The head in hv, RMS-normalised by its weights (query or key norm).
fn norm_head(t: u32, is_q: bool) {
    var ss = 0.0;
    for (var i = t; i < p.head_dim; i += WG) {
        let v = hv[i];
        ss += v * v;
    }
    let scale = 1.0 / sqrt(wg_sum_f32(t, ss) / f32(p.head_dim) + p.eps);
    for (var i = t; i < p.head_dim; i += WG) {
        hv[i] = (hv[i] * scale) * select(k_norm[i], q_norm[i], is_q);
    }
}

// Element d of the head: normalised (in hv) or as the GEMV wrote it.
fn head_value(base: u32, d: u32) -> f32 {
    if (QK_NORM) {
        return hv[d];
    }
    return qkv[base + d];
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let slot = wg.x;
    let r = wg.y;
    let hd = p.head_dim;
    let q_dim = p.n_heads * hd;
    let kv_dim = p.n_kv_heads * hd;
    let is_q = slot < p.n_heads;
    let h = select(slot - p.n_heads, slot, is_q);
    let base = r * p.row_stride + select(q_dim + h * hd, h * hd, is_q);
    if (QK_NORM) {
        for (var d = t; d < hd; d += WG) {
            hv[d] = qkv[base + d];
        }
        norm_head(t, is_q);
        workgroupBarrier();
    }
    // Thread t rotates pairs t, t + WG, ... (no barrier without the norm: each pair is
    // read and written by one thread).
    let pos = state[0] + r;
    let cache = pos * kv_dim + h * hd;
    let half = p.rope_dim / 2u;
    for (var i = t; i < half; i += WG) {
        var a = i;
        var b = i + half;
        if (STYLE == 0u) {
            a = 2u * i;
            b = a + 1u;
        }
        let cs = table[pos * half + i];
        let x0 = head_value(base, a);
        let x1 = head_value(base, b);
        let ra = x0 * cs.x - x1 * cs.y;
        let rb = x0 * cs.y + x1 * cs.x;
        if (is_q) {
            qkv[base + a] = ra;
            qkv[base + b] = rb;
        } else {
            k_cache[cache + a] = kv_t(ra);
            k_cache[cache + b] = kv_t(rb);
        }
    }
    for (var d = p.rope_dim + t; d < hd; d += WG) {
        let v = head_value(base, d);
        if (is_q) {
            qkv[base + d] = v;
        } else {
            k_cache[cache + d] = kv_t(v);
        }
    }
    if (!is_q) {
        for (var d = t; d < hd; d += WG) {
            v_cache[cache + d] = kv_t(qkv[base + kv_dim + d]);
        }
    }
}
