//! Export to the z-lab format: config.json (`DFlashDraftModel`, `dflash_config`; the run's
//! file through `DrafterFile`, checked, written back) and model.safetensors in bf16 with
//! the exact tensor names and `{"format": "pt"}` metadata, as z-lab's reference
//! (`dflash.model.DFlashDraftModel.from_pretrained`), vLLM, SGLang and llama.cpp's
//! converter read them. transformers' `AutoModel` does not load it: the folder ships no
//! `auto_map` or modelling code. [`serving_files`] adds what those servers need of the
//! target (the mask token's text, the draft vocabulary's `d2t` form).

use crate::draft_model::param_shapes;
use crate::train::{load_params, RunDir};
use crate::TrainError;
use candle_core::{DType, Device};
use dflash_core::drafter::{DraftVocab, DrafterConfig, DrafterFile, D2T_FILE, DRAFT_VOCAB_FILE};
use dflash_core::model_files::LoadedModel;
use std::collections::HashMap;
use std::path::Path;

/// Writes the drafter of run `run_dir` (its last checkpoint) to `out`.
pub fn export(run_dir: &Path, out: &Path) -> Result<(), TrainError> {
    let run = RunDir(run_dir.to_path_buf());
    let cfg_text = std::fs::read_to_string(run.drafter_config())
        .map_err(|e| TrainError::Io(format!("{}: {e}", run.drafter_config().display())))?;
    let file = DrafterFile::from_json(&cfg_text)?;
    let cfg = DrafterConfig::try_from(file.clone())?;
    let (params, _, _) = load_params(&run, &cfg, &Device::Cpu)?;
    let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in param_shapes(&cfg) {
        let t = params.vars[&name].as_tensor().to_dtype(DType::BF16)?;
        let v: Vec<half::bf16> = t.flatten_all()?.to_vec1()?;
        bytes.push((
            name,
            shape,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b)
                    .map_err(|e| TrainError::Checkpoint(e.to_string()))?,
            ))
        })
        .collect::<Result<_, TrainError>>()?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let data = safetensors::serialize(views, Some(meta))
        .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    std::fs::create_dir_all(out).map_err(|e| TrainError::Io(e.to_string()))?;
    std::fs::write(out.join("config.json"), file.to_json_pretty())
        .map_err(|e| TrainError::Io(e.to_string()))?;
    std::fs::write(out.join("model.safetensors"), data)
        .map_err(|e| TrainError::Io(e.to_string()))?;
    Ok(())
}

/// Completes an exported drafter folder for the servers beyond this engine, from its
/// target: `dflash_config.mask_token` (the mask id's text: older SGLang builds resolve
/// the mask by it), `n_predict` (`block_size - 1`, vLLM's default draft count) and, with
/// `d2t` where the folder has a `draft_vocab.json`, its `d2t` form
/// (`draft_vocab.safetensors`: `d2t` and the target's head rows of those ids as the
/// drafter's own `lm_head.weight`, bf16; `draft_vocab_size` in config.json), which vLLM
/// reads. Without `d2t` an earlier `d2t` form is removed (config.json must not name a
/// size whose file is absent: vLLM would build an uninitialized head). Returns the size
/// of the `d2t` form written (0: none).
pub fn serving_files(dir: &Path, target: &LoadedModel, d2t: bool) -> Result<usize, TrainError> {
    let io = |p: &Path, e: std::io::Error| TrainError::Io(format!("{}: {e}", p.display()));
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| io(&cfg_path, e))?;
    let mut file = DrafterFile::from_json(&text)?;
    let cfg = DrafterConfig::try_from(file.clone())?;
    cfg.validate_against(target.config())?;
    let mask = target
        .tokenizer
        .id_to_token(cfg.mask_token_id)
        .ok_or_else(|| {
            TrainError::Io(format!(
                "mask_token_id {} has no text in the target's tokenizer",
                cfg.mask_token_id
            ))
        })?;
    file.dflash_config
        .get_or_insert_with(Default::default)
        .mask_token = Some(mask);
    file.n_predict = (cfg.block_size > 1).then(|| cfg.block_size - 1);
    let vocab_path = dir.join(DRAFT_VOCAB_FILE);
    let d2t_path = dir.join(D2T_FILE);
    file.draft_vocab_size = None;
    if d2t_path.exists() {
        std::fs::remove_file(&d2t_path).map_err(|e| io(&d2t_path, e))?;
    }
    let mut n = 0;
    if d2t && vocab_path.exists() {
        let text = std::fs::read_to_string(&vocab_path).map_err(|e| io(&vocab_path, e))?;
        let vocab = DraftVocab::from_json(&text, cfg.vocab_size)?;
        std::fs::write(&d2t_path, d2t_file(&vocab, target)?).map_err(|e| io(&d2t_path, e))?;
        n = vocab.len();
        file.draft_vocab_size = Some(n);
    }
    std::fs::write(&cfg_path, file.to_json_pretty()).map_err(|e| io(&cfg_path, e))?;
    Ok(n)
}

fn view(
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: &[u8],
) -> Result<safetensors::tensor::TensorView<'_>, TrainError> {
    safetensors::tensor::TensorView::new(dtype, shape, data)
        .map_err(|e| TrainError::Checkpoint(e.to_string()))
}

/// `draft_vocab.safetensors`: `d2t` (int64) and the target head's rows of the list (bf16).
fn d2t_file(vocab: &DraftVocab, target: &LoadedModel) -> Result<Vec<u8>, TrainError> {
    let head = target.weights.lm_head();
    let hidden = target.config().hidden_size;
    let mut row = vec![0f32; hidden];
    let mut rows = Vec::with_capacity(vocab.len() * hidden * 2);
    for &id in vocab.ids() {
        head.dequantize_row(id as usize, &mut row);
        rows.extend(
            row.iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()),
        );
    }
    let d2t: Vec<u8> = vocab.d2t().iter().flat_map(|d| d.to_le_bytes()).collect();
    let views = vec![
        (
            "d2t".to_string(),
            view(safetensors::Dtype::I64, vec![vocab.len()], &d2t)?,
        ),
        (
            "lm_head.weight".to_string(),
            view(safetensors::Dtype::BF16, vec![vocab.len(), hidden], &rows)?,
        ),
    ];
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(meta)).map_err(|e| TrainError::Checkpoint(e.to_string()))
}
