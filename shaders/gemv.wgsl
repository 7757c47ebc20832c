// y[r, o] (+)= sum_k x[r, k] * W[o, k] for r < N_ROWS <= 16: each weight is read ONCE
// for all rows (the verification path of DFlash). A row's sum runs in the same order
// whatever N_ROWS is: LANES threads share an output row and take its groups
// g = lane, lane + LANES, ...; each lane sums its groups in order; the LANES partial sums
// meet in a fixed tree. The workgroup (64 threads) covers 64 / LANES output rows.
// LANES is a per-device tuning knob (16 on GPUs, 1 on CPU adapters, where barriers are
// dear); N_ROWS makes the row loops unroll.

override ACCUMULATE: bool = false; // y += result (residual adds) instead of y = result
override N_ROWS: u32 = 1u;
override LANES: u32 = 16u;

struct Params {
    n_rows: u32,     // = N_ROWS (kept for the layout of the uniform)
    k: u32,          // columns (input length)
    m: u32,          // output rows in this chunk
    out_offset: u32, // index of this chunk's first output row in y
    out_stride: u32, // y row length (all chunks)
    wg_x: u32,       // workgroups along x (the grid may be 2-D)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> mins: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const MAX_ROWS: u32 = 16u;
var<workgroup> partial: array<f32, 1024>; // [64 threads][16 rows]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = lid % LANES;
    let sub = lid / LANES;
    let o = (wg.x + wg.y * p.wg_x) * (64u / LANES) + sub;
    var acc: array<f32, 16>;
    for (var r = 0u; r < N_ROWS; r++) {
        acc[r] = 0.0;
    }
    let gpr = p.k / GROUP;
    let k4 = p.k / 4u;
    if (o < p.m) {
        for (var g = lane; g < gpr; g += LANES) {
            let gi = o * gpr + g;
            let s = group_scale(gi);
            let mn = group_min(gi);
            let xb = g * (GROUP / 4u); // first vec4 of x for this group
            if (FORMAT == 0u) {
                let v = qs[gi];
                for (var w = 0u; w < 4u; w++) {
                    let a = q4_lo(v[w]) * s + mn;
                    let b = q4_hi(v[w]) * s + mn;
                    for (var r = 0u; r < N_ROWS; r++) {
                        let xi = r * k4 + xb + w * 2u;
                        acc[r] += dot(a, x[xi]) + dot(b, x[xi + 1u]);
                    }
                }
            } else {
                let nv = GROUP / 16u;
                for (var vi = 0u; vi < nv; vi++) {
                    let v = qs[gi * nv + vi];
                    for (var w = 0u; w < 4u; w++) {
                        let a = q8_of(v[w]) * s + mn;
                        for (var r = 0u; r < N_ROWS; r++) {
                            acc[r] += dot(a, x[r * k4 + xb + vi * 4u + w]);
                        }
                    }
                }
            }
        }
    }
    if (LANES > 1u) {
        for (var r = 0u; r < N_ROWS; r++) {
            partial[lid * MAX_ROWS + r] = acc[r];
        }
        workgroupBarrier();
        for (var step = LANES / 2u; step > 0u; step >>= 1u) {
            if (lane < step) {
                for (var r = 0u; r < N_ROWS; r++) {
                    partial[lid * MAX_ROWS + r] += partial[(lid + step) * MAX_ROWS + r];
                }
            }
            workgroupBarrier();
        }
        for (var r = 0u; r < N_ROWS; r++) {
            acc[r] = partial[lid * MAX_ROWS + r];
        }
    }
    if (lane == 0u && o < p.m) {
        for (var r = 0u; r < N_ROWS; r++) {
            let yi = r * p.out_stride + p.out_offset + o;
            if (ACCUMULATE) {
                y[yi] = y[yi] + acc[r];
            } else {
                y[yi] = acc[r];
            }
        }
    }
}
