// Greedy token of each row: the index of the largest logit, ties to the lowest index,
// NaN never chosen. One workgroup per row; thread t scans i = t, t+WG, ... in order,
// then a fixed tree. (The rule is a commutative monoid, so any order gives the same
// token: `reduce` finishes the partials of gemv.wgsl `main_argmax` by the same rule.)
// With MAP the rows were a subset of the vocabulary (a drafter's draft head): the token
// is id_map[best].

override MAP: bool = false;

struct Params {
    len: u32,     // vocabulary size (reduce: partials per row)
    stride: u32,  // floats per row of logits (reduce: of partials)
    out_offset: u32,
    top: u32,     // logprobs: alternatives per row (at most LP_TOP)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> parts: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> id_map: array<u32>;
@group(0) @binding(5) var<storage, read_write> lp_vals: array<f32>; // [row][1 + LP_TOP]
@group(0) @binding(6) var<storage, read_write> lp_ids: array<u32>;  // [row][LP_TOP]

// Thread t's best (value, index) meet in a fixed tree (common.wgsl's wg_best); thread 0
// writes the token.
fn finish(t: u32, row: u32, best_v: f32, best_i: u32) {
    let best = wg_best(t, best_v, best_i);
    if (t == 0u) {
        var token = select(best.y, 0u, best.y == WG_NONE);
        if (MAP && best.y != WG_NONE) {
            token = id_map[best.y];
        }
        tokens[p.out_offset + row] = token;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.stride;
    var best_v = -3.4e38;
    var best_i = WG_NONE;
    for (var i = t; i < p.len; i += WG) {
        let v = logits[base + i];
        if (v == v && (best_i == WG_NONE || v > best_v)) {
            best_v = v;
            best_i = i;
        }
    }
    finish(t, wg.x, best_v, best_i);
}

// Row wg.x's best among its `len` partials (value bits, index; index WG_NONE: empty).
@compute @workgroup_size(WG)
fn reduce(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.stride;
    var best_v = -3.4e38;
    var best_i = WG_NONE;
    for (var i = t; i < p.len; i += WG) {
        let c = parts[base + i];
        let v = bitcast<f32>(c.x);
        if (c.y != WG_NONE && (best_i == WG_NONE || wg_ranks_before(v, c.y, best_v, best_i))) {
            best_v = v;
            best_i = c.y;
        }
    }
    finish(t, wg.x, best_v, best_i);
}

// Log-probabilities (dflash_core::sampling::token_logprob's definition, in this
// kernel's fixed order): with lse = m + ln(sum of exp(l - m)) over the row's logits (a
// grammar's refused ids are -inf and weigh 0), lp_vals[row][0] = l[token] - lse for the
// row's chosen token, then its `top` most likely ids (largest first, the smaller id on a
// tie; refused ids never) and their log-probabilities; WG_NONE past the last one (every
// round runs: the loop's trip count stays uniform across the workgroup's barriers).
const LP_TOP: u32 = 20u;

@compute @workgroup_size(WG)
fn logprobs(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let base = row * p.stride;
    var m = -3.4e38;
    for (var i = t; i < p.len; i += WG) {
        let v = logits[base + i];
        if (v == v && v > m) {
            m = v;
        }
    }
    m = wg_max_f32(t, m);
    var s = 0.0;
    for (var i = t; i < p.len; i += WG) {
        let v = logits[base + i];
        if (v == v && v > -3.4e38) {
            s += exp(v - m);
        }
    }
    let lse = m + log(wg_sum_f32(t, s));
    let out = row * (1u + LP_TOP);
    if (t == 0u) {
        lp_vals[out] = logits[base + tokens[p.out_offset + row]] - lse;
    }
    var prev_v = 0.0;
    var prev_i = WG_NONE;
    for (var k = 0u; k < min(p.top, LP_TOP); k++) {
        var best_v = -3.4e38;
        var best_i = WG_NONE;
        for (var i = t; i < p.len; i += WG) {
            let v = logits[base + i];
            let after = k == 0u || (prev_i != WG_NONE && wg_ranks_before(prev_v, prev_i, v, i));
            let better = best_i == WG_NONE || wg_ranks_before(v, i, best_v, best_i);
            if (v == v && v > -3.4e38 && after && better) {
                best_v = v;
                best_i = i;
            }
        }
        let best = wg_best(t, best_v, best_i);
        prev_v = bitcast<f32>(best.x);
        prev_i = best.y;
        if (t == 0u) {
            lp_vals[out + 1u + k] = prev_v - lse;
            lp_ids[row * LP_TOP + k] = prev_i;
        }
    }
}
