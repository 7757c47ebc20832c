//! Random drafters for a target, written in the exact z-lab format (config.json +
//! bf16 model.safetensors; DFlash or DFlash2): what `dflash make-random-drafter` writes to
//! measure a pair's DFlash step without a trained drafter, and what the tests load.

use super::config::{DFlash2Config, DrafterConfig, LayerKind};
use super::file::DrafterFile;
use crate::config::{ModelConfig, Rope, RopeStyle};
use crate::formats::hf::write_safetensors;
use crate::rng::Rng;
use safetensors::Dtype;
use std::collections::BTreeMap;

/// Writes the files of `write_hf` into a folder.
#[cfg(not(target_arch = "wasm32"))]
pub fn write_dir(dir: &std::path::Path, files: &BTreeMap<String, Vec<u8>>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (n, b) in files {
        std::fs::write(dir.join(n), b)?;
    }
    Ok(())
}

/// Options of a random drafter written in the exact z-lab format.
#[derive(Debug, Clone)]
pub struct DrafterSpec {
    pub layers: usize,
    pub block_size: usize,
    /// None: leave `target_layer_ids` out (the default formula applies).
    pub target_layer_ids: Option<Vec<usize>>,
    /// Put block_size inside `dflash_config` (newer files) rather than at the top level.
    pub block_in_dflash_config: bool,
    /// `layer_types`, e.g. ["sliding_attention", "full_attention"]; None leaves it out.
    pub layer_types: Option<Vec<String>>,
    pub sliding_window: usize,
    pub mask_token_id: u32,
    pub seed: u64,
}

impl DrafterSpec {
    /// `layers` layers over target `t` at block 16: the default taps, the block inside
    /// `dflash_config`, full attention, the vocabulary's last id as the mask token.
    pub fn new(t: &ModelConfig, layers: usize, seed: u64) -> Self {
        DrafterSpec {
            layers,
            block_size: 16,
            target_layer_ids: None,
            block_in_dflash_config: true,
            layer_types: None,
            sliding_window: 0,
            mask_token_id: t.vocab_size as u32 - 1,
            seed,
        }
    }
}

impl DrafterSpec {
    /// The bytes writing this drafter for target `t` takes at its peak (its weights in
    /// f32 and again in bf16), for a check before anything is allocated; `dflash2` adds
    /// the selector's codebooks of rank `selector_rank`.
    pub fn write_bytes(&self, t: &ModelConfig, dflash2_rank: Option<usize>) -> u64 {
        let (h, v) = (t.hidden_size as u64, t.vocab_size as u64);
        let q = (t.num_heads * t.head_dim) as u64;
        let kv = (t.num_kv_heads * t.head_dim) as u64;
        let per_layer = 2 * h * q + 2 * h * kv + 3 * h * t.intermediate_size as u64 + 4 * h;
        let taps = self
            .target_layer_ids
            .as_ref()
            .map_or(t.num_layers.min(self.layers.max(1)), Vec::len) as u64;
        let selector = dflash2_rank.map_or(0, |r| 2 * v * r as u64);
        let params = (h * taps * h)
            .saturating_add((self.layers as u64).saturating_mul(per_layer))
            .saturating_add(selector);
        params.saturating_mul(6)
    }
}

/// A drafter for the target `t`: config.json and model.safetensors (bf16) with the
/// z-lab tensor names.
pub fn write_drafter(t: &ModelConfig, s: &DrafterSpec) -> BTreeMap<String, Vec<u8>> {
    let (cfg, tensors) = drafter_parts(t, s);
    drafter_files(&cfg, &tensors)
}

fn drafter_files(
    cfg: &DrafterFile,
    tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    files.insert("config.json".into(), cfg.to_json_pretty().into_bytes());
    files.insert("model.safetensors".into(), write_safetensors(tensors));
    files
}

fn bf16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect()
}

/// DFlash2's extras for `write_dflash2_drafter`: its sizes and the optional scales.
#[derive(Debug, Clone)]
pub struct DFlash2Spec {
    pub sizes: DFlash2Config,
    pub output_multiplier: Option<f32>,
    pub final_logit_softcapping: Option<f32>,
    pub input_embedding_scale: Option<f32>,
}

impl DFlash2Spec {
    /// DFlash2's sizes, the scales unset.
    pub fn new(
        conv_kernel_size: usize,
        conv_group_size: usize,
        selector_rank: usize,
        selector_top_k: usize,
    ) -> Self {
        DFlash2Spec {
            sizes: DFlash2Config {
                conv_kernel_size,
                conv_group_size,
                selector_rank,
                selector_top_k,
            },
            output_multiplier: None,
            final_logit_softcapping: None,
            input_embedding_scale: None,
        }
    }
}

/// A DFlash2 drafter (`DFlash2DraftModel`): the DFlash tensors plus, per layer,
/// `attention_conv` / `mlp_conv` (`base_kernel` `[2, taps, H]`,
/// `kernel_projection.weight` `[2 * taps * H / group, H]`) and the
/// `candidate_selector` (`hidden_projection.weight` `[rank, H]`,
/// `predecessor_codebook` / `successor_codebook` `[V, rank]`), the names vLLM loads.
pub fn write_dflash2_drafter(
    t: &ModelConfig,
    s: &DrafterSpec,
    d: &DFlash2Spec,
) -> BTreeMap<String, Vec<u8>> {
    let (mut cfg, mut tensors) = drafter_parts(t, s);
    cfg.architectures = vec!["DFlash2DraftModel".into()];
    let dc = cfg.dflash_config.get_or_insert_with(Default::default);
    dc.conv_kernel_size = Some(d.sizes.conv_kernel_size);
    dc.conv_group_size = Some(d.sizes.conv_group_size);
    dc.selector_rank = Some(d.sizes.selector_rank);
    dc.selector_top_k = Some(d.sizes.selector_top_k);
    dc.output_multiplier = d.output_multiplier;
    dc.final_logit_softcapping = d.final_logit_softcapping.map(Some);
    dc.input_embedding_scale = d.input_embedding_scale;
    let h = t.hidden_size;
    let groups = h / d.sizes.conv_group_size.max(1);
    let mut rng = Rng(s.seed ^ 0xd2);
    let mut put = |name: String, shape: Vec<usize>, scale: f32, rng: &mut Rng| {
        let n = shape.iter().product();
        tensors.push((name, Dtype::BF16, shape, bf16_bytes(&rng.vec(n, scale))));
    };
    for i in 0..s.layers {
        for conv in ["attention_conv", "mlp_conv"] {
            put(
                format!("layers.{i}.{conv}.base_kernel"),
                vec![2, d.sizes.conv_kernel_size, h],
                0.5,
                &mut rng,
            );
            put(
                format!("layers.{i}.{conv}.kernel_projection.weight"),
                vec![2 * d.sizes.conv_kernel_size * groups, h],
                0.3 / (h as f32).sqrt(),
                &mut rng,
            );
        }
    }
    put(
        "candidate_selector.hidden_projection.weight".into(),
        vec![d.sizes.selector_rank, h],
        1.0 / (h as f32).sqrt(),
        &mut rng,
    );
    put(
        "candidate_selector.predecessor_codebook".into(),
        vec![t.vocab_size, d.sizes.selector_rank],
        1.0,
        &mut rng,
    );
    put(
        "candidate_selector.successor_codebook".into(),
        vec![t.vocab_size, d.sizes.selector_rank],
        1.0,
        &mut rng,
    );
    drafter_files(&cfg, &tensors)
}

type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

/// The DFlash drafter's config.json and tensors (bf16, z-lab names): the trainer's file
/// for the target's widths, with the spec's variants (block in `dflash_config`, taps or
/// `layer_types` left out).
fn drafter_parts(t: &ModelConfig, s: &DrafterSpec) -> (DrafterFile, Tensors) {
    let ids = s
        .target_layer_ids
        .clone()
        .unwrap_or_else(|| DrafterConfig::default_target_layer_ids(s.layers, t.num_layers));
    let dc = spec_config(t, s, ids.clone());
    let cfg = spec_file(t, s, &dc);
    let mut out = RandomTensors {
        rng: Rng(s.seed),
        tensors: Vec::new(),
    };
    let h = t.hidden_size;
    let sc = |x: usize| 1.0 / (x as f32).sqrt();
    out.put(
        "fc.weight".into(),
        vec![h, ids.len() * h],
        sc(ids.len() * h),
        0.0,
    );
    out.put("hidden_norm.weight".into(), vec![h], 0.1, 1.0);
    out.put("norm.weight".into(), vec![h], 0.1, 1.0);
    for i in 0..s.layers {
        out.put_layer(t, i);
    }
    (cfg, out.tensors)
}

/// The drafter config of the spec for target `t` with taps `ids`: the target's widths,
/// full layers unless `layer_types` says sliding (its window written with them only).
fn spec_config(t: &ModelConfig, s: &DrafterSpec, ids: Vec<usize>) -> DrafterConfig {
    let (h, hd) = (t.hidden_size, t.head_dim);
    let layer_kinds = match &s.layer_types {
        Some(lt) => lt
            .iter()
            .map(|k| match k.as_str() {
                "sliding_attention" => LayerKind::Sliding,
                _ => LayerKind::Full,
            })
            .collect(),
        None => vec![LayerKind::Full; s.layers],
    };
    // The window is written with `layer_types` only.
    let sliding_window = if s.layer_types.is_some() {
        s.sliding_window
    } else {
        0
    };
    DrafterConfig {
        hidden_size: h,
        intermediate_size: t.intermediate_size,
        num_layers: s.layers,
        num_heads: t.num_heads,
        num_kv_heads: t.num_kv_heads,
        head_dim: hd,
        rms_norm_eps: 1e-6,
        rope: Rope::plain(t.rope.theta, RopeStyle::Neox, hd),
        vocab_size: t.vocab_size,
        layer_kinds,
        sliding_window,
        is_causal: None,
        input_embedding_scale: 1.0,
        output_multiplier: 1.0,
        final_logit_softcapping: None,
        num_target_layers: t.num_layers,
        block_size: s.block_size,
        mask_token_id: s.mask_token_id,
        target_layer_ids: ids,
        architecture: "DFlashDraftModel".into(),
        dflash2: None,
    }
}

/// The config.json of `dc` as the trainer writes it, with the spec's variants.
fn spec_file(t: &ModelConfig, s: &DrafterSpec, dc: &DrafterConfig) -> DrafterFile {
    let mut cfg = DrafterFile::from(dc);
    cfg.max_position_embeddings = Some(t.max_position_embeddings);
    // `layer_types` as given (unknown kinds included: the parser names them), or none.
    cfg.layer_types = s.layer_types.clone();
    if cfg.layer_types.is_some() {
        cfg.sliding_window = Some(s.sliding_window);
    }
    let dflash = cfg.dflash_config.get_or_insert_with(Default::default);
    if s.target_layer_ids.is_none() {
        dflash.target_layer_ids = None;
    }
    if s.block_in_dflash_config {
        dflash.block_size = cfg.top.block_size.take();
    }
    cfg
}

/// Random bf16 tensors drawn in turn from one generator.
struct RandomTensors {
    rng: Rng,
    tensors: Tensors,
}

impl RandomTensors {
    /// A tensor of `shape`, uniform noise of `scale` around `offset`.
    fn put(&mut self, name: String, shape: Vec<usize>, scale: f32, offset: f32) {
        let n = shape.iter().product();
        let v: Vec<f32> = self
            .rng
            .vec(n, scale)
            .into_iter()
            .map(|x| x + offset)
            .collect();
        self.tensors
            .push((name, Dtype::BF16, shape, bf16_bytes(&v)));
    }

    /// Layer `i`'s norms and projections for target `t`'s widths, in the file's order.
    fn put_layer(&mut self, t: &ModelConfig, i: usize) {
        let (h, hd) = (t.hidden_size, t.head_dim);
        let (nh, nkv, ff) = (t.num_heads, t.num_kv_heads, t.intermediate_size);
        let sc = |x: usize| 1.0 / (x as f32).sqrt();
        let p = |n: &str| format!("layers.{i}.{n}");
        self.put(p("input_layernorm.weight"), vec![h], 0.1, 1.0);
        self.put(p("post_attention_layernorm.weight"), vec![h], 0.1, 1.0);
        self.put(
            p("self_attn.q_proj.weight"),
            vec![nh * hd, h],
            2.0 * sc(h),
            0.0,
        );
        self.put(
            p("self_attn.k_proj.weight"),
            vec![nkv * hd, h],
            2.0 * sc(h),
            0.0,
        );
        self.put(p("self_attn.v_proj.weight"), vec![nkv * hd, h], sc(h), 0.0);
        self.put(
            p("self_attn.o_proj.weight"),
            vec![h, nh * hd],
            sc(nh * hd),
            0.0,
        );
        self.put(p("self_attn.q_norm.weight"), vec![hd], 0.1, 1.0);
        self.put(p("self_attn.k_norm.weight"), vec![hd], 0.1, 1.0);
        self.put(p("mlp.gate_proj.weight"), vec![ff, h], sc(h), 0.0);
        self.put(p("mlp.up_proj.weight"), vec![ff, h], sc(h), 0.0);
        self.put(p("mlp.down_proj.weight"), vec![h, ff], sc(ff), 0.0);
    }
}
