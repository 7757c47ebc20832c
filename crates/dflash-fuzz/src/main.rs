//! dflash-fuzz: mutation fuzzing, on stable Rust, of every parser a user's file or
//! request reaches (GGUF header, in-memory and streaming GGUF loaders, Hugging Face
//! folders, drafter folders, the GGUF tokenizer, chat templates, the web request).
//!
//! Each target starts from seeds (the tests' synthetic models, the real files in the
//! model cache) and mutates them (bits, edge-value fields, ranges, dictionary words,
//! splices). There is no coverage instrumentation: an input joins the corpus when it
//! reaches an outcome (ok, or an error message with its numbers blanked) not seen
//! before. A panic, two loaders disagreeing, or one execution over `--slow` seconds is
//! a finding: the input is written to `--findings` and the run fails. A watchdog ends
//! the process (after writing the input) when one execution hangs.
//!
//!   cargo run --release -p dflash-fuzz -- [--target NAME]... [--seconds 10] [--seed 1]
//!
//! One JSON line per target (executions, corpus, outcomes, slowest execution,
//! findings); `DFLASH_FUZZ_KEYS=1` prints each new outcome to stderr.

use clap::Parser;
use dflash_fuzz::mutate::{mutate, Rng};
use dflash_fuzz::{targets, Input, Part};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Mutation fuzzing of dflash-web's parsers")]
struct Args {
    /// Targets to run (default: all): gguf-header, gguf-load, hf-folder, drafter,
    /// tokenizer, chat-template, request.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Seconds per target.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// One execution taking longer than this is a finding.
    #[arg(long, default_value_t = 5.0)]
    slow: f64,
    /// Where findings are written.
    #[arg(long, default_value = "target/fuzz-findings")]
    findings: PathBuf,
    /// Reproducing a crash that ends the process (an allocation failure aborts before
    /// anything can be saved): print the execution count every 10000 executions, and
    /// write each input from execution N on to FINDINGS/TARGET/current/ before it runs.
    #[arg(long)]
    record_after: Option<u64>,
    /// Write each target's seeds under this folder (DIR/target/n/part) and exit: the
    /// starting points of scripts/hostile-battery.py.
    #[arg(long)]
    dump_seeds: Option<PathBuf>,
}

/// The execution under way, for the watchdog.
#[derive(Default)]
struct Running {
    target: String,
    parts: Vec<Part>,
    since: Option<Instant>,
}

type Current = Arc<Mutex<Running>>;

/// A target's run, printed as one JSON line.
struct Report {
    target: &'static str,
    seeds: usize,
    executions: u64,
    corpus: usize,
    outcomes: usize,
    slowest_s: f64,
    findings: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let names: Vec<String> = if args.targets.is_empty() {
        targets::NAMES.iter().map(|s| s.to_string()).collect()
    } else {
        args.targets.clone()
    };
    if let Some(dir) = &args.dump_seeds {
        for name in &names {
            let t = targets::target(name).expect("a known target");
            for (n, seed) in t.seeds.iter().enumerate() {
                write_parts(&dir.join(name).join(n.to_string()), &seed.parts);
            }
        }
        return;
    }
    // Panics are caught and reported as findings; the default hook would print each.
    std::panic::set_hook(Box::new(|_| {}));
    let current = Current::default();
    watchdog(current.clone(), args.findings.clone());
    let mut failed = false;
    for name in &names {
        let Some(t) = targets::target(name) else {
            eprintln!(
                "unknown target {name}; targets: {}",
                targets::NAMES.join(", ")
            );
            std::process::exit(2);
        };
        let r = fuzz(&t, &args, &current);
        failed |= !r.findings.is_empty();
        println!(
            "{}",
            serde_json::json!({
                "target": r.target, "seconds": args.seconds, "seeds": r.seeds,
                "executions": r.executions, "corpus": r.corpus, "outcomes": r.outcomes,
                "slowest_s": r.slowest_s, "findings": r.findings,
            })
        );
    }
    if failed {
        eprintln!("findings written to {}", args.findings.display());
        std::process::exit(1);
    }
}

fn fuzz(t: &targets::Target, args: &Args, current: &Mutex<Running>) -> Report {
    // Each target its own stream (FNV-1a of its name mixed into the seed).
    let name_hash = t.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = Rng::new(args.seed ^ name_hash);
    let mut corpus: Vec<Input> = Vec::new();
    let mut seen = HashSet::new();
    let mut report = Report {
        target: t.name,
        seeds: t.seeds.len(),
        executions: 0,
        corpus: 0,
        outcomes: 0,
        slowest_s: 0.0,
        findings: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let mut queue = t.seeds.clone().into_iter();
    while Instant::now() < deadline && report.findings.len() < 5 {
        // The seeds first, then mutations of the corpus (or of the seeds if none joined).
        let input = queue.next().unwrap_or_else(|| {
            let pool = if corpus.is_empty() { &t.seeds } else { &corpus };
            let mut i = pool[rng.below(pool.len())].clone();
            mutate(&mut rng, &mut i, pool, t.dictionary);
            i
        });
        if let Some(n) = args.record_after {
            if report.executions.is_multiple_of(10_000) {
                eprintln!("{}: {} executions", t.name, report.executions);
            }
            if report.executions >= n {
                let _ = std::fs::remove_dir_all(args.findings.join(t.name).join("current"));
                write_parts(&args.findings.join(t.name).join("current"), &input.parts);
            }
        }
        *current.lock().unwrap() = Running {
            target: t.name.to_string(),
            parts: input.parts.clone(),
            since: Some(Instant::now()),
        };
        let t0 = Instant::now();
        let verdict = catch_unwind(AssertUnwindSafe(|| (t.run)(&input)));
        let took = t0.elapsed().as_secs_f64();
        current.lock().unwrap().since = None;
        report.executions += 1;
        report.slowest_s = report.slowest_s.max(took);
        let (finding, key) = match verdict {
            Err(panic) => (Some(format!("panic: {}", panic_message(&*panic))), None),
            Ok(v) if v.finding.is_some() => (v.finding, None),
            Ok(_) if took > args.slow => (Some(format!("one execution took {took:.1} s")), None),
            Ok(v) => (None, Some(v.key)),
        };
        if let Some(f) = finding {
            let path = save(&args.findings, t.name, &input.parts);
            report.findings.push(format!("{f} ({})", path.display()));
        } else if key.is_some_and(|k| {
            if std::env::var_os("DFLASH_FUZZ_KEYS").is_some() && !seen.contains(&k) {
                eprintln!("{k}");
            }
            seen.insert(k)
        }) {
            corpus.push(input);
        }
    }
    report.corpus = corpus.len();
    report.outcomes = seen.len();
    report
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".into())
}

/// Writes an input's parts under `dir/target/<hash>/` (a folder, as the loaders read).
fn save(dir: &Path, target: &str, parts: &[Part]) -> PathBuf {
    let hash = parts
        .iter()
        .flat_map(|p| p.bytes.iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    let d = dir.join(target).join(format!("{hash:016x}"));
    write_parts(&d, parts);
    d
}

fn write_parts(dir: &Path, parts: &[Part]) {
    let _ = std::fs::create_dir_all(dir);
    for p in parts {
        let _ = std::fs::write(dir.join(&p.name), &p.bytes);
    }
}

/// Ends the process when one execution runs past a minute: a hang is a finding too.
fn watchdog(current: Current, dir: PathBuf) {
    const HANG: Duration = Duration::from_secs(60);
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let c = current.lock().unwrap();
        if c.since.is_some_and(|t| t.elapsed() > HANG) {
            let path = save(&dir, &c.target, &c.parts);
            eprintln!(
                "{}: one execution hangs (over {HANG:?}): {}",
                c.target,
                path.display()
            );
            std::process::exit(1);
        }
    });
}
