use dflash_core::cpu::{CpuModel, LogitRows};
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let reps: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(40);
    let m = dflash_core::model_files::load_path(std::path::Path::new(&path)).unwrap();
    let model = CpuModel::with_kernels(&m.weights, dflash_core::cpu::CpuKernels::Quantized);
    let mut cache = model.new_cache(4096);
    let plen: u32 = std::env::var("PROMPT_LEN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(80);
    let prompt: Vec<u32> = (0..plen).map(|i| 100 + (i * 7) % 40000).collect();
    model
        .forward(&prompt, &mut cache, LogitRows::None, &[])
        .unwrap();
    let base = cache.len();
    let taps = [1usize, 14, 27];
    let ns: Vec<usize> = std::env::args()
        .nth(3)
        .map(|s| s.split(',').map(|v| v.parse().unwrap()).collect())
        .unwrap_or(vec![1, 2, 4, 16]);
    for round in 0..2 {
        for n in ns.iter().copied() {
            let toks: Vec<u32> = (0..n as u32).map(|i| 300 + i).collect();
            let mut times = vec![];
            for _ in 0..reps {
                let t0 = Instant::now();
                let out = model
                    .forward(&toks, &mut cache, LogitRows::All, &taps)
                    .unwrap();
                times.push(t0.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(out);
                cache.truncate(base);
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            if round == 1 {
                println!(
                    "n={n}: median {:.3} ms, min {:.3}",
                    times[reps / 2],
                    times[0]
                );
            }
        }
    }
}
