// Causal grouped-query attention of n_rows query rows (positions state[0] + row) over the
// KV cache. One workgroup per (head, row). Keys are walked in chunks of WG in position
// order with an online softmax, so a row's result depends only on its position, never on
// how many rows share the dispatch.
// The cache element type kv_t (f32, or f16 where the adapter has shader-f16) is
// declared by the host in a one-line prelude.

struct Params {
    n_rows: u32,
    n_heads: u32,
    group: u32,     // query heads per KV head
    head_dim: u32,
    kv_dim: u32,
    q_stride: u32,  // floats per query row
    scale: f32,
    window: u32,    // keys visible before the query (0 = all); non-causal: context rows kept
    causal: u32,    // 1: row r sees keys 0..=state[0]+r; 0: every row sees all
                    //    state[0] + n_rows keys (a drafter block over its context)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> kc: array<kv_t>;
@group(0) @binding(4) var<storage, read> vc: array<kv_t>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const MAX_DIM_PER_THREAD: u32 = 4u; // head_dim <= 256

var<workgroup> qv: array<f32, 256>;
var<workgroup> pr: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let r = wg.y;
    let kh = h / p.group;
    var n_keys = state[0] + r + 1u;
    var first = 0u;
    if (p.causal == 1u) {
        if (p.window > 0u && n_keys > p.window) {
            first = n_keys - p.window;
        }
    } else {
        // Not causal (draft blocks): the whole block, and with a window only keys at
        // positions k with |q - k| < window (q = state[0] + r).
        n_keys = state[0] + p.n_rows;
        if (p.window > 0u) {
            let q = state[0] + r;
            if (q + 1u > p.window) {
                first = q + 1u - p.window;
            }
            n_keys = min(n_keys, q + p.window);
        }
    }
    let qbase = r * p.q_stride + h * p.head_dim;
    for (var d = t; d < p.head_dim; d += WG) {
        qv[d] = q[qbase + d];
    }
    workgroupBarrier();
    var m = -3.0e38;
    var l = 0.0;
    var acc: array<f32, 4>;
    for (var i = 0u; i < MAX_DIM_PER_THREAD; i++) {
        acc[i] = 0.0;
    }
    let koff = kh * p.head_dim;
    for (var c0 = first; c0 < n_keys; c0 += WG) {
        let j = c0 + t;
        var s = -3.0e38;
        if (j < n_keys) {
            let kb = j * p.kv_dim + koff;
            var d0 = 0.0;
            for (var d = 0u; d < p.head_dim; d++) {
                d0 += qv[d] * f32(kc[kb + d]);
            }
            s = d0 * p.scale;
        }
        let m_new = max(m, wg_max_f32(t, s));
        var e = 0.0;
        if (j < n_keys) {
            e = exp(s - m_new);
        }
        pr[t] = e;
        let l_chunk = wg_sum_f32(t, e);
        let corr = exp(m - m_new);
        l = l * corr + l_chunk;
        let n_here = min(WG, n_keys - c0);
        for (var i = 0u; i < MAX_DIM_PER_THREAD; i++) {
            let d = t + i * WG;
            if (d < p.head_dim) {
                var a = acc[i] * corr;
                for (var jj = 0u; jj < n_here; jj++) {
                    a += pr[jj] * f32(vc[(c0 + jj) * p.kv_dim + koff + d]);
                }
                acc[i] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var i = 0u; i < MAX_DIM_PER_THREAD; i++) {
        let d = t + i * WG;
        if (d < p.head_dim) {
            out[r * p.n_heads * p.head_dim + h * p.head_dim + d] = acc[i] / l;
        }
    }
}
