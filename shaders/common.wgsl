// The prelude of every kernel (pipelines.rs puts `const WG` before it, from Rust's
// pipelines::WORKGROUP_SIZE: the one definition of the workgroup size): the workgroup
// reductions, each a fixed tree (thread t takes t + s for s = WG/2, WG/4, ..., 1), so
// a reduction's result never depends on the adapter, the pass or the rows beside it.
// Each is called by all WG threads in uniform control flow and ends with a barrier, so
// its scratch array may be used again at once.

var<workgroup> wg_f32: array<f32, WG>;
var<workgroup> wg_u32: array<u32, WG>;

fn wg_sum_f32(t: u32, v: f32) -> f32 {
    wg_f32[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            wg_f32[t] += wg_f32[t + s];
        }
        workgroupBarrier();
    }
    let r = wg_f32[0];
    workgroupBarrier();
    return r;
}

fn wg_max_f32(t: u32, v: f32) -> f32 {
    wg_f32[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            wg_f32[t] = max(wg_f32[t], wg_f32[t + s]);
        }
        workgroupBarrier();
    }
    let r = wg_f32[0];
    workgroupBarrier();
    return r;
}

fn wg_sum_u32(t: u32, v: u32) -> u32 {
    wg_u32[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            wg_u32[t] += wg_u32[t + s];
        }
        workgroupBarrier();
    }
    let r = wg_u32[0];
    workgroupBarrier();
    return r;
}

// No candidate: an empty (value, index) pair.
const WG_NONE: u32 = 0xffffffffu;

// (va, ia) ranks before (vb, ib): the larger value, the smaller index on a tie.
fn wg_ranks_before(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

// The workgroup's best (value, index) pair: the largest value, the smallest index on a
// tie; pairs with index WG_NONE never win (all empty: WG_NONE).
fn wg_best(t: u32, v: f32, i: u32) -> vec2<u32> {
    wg_f32[t] = v;
    wg_u32[t] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            let ok = wg_u32[t + s] != WG_NONE
                && (wg_u32[t] == WG_NONE || wg_ranks_before(wg_f32[t + s], wg_u32[t + s], wg_f32[t], wg_u32[t]));
            if (ok) {
                wg_f32[t] = wg_f32[t + s];
                wg_u32[t] = wg_u32[t + s];
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(bitcast<u32>(wg_f32[0]), wg_u32[0]);
    workgroupBarrier();
    return r;
}
