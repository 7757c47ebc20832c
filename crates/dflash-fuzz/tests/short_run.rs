//! A short run of the fuzzer over every target (a few seconds each, the CI run; the long
//! one is `cargo run --release -p dflash-fuzz -- --seconds 600`): it finds nothing, and
//! every target (each of `targets::NAMES`, once) reports executions and outcomes. Built
//! by the workspace's own test build, so CI compiles nothing for it. DFLASH_FUZZ_SECONDS sets the seconds per target (6).

use std::process::Command;

#[test]
fn every_parser_survives_a_short_fuzzing_run() {
    let seconds = std::env::var("DFLASH_FUZZ_SECONDS").unwrap_or_else(|_| "6".into());
    let findings = std::env::temp_dir().join(format!("dflash-fuzz-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_dflash-fuzz"))
        .args(["--seconds", &seconds, "--findings"])
        .arg(&findings)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "the fuzzer failed ({}): {}\n{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Every default target (targets::NAMES), each once.
    let names: std::collections::BTreeSet<&str> = reports
        .iter()
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), reports.len(), "{stdout}");
    assert!(reports.len() >= 7, "{stdout}");
    for r in &reports {
        assert_eq!(r["findings"], serde_json::json!([]), "{r}");
        assert!(r["executions"].as_u64().unwrap() > 0, "{r}");
        assert!(r["outcomes"].as_u64().unwrap() > 0, "{r}");
    }
    let _ = std::fs::remove_dir_all(&findings);
}
