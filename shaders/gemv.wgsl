// y[r, o] (+)= sum_k W[o, k] * x[r, k] for r < N_ROWS <= 16: each weight is read ONCE
// for all rows (the verification path of DFlash). A row's sum runs in the same order
// whatever N_ROWS is: LANES threads share an output row and take its groups
// g = lane, lane + LANES, ...; each lane sums its groups in order; the LANES partial sums
// meet in a fixed tree. The workgroup (WG threads) covers WG / LANES output rows.
// LANES is a per-device tuning knob (16 on GPUs, 1 on CPU adapters, where barriers are
// dear); N_ROWS makes the row loops unroll.
//
// Fused neighbours (each an override constant, each the same arithmetic as the separate
// kernel it replaces, so the bits do not change):
//   NORM     x is RMS-normalised and scaled by norm_w in the prologue: every workgroup
//            computes each row's 1/rms in rmsnorm.wgsl's order (thread t sums
//            i = t, t + WG, ...; a fixed tree) and normalises x as it reads it.
//   BIAS     y = acc + bias[bias_offset + o].
//   PAIR     SwiGLU of two row blocks of one matrix ([gate; up]): the thread computes rows
//            o and o + pair_rows from the same x loads; y[o] = silu(gate) * up.
//   main_argmax also leaves each workgroup's best (value, index) per x row in `best`
//   (each row's own with LANES = 1); argmax.wgsl `reduce` finishes it: the lm_head and
//   the greedy head in one pass.

override ACCUMULATE: bool = false; // y += result (residual adds) instead of y = result
override N_ROWS: u32 = 1u;
override LANES: u32 = 16u;
override NORM: bool = false;
override BIAS: bool = false;
override PAIR: bool = false;

struct Params {
    n_rows: u32,      // = N_ROWS (kept for the layout of the uniform)
    k: u32,           // columns (input length)
    m: u32,           // output rows in this chunk (PAIR: rows of each half)
    out_offset: u32,  // index of this chunk's first output row in y
    out_stride: u32,  // y row length (all chunks)
    wg_x: u32,        // workgroups along x (the grid may be 2-D)
    eps: f32,         // NORM
    bias_offset: u32, // BIAS: bias index of output row 0
    pair_rows: u32,   // PAIR: row distance from a gate row to its up row
    part_offset: u32, // main_argmax: this chunk's first workgroup among all chunks
    n_parts: u32,     // main_argmax: workgroups of all chunks (the stride of `best`)
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> mins: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> bias: array<f32>;
@group(0) @binding(8) var<storage, read_write> best: array<vec2<u32>>;

const MAX_ROWS: u32 = 16u;
// [2 matrix rows][16 x rows][WG threads]: thread-minor, so the tree has no bank conflicts.
var<workgroup> partial: array<f32, 2u * MAX_ROWS * WG>;

var<workgroup> shared_inv_rms: array<f32, 16>;
var<private> inv_rms: array<f32, 16>; // NORM: each x row's 1 / rms

var<private> acc: array<f32, 16>;  // row o, per x row
var<private> acc2: array<f32, 16>; // row o + pair_rows (PAIR)

// partial[base ..] summed in place in the fixed tree order (pairs at distance len/2,
// len/4, ..., 1) by one thread: the bits of the parallel tree without its barriers
// (CPU adapters compile a barrier inside a loop into slow coroutines).
fn tree_in_place(base: u32, len: u32) -> f32 {
    for (var s = len / 2u; s > 0u; s >>= 1u) {
        for (var i = 0u; i < s; i++) {
            partial[base + i] += partial[base + i + s];
        }
    }
    return partial[base];
}

// Each x row's 1 / rms, in rmsnorm.wgsl's order: thread t sums x[r, i]^2 for
// i = t, t + WG, ...; the WG sums meet in the fixed tree.
fn norm_prologue(lid: u32) {
    for (var r = 0u; r < N_ROWS; r++) {
        var ss = 0.0;
        for (var i = lid; i < p.k; i += WG) {
            let j = r * p.k + i;
            let v = x[j / 4u][j % 4u];
            ss += v * v;
        }
        partial[r * WG + lid] = ss;
    }
    workgroupBarrier();
    if (lid < N_ROWS) {
        shared_inv_rms[lid] = 1.0 / sqrt(tree_in_place(lid * WG, WG) / f32(p.k) + p.eps);
    }
    workgroupBarrier();
    for (var r = 0u; r < N_ROWS; r++) {
        inv_rms[r] = shared_inv_rms[r];
    }
}

// vec4 `i` of x row `r`, normalised when NORM.
fn x_at(r: u32, i: u32) -> vec4<f32> {
    let v = x[r * (p.k / 4u) + i];
    if (NORM) {
        return (v * inv_rms[r]) * norm_w[i];
    }
    return v;
}

// Weights 8w..8w+3 and 8w+4..8w+7 of a q4 group (words v, scale s, min mn).
fn q4_group_lo(v: vec4<u32>, w: u32, s: f32, mn: f32) -> vec4<f32> {
    return q4_lo(v[w]) * s + mn;
}
fn q4_group_hi(v: vec4<u32>, w: u32, s: f32, mn: f32) -> vec4<f32> {
    return q4_hi(v[w]) * s + mn;
}

// acc[r] (and acc2[r]) = this lane's share of row o (and o + pair_rows).
fn accumulate(o: u32, lane: u32) {
    for (var r = 0u; r < N_ROWS; r++) {
        acc[r] = 0.0;
        if (PAIR) {
            acc2[r] = 0.0;
        }
    }
    let gpr = p.k / GROUP;
    if (o >= p.m) {
        return;
    }
    for (var g = lane; g < gpr; g += LANES) {
        let gi = o * gpr + g;
        let gi2 = (o + p.pair_rows) * gpr + g;
        let s = group_scale(gi);
        let mn = group_min(gi);
        var s2 = 0.0;
        var mn2 = 0.0;
        if (PAIR) {
            s2 = group_scale(gi2);
            mn2 = group_min(gi2);
        }
        let xb = g * (GROUP / 4u); // first vec4 of x for this group
        if (FORMAT == 0u) {
            let v = qs[gi];
            var v2 = vec4<u32>();
            if (PAIR) {
                v2 = qs[gi2];
            }
            for (var w = 0u; w < 4u; w++) {
                let a = q4_group_lo(v, w, s, mn);
                let b = q4_group_hi(v, w, s, mn);
                let a2 = q4_group_lo(v2, w, s2, mn2);
                let b2 = q4_group_hi(v2, w, s2, mn2);
                for (var r = 0u; r < N_ROWS; r++) {
                    let x0 = x_at(r, xb + w * 2u);
                    let x1 = x_at(r, xb + w * 2u + 1u);
                    acc[r] += dot(a, x0) + dot(b, x1);
                    if (PAIR) {
                        acc2[r] += dot(a2, x0) + dot(b2, x1);
                    }
                }
            }
        } else {
            let nv = GROUP / 16u;
            for (var vi = 0u; vi < nv; vi++) {
                let v = qs[gi * nv + vi];
                var v2 = vec4<u32>();
                if (PAIR) {
                    v2 = qs[gi2 * nv + vi];
                }
                for (var w = 0u; w < 4u; w++) {
                    let a = q8_of(v[w]) * s + mn;
                    let a2 = q8_of(v2[w]) * s2 + mn2;
                    for (var r = 0u; r < N_ROWS; r++) {
                        let xv = x_at(r, xb + vi * 4u + w);
                        acc[r] += dot(a, xv);
                        if (PAIR) {
                            acc2[r] += dot(a2, xv);
                        }
                    }
                }
            }
        }
    }
}

// The LANES partial sums of each output row meet in a fixed tree (lane 0 walks it).
fn lane_tree(lid: u32, lane: u32) {
    if (LANES == 1u) {
        return;
    }
    for (var r = 0u; r < N_ROWS; r++) {
        partial[r * WG + lid] = acc[r];
        if (PAIR) {
            partial[(MAX_ROWS + r) * WG + lid] = acc2[r];
        }
    }
    workgroupBarrier();
    if (lane == 0u) {
        for (var r = 0u; r < N_ROWS; r++) {
            acc[r] = tree_in_place(r * WG + lid, LANES);
            if (PAIR) {
                acc2[r] = tree_in_place((MAX_ROWS + r) * WG + lid, LANES);
            }
        }
    }
}

// Row o of every x row into y, with the bias, SwiGLU and residual epilogues.
fn store(o: u32) {
    for (var r = 0u; r < N_ROWS; r++) {
        let yi = r * p.out_stride + p.out_offset + o;
        var v = acc[r];
        if (BIAS) {
            v = v + bias[p.bias_offset + o];
        }
        if (PAIR) {
            v = (v / (1.0 + exp(-v))) * acc2[r];
        }
        if (ACCUMULATE) {
            v = y[yi] + v;
        }
        y[yi] = v;
    }
}

fn gemv(lid: u32, wgi: u32) {
    if (NORM) {
        norm_prologue(lid);
    }
    let lane = lid % LANES;
    let o = wgi * (WG / LANES) + lid / LANES;
    accumulate(o, lane);
    lane_tree(lid, lane);
    if (lane == 0u && o < p.m) {
        store(o);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    gemv(lid, wg.x + wg.y * p.wg_x);
}

fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return ib == 0xffffffffu || va > vb || (va == vb && ia < ib);
}

// `main`, then each x row's best (largest value, lowest index, NaN never) among this
// workgroup's output rows into best[r * n_parts + part_offset + workgroup].
@compute @workgroup_size(WG)
fn main_argmax(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let wgi = wg.x + wg.y * p.wg_x;
    gemv(lid, wgi);
    if (LANES == 1u) {
        // One thread per row: each row is its own partial (no barrier on CPU adapters).
        let o = wgi * WG + lid;
        if (o < p.m) {
            for (var r = 0u; r < N_ROWS; r++) {
                let v = acc[r];
                let i = select(0xffffffffu, p.out_offset + o, v == v);
                best[r * p.n_parts + p.part_offset + o] = vec2<u32>(bitcast<u32>(v), i);
            }
        }
        return;
    }
    let rows = WG / LANES;
    let sub = lid / LANES;
    workgroupBarrier();
    if (lid % LANES == 0u) {
        for (var r = 0u; r < N_ROWS; r++) {
            partial[r * WG + sub] = acc[r];
        }
    }
    workgroupBarrier();
    if (lid < N_ROWS && wgi * rows < p.m) {
        var bv = 0.0;
        var bi = 0xffffffffu;
        for (var j = 0u; j < rows; j++) {
            let v = partial[lid * WG + j];
            let oj = wgi * rows + j;
            if (oj < p.m && v == v && better(v, p.out_offset + oj, bv, bi)) {
                bv = v;
                bi = p.out_offset + oj;
            }
        }
        best[lid * p.n_parts + p.part_offset + wgi] = vec2<u32>(bitcast<u32>(bv), bi);
    }
}
