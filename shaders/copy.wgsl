// The bandwidth roofline: dst = src, 16 bytes per thread per iteration.

struct Params {
    n: u32,     // vec4 count
    wg_x: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.wg_x * WG;
    if (i < p.n) {
        dst[i] = src[i];
    }
}

// The per-dispatch cost: one invocation that depends on the previous dispatch's write.
@compute @workgroup_size(1)
fn touch() {
    dst[0] = dst[0] + vec4<u32>(1u);
}

// A read-only stream: every vec4 of src read once; a write only on an impossible value,
// so the loads stay.
@compute @workgroup_size(WG)
fn stream(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * p.wg_x * WG;
    if (i < p.n) {
        let v = src[i];
        if (v.x == 0xfffffff1u && v.y == 0xfffffff2u) {
            dst[0] = v;
        }
    }
}
