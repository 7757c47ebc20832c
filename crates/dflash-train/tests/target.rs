//! The candle target agrees with the CPU reference (the engine's oracle): logits and taps
//! of a tiny model of each architecture, alone and left-padded in a batch.

use candle_core::{Device, IndexOp, Tensor};
use dflash_core::config::Arch;
use dflash_core::cpu::{CpuModel, LogitRows};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf};
use dflash_train::target::Target;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn candle_target_matches_cpu_reference() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let c = tiny_config(arch);
        let m = load_gguf(&write_gguf(&c, &random_weights(&c, 7), GgmlType::Q8_0)).unwrap();
        let cpu = CpuModel::new(&m.weights);
        let tgt = Target::new(&m.weights, &Device::Cpu).unwrap();
        let taps = [0usize, c.num_layers - 1];
        let seqs: Vec<Vec<u32>> = vec![
            (0..11).map(|i| (i * 7 + 3) % c.vocab_size as u32).collect(),
            (0..6).map(|i| (i * 5 + 1) % c.vocab_size as u32).collect(),
        ];
        let mut want = Vec::new();
        for s in &seqs {
            let mut cache = cpu.new_cache(64);
            let out = cpu.forward(s, &mut cache, LogitRows::All, &taps).unwrap();
            // One sequence alone.
            let t = Tensor::from_slice(s, (1, s.len()), &Device::Cpu).unwrap();
            let mut bc = tgt.new_cache(vec![0]);
            let (x, tp) = tgt.forward(&t, &mut bc, &taps).unwrap();
            let logits: Vec<f32> = tgt
                .logits(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let d = max_diff(&logits, &out.logits);
            assert!(d < 1e-3, "{arch:?}: logits differ by {d}");
            let tv: Vec<f32> = tp.unwrap().flatten_all().unwrap().to_vec1().unwrap();
            assert!(max_diff(&tv, &out.taps) < 1e-3, "{arch:?}: taps differ");
            want.push(out);
        }
        // Both, left-padded into one batch: each row's logits equal its own run's.
        let lp = seqs[0].len();
        let mut toks = seqs[0].clone();
        toks.extend(std::iter::repeat_n(0u32, lp - seqs[1].len()));
        toks.extend_from_slice(&seqs[1]);
        let t = Tensor::from_vec(toks, (2, lp), &Device::Cpu).unwrap();
        let mut bc = tgt.new_cache(vec![0, lp - seqs[1].len()]);
        let (x, _) = tgt.forward(&t, &mut bc, &[]).unwrap();
        let l1: Vec<f32> = tgt
            .logits(&x.i((1, lp - seqs[1].len()..)).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(
            max_diff(&l1, &want[1].logits) < 1e-3,
            "{arch:?}: padded row differs"
        );
        // Greedy generation of the batch equals the CPU reference's greedy tokens.
        let gen = tgt.generate_greedy(&seqs, 5, &|_| false).unwrap();
        for (s, g) in seqs.iter().zip(&gen) {
            let mut cache = cpu.new_cache(64);
            let mut ids = s.clone();
            let mut out = cpu.forward(&ids, &mut cache, LogitRows::Last, &[]).unwrap();
            for _ in 0..5 {
                let t = cpu.argmax_last(&out.logits);
                ids.push(t);
                out = cpu.forward(&[t], &mut cache, LogitRows::Last, &[]).unwrap();
            }
            assert_eq!(&ids[s.len()..], &g[..], "{arch:?}: greedy differs");
        }
    }
}
