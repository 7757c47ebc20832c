#![no_main]
dflash_fuzz_coverage::target!("chat-template", "template");
