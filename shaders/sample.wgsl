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

var<workgroup> chunk_sum: array<f32, WG>;

// sampling::random_u32 of the CPU reference (random.wgsl).
fn random_u32(pos: u32, stream: u32) -> u32 {
    return rand_u32(p.seed_lo, p.seed_hi, pos, stream);
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

// The kept set of a row: max z and the key threshold (top-k, min-p, top-p). Called by
// every thread of the workgroup (it reduces across it).
struct Kept {
    m: f32,
    thr: u32,
}

fn kept_set(t: u32, base: u32, n: u32, lo_i: u32, hi_i: u32) -> Kept {
    var mx = -3.4e38;
    for (var i = lo_i; i < hi_i; i++) {
        let z = logits[base + i] * p.inv_temp;
        if (z == z) {
            mx = max(mx, z);
        }
    }
    let m = wg_max_f32(t, mx);

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
            if (wg_sum_u32(t, c) >= p.top_k) {
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
        let goal = wg_sum_f32(t, s0) * p.top_p;
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
            if (wg_sum_f32(t, s) >= goal) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        thr = lo;
    }
    return Kept(m, thr);
}

// Each thread's kept mass of its chunk of ids into chunk_sum; returns the row's total
// (chunks added in order).
fn kept_mass(t: u32, base: u32, lo_i: u32, hi_i: u32, k: Kept) -> f32 {
    var cs = 0.0;
    for (var i = lo_i; i < hi_i; i++) {
        let z = logits[base + i] * p.inv_temp;
        if (key(z) >= k.thr) {
            cs += exp(z - k.m);
        }
    }
    chunk_sum[t] = cs;
    workgroupBarrier();
    var total = 0.0;
    for (var c = 0u; c < WG; c++) {
        total += chunk_sum[c];
    }
    return total;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let base = row * p.stride;
    let n = p.len;
    let chunk = (n + WG - 1u) / WG;
    let lo_i = min(t * chunk, n);
    let hi_i = min(lo_i + chunk, n);

    let k = kept_set(t, base, n, lo_i, hi_i);
    let m = k.m;
    let thr = k.thr;
    let total = kept_mass(t, base, lo_i, hi_i, k);
    if (t == 0u) {
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

// Rejection-sampling verification of a DFlash block (dflash_core::rejection::verify):
// row j holds the target's logits for the token after ids[j], whose draft is ids[j + 1].
// With p the kept distribution and q the proposal (QK candidates per row in q_ids /
// q_vals; QK = 0: the draft was proposed with certainty), accept when
// u(stream 1) * q(d) < p(d), else draw from max(0, p - q) (stream 2).
// verdict[2j] = 1 accepted / 0 rejected, verdict[2j + 1] = the token.
override QK: u32 = 0u;
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<storage, read> q_ids: array<u32>;
@group(0) @binding(6) var<storage, read> q_vals: array<f32>;
@group(0) @binding(7) var<storage, read_write> verdict: array<u32>;

fn q_of(j: u32, x: u32, d: u32) -> f32 {
    if (QK == 0u) {
        return select(0.0, 1.0, x == d);
    }
    var q = 0.0;
    for (var c = 0u; c < QK; c++) {
        if (q_ids[j * QK + c] == x) {
            q += q_vals[j * QK + c];
        }
    }
    return q;
}

// p(i): the kept distribution of the row at `base`.
fn p_of(base: u32, i: u32, k: Kept, total: f32) -> f32 {
    let z = logits[base + i] * p.inv_temp;
    return select(0.0, exp(z - k.m) / total, key(z) >= k.thr);
}

@compute @workgroup_size(WG)
fn verify_rejection(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let base = row * p.stride;
    let n = p.len;
    let chunk = (n + WG - 1u) / WG;
    let lo_i = min(t * chunk, n);
    let hi_i = min(lo_i + chunk, n);
    let k = kept_set(t, base, n, lo_i, hi_i);
    let total = kept_mass(t, base, lo_i, hi_i, k);
    if (t == 0u) {
        let pos = state[0] + row + p.pos_offset;
        let d = ids[row + 1u];
        let pd = p_of(base, d, k, total);
        let qd = q_of(row, d, d);
        let u = f32(random_u32(pos, 1u) >> 8u) * (1.0 / 16777216.0);
        if (qd > 0.0 && u * qd < pd) {
            verdict[2u * row] = 1u;
            verdict[2u * row + 1u] = d;
            return;
        }
        // The residual max(0, p - q), summed then inverted in id order.
        var rt = 0.0;
        for (var i = 0u; i < n; i++) {
            rt += max(p_of(base, i, k, total) - q_of(row, i, d), 0.0);
        }
        let u2 = f32(random_u32(pos, 2u) >> 8u) * (1.0 / 16777216.0);
        var chosen = 0u;
        var cum = 0.0;
        var last = 0u;
        var found = false;
        for (var i = 0u; i < n && !found; i++) {
            let px = p_of(base, i, k, total);
            var r = px;
            if (rt > 0.0) {
                r = max(px - q_of(row, i, d), 0.0);
            }
            if (r > 0.0) {
                cum += r;
                last = i;
                if (u2 * select(1.0, rt, rt > 0.0) < cum) {
                    chosen = i;
                    found = true;
                }
            }
        }
        if (!found) {
            chosen = last;
        }
        verdict[2u * row] = 0u;
        verdict[2u * row + 1u] = chosen;
    }
}
