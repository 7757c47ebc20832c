// The bandwidth roofline: dst = src, 16 bytes per thread per iteration.

struct Params {
    n: u32,     // vec4 count
    wg_x: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.wg_x * 64u;
    if (i < p.n) {
        dst[i] = src[i];
    }
}
