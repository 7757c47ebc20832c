// DFlash2's drafter ops: the input-embedding scale, the grouped dynamic depthwise
// convolution around each sublayer, the lm_head top-K candidates of each slot and the
// candidate selector's greedy walk from the anchor. CPU reference:
// dflash_core::drafter::{grouped_conv, top_k, CpuDrafter::select}.

// Each entry point has its own uniform at binding 0 (one entry point reads one of them).
struct ScaleParams {
    n: u32,     // floats
    scale: f32,
}

struct ConvParams {
    n_rows: u32,
    hidden: u32,
    taps: u32,
    group: u32,       // channels per coefficient group
    coef_stride: u32, // floats per coefficient row
    coef_offset: u32, // this side's [taps, groups] inside a coefficient row
    base_offset: u32, // this side's [taps, hidden] inside base
    accumulate: u32,  // 1: out += conv(x)
}

struct TopKParams {
    vocab: u32,
    stride: u32,      // floats per logit row
    k: u32,
    first_row: u32,
    multiplier: f32,  // output multiplier
    cap: f32,         // soft cap (0 = off)
}

struct WalkParams {
    slots: u32,
    k: u32,
    rank: u32,
    hp_first: u32,    // first row of hp (the slot after the anchor)
    sampled: u32,     // 1: sample at the sampler's temperature (rejection sampling)
}

@group(0) @binding(0) var<uniform> scale_p: ScaleParams;
@group(0) @binding(0) var<uniform> conv_p: ConvParams;
@group(0) @binding(0) var<uniform> topk_p: TopKParams;
@group(0) @binding(0) var<uniform> walk_p: WalkParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> coef: array<f32>;
@group(0) @binding(3) var<storage, read> base: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// out *= scale over n floats. (binding 4 only)
@compute @workgroup_size(WG)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * WG;
    if (i < scale_p.n) {
        out[i] = out[i] * scale_p.scale;
    }
}

// out[i, c] (+)= sum_{t <= i, t < taps} (base[t, c] + coef[i, t, c / group]) * x[i - t, c]
// (ConvParams.) One thread per (channel, row); t in order as on the CPU.
@compute @workgroup_size(WG)
fn conv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let i = gid.y;
    let h = conv_p.hidden;
    if (c >= h || i >= conv_p.n_rows) {
        return;
    }
    let groups = h / conv_p.group;
    let taps = min(conv_p.taps, i + 1u);
    var acc = 0.0;
    for (var t = 0u; t < taps; t++) {
        let ci = i * conv_p.coef_stride + conv_p.coef_offset + t * groups + c / conv_p.group;
        let k = base[conv_p.base_offset + t * h + c] + coef[ci];
        acc += k * x[(i - t) * h + c];
    }
    if (conv_p.accumulate == 1u) {
        out[i * h + c] = out[i * h + c] + acc;
    } else {
        out[i * h + c] = acc;
    }
}

// Top-K of logit rows (TopKParams). One workgroup per row (row = first_row + wg.x):
// K passes, each taking the best element after the previous pick in the order (value
// descending, index ascending); NaN never taken. ids / vals: [row - first_row][K].
@group(0) @binding(5) var<storage, read> logits: array<f32>;
@group(0) @binding(6) var<storage, read_write> cand_ids: array<u32>;
@group(0) @binding(7) var<storage, read_write> cand_vals: array<f32>;

var<workgroup> prev_v: f32;
var<workgroup> prev_i: u32;

@compute @workgroup_size(WG)
fn topk(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = topk_p.first_row + wg.x;
    let base_i = row * topk_p.stride;
    if (t == 0u) {
        prev_v = 3.4e38;
        prev_i = WG_NONE;
    }
    workgroupBarrier();
    for (var j = 0u; j < topk_p.k; j++) {
        let pv = prev_v;
        let pi = prev_i;
        var best_v = -3.4e38;
        var best_i = WG_NONE;
        for (var i = t; i < topk_p.vocab; i += WG) {
            let v = logits[base_i + i];
            // After the previous pick, and better than this thread's best so far.
            let after = pi == WG_NONE || wg_ranks_before(pv, pi, v, i);
            if (v == v && after && (best_i == WG_NONE || wg_ranks_before(v, i, best_v, best_i))) {
                best_v = v;
                best_i = i;
            }
        }
        let best = wg_best(t, best_v, best_i);
        let bv0 = bitcast<f32>(best.x);
        if (t == 0u) {
            let o = wg.x * topk_p.k + j;
            cand_ids[o] = select(best.y, 0u, best.y == WG_NONE);
            var u = bv0 * topk_p.multiplier;
            let cap = topk_p.cap;
            if (cap > 0.0) {
                u = tanh(u / cap) * cap;
            }
            cand_vals[o] = u;
            prev_v = bv0;
            prev_i = best.y;
        }
        workgroupBarrier();
    }
}

// The selector's walk (WalkParams): `slots` slots of K candidates, sampled at the
// sampler's temperature (rejection-sampling mode) or greedy. Slot l scores its
// candidates after the previous choice (the anchor, state[2], for the first):
// unary[c] + sum_r A[pred, r] * hp[l, r] * B[c, r], with the CPU's dot order (8 partial
// sums, then the tail); takes the first best; writes drafts[1 + l]. One workgroup;
// thread c scores candidate c.
@group(0) @binding(8) var<storage, read> hp: array<f32>;
@group(0) @binding(9) var<storage, read> pred_cb: array<f32>;
@group(0) @binding(10) var<storage, read> succ_cb: array<f32>;
@group(0) @binding(11) var<storage, read> state: array<u32>;
@group(0) @binding(12) var<storage, read_write> drafts: array<u32>;
@group(0) @binding(13) var<storage, read> sel_ids: array<u32>;
@group(0) @binding(14) var<storage, read> sel_vals: array<f32>;

var<workgroup> scores: array<f32, 256>;
var<workgroup> chosen: u32;

// The sampler's parameters (sample.wgsl's layout): temperature and seed of the walk
// at T > 0 (walk_p.sampled = 1: rejection-sampling mode).
struct SampleParams {
    len: u32,
    stride: u32,
    top_k: u32,
    pos_offset: u32,
    inv_temp: f32,
    top_p: f32,
    min_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    out_offset: u32,
    pad0: u32,
    pad1: u32,
}
@group(0) @binding(15) var<uniform> sp: SampleParams;
@group(0) @binding(16) var<storage, read_write> q_vals: array<f32>;

// Gumbel noise of candidate token c at a position (rejection::gumbel).
fn gumbel(pos: u32, c: u32) -> f32 {
    let u = (f32(rand_u32(sp.seed_lo, sp.seed_hi, pos, 16u + c) >> 8u) + 0.5) * (1.0 / 16777216.0);
    return -log(-log(u));
}

@compute @workgroup_size(WG)
fn walk(@builtin(local_invocation_index) t: u32) {
    let k = walk_p.k;
    let rank = walk_p.rank;
    if (t == 0u) {
        chosen = state[2];
    }
    workgroupBarrier();
    for (var l = 0u; l < walk_p.slots; l++) {
        let pred = chosen;
        for (var c = t; c < k; c += WG) {
            let cand = sel_ids[l * k + c];
            var acc: array<f32, 8>;
            for (var j = 0u; j < 8u; j++) {
                acc[j] = 0.0;
            }
            let full = rank / 8u * 8u;
            let hrow = (walk_p.hp_first + l) * rank;
            for (var r = 0u; r < full; r += 8u) {
                for (var j = 0u; j < 8u; j++) {
                    let ah = pred_cb[pred * rank + r + j] * hp[hrow + r + j];
                    acc[j] += ah * succ_cb[cand * rank + r + j];
                }
            }
            var tail = 0.0;
            for (var r = full; r < rank; r++) {
                tail += pred_cb[pred * rank + r] * hp[hrow + r] * succ_cb[cand * rank + r];
            }
            let d = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
            scores[c] = sel_vals[l * k + c] + d;
        }
        workgroupBarrier();
        if (t == 0u && walk_p.sampled == 1u) {
            // T > 0: Gumbel-max over scores / T, recording q = softmax(scores / T).
            let pos = state[0] + 1u + l;
            var m = -3.4e38;
            for (var c = 0u; c < k; c++) {
                m = max(m, scores[c] * sp.inv_temp);
            }
            var sum = 0.0;
            for (var c = 0u; c < k; c++) {
                sum += exp(scores[c] * sp.inv_temp - m);
            }
            var best = 0u;
            var best_v = -3.4e38;
            for (var c = 0u; c < k; c++) {
                let z = scores[c] * sp.inv_temp;
                q_vals[l * k + c] = exp(z - m) / sum;
                let v = z + gumbel(pos, sel_ids[l * k + c]);
                if (v > best_v) {
                    best_v = v;
                    best = c;
                }
            }
            chosen = sel_ids[l * k + best];
            drafts[1u + l] = chosen;
        } else if (t == 0u) {
            var best = 0u;
            for (var c = 1u; c < k; c++) {
                let v = scores[c];
                if (v > scores[best] || (scores[best] != scores[best] && v == v)) {
                    best = c;
                }
            }
            chosen = sel_ids[l * k + best];
            drafts[1u + l] = chosen;
        }
        workgroupBarrier();
    }
}
