// Sampling of one token per row at temperature T with top-k, min-p and top-p, using the
// random number keyed by (seed, absolute position) only, so that the draw for a position
// is the same whether the row was computed alone or among 16 (plain and speculative
// decoding draw the same numbers). One workgroup per row.
//
// Semantics (the CPU reference `sampling::sample` implements the same):
//   z = logit / T; kept = { z >= threshold } where the threshold is the largest of
//   - top-k: the k-th largest z;
//   - min-p: max z + ln(min_p);
//   - top-p: the largest value whose upper set still holds top_p of the softmax mass
//     (over the tokens the other two keep);
//   then u = uniform(seed, position) * sum(kept e^(z - max z)), and the token is the
//   first id (in id order) at which the running sum exceeds u.

struct Params {
    len: u32,        // vocabulary size
    stride: u32,     // floats per row of logits
    top_k: u32,      // 0 = off
    pos_offset: u32, // position of the sampled token = state[0] + row + pos_offset
    inv_temp: f32,
    top_p: f32,      // 1 = off
    min_p: f32,      // 0 = off
    seed_lo: u32,
    seed_hi: u32,
    out_offset: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;

const WG: u32 = 64u;
var<workgroup> rf: array<f32, 64>;
var<workgroup> ru: array<u32, 64>;
var<workgroup> chunk_sum: array<f32, 64>;

fn hash32(x0: u32) -> u32 {
    var x = x0;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// sampling::random_u32 of the CPU reference.
fn random_u32(pos: u32, stream: u32) -> u32 {
    var h = hash32(p.seed_lo ^ 0x9e3779b9u);
    h = hash32(h ^ p.seed_hi);
    h = hash32(h ^ pos);
    return hash32(h ^ (stream * 0x85ebca6bu));
}

// Order-preserving map of floats to u32 (NaN maps to 0: never kept).
fn key(v: f32) -> u32 {
    if (v != v) {
        return 0u;
    }
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn unkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

fn sum_u(t: u32, v: u32) -> u32 {
    ru[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            ru[t] += ru[t + s];
        }
        workgroupBarrier();
    }
    let r = ru[0];
    workgroupBarrier();
    return r;
}

fn sum_f(t: u32, v: f32) -> f32 {
    rf[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            rf[t] += rf[t + s];
        }
        workgroupBarrier();
    }
    let r = rf[0];
    workgroupBarrier();
    return r;
}

fn max_f(t: u32, v: f32) -> f32 {
    rf[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            rf[t] = max(rf[t], rf[t + s]);
        }
        workgroupBarrier();
    }
    let r = rf[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let base = row * p.stride;
    let n = p.len;
    let chunk = (n + WG - 1u) / WG;
    let lo_i = min(t * chunk, n);
    let hi_i = min(lo_i + chunk, n);

    var mx = -3.4e38;
    for (var i = lo_i; i < hi_i; i++) {
        let z = logits[base + i] * p.inv_temp;
        if (z == z) {
            mx = max(mx, z);
        }
    }
    let m = max_f(t, mx);

    // top-k: the largest key t_k with count(key >= t_k) >= k.
    var thr = 0u;
    if (p.top_k > 0u && p.top_k < n) {
        var lo = 0u;
        var hi = 0xffffffffu;
        for (var it = 0u; it < 32u; it++) {
            let d = hi - lo;
            let mid = lo + (d >> 1u) + (d & 1u);
            var c = 0u;
            for (var i = lo_i; i < hi_i; i++) {
                if (key(logits[base + i] * p.inv_temp) >= mid) {
                    c += 1u;
                }
            }
            if (sum_u(t, c) >= p.top_k) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        thr = lo;
    }
    // min-p: e^(z - m) >= min_p.
    if (p.min_p > 0.0) {
        thr = max(thr, key(m + log(p.min_p)));
    }
    // top-p over what the others keep.
    if (p.top_p < 1.0) {
        var s0 = 0.0;
        for (var i = lo_i; i < hi_i; i++) {
            let z = logits[base + i] * p.inv_temp;
            if (key(z) >= thr) {
                s0 += exp(z - m);
            }
        }
        let goal = sum_f(t, s0) * p.top_p;
        var lo = thr;
        var hi = key(m);
        for (var it = 0u; it < 32u; it++) {
            let d = hi - lo;
            let mid = lo + (d >> 1u) + (d & 1u);
            var s = 0.0;
            for (var i = lo_i; i < hi_i; i++) {
                let z = logits[base + i] * p.inv_temp;
                if (key(z) >= mid) {
                    s += exp(z - m);
                }
            }
            if (sum_f(t, s) >= goal) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        thr = lo;
    }
    // Kept mass per contiguous chunk of ids, then the inverse CDF in id order.
    var cs = 0.0;
    for (var i = lo_i; i < hi_i; i++) {
        let z = logits[base + i] * p.inv_temp;
        if (key(z) >= thr) {
            cs += exp(z - m);
        }
    }
    chunk_sum[t] = cs;
    workgroupBarrier();
    if (t == 0u) {
        var total = 0.0;
        for (var c = 0u; c < WG; c++) {
            total += chunk_sum[c];
        }
        let pos = state[0] + row + p.pos_offset;
        let u = f32(random_u32(pos, 0u) >> 8u) * (1.0 / 16777216.0) * total;
        var cum = 0.0;
        var chosen = 0xffffffffu;
        var last = 0u;
        for (var c = 0u; c < WG && chosen == 0xffffffffu; c++) {
            if (chunk_sum[c] > 0.0 && u < cum + chunk_sum[c]) {
                let a = min(c * chunk, n);
                let b = min(a + chunk, n);
                for (var i = a; i < b; i++) {
                    let z = logits[base + i] * p.inv_temp;
                    if (key(z) >= thr) {
                        cum += exp(z - m);
                        last = i;
                        if (u < cum) {
                            chosen = i;
                            break;
                        }
                    }
                }
                if (chosen == 0xffffffffu) {
                    chosen = last; // rounding at the end of the chunk
                }
            } else {
                cum += chunk_sum[c];
            }
        }
        if (chosen == 0xffffffffu) {
            chosen = last;
        }
        tokens[p.out_offset + row] = chosen;
    }
}
