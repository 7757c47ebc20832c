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

/// The sampled head's softmax is the log-softmax over its rows alone: each label's NLL
/// equals the composed one over the logits of the candidate ids, every label and `always`
/// id is a candidate, a label outside them is an error, and with every id in `always` it
/// is the whole head.
#[test]
fn sampled_head_is_the_softmax_over_its_rows() {
    use dflash_train::head_loss::CandidateHead;
    let dev = Device::Cpu;
    let (n, h, v) = (6, 8, 300);
    let w = Tensor::randn(0f32, 1.0, (v, h), &dev).unwrap();
    let x = Tensor::randn(0f32, 1.0, (n, h), &dev).unwrap();
    let labels: Vec<u32> = vec![5, 17, 5, 250, 99, 17];
    let always: Vec<u32> = vec![5, 17, 99, 250, 251];
    let mut rng = dflash_core::rng::Rng(7);
    let head = CandidateHead::draw(&w, &always, 40, &mut rng).unwrap();
    assert!(always.iter().all(|t| head.ids.contains(t)));
    assert!(head.ids.len() > always.len() + 20 && head.ids.len() <= always.len() + 40);
    assert!(head.ids.windows(2).all(|p| p[0] < p[1]), "ids ascend");

    let local = head.local_labels(&labels).unwrap();
    let nll: Vec<f32> = x
        .apply_op1(FrozenHeadNll::new(head.rows.clone(), local))
        .unwrap()
        .to_vec1()
        .unwrap();
    let logits: Vec<Vec<f32>> = x.matmul(&w.t().unwrap()).unwrap().to_vec2().unwrap();
    for (r, &label) in labels.iter().enumerate() {
        let zs: Vec<f32> = head.ids.iter().map(|&t| logits[r][t as usize]).collect();
        let m = zs.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let lse = m + zs.iter().map(|z| (z - m).exp()).sum::<f32>().ln();
        let want = lse - logits[r][label as usize];
        assert!(
            (nll[r] - want).abs() < 1e-4,
            "row {r}: {} vs {want}",
            nll[r]
        );
    }
    let outside = (0..v as u32).find(|t| !head.ids.contains(t)).unwrap();
    let err = head.local_labels(&[outside]).unwrap_err().to_string();
    assert!(err.contains(&format!("label {outside}")), "{err}");

    let all: Vec<u32> = (0..v as u32).collect();
    let whole = CandidateHead::draw(&w, &all, 0, &mut rng).unwrap();
    assert_eq!(whole.ids, all);
    let full: Vec<f32> = x
        .apply_op1(FrozenHeadNll::new(w.clone(), labels.clone()))
        .unwrap()
        .to_vec1()
        .unwrap();
    let same: Vec<f32> = x
        .apply_op1(FrozenHeadNll::new(whole.rows.clone(), labels.clone()))
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(full, same);
}
