// The 8-bit-activation GEMV: y[r, o] = sum_k W[o, k] * x[r, k] with x quantized to 8
// bits per weight group and each group's product an exact integer dot (dot4I8Packed,
// WGSL's packed_4x8_integer_dot_product). It is the CPU engine's arithmetic
// (dflash_core::cpu::quant_matmul), step for step:
//   quantize  per x row and group of GROUP values: scale = amax / 127, q = x * (127 / amax)
//             rounded half away from zero into -127..=127, sum = scale * sum(q); the bytes
//             of a q4 group stored even elements first, then odd ones (the order of a q4
//             word's low and high nibbles), a q8 group's in order.
//   main      per group g the exact integer isum, the term (scale_w * scale_x) * isum +
//             min_w * sum_x, added to accumulator g % 8 in ascending g (lane g % 8 of
//             LANES = 8 owns it), the 8 combined by the CPU's fixed tree.
// So a row's result never depends on how many rows share the pass. It is not bit-for-bit
// the CPU's: WGSL's division is not correctly rounded (a scale may differ in its last
// bits) and a driver may fuse a product into the following add.
// Not yet in any model's plan: `dflash bench --profile` measures it per weight shape
// against the f32-activation GEMV of gemv.wgsl.

override N_ROWS: u32 = 1u;
override OUTS: u32 = 1u; // output rows per thread, 1..=MAX_OUTS
const LANES: u32 = 8u;
const MAX_ROWS: u32 = 16u;
const MAX_OUTS: u32 = 4u;

struct Params {
    n_rows: u32,     // = N_ROWS (kept for the layout of the uniform)
    k: u32,          // columns (input length)
    m: u32,          // main: output rows in this chunk
    out_offset: u32, // main: index of this chunk's first output row in y
    out_stride: u32, // main: y row length (all chunks)
    wg_x: u32,       // workgroups along x (the grid may be 2-D)
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;                 // quantize: [rows, k]
@group(0) @binding(2) var<storage, read_write> xq: array<vec4<u32>>;    // [rows, k / 16]
@group(0) @binding(3) var<storage, read_write> xs: array<vec2<f32>>;    // [rows, k / GROUP]: (scale, sum)
@group(0) @binding(4) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> mins: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

// Rust's f32::round: half away from zero (WGSL's round goes to even).
fn round_half_away(v: f32) -> f32 {
    let t = trunc(v);
    if (abs(v - t) == 0.5) {
        return t + sign(v);
    }
    return round(v);
}

// The byte position of element i of a group.
fn q_position(i: u32) -> u32 {
    if (FORMAT == 0u) {
        return (i % 2u) * (GROUP / 2u) + i / 2u;
    }
    return i;
}

// One thread per (x row, group).
@compute @workgroup_size(WG)
fn quantize(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * p.wg_x) * WG + lid;
    let gpr = p.k / GROUP;
    if (t >= p.n_rows * gpr) {
        return;
    }
    let base = t * GROUP; // rows are k long and k a multiple of GROUP
    var amax = 0.0;
    for (var i = 0u; i < GROUP; i++) {
        amax = max(amax, abs(x[base + i]));
    }
    var scale = 0.0;
    var inv = 0.0;
    if (amax > 0.0) {
        scale = amax / 127.0;
        inv = 127.0 / amax;
    }
    var words = array<u32, 8>();
    var total = 0i;
    for (var i = 0u; i < GROUP; i++) {
        let q = i32(clamp(round_half_away(x[base + i] * inv), -127.0, 127.0));
        total += q;
        let at = q_position(i);
        words[at / 4u] |= (bitcast<u32>(q) & 0xffu) << ((at % 4u) * 8u);
    }
    for (var v = 0u; v < GROUP / 16u; v++) {
        xq[base / 16u + v] = vec4<u32>(words[4u * v], words[4u * v + 1u], words[4u * v + 2u], words[4u * v + 3u]);
    }
    xs[t] = vec2<f32>(scale, scale * f32(total));
}

// The exact integer dot of weight group gi with x row r's group g.
fn group_isum(gi: u32, r: u32, g: u32) -> i32 {
    let xv = (r * p.k + g * GROUP) / 16u; // the group's first x vec4
    var s = 0i;
    if (FORMAT == 0u) {
        let w = qs[gi];
        let even = xq[xv];
        let odd = xq[xv + 1u];
        for (var j = 0u; j < 4u; j++) {
            s += dot4I8Packed(w[j] & 0x0f0f0f0fu, even[j]);
            s += dot4I8Packed((w[j] >> 4u) & 0x0f0f0f0fu, odd[j]);
        }
        return s;
    }
    for (var v = 0u; v < GROUP / 16u; v++) {
        let w = qs[gi * (GROUP / 16u) + v];
        let xw = xq[xv + v];
        for (var j = 0u; j < 4u; j++) {
            s += dot4I8Packed(w[j], xw[j]);
        }
    }
    return s;
}

// [16 x rows][WG threads]: each lane's accumulator for the tree.
var<workgroup> partial: array<f32, MAX_ROWS * WG>;
// [OUTS output rows][16 x rows]
var<private> acc: array<f32, 64>;

fn out_row(o0: u32, j: u32) -> u32 {
    return o0 + j * (WG / LANES);
}

// acc[j][r] = accumulator `lane` (groups g = lane mod 8) of output row o_j.
fn accumulate(o0: u32, lane: u32) {
    for (var i = 0u; i < OUTS * MAX_ROWS; i++) {
        acc[i] = 0.0;
    }
    let gpr = p.k / GROUP;
    for (var g = lane; g < gpr; g += LANES) {
        for (var j = 0u; j < OUTS; j++) {
            let gi = min(out_row(o0, j), p.m - 1u) * gpr + g;
            let sw = group_scale(gi);
            let mw = group_min(gi);
            for (var r = 0u; r < N_ROWS; r++) {
                let s = xs[r * gpr + g];
                let term = (sw * s.x) * f32(group_isum(gi, r, g)) + mw * s.y;
                acc[j * MAX_ROWS + r] += term;
            }
        }
    }
}

// The CPU's tree over the 8 accumulators at partial[base ..].
fn combine(base: u32) -> f32 {
    let a = base;
    return ((partial[a] + partial[a + 4u]) + (partial[a + 1u] + partial[a + 5u]))
        + ((partial[a + 2u] + partial[a + 6u]) + (partial[a + 3u] + partial[a + 7u]));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let wgi = wg.x + wg.y * p.wg_x;
    let lane = lid % LANES;
    let o0 = wgi * OUTS * (WG / LANES) + lid / LANES;
    accumulate(o0, lane);
    for (var j = 0u; j < OUTS; j++) {
        workgroupBarrier(); // the previous row's partials have been read
        for (var r = 0u; r < N_ROWS; r++) {
            partial[r * WG + lid] = acc[j * MAX_ROWS + r];
        }
        workgroupBarrier();
        let o = out_row(o0, j);
        if (lane == 0u && o < p.m) {
            for (var r = 0u; r < N_ROWS; r++) {
                y[r * p.out_stride + p.out_offset + o] = combine(r * WG + lid);
            }
        }
    }
}
