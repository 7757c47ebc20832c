//! The fuzzing targets (every parser a user's file or request reaches) and the stable
//! mutator, shared by `dflash-fuzz` (mutation fuzzing on stable Rust, `main.rs`) and the
//! coverage-guided targets of `fuzz/` (cargo-fuzz, libFuzzer, on nightly).

pub mod mutate;
pub mod targets;

/// One input: a file (or a request), or the files of a folder.
#[derive(Clone)]
pub struct Part {
    pub name: String,
    pub bytes: Vec<u8>,
}

#[derive(Clone)]
pub struct Input {
    pub parts: Vec<Part>,
}

impl Input {
    /// This input with the part named `name` (a file of a folder) replaced by `bytes`;
    /// the whole input where it has a single part.
    pub fn with_part(&self, name: &str, bytes: &[u8]) -> Input {
        let mut i = self.clone();
        let single = i.parts.len() == 1;
        for p in &mut i.parts {
            if single || p.name == name {
                p.bytes = bytes.to_vec();
            }
        }
        i
    }
}

/// One coverage-guided execution (a libFuzzer target of `fuzz/`): `bytes` in place of
/// part `part` of the target's first seed, run as `dflash-fuzz` runs it. A panic
/// propagates (libFuzzer's finding); a defect other than a panic panics.
pub fn run_part(target: &targets::Target, part: &str, bytes: &[u8]) {
    let input = target.seeds[0].with_part(part, bytes);
    if let Some(f) = (target.run)(&input).finding {
        panic!("{}: {f}", target.name);
    }
}
