use dflash_core::cpu::packed::PackedMatrix;
use dflash_core::cpu::quant_matmul::{in_pool, quant_matmul, Kernel, QuantizedRows};
use dflash_core::quant::{QFormat, QuantMatrix};
use std::time::Instant;

fn main() {
    let kernel = Kernel::detect();
    for (name, format, rows, cols) in [
        ("mlp 1536x576 q4", QFormat::Q4, 3072usize, 576usize),
        ("lm_head 49152x576 q8", QFormat::Q8, 49152, 576),
    ] {
        let mut s = 1u32;
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        let m = match format {
            QFormat::Q4 => QuantMatrix::quantize_q4(&w, rows, cols),
            _ => QuantMatrix::quantize_q8(&w, rows, cols),
        };
        drop(w);
        let pm = PackedMatrix::from_quant(&m).unwrap();
        for n in [1usize, 2, 3, 4, 8, 16] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let xq = QuantizedRows::new(&x, n, cols, format, 32);
            let reps = 30;
            let t = in_pool(|| {
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let t0 = Instant::now();
                    std::hint::black_box(quant_matmul(&m, &xq, kernel));
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                best
            });
            let tp = in_pool(|| {
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let t0 = Instant::now();
                    std::hint::black_box(unsafe { pm.matmul_vnni(&xq) });
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                best
            });
            println!(
                "{name} n={n}: rowdot {:.3} ms packed {:.3} ms",
                t * 1e3,
                tp * 1e3
            );
        }
    }
}
