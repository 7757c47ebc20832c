// y[r, o] (+)= sum_k W[o, k] * x[r, k] for r < N_ROWS <= 16: each weight is read ONCE
// for all rows (the verification path of DFlash). A row's sum runs in the same order
// whatever N_ROWS is: LANES threads share an output row and take its groups
// g = lane, lane + LANES, ...; each lane sums its groups in order; the LANES partial sums
// meet in a fixed tree. Each thread owns OUTS output rows (o, o + THREADS / LANES, ...)
// and loads each activation once for all of them, so the workgroup of THREADS covers
// OUTS * THREADS / LANES rows and an activation is requested OUTS times less often;
// every output row's sum is the same expressions in the same order whatever OUTS is.
// Eight weights at a time, a row's sum gains scale * sum(q * x) + min * sum(x) (vec4
// products, summed once): the dequantization's multiply-add is paid per eight weights.
// LANES, OUTS and THREADS are per-device, per-shape tuning knobs (16 lanes on GPUs, 1 on
// CPU adapters, where barriers are dear); N_ROWS and OUTS make the loops unroll.
//
// Fused neighbours (each an override constant, each the same arithmetic as the separate
// kernel it replaces, so the bits do not change):
//   NORM     x is RMS-normalised and scaled by norm_w in the prologue: every workgroup
//            computes each row's 1/rms in rmsnorm.wgsl's order (thread t sums
//            i = t, t + WG, ...; a fixed tree) and normalises x as it reads it.
//   BIAS     y = acc + bias[bias_offset + o].
//   PAIR     SwiGLU of two row blocks of one matrix ([gate; up]): the thread computes rows
//            o and o + pair_rows from the same x loads; y[o] = silu(gate) * up.
//   NORM_SUMS x is RMSNorm's input times the norm's weight, written with partial sums of
//            its squares (after x's MAX_ROWS rows) by the residual GEMV that wrote the
//            residual stream (main_norm_out): row r's norm_parts partials give its
//            1/rms, which scales the finished sums (RMSNorm is linear in x once 1/rms
//            is known), so no workgroup walks x for its norm. With LANES = 1 each
//            thread sums them alone in order (no barrier); else the workgroup shares
//            them in the prologue. Not the separate kernel's bits (its 1/rms multiplies
//            each x first): the CPU reference's tolerance, and batch invariance, hold.
//   main_norm_out (and main_tap_norm_out, `main_tap` with it), with ACCUMULATE: the next
//            RMSNorm's share in the epilogue: each stored value v of x row r also as
//            v * norm_w[o] into prenorm[r * out_stride + o], and each row-owning
//            thread's sum of v^2 over its rows (in order) into
//            prenorm[MAX_ROWS * out_stride + r * norm_parts + part], part = its index
//            among the row-owning threads of the grid (norm_parts: their count padded
//            with zeros to a multiple of 4, which the readers load as vec4).
//   main_tap also copies each stored value into taps[r * tap_stride + tap_offset + o] (a
//   DFlash tap of the residual stream after a layer: the copy it replaces). An entry of
//   its own, so that the others never bind the taps.
//   main_experts: a mixture-of-experts projection (moe.wgsl routes). The matrix is every
//   expert's rows stacked (expert e's at (e - expert_lo) * m in this chunk); a workgroup
//   serves one expert and one tile of its m rows for ALL x rows that chose it, so a
//   16-row verify reads each selected expert once. x row r's result lands in its slot
//   j (routes[r * EXPERT_K + j] == e): y[(r * EXPERT_K + j) * out_stride + o]. With
//   X_SLOTS the input of x row r is its own slot's row of x (the down projection reads
//   each slot's activation), else row r. Every row's sum is the plain kernel's, so a
//   row's result does not depend on the others; rows that did not choose the expert
//   are computed and not stored, and a workgroup whose expert no row chose returns.
//   main_argmax also leaves each workgroup's best (value, index) per x row in `best`
//   (each row's own with LANES = 1); argmax.wgsl `reduce` finishes it: the lm_head and
//   the greedy head in one pass.

override ACCUMULATE: bool = false; // y += result (residual adds) instead of y = result
override N_ROWS: u32 = 1u;
override LANES: u32 = 16u;
override OUTS: u32 = 1u; // output rows per thread, 1..=MAX_OUTS
override NORM: bool = false;
override BIAS: bool = false;
override PAIR: bool = false;
override EXPERT_K: u32 = 0u; // main_experts: experts per x row (0: a plain GEMV)
override X_SLOTS: bool = false; // main_experts: x row r reads its slot's row of x
override NORM_SUMS: bool = false;
override THREADS: u32 = 64u; // threads per workgroup: WG, 32 or 16 (at least LANES and N_ROWS)

struct Params {
    n_rows: u32,      // = N_ROWS (kept for the layout of the uniform)
    k: u32,           // columns (input length)
    m: u32,           // output rows in this chunk (PAIR: rows of each half)
    out_offset: u32,  // index of this chunk's first output row in y
    out_stride: u32,  // y row length (all chunks)
    wg_x: u32,        // workgroups along x (the grid may be 2-D)
    eps: f32,         // NORM, NORM_SUMS
    bias_offset: u32, // BIAS: bias index of output row 0
    pair_rows: u32,   // PAIR: row distance from a gate row to its up row
    part_offset: u32, // main_argmax: this chunk's first workgroup among all chunks
    n_parts: u32,     // main_argmax: workgroups of all chunks (the stride of `best`)
    tap_offset: u32,  // main_tap: first float of this matrix's rows in a taps row
    tap_stride: u32,  // main_tap: floats per taps row
    expert_lo: u32,   // main_experts: the first expert whose rows are in this chunk
    zero: u32,        // 0 (see x_sum)
    norm_parts: u32,  // NORM_SUMS, main_norm_out: partial sums of squares per x row
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
@group(0) @binding(9) var<storage, read_write> taps: array<f32>;
@group(0) @binding(10) var<storage, read> routes: array<u32>; // main_experts: [rows, EXPERT_K]
// main_norm_out: [MAX_ROWS, out_stride] of x * norm_w, then [MAX_ROWS, norm_parts]
// partial sums (a NORM_SUMS reader's x). Only its entries bind it, so that the others
// stay within WebGPU's default 8 storage buffers.
@group(0) @binding(11) var<storage, read_write> prenorm: array<f32>;

const MAX_ROWS: u32 = 16u;
const MAX_OUTS: u32 = 8u;
// [2 matrix rows][16 x rows][WG slots]: thread-minor, so the tree has no bank conflicts.
var<workgroup> partial: array<f32, 2u * MAX_ROWS * WG>;
// main_argmax: the index of each thread's best row per x row (its value in `partial`).
var<workgroup> part_index: array<u32, MAX_ROWS * WG>;

var<workgroup> shared_inv_rms: array<f32, 16>;
var<private> inv_rms: array<f32, 16>; // NORM: each x row's 1 / rms

// main_experts: the slot of this workgroup's expert in each x row (NO_SLOT: not
// chosen), and the first weight row of the expert in the chunk.
const NO_SLOT: u32 = 0xffffffffu;
var<workgroup> wg_slots: array<u32, 16>;
var<workgroup> wg_chosen: u32;
var<private> slots: array<u32, 16>;
var<private> row_base: u32;

// [OUTS output rows][16 x rows]: acc for row o_j, acc2 for o_j + pair_rows (PAIR).
var<private> acc: array<f32, 128>;
var<private> acc2: array<f32, 128>;
// The current group of each owned row: its weight words, scale and min (and PAIR's).
var<private> wq: array<vec4<u32>, 8>;
var<private> wq2: array<vec4<u32>, 8>;
var<private> ws: array<vec4<f32>, 8>; // (scale, min, scale2, min2)
// The quantized values (not yet scaled) of the current eight weights of each owned row.
var<private> wa: array<vec4<f32>, 8>;
var<private> wb: array<vec4<f32>, 8>;
var<private> wa2: array<vec4<f32>, 8>;
var<private> wb2: array<vec4<f32>, 8>;

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

// Term i of x row r's sum of squares: x[r, i]^2 (NORM), or the sum of vec4 i of its
// partial sums (NORM_SUMS: norm_parts, a multiple of 4, per row).
fn norm_term(r: u32, i: u32) -> f32 {
    if (NORM_SUMS) {
        return hsum(x[MAX_ROWS * p.k / 4u + r * (p.norm_parts / 4u) + i]);
    }
    let j = r * p.k + i;
    let v = x[j / 4u][j % 4u];
    return v * v;
}

// Terms of a row's sum of squares.
fn norm_terms() -> u32 {
    return select(p.k, p.norm_parts / 4u, NORM_SUMS);
}

// Each x row's 1 / rms, in rmsnorm.wgsl's order: sum t of WG sums of norm_term(r, i)
// for i = t, t + WG, ... (thread lid takes sums lid, lid + THREADS, ...); the WG sums
// meet in the fixed tree.
fn norm_prologue(lid: u32) {
    for (var r = 0u; r < N_ROWS; r++) {
        for (var t = lid; t < WG; t += THREADS) {
            var ss = 0.0;
            for (var i = t; i < norm_terms(); i += WG) {
                ss += norm_term(r, i);
            }
            partial[r * WG + t] = ss;
        }
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

// NORM_SUMS: the thread's finished sums times each x row's 1 / rms: from the prologue
// where LANES > 1 (the workgroup shares the sum), else from the partial sums
// main_norm_out left, summed in order by the thread alone (no barrier; after the sums,
// so that nothing more is live through them).
fn scale_by_inv_rms() {
    for (var r = 0u; r < N_ROWS; r++) {
        var inv = inv_rms[r];
        if (LANES == 1u) {
            var ss = 0.0;
            for (var i = 0u; i < norm_terms(); i++) {
                ss += norm_term(r, i);
            }
            inv = 1.0 / sqrt(ss / f32(p.k) + p.eps);
        }
        for (var j = 0u; j < OUTS; j++) {
            acc[j * MAX_ROWS + r] *= inv;
            acc2[j * MAX_ROWS + r] *= inv;
        }
    }
}

// main_norm_out: the next norm's x * weight of the owned rows just stored, and their
// sum of squares per x row as partial `part` (0 where the thread owns no row); partial
// 0's thread zeroes the partials that pad the row's to a multiple of 4.
fn norm_out(o0: u32, part: u32) {
    let at = MAX_ROWS * p.out_stride;
    let owners = (p.m + rows_per_workgroup() - 1u) / rows_per_workgroup() * (THREADS / LANES);
    for (var r = 0u; r < N_ROWS; r++) {
        for (var i = owners; i < p.norm_parts && part == 0u; i++) {
            prenorm[at + r * p.norm_parts + i] = 0.0;
        }
        var ss = 0.0;
        for (var j = 0u; j < OUTS; j++) {
            let o = p.out_offset + out_row(o0, j);
            if (out_row(o0, j) < p.m) {
                let v = y[r * p.out_stride + o];
                ss += v * v;
                prenorm[r * p.out_stride + o] = v * norm_w[o / 4u][o % 4u];
            }
        }
        prenorm[at + r * p.norm_parts + part] = ss;
    }
}

// The row of x that x row r reads: its slot's (X_SLOTS), else its own.
fn x_row(r: u32) -> u32 {
    if (EXPERT_K > 0u && X_SLOTS) {
        return r * EXPERT_K + select(slots[r], 0u, slots[r] == NO_SLOT);
    }
    return r;
}

// vec4 `i` of the norm's weight (NORM), loaded once for every x row.
fn norm_at(i: u32) -> vec4<f32> {
    if (NORM) {
        return norm_w[i];
    }
    return vec4<f32>(1.0);
}

// vec4 `i` of x row `r`, normalised when NORM (nw: norm_at(i)).
fn x_at(r: u32, i: u32, nw: vec4<f32>) -> vec4<f32> {
    let v = x[x_row(r) * (p.k / 4u) + i];
    if (NORM) {
        return (v * inv_rms[r]) * nw;
    }
    return v;
}

// Output row j of the thread whose first row is o0.
fn out_row(o0: u32, j: u32) -> u32 {
    return o0 + j * (THREADS / LANES);
}

// Index of group g of output row j, clamped into the chunk: a thread's rows past the
// chunk's end read the last row's weights and are never stored.
fn group_index(o0: u32, j: u32, g: u32, gpr: u32) -> u32 {
    if (EXPERT_K > 0u) {
        return (row_base + min(out_row(o0, j), p.m - 1u)) * gpr + g;
    }
    return min(out_row(o0, j), p.m - 1u) * gpr + g;
}

// Scale and min of group g of each owned row (and of its up row, PAIR), loaded up front.
fn load_scales(o0: u32, g: u32, gpr: u32) {
    for (var j = 0u; j < OUTS; j++) {
        let gi = group_index(o0, j, g, gpr);
        ws[j] = vec4<f32>(group_scale(gi), group_min(gi), 0.0, 0.0);
        if (PAIR) {
            let gi2 = gi + p.pair_rows * gpr;
            ws[j].z = group_scale(gi2);
            ws[j].w = group_min(gi2);
        }
    }
}

// Word vector `vi` of group g of each owned row (PAIR: and of its up row).
fn load_words(o0: u32, g: u32, gpr: u32, vi: u32) {
    let nv = select(GROUP / 16u, 1u, FORMAT == 0u);
    for (var j = 0u; j < OUTS; j++) {
        let gi = group_index(o0, j, g, gpr);
        wq[j] = qs[gi * nv + vi];
        if (PAIR) {
            wq2[j] = qs[(gi + p.pair_rows * gpr) * nv + vi];
        }
    }
}

fn hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// The sum of two vec4 of x. A normalised x (NORM) is a product, which a compiler may fuse
// into the add as a multiply-add (and algebraic rewrites see through float arithmetic);
// XORed with p.zero (0, unknown to the compiler) it is rounded first, as the separate
// RMSNorm's stored xn is: the same bits fused or not.
fn x_sum(x0: vec4<f32>, x1: vec4<f32>) -> f32 {
    if (NORM) {
        let z = vec4<u32>(p.zero);
        let r0 = bitcast<vec4<f32>>(bitcast<vec4<u32>>(x0) ^ z);
        let r1 = bitcast<vec4<f32>>(bitcast<vec4<u32>>(x1) ^ z);
        return hsum(r0 + r1);
    }
    return hsum(x0 + x1);
}

// What eight weights (quantized values qa, qb against x0, x1; xs = x_sum(x0, x1)) of a
// group with scale sc.x and min sc.y add to a row's sum: both accumulate paths use it.
fn eight_term(
    sc: vec2<f32>, qa: vec4<f32>, qb: vec4<f32>, x0: vec4<f32>, x1: vec4<f32>, xs: f32,
) -> f32 {
    return sc.x * hsum(fma(qb, x1, qa * x0)) + sc.y * xs;
}

// Eight weights of each owned row (wa, wb: their quantized values, not yet scaled)
// against every x row's vec4 pair at xi and xi + 1: the row's sum gains
// scale * sum(q * x) + min * sum(x), so the dequantization's multiply-add is paid per
// eight weights and the products stay vec4 until their sum.
fn accumulate_eight(xi: u32) {
    let nw0 = norm_at(xi);
    let nw1 = norm_at(xi + 1u);
    for (var r = 0u; r < N_ROWS; r++) {
        let x0 = x_at(r, xi, nw0);
        let x1 = x_at(r, xi + 1u, nw1);
        let xs = x_sum(x0, x1);
        for (var j = 0u; j < OUTS; j++) {
            let i = j * MAX_ROWS + r;
            acc[i] += eight_term(ws[j].xy, wa[j], wb[j], x0, x1, xs);
            if (PAIR) {
                acc2[i] += eight_term(ws[j].zw, wa2[j], wb2[j], x0, x1, xs);
            }
        }
    }
}

// The quantized values of two vec4 of each owned row's current words into wa, wb (wa2,
// wb2): nibbles 0..3 and 4..7 of q4 word w, or the bytes of q8 words w and w + 1.
fn unpack_eight(w: u32) {
    for (var j = 0u; j < OUTS; j++) {
        if (FORMAT == 0u) {
            wa[j] = q4_lo(wq[j][w]);
            wb[j] = q4_hi(wq[j][w]);
            if (PAIR) {
                wa2[j] = q4_lo(wq2[j][w]);
                wb2[j] = q4_hi(wq2[j][w]);
            }
        } else {
            wa[j] = q8_of(wq[j][w]);
            wb[j] = q8_of(wq[j][w + 1u]);
            if (PAIR) {
                wa2[j] = q8_of(wq2[j][w]);
                wb2[j] = q8_of(wq2[j][w + 1u]);
            }
        }
    }
}

// acc[j][r] (and acc2[j][r]) = this lane's share of output row o_j (and o_j + pair_rows).
fn accumulate(o0: u32, lane: u32) {
    for (var i = 0u; i < OUTS * MAX_ROWS; i++) {
        acc[i] = 0.0;
        acc2[i] = 0.0;
    }
    let gpr = p.k / GROUP;
    if (o0 >= p.m) {
        return;
    }
    for (var g = lane; g < gpr; g += LANES) {
        load_scales(o0, g, gpr);
        let xb = g * (GROUP / 4u); // first vec4 of x for this group
        if (FORMAT == 0u) {
            load_words(o0, g, gpr, 0u);
            for (var w = 0u; w < 4u; w++) {
                unpack_eight(w);
                accumulate_eight(xb + w * 2u);
            }
        } else {
            for (var vi = 0u; vi < GROUP / 16u; vi++) {
                load_words(o0, g, gpr, vi);
                for (var w = 0u; w < 4u; w += 2u) {
                    unpack_eight(w);
                    accumulate_eight(xb + vi * 4u + w);
                }
            }
        }
    }
}

// `accumulate` for a thread that owns one output row (OUTS = 1, PAIR: one gate/up pair)
// or two (OUTS = 2), its sums in function variables: the same expressions in the same
// order, so the same bits. SwiftShader's JIT keeps the module's private arrays in memory
// and does not unroll their loops (there a thread per row took 2.7x the time with the
// arrays); its second row (the up row, or the second owned row) shares the x loads.
fn accumulate_one_row(o0: u32, lane: u32) {
    var a1: array<f32, 16>;
    var a2: array<f32, 16>;
    for (var r = 0u; r < N_ROWS; r++) {
        a1[r] = 0.0;
        a2[r] = 0.0;
    }
    let two = PAIR || OUTS == 2u;
    let gpr = p.k / GROUP;
    for (var g = lane; g < gpr && o0 < p.m; g += LANES) {
        let gi = group_index(o0, 0u, g, gpr);
        var gi2 = gi + p.pair_rows * gpr;
        if (OUTS == 2u) {
            gi2 = group_index(o0, 1u, g, gpr);
        }
        let sc = vec2<f32>(group_scale(gi), group_min(gi));
        var sc2 = vec2<f32>(0.0);
        if (two) {
            sc2 = vec2<f32>(group_scale(gi2), group_min(gi2));
        }
        let xb = g * (GROUP / 4u);
        let nv = select(GROUP / 16u, 1u, FORMAT == 0u);
        for (var vi = 0u; vi < nv; vi++) {
            let v = qs[gi * nv + vi];
            var v2 = vec4<u32>(0u);
            if (two) {
                v2 = qs[gi2 * nv + vi];
            }
            for (var w = 0u; w < 4u; w += select(2u, 1u, FORMAT == 0u)) {
                // Eight weights: nibbles 0..3 and 4..7 of q4 word w, or q8 words w, w + 1.
                var qa: vec4<f32>;
                var qb: vec4<f32>;
                var qa2: vec4<f32>;
                var qb2: vec4<f32>;
                var xi: u32;
                if (FORMAT == 0u) {
                    qa = q4_lo(v[w]);
                    qb = q4_hi(v[w]);
                    qa2 = q4_lo(v2[w]);
                    qb2 = q4_hi(v2[w]);
                    xi = xb + w * 2u;
                } else {
                    qa = q8_of(v[w]);
                    qb = q8_of(v[w + 1u]);
                    qa2 = q8_of(v2[w]);
                    qb2 = q8_of(v2[w + 1u]);
                    xi = xb + vi * 4u + w;
                }
                let nw0 = norm_at(xi);
                let nw1 = norm_at(xi + 1u);
                for (var r = 0u; r < N_ROWS; r++) {
                    let x0 = x_at(r, xi, nw0);
                    let x1 = x_at(r, xi + 1u, nw1);
                    let xs = x_sum(x0, x1);
                    a1[r] += eight_term(sc, qa, qb, x0, x1, xs);
                    if (two) {
                        a2[r] += eight_term(sc2, qa2, qb2, x0, x1, xs);
                    }
                }
            }
        }
    }
    for (var r = 0u; r < N_ROWS; r++) {
        acc[r] = a1[r];
        if (OUTS == 2u) {
            acc[MAX_ROWS + r] = a2[r];
        } else {
            acc2[r] = a2[r];
        }
    }
}

// The LANES partial sums of each output row meet in a fixed tree (lane 0 walks it), one
// owned row after another through the same scratch.
fn lane_tree(lid: u32, lane: u32) {
    if (LANES == 1u) {
        return;
    }
    for (var j = 0u; j < OUTS; j++) {
        if (j > 0u) {
            workgroupBarrier(); // lane 0 has read row j - 1's partials
        }
        for (var r = 0u; r < N_ROWS; r++) {
            partial[r * WG + lid] = acc[j * MAX_ROWS + r];
            if (PAIR) {
                partial[(MAX_ROWS + r) * WG + lid] = acc2[j * MAX_ROWS + r];
            }
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var r = 0u; r < N_ROWS; r++) {
                acc[j * MAX_ROWS + r] = tree_in_place(r * WG + lid, LANES);
                if (PAIR) {
                    acc2[j * MAX_ROWS + r] = tree_in_place((MAX_ROWS + r) * WG + lid, LANES);
                }
            }
        }
    }
}

// The owned rows of every x row into y, with the bias, SwiGLU and residual epilogues.
fn store(o0: u32) {
    for (var j = 0u; j < OUTS; j++) {
        let o = out_row(o0, j);
        if (o >= p.m) {
            return;
        }
        for (var r = 0u; r < N_ROWS; r++) {
            var yi = r * p.out_stride + p.out_offset + o;
            if (EXPERT_K > 0u) {
                if (slots[r] == NO_SLOT) {
                    continue;
                }
                yi = (r * EXPERT_K + slots[r]) * p.out_stride + o;
            }
            var v = acc[j * MAX_ROWS + r];
            if (BIAS) {
                v = v + bias[p.bias_offset + o];
            }
            if (PAIR) {
                v = (v / (1.0 + exp(-v))) * acc2[j * MAX_ROWS + r];
            }
            if (ACCUMULATE) {
                v = y[yi] + v;
            }
            y[yi] = v;
        }
    }
}

// Output rows one workgroup covers.
fn rows_per_workgroup() -> u32 {
    return OUTS * (THREADS / LANES);
}

// The first output row of thread lid of workgroup wgi.
fn first_row(lid: u32, wgi: u32) -> u32 {
    return wgi * rows_per_workgroup() + lid / LANES;
}

fn gemv(lid: u32, wgi: u32) {
    if (NORM || (NORM_SUMS && LANES > 1u)) {
        norm_prologue(lid);
    }
    let lane = lid % LANES;
    let o0 = first_row(lid, wgi);
    if (OUTS == 1u || (OUTS == 2u && !PAIR)) {
        accumulate_one_row(o0, lane);
    } else {
        accumulate(o0, lane);
    }
    lane_tree(lid, lane);
    if (lane == 0u) {
        if (NORM_SUMS) {
            scale_by_inv_rms();
        }
        store(o0);
    }
}

@compute @workgroup_size(THREADS)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    gemv(lid, wg.x + wg.y * p.wg_x);
}

// One expert's tile of rows for every x row that chose it (see the header). Workgroup
// wgi serves expert expert_lo + wgi / tiles and tile wgi % tiles of its rows.
@compute @workgroup_size(THREADS)
fn main_experts(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let wgi = wg.x + wg.y * p.wg_x;
    let tiles = (p.m + rows_per_workgroup() - 1u) / rows_per_workgroup();
    let local_expert = wgi / tiles;
    let expert = p.expert_lo + local_expert;
    if (lid < N_ROWS) {
        var slot = NO_SLOT;
        for (var j = 0u; j < EXPERT_K; j++) {
            if (routes[lid * EXPERT_K + j] == expert) {
                slot = j;
            }
        }
        wg_slots[lid] = slot;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var chosen = 0u;
        for (var r = 0u; r < N_ROWS; r++) {
            chosen |= u32(wg_slots[r] != NO_SLOT);
        }
        wg_chosen = chosen;
    }
    if (workgroupUniformLoad(&wg_chosen) == 0u) {
        return;
    }
    for (var r = 0u; r < N_ROWS; r++) {
        slots[r] = wg_slots[r];
    }
    row_base = local_expert * p.m;
    gemv(lid, wgi % tiles);
}

// Each value thread lid of workgroup wgi stored (read back) into the taps.
fn tap_out(lid: u32, wgi: u32) {
    let o0 = first_row(lid, wgi);
    for (var j = 0u; j < OUTS; j++) {
        let o = out_row(o0, j);
        if (o >= p.m) {
            return;
        }
        for (var r = 0u; r < N_ROWS; r++) {
            let at = p.out_offset + o;
            taps[r * p.tap_stride + p.tap_offset + at] = y[r * p.out_stride + at];
        }
    }
}

// `main`, then each stored value (read back by the thread that stored it) into the taps.
@compute @workgroup_size(THREADS)
fn main_tap(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let wgi = wg.x + wg.y * p.wg_x;
    gemv(lid, wgi);
    if (lid % LANES == 0u) {
        tap_out(lid, wgi);
    }
}

// `main` (a residual add), then the next norm's share of what it stored (`norm_out`).
@compute @workgroup_size(THREADS)
fn main_norm_out(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let wgi = wg.x + wg.y * p.wg_x;
    gemv(lid, wgi);
    if (lid % LANES == 0u) {
        norm_out(first_row(lid, wgi), wgi * (THREADS / LANES) + lid / LANES);
    }
}

// `main_tap` and `main_norm_out` in one (9 storage buffers).
@compute @workgroup_size(THREADS)
fn main_tap_norm_out(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
) {
    let wgi = wg.x + wg.y * p.wg_x;
    gemv(lid, wgi);
    if (lid % LANES == 0u) {
        tap_out(lid, wgi);
        norm_out(first_row(lid, wgi), wgi * (THREADS / LANES) + lid / LANES);
    }
}

fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return ib == 0xffffffffu || va > vb || (va == vb && ia < ib);
}

// `main`, then each x row's best (largest value, lowest index, NaN never) among this
// workgroup's output rows into best[r * n_parts + part_offset + workgroup].
@compute @workgroup_size(THREADS)
fn main_argmax(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let wgi = wg.x + wg.y * p.wg_x;
    gemv(lid, wgi);
    let o0 = first_row(lid, wgi);
    if (LANES == 1u) {
        // One thread per row: each row is its own partial (no barrier on CPU adapters).
        for (var j = 0u; j < OUTS; j++) {
            let o = out_row(o0, j);
            if (o < p.m) {
                for (var r = 0u; r < N_ROWS; r++) {
                    let v = acc[j * MAX_ROWS + r];
                    let i = select(0xffffffffu, p.out_offset + o, v == v);
                    best[r * p.n_parts + p.part_offset + o] = vec2<u32>(bitcast<u32>(v), i);
                }
            }
        }
        return;
    }
    // Each row-owning thread's best among its owned rows, per x row, into
    // [x row][thread's slot] (THREADS / LANES <= WG slots: at most 16 x 64, whatever
    // OUTS is); thread r then takes the best of x row r's slots. `better` is a total
    // order (largest value, then lowest index), so the grouping does not change the pick.
    let subs = THREADS / LANES;
    workgroupBarrier();
    if (lid % LANES == 0u) {
        for (var r = 0u; r < N_ROWS; r++) {
            var bv = 0.0;
            var bi = 0xffffffffu;
            for (var j = 0u; j < OUTS; j++) {
                let o = out_row(o0, j);
                let v = acc[j * MAX_ROWS + r];
                if (o < p.m && v == v && better(v, p.out_offset + o, bv, bi)) {
                    bv = v;
                    bi = p.out_offset + o;
                }
            }
            partial[r * subs + lid / LANES] = bv;
            part_index[r * subs + lid / LANES] = bi;
        }
    }
    workgroupBarrier();
    if (lid < N_ROWS && wgi * rows_per_workgroup() < p.m) {
        var bv = 0.0;
        var bi = 0xffffffffu;
        for (var i = 0u; i < subs; i++) {
            let v = partial[lid * subs + i];
            let at = part_index[lid * subs + i];
            if (at != 0xffffffffu && better(v, at, bv, bi)) {
                bv = v;
                bi = at;
            }
        }
        best[lid * p.n_parts + p.part_offset + wgi] = vec2<u32>(bitcast<u32>(bv), bi);
    }
}
