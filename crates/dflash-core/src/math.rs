//! The transcendental functions of every CPU engine's arithmetic, from one pure-Rust
//! implementation (the `libm` crate) on every target. Rust's `f32::exp`, `sin_cos`,
//! `ln`, `tanh` and `powf` call the platform's library: glibc natively, compiler-builtins'
//! port of musl in wasm32, and the two differ in the last bit on some inputs. The 8-bit
//! activation quantizer turns such a bit into a different rounding of a whole group,
//! and 30 layers later into a different token, so the native and browser CPU engines
//! would not give the same answer. (`sqrt` is correctly rounded everywhere: the
//! hardware's.)

/// e^x.
#[inline]
pub fn exp(x: f32) -> f32 {
    libm::expf(x)
}

/// The natural logarithm.
#[inline]
pub fn ln(x: f32) -> f32 {
    libm::logf(x)
}

/// ln(1 + x).
#[inline]
pub fn ln_1p(x: f32) -> f32 {
    libm::log1pf(x)
}

/// (sin x, cos x).
#[inline]
pub fn sin_cos(x: f32) -> (f32, f32) {
    libm::sincosf(x)
}

/// tanh x.
#[inline]
pub fn tanh(x: f32) -> f32 {
    libm::tanhf(x)
}

/// x^y in f64 (RoPE's frequencies).
#[inline]
pub fn pow64(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[cfg(test)]
mod tests {
    /// The functions are libm's own, whatever the platform's library gives.
    #[test]
    fn the_same_bits_as_libm() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0137;
            assert_eq!(super::exp(x).to_bits(), libm::expf(x).to_bits());
            assert_eq!(super::sin_cos(x), libm::sincosf(x));
        }
    }
}
