//! Training prompts from material a fresh machine has or can fetch from the package
//! registries: Python's own standard library (function signatures and docstrings turned
//! into coding requests, module questions) and templated arithmetic word problems and
//! writing requests. No evaluation set (HumanEval, MT-Bench, benchmark prompts) is read.

use std::path::{Path, PathBuf};

mod general;

#[derive(Debug, Clone)]
pub struct Prompt {
    /// Stable id: source and index, so a resumed run skips what is done.
    pub id: String,
    pub source: &'static str,
    pub text: String,
}

pub use dflash_core::rng::Rng;

fn py_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !matches!(
                name,
                "test" | "tests" | "idle_test" | "site-packages" | "dist-packages" | "__pycache__"
            ) && !name.starts_with('.')
            {
                py_files(&p, out);
            }
        } else if name.ends_with(".py") {
            out.push(p);
        }
    }
}

/// A function with its signature and docstring, cut from a Python source file.
#[derive(Debug, Clone)]
pub struct PyFunction {
    pub name: String,
    pub signature: String,
    pub doc: String,
}

/// Top-level and method definitions with a docstring of 1..=12 lines.
pub fn functions_in(src: &str) -> Vec<PyFunction> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let t = l.trim_start();
        let indent = l.len() - t.len();
        if !(t.starts_with("def ") && indent <= 4) {
            i += 1;
            continue;
        }
        let name: String = t[4..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature may span lines; it ends at a line ending with ':'.
        let mut sig = vec![t.to_string()];
        let mut j = i;
        while !lines[j].trim_end().ends_with(':') && j + 1 < lines.len() && j < i + 6 {
            j += 1;
            sig.push(lines[j].trim().to_string());
        }
        let body = lines.get(j + 1).map(|s| s.trim()).unwrap_or("");
        let quote = if body.starts_with("\"\"\"") {
            "\"\"\""
        } else if body.starts_with("'''") {
            "'''"
        } else {
            ""
        };
        i = j + 1;
        if quote.is_empty() || name.starts_with('_') || name.is_empty() {
            continue;
        }
        let mut doc = vec![body[3..].to_string()];
        let mut k = j + 1;
        let mut closed = body.len() >= 6 && body[3..].contains(quote);
        while !closed && k + 1 < lines.len() && k < j + 14 {
            k += 1;
            let d = lines[k].trim();
            closed = d.contains(quote);
            doc.push(d.to_string());
        }
        if !closed || doc.len() > 12 {
            continue;
        }
        let doc = doc.join("\n").replace(quote, "").trim().to_string();
        let sig = sig
            .join(" ")
            .replace("self, ", "")
            .replace("(self)", "()")
            .replace("def ", "");
        if doc.len() < 30
            || doc.len() > 700
            || sig.len() > 160
            || doc.contains(">>>") && doc.len() > 500
        {
            continue;
        }
        out.push(PyFunction {
            name,
            signature: sig.trim_end_matches(':').to_string(),
            doc,
        });
        i = k + 1;
    }
    out
}

fn indent_doc(doc: &str) -> String {
    doc.lines()
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                format!("    {l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the standard library gives: coding requests from its docstrings, module
/// questions, and each docstring's first paragraph (keyed by module.function).
pub struct StdlibPools {
    pub code: Vec<Prompt>,
    pub modules: Vec<Prompt>,
    pub paragraphs: Vec<(String, String)>,
}

/// Coding requests from the standard library's docstrings, and module questions.
pub fn stdlib_prompts(stdlib: &Path) -> StdlibPools {
    let mut files = Vec::new();
    py_files(stdlib, &mut files);
    let mut code = Vec::new();
    let mut modules = Vec::new();
    let mut paragraphs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for f in &files {
        let rel = f
            .strip_prefix(stdlib)
            .unwrap_or(f)
            .to_string_lossy()
            .replace('/', ".")
            .trim_end_matches(".py")
            .replace(".__init__", "");
        if !rel.split('.').any(|p| p.starts_with('_')) && seen.insert(rel.clone()) {
            modules.push(rel.clone());
        }
        let Ok(src) = std::fs::read_to_string(f) else {
            continue;
        };
        for (n, func) in functions_in(&src).into_iter().enumerate() {
            let key = format!("{rel}.{}", func.name);
            if !seen.insert(key.clone()) {
                continue;
            }
            let first_para = func
                .doc
                .split("\n\n")
                .next()
                .unwrap_or("")
                .replace('\n', " ");
            paragraphs.push((key.clone(), first_para.clone()));
            let stub = format!(
                "def {}:\n    \"\"\"{}\n    \"\"\"\n",
                func.signature,
                indent_doc(&func.doc).trim_start()
            );
            let text = match (code.len() + n) % 4 {
                0 | 1 => format!("Complete the following Python function:\n```python\n{stub}```"),
                2 => format!("Write a Python function `{}` that does the following: {first_para}", func.signature),
                _ => format!("Implement this function in Python and explain briefly how it works:\n```python\n{stub}```"),
            };
            code.push(Prompt {
                id: format!("py:{key}"),
                source: "stdlib-code",
                text,
            });
        }
    }
    let forms = [
        "What is the Python `{}` module used for? Give a short example.",
        "Show how to use the `{}` module in Python with a small example program.",
        "Explain the purpose of Python's `{}` module to a beginner.",
    ];
    let questions = modules
        .iter()
        .enumerate()
        .map(|(i, m)| Prompt {
            id: format!("mod:{m}:{}", i % 3),
            source: "stdlib-module",
            text: forms[i % 3].replace("{}", m),
        })
        .collect();
    StdlibPools {
        code,
        modules: questions,
        paragraphs,
    }
}

const NAMES: &[&str] = &[
    "Ava", "Ben", "Chloe", "Daniel", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kemi",
    "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq",
];
const ITEMS: &[&str] = &[
    "apples", "marbles", "books", "stickers", "pencils", "cookies", "coins", "stamps", "shells",
    "cards",
];
const TOPICS: &[&str] = &[
    "the ocean",
    "a rainy afternoon",
    "learning to code",
    "a mountain village",
    "friendship",
    "the night sky",
    "autumn leaves",
    "a busy train station",
    "an old library",
    "a robot that learns to paint",
    "the first day of school",
    "a lighthouse keeper",
    "coffee",
    "the importance of sleep",
    "recycling",
    "a city park",
    "time management",
    "a lost umbrella",
    "bees",
    "winter mornings",
];
const FORMS: &[&str] = &[
    "Write a short poem about {}.",
    "Write a short story about {}.",
    "Write a friendly email to a colleague about {}.",
    "Give five practical tips about {}.",
    "Write a one-paragraph summary about {}.",
    "Describe {} in three sentences.",
];

/// Templated arithmetic word problems (numbers drawn from a seeded generator).
pub fn arithmetic_prompts(n: usize, seed: u64) -> Vec<Prompt> {
    let mut r = Rng(seed);
    (0..n)
        .map(|i| {
            let (a, b, c) = (2 + r.below(60), 1 + r.below(40), 1 + r.below(20));
            let (x, y) = (r.pick(NAMES), r.pick(NAMES));
            let it = r.pick(ITEMS);
            let text = match i % 5 {
                0 => format!("{x} has {a} {it}. {x} buys {b} more and then gives {c} to {y}. How many {it} does {x} have now? Explain step by step."),
                1 => format!("A box holds {b} {it}. {x} fills {c} boxes and has {a} {it} left over. How many {it} did {x} start with?"),
                2 => format!("{x} reads {b} pages a day. How many days does it take to read a book of {} pages? Show your work.", b * (a + 3)),
                3 => format!("{x} and {y} share {} {it} equally, then {x} finds {c} more. How many does {x} have?", 2 * a),
                _ => format!("What is {a} times {b} plus {c}? Explain the order of operations."),
            };
            Prompt { id: format!("math:{seed}:{i}"), source: "arithmetic", text }
        })
        .collect()
}

/// Templated writing requests.
pub fn writing_prompts() -> Vec<Prompt> {
    let mut out = Vec::new();
    for (fi, f) in FORMS.iter().enumerate() {
        for (ti, t) in TOPICS.iter().enumerate() {
            out.push(Prompt {
                id: format!("write:{fi}:{ti}"),
                source: "writing",
                text: f.replace("{}", t),
            });
        }
    }
    out
}

/// The prompt mixes of `dflash-train data --mix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mix {
    /// Per 10 prompts: 5 code, 2 module questions, 2 arithmetic, 1 writing (the mix of
    /// the committed SmolLM2 drafter's data).
    Code,
    /// Per 10: 2 code, 2 explanations, and one each of role-play, reasoning,
    /// rewriting, arithmetic, writing and module questions.
    General,
    /// Every prompt written by the target itself, sampled from its chat template's
    /// user turn as `data` runs (`self_prompts`): the widest mix, from no corpus.
    #[value(name = "self")]
    SelfWritten,
    /// Prompts the target writes after a system message about Python programming
    /// (`self_prompts::Topic::Code`): coding requests in its own words.
    #[value(name = "self-code")]
    SelfCode,
    /// Python functions the target begins itself after that message, each to complete
    /// (`self_prompts::Topic::Stub`): "Complete the following Python function" requests.
    #[value(name = "self-stub")]
    SelfStub,
    /// Chat requests the target writes itself after a system message naming one kind
    /// of request in turn (`self_prompts::Topic::Chat`: writing, role-play, reasoning,
    /// math, extraction, science, humanities).
    #[value(name = "self-chat")]
    SelfChat,
}

/// Every prompt, mixed deterministically: roughly half coding, the rest module
/// questions, arithmetic and writing (`Mix::Code`).
pub fn build(stdlib: Option<&Path>, seed: u64) -> Vec<Prompt> {
    build_mix(stdlib, seed, Mix::Code)
}

/// Every prompt of `mix`, each pool shuffled by `seed`, interleaved by the mix's
/// pattern; exhausted pools are skipped. None for the self-written mixes, whose
/// prompts the target writes (`self_prompts::distill_self_written`).
pub fn build_mix(stdlib: Option<&Path>, seed: u64, mix: Mix) -> Vec<Prompt> {
    let std = match stdlib {
        Some(d) => stdlib_prompts(d),
        None => StdlibPools {
            code: vec![],
            modules: vec![],
            paragraphs: vec![],
        },
    };
    let mut r = Rng(seed ^ 0x5EED);
    let mut pools = vec![
        std.code,
        std.modules,
        arithmetic_prompts(2000, seed),
        writing_prompts(),
    ];
    let pattern: &[usize] = match mix {
        Mix::Code => &[0, 2, 0, 1, 0, 3, 0, 2, 0, 1],
        Mix::General => {
            pools.push(general::explanation_prompts());
            pools.push(general::roleplay_prompts());
            pools.push(general::reasoning_prompts(2000, seed));
            pools.push(general::rewrite_prompts(&std.paragraphs));
            &[0, 4, 5, 6, 7, 0, 4, 2, 3, 1]
        }
        Mix::SelfWritten | Mix::SelfCode | Mix::SelfStub | Mix::SelfChat => return Vec::new(),
    };
    for p in pools.iter_mut() {
        r.shuffle(p);
    }
    interleave(pools, pattern)
}

fn interleave(pools: Vec<Vec<Prompt>>, pattern: &[usize]) -> Vec<Prompt> {
    let mut pools: Vec<_> = pools.into_iter().map(|p| p.into_iter()).collect();
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for &p in pattern {
            if let Some(x) = pools[p].next() {
                out.push(x);
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

/// The Python standard library directory of `python3` on this machine, if any.
pub fn find_stdlib() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    p.is_dir().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny standard library: three modules, five documented functions.
    fn fake_stdlib(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("dflash-fake-stdlib-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = |file: &str, body: &str| std::fs::write(d.join(file), body).unwrap();
        f("alpha.py", "def one(x):\n    \"\"\"Return x plus one, for any number that can be added to.\"\"\"\n    return x + 1\n\ndef two(a, b):\n    \"\"\"Join two strings with a space between them and return the joined text.\"\"\"\n    return a + ' ' + b\n");
        f("beta.py", "def three():\n    \"\"\"Three.\"\"\"\n    return 3\n\nclass K:\n    def four(self):\n        \"\"\"The number four, as an integer value that a caller can rely on.\"\"\"\n        return 4\n");
        f("gamma.py", "def five(s):\n    '''Upper-case s.\n\n    More words.\n    '''\n    return s.upper()\n");
        d
    }

    /// FNV-1a over every prompt's id and text.
    fn fnv(p: &[Prompt]) -> u64 {
        let mut h = 0xcbf29ce484222325u64;
        for b in p.iter().flat_map(|p| p.id.bytes().chain(p.text.bytes())) {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
        h
    }

    fn ids(p: &[Prompt], n: usize) -> Vec<&str> {
        p.iter().take(n).map(|p| p.id.as_str()).collect()
    }

    /// The code mix is the one the committed drafter's data was made with (so
    /// scripts/train-smollm2.sh still reproduces it): the same prompts in the same
    /// order as the mix gave them before the general mix was added (these ids, and
    /// the count and hash of every id and text).
    #[test]
    fn the_code_mix_is_unchanged() {
        let d = fake_stdlib("code");
        let all = build(Some(&d), 1);
        let golden = [
            "py:alpha.one",
            "math:1:259",
            "py:alpha.two",
            "mod:gamma:2",
            "py:beta.four",
            "write:4:9",
            "math:1:94",
            "mod:alpha:0",
            "math:1:1496",
            "mod:beta:1",
            "write:4:0",
            "math:1:1044",
            "math:1:835",
            "write:3:14",
            "math:1:316",
            "math:1:803",
            "write:0:19",
            "math:1:1010",
            "math:1:1823",
            "write:1:18",
            "math:1:528",
            "math:1:1565",
            "write:4:5",
            "math:1:139",
        ];
        assert_eq!(ids(&all, 24), golden);
        assert_eq!((all.len(), fnv(&all)), (2126, 0x2ed8c424a867313f));
    }

    /// The general mix draws from every pool in its pattern, and every id is distinct
    /// (a resumed `data` run skips prompts by id).
    #[test]
    fn the_general_mix_has_every_pool_and_distinct_ids() {
        let d = fake_stdlib("general");
        let long = "Split the text at every comma, strip the spaces around each piece and return the pieces that are not empty, in order.";
        std::fs::write(
            d.join("delta.py"),
            format!("def six(t):\n    \"\"\"{long}\"\"\"\n"),
        )
        .unwrap();
        let all = build_mix(Some(&d), 1, Mix::General);
        let first: Vec<&str> = all.iter().take(10).map(|p| p.source).collect();
        for source in [
            "stdlib-code",
            "explanation",
            "roleplay",
            "reasoning",
            "rewrite",
            "arithmetic",
            "writing",
            "stdlib-module",
        ] {
            assert!(first.contains(&source), "{source} missing from {first:?}");
        }
        let mut seen = std::collections::HashSet::new();
        assert!(
            all.iter().all(|p| seen.insert(p.id.clone())),
            "duplicate ids"
        );
        assert!(all
            .iter()
            .any(|p| p.source == "rewrite" && p.text.contains(long)));
        assert_eq!(fnv(&all), fnv(&build_mix(Some(&d), 1, Mix::General)));
    }
}
