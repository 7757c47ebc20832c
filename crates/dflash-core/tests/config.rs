//! Hyper-parameters from Hugging Face config.json: llama3 rope scaling, defaults, errors.

use dflash_core::config::{Arch, ModelConfig, RopeStyle};

const LLAMA31: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false
}"#;

#[test]
fn llama3_rope_scaling_becomes_frequency_divisors() {
    let c = ModelConfig::from_hf_json(LLAMA31).unwrap();
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!(c.rope.style, RopeStyle::Neox);
    assert_eq!((c.head_dim, c.rope.dim, c.num_kv_heads), (128, 128, 8));
    let ff = &c.rope.freq_factors();
    assert_eq!(ff.len(), 64);
    // High frequencies (wavelength < 8192/4) are kept, low ones (> 8192/1) divided by 8,
    // and the band between is interpolated smoothly and monotonically.
    assert_eq!(ff[0], 1.0);
    assert_eq!(ff[63], 8.0);
    let mid: Vec<f32> = ff.iter().cloned().filter(|&f| f > 1.0 && f < 8.0).collect();
    assert!(!mid.is_empty());
    assert!(ff.windows(2).all(|w| w[1] >= w[0]));
    let inv = c.rope_inv_freq();
    let plain = 500000f64.powf(-2.0 * 63.0 / 128.0);
    assert!(((inv[63] as f64) - plain / 8.0).abs() < 1e-12);
}

#[test]
fn unknown_rope_scaling_and_bad_heads_are_errors() {
    let yarn = LLAMA31.replace("\"llama3\"", "\"yarn\"");
    assert!(matches!(
        ModelConfig::from_hf_json(&yarn),
        Err(dflash_core::Error::BadConfig(_))
    ));
    let bad = LLAMA31.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5");
    assert!(matches!(
        ModelConfig::from_hf_json(&bad),
        Err(dflash_core::Error::BadConfig(_))
    ));
    assert!(matches!(
        ModelConfig::from_hf_json("{"),
        Err(dflash_core::Error::BadConfig(_))
    ));
}

/// Transformers 5 writes RoPE as `rope_parameters`: the same theta and llama3 scaling as
/// the top-level fields; both forms with different thetas are refused.
#[test]
fn rope_parameters_of_transformers_5_are_read() {
    let old = ModelConfig::from_hf_json(LLAMA31).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(LLAMA31).unwrap();
    let mut rp = v["rope_scaling"].clone();
    rp["rope_theta"] = v["rope_theta"].clone();
    v["rope_parameters"] = rp;
    let o = v.as_object_mut().unwrap();
    o.remove("rope_theta");
    o.remove("rope_scaling");
    let new = ModelConfig::from_hf_json(&v.to_string()).unwrap();
    assert_eq!(
        (new.rope.theta, new.rope.freq_factors()),
        (old.rope.theta, old.rope.freq_factors())
    );
    // Plain default RoPE at another theta.
    let qwen = r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"}}"#;
    let q = ModelConfig::from_hf_json(qwen).unwrap();
    assert_eq!(q.rope.theta, 1e7);
    assert!(q.rope.freq_factors().is_empty());
    let both = qwen.replace(
        "\"vocab_size\": 300,",
        "\"vocab_size\": 300, \"rope_theta\": 1000000,",
    );
    assert!(matches!(
        ModelConfig::from_hf_json(&both),
        Err(dflash_core::Error::BadConfig(_))
    ));
}
