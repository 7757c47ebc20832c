//! One libFuzzer target per parser: `target!("dflash-fuzz target", "file of its seed")`.

pub use dflash_fuzz;
pub use libfuzzer_sys;

/// A libFuzzer target: the bytes in place of `$part` of `$target`'s first seed, run as
/// dflash-fuzz runs them (a panic is the finding).
#[macro_export]
macro_rules! target {
    ($target:literal, $part:literal) => {
        thread_local! {
            static TARGET: $crate::dflash_fuzz::targets::Target =
                $crate::dflash_fuzz::targets::target($target).expect("a dflash-fuzz target");
        }
        $crate::libfuzzer_sys::fuzz_target!(|data: &[u8]| {
            TARGET.with(|t| $crate::dflash_fuzz::run_part(t, $part, data));
        });
    };
}
