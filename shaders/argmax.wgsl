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
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> parts: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> id_map: array<u32>;

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
