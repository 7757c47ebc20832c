// Greedy token of each row: the index of the largest logit, ties to the lowest index,
// NaN never chosen. One workgroup per row; thread t scans i = t, t+64, ... in order,
// then a fixed tree. (The rule is a commutative monoid, so any order gives the same
// token: `reduce` finishes the partials of gemv.wgsl `main_argmax` by the same rule.)

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

var<workgroup> bv: array<f32, 64>;
var<workgroup> bi: array<u32, 64>;

const NONE: u32 = 0xffffffffu;

fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

// Thread t's best (value, index) meet in a fixed tree; thread 0 writes the token.
fn finish(t: u32, row: u32, best_v: f32, best_i: u32) {
    bv[t] = best_v;
    bi[t] = best_i;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (t < s) {
            let ok = bi[t + s] != NONE && (bi[t] == NONE || better(bv[t + s], bi[t + s], bv[t], bi[t]));
            if (ok) {
                bv[t] = bv[t + s];
                bi[t] = bi[t + s];
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        tokens[p.out_offset + row] = select(bi[0], 0u, bi[0] == NONE);
    }
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.stride;
    var best_v = -3.4e38;
    var best_i = NONE;
    for (var i = t; i < p.len; i += 64u) {
        let v = logits[base + i];
        if (v == v && (best_i == NONE || v > best_v)) {
            best_v = v;
            best_i = i;
        }
    }
    finish(t, wg.x, best_v, best_i);
}

// Row wg.x's best among its `len` partials (value bits, index; index NONE: empty).
@compute @workgroup_size(64)
fn reduce(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.stride;
    var best_v = -3.4e38;
    var best_i = NONE;
    for (var i = t; i < p.len; i += 64u) {
        let c = parts[base + i];
        let v = bitcast<f32>(c.x);
        if (c.y != NONE && (best_i == NONE || better(v, c.y, best_v, best_i))) {
            best_v = v;
            best_i = c.y;
        }
    }
    finish(t, wg.x, best_v, best_i);
}
