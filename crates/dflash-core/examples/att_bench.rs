use dflash_core::cpu::ops::attention_row;
use std::time::Instant;
fn main() {
    let (nh, nkv, hd) = (9, 3, 64);
    for pos in [81usize, 500, 2000] {
        let q: Vec<f32> = (0..nh * hd).map(|i| (i % 13) as f32 * 0.01).collect();
        let kc: Vec<f32> = (0..(pos + 1) * nkv * hd)
            .map(|i| (i % 17) as f32 * 0.01)
            .collect();
        let vc = kc.clone();
        let mut out = vec![0f32; nh * hd];
        let reps = 2000;
        let t0 = Instant::now();
        for _ in 0..reps {
            attention_row(&q, &kc, &vc, pos, nh, nkv, hd, &mut out);
            std::hint::black_box(&out);
        }
        let per = t0.elapsed().as_secs_f64() / reps as f64;
        println!(
            "pos {pos}: {:.1} us per row-layer, x30 layers = {:.3} ms",
            per * 1e6,
            per * 30e3
        );
    }
}
