// Sampling of one token per row at temperature T with top-k, min-p and top-p, using the
// random number keyed by (seed, absolute position) only, so that the draw for a position
// is the same whether the row was computed alone or among 16 (plain and speculative
// decoding draw the same numbers). One workgroup per row.
//
// Semantics (the CPU reference `sampling::sample` implements the same):
//   z = logit / T; kept = { z >= threshold } where the threshold is the largest of
//   - top-k: the k-th largest z;
//   - min-p: max z + ln(min_p);
//   - top-p: the largest value whose upper set still holds top_p of the softmax mass
//     (over the tokens the other two keep);
//   then u = uniform(seed, position) * sum(kept e^(z - max z)), and the token is the
//   first id (in id order) at which the running sum exceeds u.

struct Params {
    len: u32,        // vocabulary size
    stride: u32,     // floats per row of logits
    top_k: u32,      // 0 = off
    pos_offset: u32, // position of the sampled token = state[0] + row + pos_offset
    inv_temp: f32,
    top_p: f32,      // 1 = off
    min_p: f32,      // 0 = off
    seed_lo: u32,
    seed_hi: u32,
    out_offset: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;

var<workgroup> chunk_sum: array<f32, WG>;

// sampling::random_u32 of the CPU reference (random.wgsl).
fn random_u32(pos: u32, stream: u32) -> u32 {
    return rand_u32(p.seed_lo, p.seed_hi, pos, stream);
}

// Order-preserving map of floats to u32 (NaN maps to 0: never kept).
fn key(v: f32) -> u32 {
    if (v != v) {
        return 0u;
    }
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn unkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// The kept set of a row: max z and the key threshold (top-k, min-p, top-p). Called by
// every thread of the workgroup (it reduces across it).
struct Kept {
    m: f32,
    thr: u32,
}

fn kept_set(t: u32, base: u32, n: u32, lo_i: u32, hi_i: u32) -> Kept {
    var mx = -3.4e38;
    for (var i = lo_i; i < hi_i; i++) {
        let z = logits[base + i] * p.inv_temp;
        if (z == z) {
            mx = max(mx, z);
        }
    }
    let m = wg_max_f32(t, mx);

    // top-k: the largest key t_k with count(key >= t_k) >= k.
    var thr = 0u;
    if (p.top_k > 0u && p.top_k < n) {
        var lo = 0u;
        var hi = 0xffffffffu;
        for (var it = 0u; it < 32u; it++) {
            let d = hi - lo;
            let mid = lo + (d >> 1u) + (d & 1u);
            var c = 0u;
            for (var i = lo_i; i < hi_i; i++) {
                if (key(logits[base + i] * p.inv_temp) >= mid) {
                    c += 1u;
                }
            }
            if (wg_sum_u32(t, c) >= p.top_k) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        thr = lo;
    }
    // min-p: e^(z - m) >= min_p.
    if (p.min_p > 0.0) {
        thr = max(thr, key(m + log(p.min_p)));
    }
    // top-p over what the others keep.
    if (p.top_p < 1.0) {
        var s0 = 0.0;
        for (var i = lo_i; i < hi_i; i++) {
            let z = logits[base + i] * p.inv_temp;
            if (key(z) >= thr) {
                s0 += exp(z - m);
            }
        }
        let goal = wg_sum_f32(t, s0) * p.top_p;
        var lo = thr;
        var hi = key(m);
        for (var it = 0u; it < 32u; it++) {
            let d = hi - lo;
            let mid = lo + (d >> 1u) + (d & 1u);
            var s = 0.0;
            for (var i = lo_i; i < hi_i; i++) {
                let z = logits[base + i] * p.inv_temp;
                if (key(z) >= mid) {
                    s += exp(z - m);
                }
            }
            if (wg_sum_f32(t, s) >= goal) {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        thr = lo;
    }
    return Kept(m, thr);
}

// Each thread's kept mass of its chunk of ids into chunk_sum; returns the row's total
// (chunks added in order).
fn kept_mass(t: u32, base: u32, lo_i: u32, hi_i: u32, k: Kept) -> f32 {
    var cs = 0.0;
    for (var i = lo_i; i < hi_i; i++) {
        let z = logits[base + i] * p.inv_temp;
        if (key(z) >= k.thr) {
            cs += exp(z - k.m);
        }
    }
    chunk_sum[t] = cs;
    workgroupBarrier();
    var total = 0.0;
    for (var c = 0u; c < WG; c++) {
        total += chunk_sum[c];
    }
    return total;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let base = row * p.stride;
    let n = p.len;
    let chunk = (n + WG - 1u) / WG;
    let lo_i = min(t * chunk, n);
    let hi_i = min(lo_i + chunk, n);

    let k = kept_set(t, base, n, lo_i, hi_i);
    let m = k.m;
    let thr = k.thr;
    let total = kept_mass(t, base, lo_i, hi_i, k);
    if (t == 0u) {
        let pos = state[0] + row + p.pos_offset;
        let u = f32(random_u32(pos, 0u) >> 8u) * (1.0 / 16777216.0) * total;
        var cum = 0.0;
        var chosen = 0xffffffffu;
        var last = 0u;
        for (var c = 0u; c < WG && chosen == 0xffffffffu; c++) {
            if (chunk_sum[c] > 0.0 && u < cum + chunk_sum[c]) {
                let a = min(c * chunk, n);
                let b = min(a + chunk, n);
                for (var i = a; i < b; i++) {
                    let z = logits[base + i] * p.inv_temp;
                    let e = exp(z - m);
                    if (key(z) >= thr && e > 0.0) {
                        cum += e;
                        last = i;
                        if (u < cum) {
                            chosen = i;
                            break;
                        }
                    }
                }
                if (chosen == 0xffffffffu) {
                    chosen = last; // rounding at the end of the chunk
                }
            } else {
                cum += chunk_sum[c];
            }
        }
        if (chosen == 0xffffffffu) {
            chosen = last;
        }
        tokens[p.out_offset + row] = chosen;
    }
}

// Rejection-sampling verification of a DFlash block (dflash_core::rejection::verify):
// row j holds the target's logits for the token after ids[j], whose draft is ids[j + 1].
// With p the kept distribution and q the proposal (QK candidates per row in q_ids /
// q_vals; QK = 0: the draft was proposed with certainty), accept when
// u(stream 1) * q(d) < p(d), else draw from max(0, p - q) (stream 2).
// verdict[2j] = 1 accepted / 0 rejected, verdict[2j + 1] = the token.
override QK: u32 = 0u;
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<storage, read> q_ids: array<u32>;
@group(0) @binding(6) var<storage, read> q_vals: array<f32>;
@group(0) @binding(7) var<storage, read_write> verdict: array<u32>;

fn q_of(j: u32, x: u32, d: u32) -> f32 {
    if (QK == 0u) {
        return select(0.0, 1.0, x == d);
    }
    var q = 0.0;
    for (var c = 0u; c < QK; c++) {
        if (q_ids[j * QK + c] == x) {
            q += q_vals[j * QK + c];
        }
    }
    return q;
}

// p(i): the kept distribution of the row at `base`.
fn p_of(base: u32, i: u32, k: Kept, total: f32) -> f32 {
    let z = logits[base + i] * p.inv_temp;
    return select(0.0, exp(z - k.m) / total, key(z) >= k.thr);
}

@compute @workgroup_size(WG)
fn verify_rejection(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let base = row * p.stride;
    let n = p.len;
    let chunk = (n + WG - 1u) / WG;
    let lo_i = min(t * chunk, n);
    let hi_i = min(lo_i + chunk, n);
    let k = kept_set(t, base, n, lo_i, hi_i);
    let total = kept_mass(t, base, lo_i, hi_i, k);
    if (t == 0u) {
        let pos = state[0] + row + p.pos_offset;
        let d = ids[row + 1u];
        let pd = p_of(base, d, k, total);
        let qd = q_of(row, d, d);
        let u = f32(random_u32(pos, 1u) >> 8u) * (1.0 / 16777216.0);
        if (qd > 0.0 && u * qd < pd) {
            verdict[2u * row] = 1u;
            verdict[2u * row + 1u] = d;
            return;
        }
        // The residual max(0, p - q), summed then inverted in id order.
        var rt = 0.0;
        for (var i = 0u; i < n; i++) {
            rt += max(p_of(base, i, k, total) - q_of(row, i, d), 0.0);
        }
        let u2 = f32(random_u32(pos, 2u) >> 8u) * (1.0 / 16777216.0);
        var chosen = 0u;
        var cum = 0.0;
        var last = 0u;
        var found = false;
        for (var i = 0u; i < n && !found; i++) {
            let px = p_of(base, i, k, total);
            var r = px;
            if (rt > 0.0) {
                r = max(px - q_of(row, i, d), 0.0);
            }
            if (r > 0.0) {
                cum += r;
                last = i;
                if (u2 * select(1.0, rt, rt > 0.0) < cum) {
                    chosen = i;
                    found = true;
                }
            }
        }
        if (!found) {
            chosen = last;
        }
        verdict[2u * row] = 0u;
        verdict[2u * row + 1u] = chosen;
    }
}

// ---------------------------------------------------------------------------------------
// The same rule with many workgroups per row (GPUs): the vocabulary in chunks of CHUNK
// ids (fixed by the vocabulary size, so a row's result never depends on the rows beside
// it), and the top-k and top-p thresholds found by radix selection over the keys, a byte
// per round from the top: each round, every chunk counts (top-k) or sums the kept mass
// e^(z - m) of (top-p) the keys that share the bytes found so far, into 256 bins by the
// next byte (each bin summed in id order by the one thread that owns it); `select` adds
// each bin over the chunks in ascending order and keeps the largest byte whose upper set
// still holds k tokens (top-k) or the goal mass (top-p). Counts are exact, so top-k is
// the bisection's key; top-p is the same definition with sums in another order (they
// agree but where a sum rounds across the goal). Then each chunk's kept mass, and `draw`
// walks the chunks, a chunk's 64 runs of CHUNK / 64 ids, and a run's ids, in id order.
// Twenty dispatches of a few microseconds replace one workgroup's ~33 passes over the
// vocabulary. A round's kernels do nothing when their filter is off.
override MODE: u32 = 0u; // histogram / select: 0 top-k (counts), 1 top-p (masses)

const CHUNK: u32 = 1024u;
const BINS: u32 = 256u;
const RUN: u32 = CHUNK / WG;
// Per-row selection state in `sel` (SEL words per row).
const SEL: u32 = 8u;
const S_M: u32 = 0u;       // max z (f32 bits)
const S_THR: u32 = 1u;     // kept keys are >= this (top-k and min-p so far)
const S_PREFIX: u32 = 2u;  // the key bytes found so far (high bytes)
const S_LEVEL: u32 = 3u;   // bytes found so far, 0..4
const S_ABOVE_N: u32 = 4u; // tokens whose key is above the prefix's range
const S_ABOVE_M: u32 = 5u; // their mass (f32 bits)
const S_GOAL: u32 = 6u;    // top-p: top_p times the kept mass (f32 bits)

@group(0) @binding(8) var<storage, read_write> chunk_vals: array<f32>; // [rows][chunks]
@group(0) @binding(9) var<storage, read_write> hist: array<vec2<u32>>; // [rows][chunks][BINS]
@group(0) @binding(10) var<storage, read_write> sel: array<u32>;       // [rows][SEL]

var<workgroup> chunk_z: array<f32, CHUNK>;
var<workgroup> bin_n: array<u32, BINS>;
var<workgroup> bin_m: array<f32, BINS>;
var<workgroup> run_mass: array<f32, WG>;
var<workgroup> picked: vec3<u32>; // draw: the chunk, the mass before it and u (f32 bits)
var<workgroup> round_level: u32;

// The row's selection level, uniform across the workgroup (read by thread 0).
fn load_level(t: u32, s: u32) -> u32 {
    if (t == 0u) {
        round_level = sel[s + S_LEVEL];
    }
    return workgroupUniformLoad(&round_level);
}

fn n_chunks() -> u32 {
    return (p.len + CHUNK - 1u) / CHUNK;
}

fn z_at(row: u32, i: u32) -> f32 {
    return logits[row * p.stride + i] * p.inv_temp;
}

// This workgroup's chunk of ids [lo, hi) and the row.
fn chunk_range(c: u32) -> vec2<u32> {
    let lo = c * CHUNK;
    return vec2<u32>(lo, min(lo + CHUNK, p.len));
}

// Whether this round runs: its filter is on (from the uniform buffer) and its key is not
// yet whole (`level`, uniform through load_level).
fn round_open(level: u32) -> bool {
    if (level >= 4u) {
        return false;
    }
    if (MODE == 0u) {
        return p.top_k > 0u && p.top_k < p.len;
    }
    return p.top_p < 1.0;
}

@compute @workgroup_size(WG)
fn chunk_max(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let r = chunk_range(wg.x);
    var mx = -3.4e38;
    for (var i = r.x + t; i < r.y; i += WG) {
        let z = z_at(wg.y, i);
        if (z == z) {
            mx = max(mx, z);
        }
    }
    let m = wg_max_f32(t, mx);
    if (t == 0u) {
        chunk_vals[wg.y * n_chunks() + wg.x] = m;
    }
}

// m = the largest chunk max; the min-p threshold; an empty selection.
@compute @workgroup_size(1)
fn prepare(@builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    var m = -3.4e38;
    for (var c = 0u; c < n_chunks(); c++) {
        m = max(m, chunk_vals[row * n_chunks() + c]);
    }
    let s = row * SEL;
    sel[s + S_M] = bitcast<u32>(m);
    sel[s + S_THR] = select(0u, key(m + log(p.min_p)), p.min_p > 0.0);
    sel[s + S_PREFIX] = 0u;
    sel[s + S_LEVEL] = 0u;
    sel[s + S_ABOVE_N] = 0u;
    sel[s + S_ABOVE_M] = 0u;
    sel[s + S_GOAL] = 0u;
}

// This chunk's bins of the round: the keys sharing the prefix (and, top-p, at or above
// the threshold) by their next byte; thread t owns bins 4t..4t+3 and walks the chunk in
// id order.
@compute @workgroup_size(WG)
fn histogram(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let s = row * SEL;
    let level = load_level(t, s);
    if (!round_open(level)) {
        return;
    }
    let r = chunk_range(wg.x);
    for (var i = r.x + t; i < r.y; i += WG) {
        chunk_z[i - r.x] = z_at(row, i);
    }
    workgroupBarrier();
    let shift = 24u - 8u * level;
    let high = select(0u, 0xffffffffu << (32u - 8u * level), level > 0u);
    let prefix = sel[s + S_PREFIX];
    let thr = select(0u, sel[s + S_THR], MODE == 1u);
    let m = bitcast<f32>(sel[s + S_M]);
    var n = vec4<u32>();
    var mass = vec4<f32>();
    for (var i = 0u; i < r.y - r.x; i++) {
        let z = chunk_z[i];
        let k = key(z);
        let b = (k >> shift) & 0xffu;
        if ((k & high) == prefix && k >= thr && b / 4u == t) {
            n[b % 4u] += 1u;
            if (MODE == 1u) {
                mass[b % 4u] += exp(z - m);
            }
        }
    }
    let base = (row * n_chunks() + wg.x) * BINS + 4u * t;
    for (var j = 0u; j < 4u; j++) {
        hist[base + j] = vec2<u32>(n[j], bitcast<u32>(mass[j]));
    }
}

// Each bin over the chunks (ascending), then the largest byte whose upper set holds the
// target; after the fourth byte the key found raises the threshold.
@compute @workgroup_size(WG)
fn select_byte(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let s = wg.x * SEL;
    let level = load_level(t, s);
    if (!round_open(level)) {
        return;
    }
    let row = wg.x;
    for (var j = 0u; j < 4u; j++) {
        var n = 0u;
        var mass = 0.0;
        for (var c = 0u; c < n_chunks(); c++) {
            let h = hist[(row * n_chunks() + c) * BINS + 4u * t + j];
            n += h.x;
            mass += bitcast<f32>(h.y);
        }
        bin_n[4u * t + j] = n;
        bin_m[4u * t + j] = mass;
    }
    workgroupBarrier();
    if (t == 0u) {
        choose_byte(s, level);
    }
}

// select_byte's serial part (thread 0): the largest byte b with above + bins >= b at
// least the target (0 where rounding leaves none: the whole range stays in).
fn choose_byte(s: u32, level: u32) {
    var above_n = sel[s + S_ABOVE_N];
    var above_m = bitcast<f32>(sel[s + S_ABOVE_M]);
    var goal = bitcast<f32>(sel[s + S_GOAL]);
    if (MODE == 1u && level == 0u) {
        var total = 0.0;
        for (var b = 0u; b < BINS; b++) {
            total += bin_m[b];
        }
        goal = total * p.top_p;
    }
    // Bins 255..1; where none reaches the target, byte 0 with `above` not counting it.
    var chosen = 0u;
    for (var i = 0u; i < BINS - 1u; i++) {
        let b = BINS - 1u - i;
        let enough = select(above_m + bin_m[b] >= goal, above_n + bin_n[b] >= p.top_k, MODE == 0u);
        if (enough) {
            chosen = b;
            break;
        }
        above_n += bin_n[b];
        above_m += bin_m[b];
    }
    let prefix = sel[s + S_PREFIX] | (chosen << (24u - 8u * level));
    if (level == 3u) {
        // A whole key: the threshold, and an empty selection for the next filter.
        sel[s + S_THR] = max(sel[s + S_THR], prefix);
        sel[s + S_PREFIX] = 0u;
        sel[s + S_LEVEL] = 0u;
        sel[s + S_ABOVE_N] = 0u;
        sel[s + S_ABOVE_M] = 0u;
        if (MODE == 1u) {
            sel[s + S_LEVEL] = 4u; // top-p is the last filter
        }
        return;
    }
    sel[s + S_PREFIX] = prefix;
    sel[s + S_LEVEL] = level + 1u;
    sel[s + S_ABOVE_N] = above_n;
    sel[s + S_ABOVE_M] = bitcast<u32>(above_m);
    sel[s + S_GOAL] = bitcast<u32>(goal);
}

// The kept mass of RUN ids from `lo` in id order.
fn run_kept_mass(row: u32, lo: u32, hi: u32, thr: u32, m: f32) -> f32 {
    var sum = 0.0;
    for (var i = lo; i < hi; i++) {
        let z = z_at(row, i);
        if (key(z) >= thr) {
            sum += exp(z - m);
        }
    }
    return sum;
}

// Each thread's run of chunk c (RUN ids in id order) into run_mass.
fn run_masses(t: u32, row: u32, c: u32) {
    let r = chunk_range(c);
    let lo = min(r.x + t * RUN, r.y);
    let s = row * SEL;
    run_mass[t] = run_kept_mass(row, lo, min(lo + RUN, r.y), sel[s + S_THR], bitcast<f32>(sel[s + S_M]));
}

// The chunk's kept mass: its runs, in a fixed tree.
@compute @workgroup_size(WG)
fn chunk_mass(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    run_masses(t, wg.y, wg.x);
    let total = wg_sum_f32(t, run_mass[t]);
    if (t == 0u) {
        chunk_vals[wg.y * n_chunks() + wg.x] = total;
    }
}

// u = uniform(seed, position) times the kept mass; the chunk, the run, then the id at
// which the running mass exceeds u (the last kept id where rounding leaves u above all).
@compute @workgroup_size(WG)
fn draw(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    if (t == 0u) {
        picked = pick_chunk(row);
    }
    let c = workgroupUniformLoad(&picked).x;
    run_masses(t, row, c);
    workgroupBarrier();
    if (t == 0u) {
        tokens[p.out_offset + row] = walk_chunk(row, c, bitcast<f32>(picked.y), bitcast<f32>(picked.z));
    }
}

// The row's u.
fn row_u(row: u32) -> f32 {
    var total = 0.0;
    for (var c = 0u; c < n_chunks(); c++) {
        total += chunk_vals[row * n_chunks() + c];
    }
    let pos = state[0] + row + p.pos_offset;
    return f32(random_u32(pos, 0u) >> 8u) * (1.0 / 16777216.0) * total;
}

// The chunk whose mass takes u (else the last with mass), the mass before it, and u.
fn pick_chunk(row: u32) -> vec3<u32> {
    let u = row_u(row);
    var cum = 0.0;
    var last = 0u;
    for (var c = 0u; c < n_chunks(); c++) {
        let v = chunk_vals[row * n_chunks() + c];
        if (v > 0.0) {
            last = c;
            if (u < cum + v) {
                return vec3<u32>(c, bitcast<u32>(cum), bitcast<u32>(u));
            }
        }
        cum += v;
    }
    // Rounding left u above every chunk: the chunks after `last` hold nothing.
    let before = cum - chunk_vals[row * n_chunks() + last];
    return vec3<u32>(last, bitcast<u32>(before), bitcast<u32>(u));
}

// draw's serial part: the run of chunk c that takes u (else its last run with mass).
fn walk_chunk(row: u32, c: u32, before: f32, u: f32) -> u32 {
    let r = chunk_range(c);
    var cum = before;
    var last = 0u;
    for (var j = 0u; j < WG; j++) {
        if (run_mass[j] > 0.0) {
            last = j;
            if (u < cum + run_mass[j]) {
                return walk_run(row, min(r.x + j * RUN, r.y), r.y, cum, u);
            }
        }
        cum += run_mass[j];
    }
    return walk_run(row, min(r.x + last * RUN, r.y), r.y, cum - run_mass[last], u);
}

// The kept id of the run from `lo` at which the running mass exceeds u, else its last.
fn walk_run(row: u32, lo: u32, end: u32, before: f32, u: f32) -> u32 {
    let s = row * SEL;
    let thr = sel[s + S_THR];
    let m = bitcast<f32>(sel[s + S_M]);
    var cum = before;
    var last = lo;
    for (var i = lo; i < min(lo + RUN, end); i++) {
        let z = z_at(row, i);
        let e = exp(z - m);
        if (key(z) >= thr && e > 0.0) {
            cum += e;
            last = i;
            if (u < cum) {
                return i;
            }
        }
    }
    return last;
}
