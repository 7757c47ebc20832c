#![no_main]
dflash_fuzz_coverage::target!("tool-calls", "text");
