#![no_main]
dflash_fuzz_coverage::target!("gguf-header", "header");
