// The 8-bit-activation GEMV: y[r, o] = sum_k W[o, k] * x[r, k] with x quantized to 8
// bits per weight group and each group's product an exact integer dot (dot4I8Packed,
// WGSL's packed_4x8_integer_dot_product). It is the CPU engine's arithmetic
// (dflash_core::cpu::quant_matmul), step for step:
//   quantize  per x row and group of GROUP values: scale = amax / 127, q = x * (127 / amax)
//             rounded half away from zero into -127..=127, sum = scale * sum(q); the bytes
//             of a q4 group stored even elements first, then odd ones (the order of a q4
//             word's low and high nibbles), a q8 group's in order.
//   quantize_norm  the same of RMSNorm(x) * norm_w: one workgroup per x row computes its
//             1/rms in rmsnorm.wgsl's order and normalises each value as rmsnorm.wgsl
//             does before quantizing it (the norm's kernel and the quantization in one).
//   main      per group g the exact integer isum, the term (scale_w * scale_x) * isum +
//             min_w * sum_x, added to accumulator g % 8 in ascending g (lane g % 8 of
//             LANES = 8 owns it), the 8 combined by the CPU's fixed tree.
// So a row's result never depends on how many rows share the pass. It is not bit-for-bit
// the CPU's: WGSL's division is not correctly rounded (a scale may differ in its last
// bits) and a driver may fuse a product into the following add.
// Epilogues (override constants, gemv.wgsl's expressions in its order): BIAS y = acc +
// bias[bias_offset + o]; PAIR the SwiGLU of the matrix's two row halves ([gate; up]:
// rows o and o + pair_rows, y[o] = silu(gate) * up); ACCUMULATE y += result;
// `main_tap` also copies each stored value into taps[r * tap_stride + tap_offset +
// out_offset + o].
// A paired row's up sums go through the same 4 KiB of workgroup scratch after its gate's
// (on lavapipe twice the scratch made every variant 2.2x slower) and share the thread's
// 64 accumulators (OUTS <= 2 with PAIR).
// In a model's plan where the adapter's tuning asks for 8-bit activations
// (`Tuning::int8_activations`, ops::dp4a::gemv_fused); `dflash bench --profile` also
// measures it per weight shape against the f32-activation GEMV of gemv.wgsl.

override N_ROWS: u32 = 1u;
override OUTS: u32 = 1u; // output rows per thread, 1..=MAX_OUTS (PAIR: 1..=2)
override ACCUMULATE: bool = false;
override BIAS: bool = false;
override PAIR: bool = false;
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
    eps: f32,        // quantize_norm: RMSNorm's epsilon
    bias_offset: u32, // BIAS: index of this chunk's first row in bias
    pair_rows: u32,  // PAIR: rows of each half (= m)
    tap_offset: u32, // main_tap
    tap_stride: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;                 // quantize: [rows, k]
@group(0) @binding(2) var<storage, read_write> xq: array<vec4<u32>>;    // [rows, k / 16]
@group(0) @binding(3) var<storage, read_write> xs: array<vec2<f32>>;    // [rows, k / GROUP]: (scale, sum)
@group(0) @binding(4) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;
@group(0) @binding(6) var<storage, read> mins: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;
@group(0) @binding(8) var<storage, read> bias: array<f32>;
@group(0) @binding(9) var<storage, read_write> taps: array<f32>;
@group(0) @binding(10) var<storage, read> norm_w: array<f32>;

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

// Group t (of row t / (k / GROUP)) of x, times `inv_rms` and the norm's weight where
// `norm` (rmsnorm.wgsl's expression), quantized into xq and xs.
fn quantize_group(t: u32, norm: bool, inv_rms: f32) {
    let base = t * GROUP; // rows are k long and k a multiple of GROUP
    let col = base % p.k;
    var v = array<f32, 32>();
    var amax = 0.0;
    for (var i = 0u; i < GROUP; i++) {
        v[i] = x[base + i];
        if (norm) {
            v[i] = (v[i] * inv_rms) * norm_w[col + i];
        }
        amax = max(amax, abs(v[i]));
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
        let q = i32(clamp(round_half_away(v[i] * inv), -127.0, 127.0));
        total += q;
        let at = q_position(i);
        words[at / 4u] |= (bitcast<u32>(q) & 0xffu) << ((at % 4u) * 8u);
    }
    for (var w = 0u; w < GROUP / 16u; w++) {
        xq[base / 16u + w] = vec4<u32>(words[4u * w], words[4u * w + 1u], words[4u * w + 2u], words[4u * w + 3u]);
    }
    xs[t] = vec2<f32>(scale, scale * f32(total));
}

// One thread per (x row, group).
@compute @workgroup_size(WG)
fn quantize(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * p.wg_x) * WG + lid;
    if (t < p.n_rows * (p.k / GROUP)) {
        quantize_group(t, false, 1.0);
    }
}

// One workgroup per x row: its 1/rms as rmsnorm.wgsl computes it (thread t sums x[i]^2
// for i = t, t + WG, ...; a fixed tree), then thread t quantizes groups t, t + WG, ...
@compute @workgroup_size(WG)
fn quantize_norm(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.k;
    var ss = 0.0;
    for (var i = lid; i < p.k; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    let inv_rms = 1.0 / sqrt(wg_sum_f32(lid, ss) / f32(p.k) + p.eps);
    let gpr = p.k / GROUP;
    for (var g = lid; g < gpr; g += WG) {
        quantize_group(wg.x * gpr + g, true, inv_rms);
    }
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
// [OUTS output rows][16 x rows], then (PAIR, OUTS <= 2) rows o_j + pair_rows: one array
// of 64 (more private floats put them in memory on CPU adapters).
var<private> acc: array<f32, 64>;
// One owned row's sums per x row (and its up row's), after the lanes' tree.
var<private> sums: array<f32, 32>;

// acc's index of output row j (its up row with `up`) for x row r.
fn acc_at(j: u32, r: u32, up: bool) -> u32 {
    return (select(j, OUTS + j, up)) * MAX_ROWS + r;
}

fn out_row(o0: u32, j: u32) -> u32 {
    return o0 + j * (WG / LANES);
}

// What weight group gi (scale sw, min mw) adds to x row r's sum over its group g.
fn group_term(gi: u32, sw: f32, mw: f32, r: u32, g: u32, gpr: u32) -> f32 {
    let s = xs[r * gpr + g];
    return (sw * s.x) * f32(group_isum(gi, r, g)) + mw * s.y;
}

// acc[j][r] (and its up row's) = accumulator `lane` (groups g = lane mod 8) of output
// row o_j (and o_j + pair_rows).
fn accumulate(o0: u32, lane: u32) {
    for (var i = 0u; i < select(1u, 2u, PAIR) * OUTS * MAX_ROWS; i++) {
        acc[i] = 0.0;
    }
    let gpr = p.k / GROUP;
    for (var g = lane; g < gpr; g += LANES) {
        for (var j = 0u; j < OUTS; j++) {
            let gi = min(out_row(o0, j), p.m - 1u) * gpr + g;
            let sw = group_scale(gi);
            let mw = group_min(gi);
            for (var r = 0u; r < N_ROWS; r++) {
                acc[acc_at(j, r, false)] += group_term(gi, sw, mw, r, g, gpr);
            }
            if (PAIR) {
                let gi2 = gi + p.pair_rows * gpr;
                let sw2 = group_scale(gi2);
                let mw2 = group_min(gi2);
                for (var r = 0u; r < N_ROWS; r++) {
                    acc[acc_at(j, r, true)] += group_term(gi2, sw2, mw2, r, g, gpr);
                }
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

// Where x row r's output row o goes in y.
fn y_index(r: u32, o: u32) -> u32 {
    return r * p.out_stride + p.out_offset + o;
}

// The sum of output row o for x row r (gate: its up row's `up`) into y, with the bias,
// SwiGLU and residual epilogues.
fn store(r: u32, o: u32, sum: f32, up: f32) {
    var v = sum;
    if (BIAS) {
        v = v + bias[p.bias_offset + o];
    }
    if (PAIR) {
        v = (v / (1.0 + exp(-v))) * up;
    }
    let yi = y_index(r, o);
    if (ACCUMULATE) {
        v = y[yi] + v;
    }
    y[yi] = v;
}

// The thread's first output row: LANES threads per row, OUTS rows per thread.
fn first_row(lid: u32, wg: vec3<u32>) -> u32 {
    return (wg.x + wg.y * p.wg_x) * OUTS * (WG / LANES) + lid / LANES;
}

// Each x row's sum of the thread's output row j (its up row with `up`) from the lanes'
// accumulators in the CPU's tree, into `sums` (lane 0's), through the workgroup's
// scratch (two barriers).
fn lane_sums(lid: u32, j: u32, up: bool) {
    workgroupBarrier(); // the previous sums have been read
    for (var r = 0u; r < N_ROWS; r++) {
        partial[r * WG + lid] = acc[acc_at(j, r, up)];
    }
    workgroupBarrier();
    if (lid % LANES != 0u) {
        return;
    }
    for (var r = 0u; r < N_ROWS; r++) {
        sums[select(0u, MAX_ROWS, up) + r] = combine(r * WG + lid);
    }
}

// Every owned row's lanes meet in the tree; lane 0 stores the rows.
fn gemv(lid: u32, wg: vec3<u32>) {
    let lane = lid % LANES;
    let o0 = first_row(lid, wg);
    accumulate(o0, lane);
    for (var j = 0u; j < OUTS; j++) {
        lane_sums(lid, j, false);
        if (PAIR) {
            lane_sums(lid, j, true);
        }
        let o = out_row(o0, j);
        if (lane == 0u && o < p.m) {
            for (var r = 0u; r < N_ROWS; r++) {
                store(r, o, sums[r], sums[MAX_ROWS + r]);
            }
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    gemv(lid, wg);
}

// `main`, then each stored value also into the taps (an entry of its own, so that the
// others never bind them).
@compute @workgroup_size(WG)
fn main_tap(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    gemv(lid, wg);
    let o0 = first_row(lid, wg);
    if (lid % LANES != 0u) {
        return;
    }
    for (var j = 0u; j < OUTS; j++) {
        let o = out_row(o0, j);
        for (var r = 0u; r < N_ROWS && o < p.m; r++) {
            // The row's place in the whole matrix (out_offset: its chunk's first row).
            taps[r * p.tap_stride + p.tap_offset + p.out_offset + o] = y[y_index(r, o)];
        }
    }
}
