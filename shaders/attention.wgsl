// Causal grouped-query attention of n_rows query rows (positions state[0] + row) over the
// KV cache. One workgroup per (HEADS query heads of one KV head, row): each key and value
// is loaded once for the HEADS heads. Keys are walked in chunks of WG in position order
// with an online softmax, so a row's result depends only on its position, never on how
// many rows share the dispatch. Each head's arithmetic is that of a workgroup of its own:
// its dot products in the same order, its chunk max and sum over the same fixed tree
// (pairs at distance WG/2, WG/4, ..., 1: common.wgsl's), walked by one thread per head
// rather than by the workgroup, which needs 5 barriers per chunk instead of 17 (CPU
// adapters, the kernel's users, compile each barrier into a switch between coroutines).
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
// The cache and the output as vectors of 4 (head_dim is a multiple of 4): a load or store
// of 4 values is one per-lane access where CPU adapters make each access a loop over
// the lanes.
@group(0) @binding(3) var<storage, read> kc: array<vec4<kv_t>>;
@group(0) @binding(4) var<storage, read> vc: array<vec4<kv_t>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;

const MAX_HEADS: u32 = 8u;
override HEADS: u32 = 1u; // query heads per workgroup: a divisor of group, <= MAX_HEADS

// [HEADS][head_dim / 4]; head_dim <= 4 WG = 256 (thread t owns dimensions 4t..4t+3).
var<workgroup> qv: array<vec4<f32>, 512>;
// [HEADS][WG]: each head's scores, then its weights (pr, kept for the values) and the
// scratch its tree walks (red).
var<workgroup> pr: array<f32, 512>;
var<workgroup> red: array<f32, 512>;
var<workgroup> chunk_stat: array<f32, 8>; // each head's chunk max, then its chunk sum

// The first key and the key count of row r.
fn key_range(r: u32) -> vec2<u32> {
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
    return vec2<u32>(first, n_keys);
}

// red[base ..] reduced in place in the fixed tree order by one thread (max or sum).
fn tree_max(base: u32) -> f32 {
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        for (var i = 0u; i < s; i++) {
            red[base + i] = max(red[base + i], red[base + i + s]);
        }
    }
    return red[base];
}

fn tree_sum(base: u32) -> f32 {
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        for (var i = 0u; i < s; i++) {
            red[base + i] += red[base + i + s];
        }
    }
    return red[base];
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h0 = wg.x * HEADS;
    let r = wg.y;
    let kh = h0 / p.group;
    let range = key_range(r);
    let first = range.x;
    let n_keys = range.y;
    let qbase = r * p.q_stride + h0 * p.head_dim;
    let hd4 = p.head_dim / 4u;
    for (var i = t; i < HEADS * hd4; i += WG) {
        let b = qbase + 4u * i;
        qv[i] = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
    }
    workgroupBarrier();
    var m: array<f32, MAX_HEADS>;
    var l: array<f32, MAX_HEADS>;
    var corr: array<f32, MAX_HEADS>;
    var sc: array<f32, MAX_HEADS>;
    var acc: array<vec4<f32>, MAX_HEADS>; // dimensions 4t..4t+3 of each head
    for (var h = 0u; h < HEADS; h++) {
        m[h] = -3.0e38;
        l[h] = 0.0;
        acc[h] = vec4<f32>(0.0);
    }
    let koff4 = kh * hd4;
    let kv4 = p.kv_dim / 4u;
    for (var c0 = first; c0 < n_keys; c0 += WG) {
        let j = c0 + t;
        for (var h = 0u; h < HEADS; h++) {
            sc[h] = 0.0;
        }
        if (j < n_keys) {
            // Each head's dot product summed in dimension order, one term at a time.
            let kb = j * kv4 + koff4;
            for (var d4 = 0u; d4 < hd4; d4++) {
                let k = vec4<f32>(kc[kb + d4]);
                for (var h = 0u; h < HEADS; h++) {
                    let qh = qv[h * hd4 + d4];
                    sc[h] += qh.x * k.x;
                    sc[h] += qh.y * k.y;
                    sc[h] += qh.z * k.z;
                    sc[h] += qh.w * k.w;
                }
            }
        }
        for (var h = 0u; h < HEADS; h++) {
            sc[h] = select(-3.0e38, sc[h] * p.scale, j < n_keys);
            red[h * WG + t] = sc[h];
        }
        workgroupBarrier();
        if (t < HEADS) {
            chunk_stat[t] = tree_max(t * WG);
        }
        workgroupBarrier();
        for (var h = 0u; h < HEADS; h++) {
            let m_new = max(m[h], chunk_stat[h]);
            var e = 0.0;
            if (j < n_keys) {
                e = exp(sc[h] - m_new);
            }
            pr[h * WG + t] = e;
            red[h * WG + t] = e;
            corr[h] = exp(m[h] - m_new);
            m[h] = m_new;
        }
        workgroupBarrier();
        if (t < HEADS) {
            chunk_stat[t] = tree_sum(t * WG);
        }
        workgroupBarrier();
        let n_here = min(WG, n_keys - c0);
        for (var h = 0u; h < HEADS; h++) {
            l[h] = l[h] * corr[h] + chunk_stat[h];
        }
        if (t < hd4) {
            for (var h = 0u; h < HEADS; h++) {
                acc[h] *= corr[h];
            }
            for (var jj = 0u; jj < n_here; jj++) {
                let v = vec4<f32>(vc[(c0 + jj) * kv4 + koff4 + t]);
                for (var h = 0u; h < HEADS; h++) {
                    acc[h] += pr[h * WG + jj] * v;
                }
            }
        }
        workgroupBarrier();
    }
    if (t < hd4) {
        for (var h = 0u; h < HEADS; h++) {
            out[(r * p.n_heads + h0 + h) * hd4 + t] = acc[h] / l[h];
        }
    }
}
