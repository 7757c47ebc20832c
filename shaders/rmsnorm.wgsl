// RMSNorm, one workgroup per row: out = (x * (1 / sqrt(mean(x^2) + eps))) * w.
// Thread t sums x[i]^2 for i = t, t+WG, ... in order; the WG sums meet in a fixed tree.
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

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.len;
    var ss = 0.0;
    for (var i = lid; i < p.len; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    let scale = 1.0 / sqrt(wg_sum_f32(lid, ss) / f32(p.len) + p.eps);
    for (var i = lid; i < p.len; i += WG) {
        out[base + i] = (x[base + i] * scale) * w[i];
    }
}

@compute @workgroup_size(WG)
fn main_inplace(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.len;
    var ss = 0.0;
    for (var i = lid; i < p.len; i += WG) {
        let v = buf[base + i];
        ss += v * v;
    }
    let scale = 1.0 / sqrt(wg_sum_f32(lid, ss) / f32(p.len) + p.eps);
    for (var i = lid; i < p.len; i += WG) {
        buf[base + i] = (buf[base + i] * scale) * w[i];
    }
}
