#![no_main]
dflash_fuzz_coverage::target!("request", "request.json");
