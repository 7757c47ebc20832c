// RMSNorm, one workgroup per row: out = (x * (1 / sqrt(mean(x^2) + eps))) * w.
// Thread t sums x[i]^2 for i = t, t+64, ... in order; the 64 sums meet in a fixed tree.
// `main` writes to a second buffer; `main_inplace` normalises rows in place (the
// per-head q/k norms of qwen3 and the drafters).

struct Params {
    len: u32,       // row length; the weight has `len` values
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> buf: array<f32>;

var<workgroup> sums: array<f32, 64>;

fn reduce(lid: u32) -> f32 {
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            sums[lid] += sums[lid + s];
        }
        workgroupBarrier();
    }
    return sums[0];
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.len;
    var ss = 0.0;
    for (var i = lid; i < p.len; i += 64u) {
        let v = x[base + i];
        ss += v * v;
    }
    sums[lid] = ss;
    let scale = 1.0 / sqrt(reduce(lid) / f32(p.len) + p.eps);
    for (var i = lid; i < p.len; i += 64u) {
        out[base + i] = (x[base + i] * scale) * w[i];
    }
}

@compute @workgroup_size(64)
fn main_inplace(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.len;
    var ss = 0.0;
    for (var i = lid; i < p.len; i += 64u) {
        let v = buf[base + i];
        ss += v * v;
    }
    sums[lid] = ss;
    let scale = 1.0 / sqrt(reduce(lid) / f32(p.len) + p.eps);
    for (var i = lid; i < p.len; i += 64u) {
        buf[base + i] = (buf[base + i] * scale) * w[i];
    }
}
