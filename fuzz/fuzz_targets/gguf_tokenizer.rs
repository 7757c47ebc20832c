#![no_main]
dflash_fuzz_coverage::target!("tokenizer", "header");
