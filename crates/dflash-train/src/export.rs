//! Export to the z-lab format: config.json (`DFlashDraftModel`, `dflash_config`; the run's
//! file through `DrafterFile`, checked, written back) and
//! model.safetensors in bf16 with the exact tensor names and `{"format": "pt"}` metadata,
//! as vLLM, SGLang and Hugging Face loaders expect.

use crate::draft_model::param_shapes;
use crate::train::{load_params, RunDir};
use crate::TrainError;
use candle_core::{DType, Device};
use dflash_core::drafter::{DrafterConfig, DrafterFile};
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
