//! The quantized CPU engine's matrix kernels measured: multiply-accumulates per second and
//! per cycle for 1 to 64 activation rows on every kernel this host runs (or those named
//! in DFLASH_KERNELS, comma separated), on the engine's threads and on one, beside the
//! host's own peak for `vpdpbusd` where it has AVX-512 VNNI. JSON lines.
//!
//!     cargo run --release -p dflash-core --example cpu_kernels [ROWS COLS] [GHZ]
//!
//! GHZ (the core clock, for MAC/cycle; default: /proc/cpuinfo's "cpu MHz").

use dflash_core::cpu::packed::{packed_kernel, PackedMatrix};
use dflash_core::cpu::quant_matmul::{in_pool, quant_matmul, Kernel, QuantizedRows};
use dflash_core::quant::{QFormat, QuantMatrix};
use std::time::Instant;

fn ghz() -> f64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map_or(3.0, |mhz| mhz / 1000.0)
}

/// Seconds per call of `f`, best of several runs of at least 50 ms.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let (t0, mut calls) = (Instant::now(), 0u32);
        while t0.elapsed().as_secs_f64() < 0.05 {
            f();
            calls += 1;
        }
        best = best.min(t0.elapsed().as_secs_f64() / f64::from(calls));
    }
    best
}

/// `vpdpbusd` zmm throughput of one core: 8 independent chains, MAC per second.
#[cfg(target_arch = "x86_64")]
fn vnni512_peak() -> Option<f64> {
    use std::arch::x86_64::*;
    if !std::arch::is_x86_feature_detected!("avx512vnni") {
        return None;
    }
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn chains(n: usize) -> i32 {
        let (a, b) = std::hint::black_box((_mm512_set1_epi8(1), _mm512_set1_epi8(2)));
        let mut s = [_mm512_setzero_si512(); 8];
        for _ in 0..n {
            for v in s.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
        }
        let mut t = s[0];
        for v in &s[1..] {
            t = _mm512_add_epi32(t, *v);
        }
        _mm512_reduce_add_epi32(t)
    }
    let n = 1 << 20;
    // SAFETY: checked above.
    let s = time(|| {
        std::hint::black_box(unsafe { chains(n) });
    });
    Some((n * 8 * 64) as f64 / s)
}
#[cfg(not(target_arch = "x86_64"))]
fn vnni512_peak() -> Option<f64> {
    None
}

fn main() {
    dflash_core::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    let (rows, cols) = match args.get(1..3) {
        Some([r, c]) => (r.parse().unwrap(), c.parse().unwrap()),
        _ => (1536, 576),
    };
    let clock = args.get(3).map_or_else(ghz, |g| g.parse().unwrap());
    let peak = vnni512_peak();
    println!(
        "{}",
        serde_json::json!({"kind": "peak", "ghz": clock, "vpdpbusd_zmm_mac_per_s_one_core": peak,
            "mac_per_cycle": peak.map(|p| p / clock / 1e9)})
    );
    let wanted: Option<Vec<String>> = std::env::var("DFLASH_KERNELS")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let threads = dflash_core::cpu::quant_matmul::threads();
    for format in [QFormat::Q4, QFormat::Q8] {
        let mut rng = 1u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((rng >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let w: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
        let m = match format {
            QFormat::Q4 => QuantMatrix::quantize_q4(&w, rows, cols),
            _ => QuantMatrix::quantize_q8(&w, rows, cols),
        };
        let p = PackedMatrix::from_quant(&m).unwrap();
        // DFLASH_STREAM_MB: that many megabytes of copies, walked in turn, so that the
        // weights come from memory as a model's do (past the last-level cache).
        let copies = std::env::var("DFLASH_STREAM_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(1, |mb| (mb << 20).div_ceil(p.n_bytes()).max(1));
        let ps: Vec<PackedMatrix> = (0..copies).map(|_| p.clone()).collect();
        for k in Kernel::available() {
            if wanted
                .as_ref()
                .is_some_and(|w| !w.iter().any(|n| n == k.name()))
            {
                continue;
            }
            for n in [1, 2, 4, 8, 16, 32, 64] {
                let xs: Vec<f32> = (0..n * cols).map(|_| 3.0 * next()).collect();
                let x = QuantizedRows::new(&xs, n, cols, format, 32);
                let run = || {
                    for p in &ps {
                        std::hint::black_box(match packed_kernel(k) {
                            true => p.matmul_with(k, &x),
                            false => quant_matmul(&m, &x, k),
                        });
                    }
                };
                let s = in_pool(|| time(run));
                let macs = (rows * cols * n * copies) as f64;
                println!(
                    "{}",
                    serde_json::json!({"kind": "kernel", "kernel": k.name(), "format": format.bits(),
                        "rows": rows, "cols": cols, "activation_rows": n, "threads": threads,
                        "us": s * 1e6, "copies": copies, "gmac_per_s": macs / s / 1e9,
                        "mac_per_cycle_per_core": macs / s / (clock * 1e9) / threads as f64,
                        "cost_over_one_row": serde_json::Value::Null})
                );
            }
        }
    }
}
