// out[r, c] = dequantized row tokens[r] of the embedding table (rows row_lo..row_hi of
// the table live in this chunk's buffers; rows outside are left to other chunks).

struct Params {
    n_rows: u32,
    cols: u32,
    row_lo: u32,
    row_hi: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> qs: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> mins: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let r = gid.y;
    if (c >= p.cols || r >= p.n_rows) {
        return;
    }
    let t = tokens[r];
    if (t < p.row_lo || t >= p.row_hi) {
        return;
    }
    let i = (t - p.row_lo) * p.cols + c;
    let g = i / GROUP;
    out[r * p.cols + c] = q_value(i) * group_scale(g) + group_min(g);
}
