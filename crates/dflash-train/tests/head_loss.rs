//! The fused frozen-head cross-entropy equals candle's composed log-softmax: the same
//! per-row NLL and the same gradient of the hidden rows.

use candle_core::{Device, Tensor, Var, D};
use dflash_train::head_loss::FrozenHeadNll;

#[test]
fn fused_head_loss_matches_composed() {
    let dev = Device::Cpu;
    let (n, h, v) = (7, 12, 50);
    let w = Tensor::randn(0f32, 1.0, (v, h), &dev).unwrap();
    let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (n, h), &dev).unwrap()).unwrap();
    let labels: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % v as u32).collect();
    let weights = Tensor::from_vec(
        (0..n).map(|i| 1.0 + i as f32 / 3.0).collect::<Vec<_>>(),
        n,
        &dev,
    )
    .unwrap();

    let op = FrozenHeadNll::new(w.clone(), labels.clone());
    let stats = op.stats.clone();
    let fused = x.as_tensor().apply_op1(op).unwrap();
    let loss_f = (&fused * &weights).unwrap().sum_all().unwrap();
    let gf = loss_f
        .backward()
        .unwrap()
        .get(x.as_tensor())
        .unwrap()
        .clone();

    let logits = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
    let lab = Tensor::from_vec(labels.clone(), (n, 1), &dev).unwrap();
    let composed = candle_nn::ops::log_softmax(&logits, D::Minus1)
        .unwrap()
        .gather(&lab, 1)
        .unwrap()
        .squeeze(1)
        .unwrap()
        .neg()
        .unwrap();
    let loss_c = (&composed * &weights).unwrap().sum_all().unwrap();
    let gc = loss_c
        .backward()
        .unwrap()
        .get(x.as_tensor())
        .unwrap()
        .clone();

    let d = |a: &Tensor, b: &Tensor| {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    assert!(
        d(&fused, &composed) < 1e-4,
        "nll differs by {}",
        d(&fused, &composed)
    );
    assert!(d(&gf, &gc) < 1e-4, "gradient differs by {}", d(&gf, &gc));
    let want: Vec<u32> = logits.argmax(D::Minus1).unwrap().to_vec1().unwrap();
    assert_eq!(stats.lock().unwrap().argmax, want);
}
