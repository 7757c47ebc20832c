#![no_main]
dflash_fuzz_coverage::target!("drafter", "config.json");
