// Shared by every kernel that reads the q4 / q8 weight formats (prepended to the
// kernel's source). The kernel declares `qs: array<vec4<u32>>`, `scales: array<u32>`
// and `mins: array<u32>` (f16 pairs), and the override constants FORMAT and GROUP.
//   q4: 32-weight groups, nibbles 8 per u32 (one vec4<u32> per group)
//   q8: 16- or 32-weight groups, signed bytes 4 per u32 (GROUP/16 vec4<u32> per group)
// weight = q * scale + min

override FORMAT: u32 = 0u; // 0 = q4, 1 = q8
override GROUP: u32 = 32u;

fn vec4s_per_group() -> u32 {
    return select(GROUP / 16u, GROUP / 32u, FORMAT == 0u);
}

fn half_at(word: u32, i: u32) -> f32 {
    let v = unpack2x16float(word);
    return select(v.x, v.y, (i & 1u) == 1u);
}

fn group_scale(g: u32) -> f32 {
    return half_at(scales[g >> 1u], g);
}

fn group_min(g: u32) -> f32 {
    return half_at(mins[g >> 1u], g);
}

// Nibbles 0..3 (q4_lo) and 4..7 (q4_hi) of a q4 word.
fn q4_lo(w: u32) -> vec4<f32> {
    return vec4<f32>(f32(w & 15u), f32((w >> 4u) & 15u), f32((w >> 8u) & 15u), f32((w >> 12u) & 15u));
}
fn q4_hi(w: u32) -> vec4<f32> {
    return vec4<f32>(f32((w >> 16u) & 15u), f32((w >> 20u) & 15u), f32((w >> 24u) & 15u), f32(w >> 28u));
}
// The 4 signed bytes of a q8 word.
fn q8_of(w: u32) -> vec4<f32> {
    return vec4<f32>(f32(i32(w << 24u) >> 24u), f32(i32(w << 16u) >> 24u), f32(i32(w << 8u) >> 24u), f32(i32(w) >> 24u));
}

// Value of element `i` (flat index into the matrix chunk).
fn q_value(i: u32) -> f32 {
    if (FORMAT == 0u) {
        let w = qs[i / 32u][(i / 8u) % 4u];
        return f32((w >> ((i % 8u) * 4u)) & 15u);
    }
    let w = qs[i / 16u][(i / 4u) % 4u];
    return f32(i32(w << (24u - (i % 4u) * 8u)) >> 24u);
}
