#![no_main]
dflash_fuzz_coverage::target!("hf-folder", "config.json");
