// Greedy token of each row: the index of the largest logit, ties to the lowest index,
// NaN never chosen. One workgroup per row; thread t scans i = t, t+64, ... in order,
// then a fixed tree.

struct Params {
    len: u32,     // vocabulary size
    stride: u32,  // floats per row of logits
    out_offset: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> tokens: array<u32>;

var<workgroup> bv: array<f32, 64>;
var<workgroup> bi: array<u32, 64>;

fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.stride;
    var best_v = -3.4e38;
    var best_i = 0xffffffffu;
    for (var i = t; i < p.len; i += 64u) {
        let v = logits[base + i];
        if (v == v && (best_i == 0xffffffffu || v > best_v)) {
            best_v = v;
            best_i = i;
        }
    }
    bv[t] = best_v;
    bi[t] = best_i;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (t < s) {
            let ok = bi[t + s] != 0xffffffffu && (bi[t] == 0xffffffffu || better(bv[t + s], bi[t + s], bv[t], bi[t]));
            if (ok) {
                bv[t] = bv[t + s];
                bi[t] = bi[t + s];
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        tokens[p.out_offset + wg.x] = select(bi[0], 0u, bi[0] == 0xffffffffu);
    }
}
