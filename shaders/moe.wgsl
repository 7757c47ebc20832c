// A mixture-of-experts feed-forward around gemv.wgsl's `main_experts`:
//   route    each row's router scores -> its EXPERT_K experts and their weights, the
//            arithmetic of the CPU reference (dflash_core::cpu::ops::route_experts):
//            softmax with the max subtracted, sums left to right; the k most probable
//            one after another (ties to the lower index, NaN never); the chosen
//            probabilities divided by their sum when `normalize`.
//   combine  x[r, o] += sum over slots j, in order, of weight[r, j] * y[r, j, o] (the
//            sum first, then the residual add, as the CPU reference), and with SHARED
//            the shared expert's row weighed by sigmoid of its gate; `combine_tap`
//            also copies the new x into the taps (a DFlash tap after the layer).
// One thread per row routes (a row's choice never depends on the other rows).

override EXPERT_K: u32 = 1u;
override SHARED: bool = false; // combine: + sigmoid(shared_gate[r]) * shared_out[r, o]

struct Params {
    n_rows: u32,
    n_experts: u32,
    normalize: u32,  // route: 1 to renormalise the chosen probabilities
    hidden: u32,     // combine: floats per row of x
    tap_offset: u32, // combine_tap: first float of the layer in a taps row
    tap_stride: u32, // combine_tap: floats per taps row
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> scores: array<f32>;          // [rows, n_experts]
@group(0) @binding(2) var<storage, read_write> routes: array<u32>;    // [rows, EXPERT_K]
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;   // [rows, EXPERT_K]
@group(0) @binding(4) var<storage, read> expert_out: array<f32>;      // [rows, EXPERT_K, hidden]
@group(0) @binding(5) var<storage, read_write> x: array<f32>;         // [rows, hidden]
@group(0) @binding(6) var<storage, read_write> taps: array<f32>;
@group(0) @binding(7) var<storage, read> shared_out: array<f32>;      // [rows, hidden]
@group(0) @binding(8) var<storage, read> shared_gate: array<f32>;     // [rows]

const MAX_K: u32 = 16u;
var<private> chosen: array<u32, 16>;
var<private> chosen_p: array<f32, 16>;

fn taken(i: u32, n: u32) -> bool {
    for (var j = 0u; j < n; j++) {
        if (chosen[j] == i) {
            return true;
        }
    }
    return false;
}

@compute @workgroup_size(WG)
fn route(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.n_rows) {
        return;
    }
    let base = r * p.n_experts;
    var m = scores[base];
    for (var i = 1u; i < p.n_experts; i++) {
        m = max(m, scores[base + i]);
    }
    var sum = 0.0;
    for (var i = 0u; i < p.n_experts; i++) {
        sum += exp(scores[base + i] - m);
    }
    let inv = 1.0 / sum;
    for (var j = 0u; j < EXPERT_K; j++) {
        var best = 0xffffffffu;
        var best_p = 0.0;
        for (var i = 0u; i < p.n_experts; i++) {
            let pi = exp(scores[base + i] - m) * inv;
            if (pi == pi && !taken(i, j) && (best == 0xffffffffu || pi > best_p)) {
                best = i;
                best_p = pi;
            }
        }
        if (best == 0xffffffffu) {
            // Every score NaN: the lowest expert not yet taken, at weight 0.
            best = 0u;
            while (taken(best, j)) {
                best++;
            }
        }
        chosen[j] = best;
        chosen_p[j] = best_p;
    }
    var total = 0.0;
    for (var j = 0u; j < EXPERT_K; j++) {
        total += chosen_p[j];
    }
    for (var j = 0u; j < EXPERT_K; j++) {
        routes[r * EXPERT_K + j] = chosen[j];
        weights[r * EXPERT_K + j] = select(chosen_p[j], chosen_p[j] / total, p.normalize == 1u);
    }
}

// The weighted sum of row r's slots at column o, added to x; returns the new x.
fn combined(i: u32) -> f32 {
    let r = i / p.hidden;
    let o = i % p.hidden;
    var v = 0.0;
    for (var j = 0u; j < EXPERT_K; j++) {
        v += weights[r * EXPERT_K + j] * expert_out[(r * EXPERT_K + j) * p.hidden + o];
    }
    if (SHARED) {
        v += (1.0 / (1.0 + exp(-shared_gate[r]))) * shared_out[i];
    }
    let out = x[i] + v;
    x[i] = out;
    return out;
}

@compute @workgroup_size(WG)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < p.n_rows * p.hidden) {
        combined(i);
    }
}

@compute @workgroup_size(WG)
fn combine_tap(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < p.n_rows * p.hidden) {
        let v = combined(i);
        taps[(i / p.hidden) * p.tap_stride + p.tap_offset + i % p.hidden] = v;
    }
}
