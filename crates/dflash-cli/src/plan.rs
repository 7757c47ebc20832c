//! `dflash plan`: the GPU memory a target and its DFlash drafter would take, from their
//! `config.json` files alone (no weights): the weights as a Q4_K_M GGUF repacked, the KV
//! cache and activations of the target with taps and the drafter's context cache and
//! activations, at each context length asked, through the same planner `GpuModel` and
//! `dflash bench --synthetic` use, against a memory budget and this adapter's (or the
//! browser's) buffer limits. Allocates nothing.

use crate::bench::parse_bytes;
use crate::CliError;
use dflash_core::synthetic::SyntheticSpec;
use dflash_gpu::synthetic::Planned;
use dflash_gpu::GpuOptions;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct PlanArgs {
    /// The target's config.json (or its Hugging Face model folder).
    #[arg(long)]
    config: PathBuf,
    /// The drafter's config.json (or its folder; a folder's draft_vocab.json puts the
    /// head rows it gathers in the plan).
    #[arg(long)]
    drafter: PathBuf,
    /// Context lengths (KV capacity in tokens) to plan, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "4096,32768")]
    context: Vec<usize>,
    /// The memory there is: bytes, or with a K/M/G/T suffix (default: the 32 GB of an
    /// Intel Arc Pro B70).
    #[arg(long, value_parser = parse_bytes, default_value = "32G")]
    memory_budget: u64,
    /// Plan within the limits a browser's WebGPU grants instead of this adapter's.
    #[arg(long)]
    browser_limits: bool,
    /// Choose the GPU adapter whose name contains this.
    #[arg(long)]
    adapter: Option<String>,
    #[arg(long)]
    json: bool,
}

/// `path`, or `path/config.json` for a folder.
fn config_text(path: &Path) -> Result<String, CliError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    std::fs::read_to_string(&file).map_err(|e| CliError::Usage(format!("{}: {e}", file.display())))
}

/// The ids a drafter folder's `draft_vocab.json` lists (checked against the target's
/// vocabulary), None without one or for a DFlash2 drafter (it drafts with the whole head).
fn draft_vocab_ids(spec: &SyntheticSpec, drafter: &Path) -> Result<Option<usize>, CliError> {
    use dflash_core::drafter::{DraftVocab, DRAFT_VOCAB_FILE};
    let file = drafter.join(DRAFT_VOCAB_FILE);
    if !drafter.is_dir() || !file.is_file() || spec.drafter.dflash2.is_some() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&file)
        .map_err(|e| CliError::Usage(format!("{}: {e}", file.display())))?;
    Ok(Some(
        DraftVocab::from_json(&text, spec.config.vocab_size)?.len(),
    ))
}

pub fn run(a: PlanArgs) -> Result<(), CliError> {
    let mut spec = SyntheticSpec::from_configs(
        &a.config.display().to_string(),
        &config_text(&a.config)?,
        &config_text(&a.drafter)?,
    )?;
    spec.draft_vocab = draft_vocab_ids(&spec, &a.drafter)?;
    let opts = GpuOptions {
        adapter: a.adapter.clone(),
        browser_limits: a.browser_limits,
        ..Default::default()
    };
    let ctx = std::rc::Rc::new(dflash_gpu::GpuContext::new(&opts)?);
    let mut plans = Vec::new();
    let mut first_error = None;
    for &context in &a.context {
        let budget = Some(a.memory_budget);
        let row = match dflash_gpu::synthetic::plan(&ctx, &spec, context, Planned::DFlash, budget) {
            Ok(p) => {
                let t = p.total();
                serde_json::json!({
                    "context": context, "fits": true,
                    "weights": t.weights, "drafter_weights": p.drafter_weights,
                    "kv_cache": t.kv_cache, "activations": t.activations, "total": t.total(),
                    "recurrent_state": dflash_gpu::model::recurrent_state_bytes(&spec.config),
                })
            }
            Err(e) => {
                let v =
                    serde_json::json!({"context": context, "fits": false, "error": e.to_string()});
                first_error.get_or_insert(e);
                v
            }
        };
        plans.push(row);
    }
    let c = &spec.config;
    let v = serde_json::json!({
        "target": a.config.display().to_string(),
        "drafter": a.drafter.display().to_string(),
        "arch": c.arch, "layers": c.num_layers, "hidden": c.hidden_size,
        "drafter_layers": spec.drafter.num_layers,
        "draft_vocab": spec.draft_vocab,
        "block_size": spec.drafter.block_size,
        "target_layer_ids": spec.drafter.target_layer_ids,
        "weights_format": "as a Q4_K_M GGUF repacked (q4/32, q8/16 where Q6_K)",
        "target_weight_bytes": spec.target_weight_bytes(),
        "memory_budget": a.memory_budget,
        "limits": if a.browser_limits { "browser" } else { "adapter" },
        "adapter": ctx.summary.name,
        "plans": plans,
    });
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&v).unwrap())?;
    } else {
        print_plans(&v)?;
    }
    match first_error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// One line per context length: the parts in GB, or why it does not fit.
fn print_plans(v: &serde_json::Value) -> Result<(), CliError> {
    let gb = |x: &serde_json::Value| x.as_u64().unwrap_or(0) as f64 / 1e9;
    outln!(
        "{} + {}-layer drafter ({} limits, budget {:.1} GB):",
        v["target"].as_str().unwrap_or(""),
        v["drafter_layers"],
        v["limits"].as_str().unwrap_or(""),
        gb(&v["memory_budget"])
    )?;
    for p in v["plans"].as_array().into_iter().flatten() {
        if p["fits"] == true {
            let state = match gb(&p["recurrent_state"]) {
                0.0 => String::new(),
                x => format!(" (of which linear-attention state {x:.2} GB)"),
            };
            outln!(
                "  context {}: weights {:.2} GB (drafter {:.2}), KV {:.2} GB{state}, activations {:.3} GB, total {:.2} GB",
                p["context"], gb(&p["weights"]), gb(&p["drafter_weights"]), gb(&p["kv_cache"]),
                gb(&p["activations"]), gb(&p["total"])
            )?;
        } else {
            outln!(
                "  context {}: does not fit: {}",
                p["context"],
                p["error"].as_str().unwrap_or("")
            )?;
        }
    }
    Ok(())
}
