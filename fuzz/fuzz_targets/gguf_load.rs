#![no_main]
dflash_fuzz_coverage::target!("gguf-load", "model.gguf");
