// Attention over the KV cache in chunks of keys fixed by absolute position, for GPUs:
// `partial` has one workgroup per (KV head, head tile, row tile, chunk) and serves all the
// query heads of its head tile for all the rows of its row tile (a 16-row verify pass)
// from one read of each key and value; `combine` merges a (head, row)'s chunks in
// ascending order. A row's result depends only on its position, never on how many rows
// share the pass or its tile: each (row, head) keeps its own running max, sum and
// output, walks its keys in sub-chunks of WG keys aligned to absolute multiples of WG,
// and a sub-chunk without keys of its own leaves them exactly as they were (a rescale by
// exp(0) = 1 and a sum of nothing); chunk boundaries are multiples of p.chunk, and
// a key of this pass (position >= state[0]) is read from the QKV rows, normalised and
// rotated here by the same function that stores it, in the cache's precision, so it has
// the bits a later pass reads from the cache.
//
// `partial` also does what qkv.wgsl does on CPU adapters: the query's per-head norm
// (QK_NORM: qwen3) and RoPE, and the key's norm + RoPE and the store of k and v at the
// row's position (by the workgroup of head tile 0 whose chunk holds that position). Keys
// a workgroup reads from the cache are older than this pass, so no workgroup reads what
// another writes.
// The cache element type kv_t is declared by the host in a one-line prelude.

override STYLE: u32 = 1u;     // 0: interleaved pairs (2i, 2i+1); 1: neox (i, i + rope_dim/2)
override QK_NORM: bool = false;
override GROUP_TILE: u32 = 1u; // query heads per workgroup: a divisor of the group, <= 8
// Rows per workgroup: ROW_TILE * GROUP_TILE <= MAX_QUERIES and
// ROW_TILE * GROUP_TILE * head_dim <= 2048 (the queries' workgroup memory).
override ROW_TILE: u32 = 1u;

struct Params {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    row_stride: u32, // floats per QKV row: (n_heads + 2 n_kv_heads) head_dim
    chunk: u32,      // keys per chunk (a multiple of WG)
    n_chunks: u32,   // chunks per (row, head) in the partials
    window: u32,     // keys visible before the query (0 = all); non-causal: context kept
    causal: u32,     // 1: row r sees keys 0..=state[0]+r; 0: all state[0] + n_rows
    scale: f32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>; // (cos, sin)
@group(0) @binding(3) var<storage, read> qkv: array<f32>;
@group(0) @binding(4) var<storage, read> q_norm: array<f32>;
@group(0) @binding(5) var<storage, read> k_norm: array<f32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<kv_t>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<kv_t>;
@group(0) @binding(8) var<storage, read_write> part_ml: array<vec2<f32>>; // (max, sum)
@group(0) @binding(9) var<storage, read_write> part_acc: array<f32>;
@group(0) @binding(10) var<storage, read_write> out: array<f32>;

const MAX_TILE: u32 = 8u;
const MAX_QUERIES: u32 = 16u; // (row, head) pairs per workgroup
const PER_THREAD: u32 = 4u; // head_dim <= 256

var<workgroup> qv: array<f32, 2048>;  // [ROW_TILE][GROUP_TILE][head_dim]: the queries
var<workgroup> w: array<f32, MAX_QUERIES * WG>; // [query][WG]: scores, then weights
var<workgroup> run_m: array<f32, MAX_QUERIES>;  // per query: running max
var<workgroup> run_l: array<f32, MAX_QUERIES>;  // per query: running sum
var<workgroup> corr: array<f32, MAX_QUERIES>;   // per query: this sub-chunk's rescale

// (first key, keys) row r sees.
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

// 1 / rms of the new key at qkv[base..] (QK_NORM; 1 otherwise), summed in index order
// by one thread: every thread that needs it gets the same bits.
fn key_inv_rms(base: u32) -> f32 {
    if (!QK_NORM) {
        return 1.0;
    }
    var ss = 0.0;
    for (var i = 0u; i < p.head_dim; i++) {
        let v = qkv[base + i];
        ss += v * v;
    }
    return 1.0 / sqrt(ss / f32(p.head_dim) + p.eps);
}

fn key_normed(base: u32, i: u32, inv: f32) -> f32 {
    if (QK_NORM) {
        return (qkv[base + i] * inv) * k_norm[i];
    }
    return qkv[base + i];
}

// Element d of the new key at qkv[base..] at position pos: normalised, rotated, in the
// cache's precision (what the store writes).
fn new_key(base: u32, d: u32, inv: f32, pos: u32) -> f32 {
    if (d >= p.rope_dim) {
        return f32(kv_t(key_normed(base, d, inv)));
    }
    let half = p.rope_dim / 2u;
    var i = d % half;
    var a = i;
    var b = i + half;
    if (STYLE == 0u) {
        i = d / 2u;
        a = 2u * i;
        b = a + 1u;
    }
    let cs = table[pos * half + i];
    let x0 = key_normed(base, a, inv);
    let x1 = key_normed(base, b, inv);
    if (d == a) {
        return f32(kv_t(x0 * cs.x - x1 * cs.y));
    }
    return f32(kv_t(x0 * cs.y + x1 * cs.x));
}

// The first float of the new key of position j (a row of this pass) for KV head kh.
fn new_key_base(j: u32, kh: u32) -> u32 {
    return (j - state[0]) * p.row_stride + p.n_heads * p.head_dim + kh * p.head_dim;
}

// Query head h of row r into qv[g * head_dim ..]: per-head norm (rmsnorm.wgsl's order),
// then RoPE at the row's position.
fn load_query(t: u32, g: u32, h: u32, r: u32) {
    let hd = p.head_dim;
    let base = r * p.row_stride + h * hd;
    var ss = 0.0;
    for (var d = t; d < hd; d += WG) {
        let v = qkv[base + d];
        qv[g * hd + d] = v;
        ss += v * v;
    }
    if (QK_NORM) {
        let inv = 1.0 / sqrt(wg_sum_f32(t, ss) / f32(hd) + p.eps);
        for (var d = t; d < hd; d += WG) {
            qv[g * hd + d] = (qv[g * hd + d] * inv) * q_norm[d];
        }
    }
    workgroupBarrier();
    let pos = state[0] + r;
    let half = p.rope_dim / 2u;
    for (var i = t; i < half; i += WG) {
        var a = i;
        var b = i + half;
        if (STYLE == 0u) {
            a = 2u * i;
            b = a + 1u;
        }
        let cs = table[pos * half + i];
        let x0 = qv[g * hd + a];
        let x1 = qv[g * hd + b];
        qv[g * hd + a] = x0 * cs.x - x1 * cs.y;
        qv[g * hd + b] = x0 * cs.y + x1 * cs.x;
    }
    workgroupBarrier();
}

// Stores the row's own key (normalised, rotated) and value at its position.
fn store_own(t: u32, kh: u32, pos: u32) {
    let base = new_key_base(pos, kh);
    let inv = key_inv_rms(base);
    let kv_dim = p.n_kv_heads * p.head_dim;
    let at = pos * kv_dim + kh * p.head_dim;
    for (var d = t; d < p.head_dim; d += WG) {
        k_cache[at + d] = kv_t(new_key(base, d, inv, pos));
        v_cache[at + d] = kv_t(qkv[base + kv_dim + d]);
    }
}

// Value element d of key j for KV head kh: from the cache, or this pass's QKV rows.
fn value_at(j: u32, kh: u32, d: u32) -> f32 {
    let kv_dim = p.n_kv_heads * p.head_dim;
    if (j < state[0]) {
        return f32(v_cache[j * kv_dim + kh * p.head_dim + d]);
    }
    return f32(kv_t(qkv[new_key_base(j, kh) + kv_dim + d]));
}

// The keys [lo, hi) of chunk c that row r of the pass sees (empty: lo >= hi).
fn chunk_keys(r: u32, c: u32) -> vec2<u32> {
    let range = key_range(r);
    return vec2<u32>(max(range.x, c * p.chunk), min(range.y, (c + 1u) * p.chunk));
}

// The keys of query q (row r0 + q / GROUP_TILE) in chunk c: empty past the pass's rows.
fn query_keys(q: u32, r0: u32, c: u32) -> vec2<u32> {
    let r = r0 + q / GROUP_TILE;
    if (r >= p.n_rows) {
        return vec2<u32>(0u, 0u);
    }
    return chunk_keys(r, c);
}

// Key j scored against every query of the workgroup into s (0 where it is not a key
// of that query's row), the key read once: from the cache, or this pass's QKV rows.
fn score_key(j: u32, kh: u32, r0: u32, c: u32) -> array<f32, 16> {
    var s: array<f32, 16>;
    let hd = p.head_dim;
    let kv_dim = p.n_kv_heads * hd;
    let queries = ROW_TILE * GROUP_TILE;
    if (j < state[0]) {
        let kb = j * kv_dim + kh * hd;
        for (var d = 0u; d < hd; d++) {
            let k = f32(k_cache[kb + d]);
            for (var q = 0u; q < queries; q++) {
                s[q] += qv[q * hd + d] * k;
            }
        }
    } else {
        let base = new_key_base(j, kh);
        let inv = key_inv_rms(base);
        for (var d = 0u; d < hd; d++) {
            let k = new_key(base, d, inv, j);
            for (var q = 0u; q < queries; q++) {
                s[q] += qv[q * hd + d] * k;
            }
        }
    }
    return s;
}

@compute @workgroup_size(WG)
fn partial(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let hd = p.head_dim;
    let group = p.n_heads / p.n_kv_heads;
    let tiles = group / GROUP_TILE;
    let kh = wg.x / tiles;
    let h0 = kh * group + (wg.x % tiles) * GROUP_TILE;
    let r0 = wg.y * ROW_TILE;
    let rows = min(ROW_TILE, p.n_rows - r0);
    let c = wg.z;
    let queries = ROW_TILE * GROUP_TILE;
    // The tile's keys: the union of its rows' (rows see ranges that only grow with r,
    // but windows move their starts).
    var lo = 0xffffffffu;
    var hi = 0u;
    for (var rr = 0u; rr < rows; rr++) {
        let pos = state[0] + r0 + rr;
        if (wg.x % tiles == 0u && pos / p.chunk == c) {
            store_own(t, kh, pos);
        }
        let keys = chunk_keys(r0 + rr, c);
        if (keys.x < keys.y) {
            lo = min(lo, keys.x);
            hi = max(hi, keys.y);
        }
    }
    if (lo >= hi) {
        return;
    }
    for (var rr = 0u; rr < rows; rr++) {
        for (var g = 0u; g < GROUP_TILE; g++) {
            load_query(t, rr * GROUP_TILE + g, h0 + g, r0 + rr);
        }
    }
    if (t < queries) {
        run_m[t] = -3.0e38;
        run_l[t] = 0.0;
    }
    var acc: array<f32, 64>; // [query][PER_THREAD]
    for (var s0 = lo / WG * WG; s0 < hi; s0 += WG) {
        // Thread t scores key s0 + t against every query of the workgroup.
        let j = s0 + t;
        var s = array<f32, 16>();
        if (j >= lo && j < hi) {
            s = score_key(j, kh, r0, c);
        }
        for (var q = 0u; q < queries; q++) {
            let keys = query_keys(q, r0, c);
            w[q * WG + t] = select(-3.0e38, s[q] * p.scale, j >= keys.x && j < keys.y);
        }
        workgroupBarrier();
        if (t < queries) {
            let n_here = sub_chunk_keys(t, r0, c, s0);
            var m = run_m[t];
            for (var jj = 0u; jj < n_here; jj++) {
                m = max(m, w[t * WG + jj]);
            }
            corr[t] = exp(run_m[t] - m);
            run_m[t] = m;
        }
        workgroupBarrier();
        for (var q = 0u; q < queries; q++) {
            let keys = query_keys(q, r0, c);
            w[q * WG + t] = select(0.0, exp(w[q * WG + t] - run_m[q]), j >= keys.x && j < keys.y);
        }
        workgroupBarrier();
        if (t < queries) {
            let n_here = sub_chunk_keys(t, r0, c, s0);
            var l = 0.0;
            for (var jj = 0u; jj < n_here; jj++) {
                l += w[t * WG + jj];
            }
            run_l[t] = run_l[t] * corr[t] + l;
        }
        accumulate_values(t, kh, r0, c, s0, &acc);
        workgroupBarrier();
    }
    store_partials(t, h0, r0, c, &acc);
}

// Keys of sub-chunk s0 that query q's weights cover: up to its row's last key (none
// where the row has no keys in the chunk).
fn sub_chunk_keys(q: u32, r0: u32, c: u32, s0: u32) -> u32 {
    let keys = query_keys(q, r0, c);
    return select(0u, min(WG, keys.y - s0), keys.x < keys.y && keys.y > s0);
}

// Each query's output dims (t + i WG) rescaled and added this sub-chunk's weighted
// values, each value read once for all queries; a query adds only its own row's keys
// [first, end) of the sub-chunk (never 0 * v of another row's key).
fn accumulate_values(t: u32, kh: u32, r0: u32, c: u32, s0: u32, acc: ptr<function, array<f32, 64>>) {
    let queries = ROW_TILE * GROUP_TILE;
    var first: array<u32, 16>;
    var end: array<u32, 16>;
    var n_max = 0u;
    for (var q = 0u; q < queries; q++) {
        let keys = query_keys(q, r0, c);
        end[q] = sub_chunk_keys(q, r0, c, s0);
        first[q] = select(0u, keys.x - s0, keys.x > s0);
        n_max = max(n_max, end[q]);
    }
    for (var i = 0u; i < PER_THREAD; i++) {
        let d = t + i * WG;
        if (d < p.head_dim) {
            for (var q = 0u; q < queries; q++) {
                (*acc)[q * PER_THREAD + i] *= corr[q];
            }
            for (var jj = 0u; jj < n_max; jj++) {
                let v = value_at(s0 + jj, kh, d);
                for (var q = 0u; q < queries; q++) {
                    if (jj >= first[q] && jj < end[q]) {
                        (*acc)[q * PER_THREAD + i] += w[q * WG + jj] * v;
                    }
                }
            }
        }
    }
}

// The (max, sum) and output of each query whose row has keys in this chunk.
fn store_partials(t: u32, h0: u32, r0: u32, c: u32, acc: ptr<function, array<f32, 64>>) {
    let hd = p.head_dim;
    for (var q = 0u; q < ROW_TILE * GROUP_TILE; q++) {
        let keys = query_keys(q, r0, c);
        if (keys.x >= keys.y) {
            continue;
        }
        let r = r0 + q / GROUP_TILE;
        let at = (r * p.n_heads + h0 + q % GROUP_TILE) * p.n_chunks + c;
        if (t == 0u) {
            part_ml[at] = vec2<f32>(run_m[q], run_l[q]);
        }
        for (var i = 0u; i < PER_THREAD; i++) {
            let d = t + i * WG;
            if (d < hd) {
                part_acc[at * hd + d] = (*acc)[q * PER_THREAD + i];
            }
        }
    }
}

// One workgroup per (head, row): the row's chunks merged in ascending order.
@compute @workgroup_size(WG)
fn combine(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let r = wg.y;
    let hd = p.head_dim;
    let range = key_range(r);
    let c0 = range.x / p.chunk;
    let c1 = (range.y - 1u) / p.chunk;
    let base = (r * p.n_heads + h) * p.n_chunks;
    var m = -3.0e38;
    for (var c = c0; c <= c1; c++) {
        m = max(m, part_ml[base + c].x);
    }
    var l = 0.0;
    for (var c = c0; c <= c1; c++) {
        let ml = part_ml[base + c];
        l += ml.y * exp(ml.x - m);
    }
    for (var d = t; d < hd; d += WG) {
        var a = 0.0;
        for (var c = c0; c <= c1; c++) {
            a += part_acc[(base + c) * hd + d] * exp(part_ml[base + c].x - m);
        }
        out[r * p.n_heads * hd + h * hd + d] = a / l;
    }
}
