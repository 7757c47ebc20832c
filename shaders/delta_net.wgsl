// A Gated DeltaNet layer (Qwen3.5's linear attention) after its input projection
// `proj` = [q k v (conv_dim) | z (value_dim) | b (value_heads) | a (value_heads)] per row,
// the arithmetic of the CPU reference (dflash_core::cpu::delta_net):
//   conv   one thread per channel, the rows in order: the depthwise causal convolution
//          of the channel's last KERNEL inputs (the earlier ones from conv_state, which
//          it advances), then SiLU, into `mixed`.
//   recur  one workgroup per value head, the rows in order: q and k of its key head
//          L2-normalised (q scaled by 1/sqrt(key_head_dim)), the head's state S
//          (key_head_dim x value_head_dim, in `s_state`) decayed by exp(A softplus(a +
//          dt_bias)) and updated by the delta rule with beta = sigmoid(b), the read-out
//          S^T q RMS-normalised by norm_w and gated by silu(z), into `readout`.
// A row's results depend only on the rows before it, computed the same way whatever
// the rows of the pass: one token at a time, a 16-row verify and prefill give the same
// bits. Each thread sums in a fixed order (no cross-thread reductions).
//
// DFlash's rollback of the states (the CPU reference keeps the state after each row;
// here the cheaper replay): `snapshot`, before a verify pass, copies both states and the
// pass's first position; after acceptance has moved the position (position[0]),
// `restore` puts the copies back and `conv` / `recur` with REPLAY run again over the
// accepted rows only (position[0] - pass_start[0] of them, from the layer's own `proj` rows
// of the pass). The same arithmetic over the same inputs: the state is the bits it
// would be had the pass held the accepted rows alone.

override REPLAY: bool = false;

struct Params {
    n_rows: u32,
    conv_dim: u32,
    kernel: u32,
    proj_stride: u32,  // floats per proj row
    key_heads: u32,
    value_heads: u32,
    key_head_dim: u32,
    value_head_dim: u32,
    eps: f32,
    tiled: u32,        // 1: value head h reads key head h % key_heads (llama.cpp's order)
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> proj: array<f32>;
@group(0) @binding(2) var<storage, read> conv_w: array<f32>;        // [conv_dim, kernel]
@group(0) @binding(3) var<storage, read_write> conv_state: array<f32>; // [kernel - 1, conv_dim]
@group(0) @binding(4) var<storage, read_write> mixed: array<f32>;   // [rows, conv_dim]
@group(0) @binding(5) var<storage, read_write> s_state: array<f32>; // [value_heads, dk, dv]
@group(0) @binding(6) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(7) var<storage, read> decay: array<f32>;         // A = -exp(A_log)
@group(0) @binding(8) var<storage, read> norm_w: array<f32>;
@group(0) @binding(9) var<storage, read_write> readout: array<f32>; // [rows, value_dim]
@group(0) @binding(10) var<storage, read> position: array<u32>;     // the pass state: [0] position
@group(0) @binding(11) var<storage, read_write> pass_start: array<u32>; // [0] the verify pass's first position
@group(0) @binding(12) var<storage, read_write> conv_pre: array<f32>;
@group(0) @binding(13) var<storage, read_write> s_pre: array<f32>;

// Rows to run: the pass's, or with REPLAY those acceptance kept.
fn rows() -> u32 {
    if (REPLAY) {
        return min(position[0] - pass_start[0], 16u);
    }
    return p.n_rows;
}

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

@compute @workgroup_size(WG)
fn conv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    let cd = p.conv_dim;
    if (ch >= cd) {
        return;
    }
    let k = p.kernel;
    let n = rows();
    for (var t = 0u; t < n; t++) {
        let input = proj[t * p.proj_stride + ch];
        var acc = 0.0;
        for (var j = 0u; j + 1u < k; j++) {
            acc += conv_w[ch * k + j] * conv_state[j * cd + ch];
        }
        mixed[t * cd + ch] = silu(acc + conv_w[ch * k + k - 1u] * input);
        for (var j = 0u; j + 2u < k; j++) {
            conv_state[j * cd + ch] = conv_state[(j + 1u) * cd + ch];
        }
        if (k > 1u) {
            conv_state[(k - 2u) * cd + ch] = input;
        }
    }
}

const MAX_HEAD_DIM: u32 = 256u;
var<workgroup> q: array<f32, MAX_HEAD_DIM>;
var<workgroup> kv: array<f32, MAX_HEAD_DIM>;
var<workgroup> o: array<f32, MAX_HEAD_DIM>;
// The rows to run, read once and shared: the loop around the barriers stays uniform.
var<workgroup> wg_rows: u32;

// 1 / sqrt(sum(x^2) + 1e-6) of q and of k (every thread, the same order).
fn inv_l2(len: u32) -> vec2<f32> {
    var ss = vec2<f32>(0.0);
    for (var i = 0u; i < len; i++) {
        ss += vec2<f32>(q[i] * q[i], kv[i] * kv[i]);
    }
    return 1.0 / sqrt(ss + 1e-6);
}

fn softplus(x: f32) -> f32 {
    return select(log(1.0 + exp(x)), x, x > 20.0);
}

@compute @workgroup_size(WG)
fn recur(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let dk = p.key_head_dim;
    let dv = p.value_head_dim;
    let kd = p.key_heads * dk;
    let vd = p.value_heads * dv;
    let kh = select(h / (p.value_heads / p.key_heads), h % p.key_heads, p.tiled == 1u);
    let sb = h * dk * dv;
    if (lid == 0u) {
        wg_rows = rows();
    }
    let n = workgroupUniformLoad(&wg_rows);
    for (var t = 0u; t < n; t++) {
        let m = t * p.conv_dim;
        for (var i = lid; i < dk; i += WG) {
            q[i] = mixed[m + kh * dk + i];
            kv[i] = mixed[m + kd + kh * dk + i];
        }
        workgroupBarrier();
        let inv = inv_l2(dk);
        let qs = inv.x * (1.0 / sqrt(f32(dk)));
        let ks = inv.y;
        let row = t * p.proj_stride;
        let b = proj[row + p.conv_dim + vd + h];
        let a = proj[row + p.conv_dim + vd + p.value_heads + h];
        let g = exp(decay[h] * softplus(a + dt_bias[h]));
        let beta = 1.0 / (1.0 + exp(-b));
        for (var j = lid; j < dv; j += WG) {
            let v = mixed[m + 2u * kd + h * dv + j];
            var mem = 0.0;
            for (var i = 0u; i < dk; i++) {
                let s = s_state[sb + i * dv + j] * g;
                s_state[sb + i * dv + j] = s;
                mem += s * (kv[i] * ks);
            }
            let delta = (v - mem) * beta;
            var r = 0.0;
            for (var i = 0u; i < dk; i++) {
                let s = s_state[sb + i * dv + j] + (kv[i] * ks) * delta;
                s_state[sb + i * dv + j] = s;
                r += s * (q[i] * qs);
            }
            o[j] = r;
        }
        workgroupBarrier();
        var ss = 0.0;
        for (var j = 0u; j < dv; j++) {
            ss += o[j] * o[j];
        }
        let inv_rms = 1.0 / sqrt(ss / f32(dv) + p.eps);
        for (var j = lid; j < dv; j += WG) {
            let z = proj[row + p.conv_dim + h * dv + j];
            readout[t * vd + h * dv + j] = ((o[j] * inv_rms) * norm_w[j]) * silu(z);
        }
        workgroupBarrier();
    }
}

fn state_lens() -> vec2<u32> {
    return vec2<u32>((p.kernel - 1u) * p.conv_dim, p.value_heads * p.key_head_dim * p.value_head_dim);
}

// Before a verify pass: the states and the pass's first position, kept.
@compute @workgroup_size(WG)
fn snapshot(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let len = state_lens();
    if (i < len.x) {
        conv_pre[i] = conv_state[i];
    }
    if (i < len.y) {
        s_pre[i] = s_state[i];
    }
    if (i == 0u) {
        pass_start[0] = position[0];
    }
}

// After acceptance: the states before the pass, back (the replay follows).
@compute @workgroup_size(WG)
fn restore(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let len = state_lens();
    if (i < len.x) {
        conv_state[i] = conv_pre[i];
    }
    if (i < len.y) {
        s_state[i] = s_pre[i];
    }
}
