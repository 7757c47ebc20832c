#![no_main]
dflash_fuzz_coverage::target!("grammar", "grammar");
