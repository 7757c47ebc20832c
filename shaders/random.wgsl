// The position-keyed random numbers of the CPU reference (dflash_core::sampling::
// random_u32): a hash chain over (seed low, seed high, position, stream). Prepended to
// the shaders that draw (sample.wgsl, dflash2.wgsl).

fn hash32(x0: u32) -> u32 {
    var x = x0;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

fn rand_u32(seed_lo: u32, seed_hi: u32, pos: u32, stream: u32) -> u32 {
    var h = hash32(seed_lo ^ 0x9e3779b9u);
    h = hash32(h ^ seed_hi);
    h = hash32(h ^ pos);
    return hash32(h ^ (stream * 0x85ebca6bu));
}

// Uniform in [0, 1) with 24 bits (sampling::random_uniform).
fn rand_uniform(seed_lo: u32, seed_hi: u32, pos: u32, stream: u32) -> f32 {
    return f32(rand_u32(seed_lo, seed_hi, pos, stream) >> 8u) * (1.0 / 16777216.0);
}
