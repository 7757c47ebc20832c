//! Training prompts from material a fresh machine has or can fetch from the package
//! registries: Python's own standard library (function signatures and docstrings turned
//! into coding requests, module questions) and templated arithmetic word problems and
//! writing requests. No evaluation set (HumanEval, MT-Bench, benchmark prompts) is read.

use std::path::{Path, PathBuf};

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

/// Coding requests from the standard library's docstrings, and module questions.
pub fn stdlib_prompts(stdlib: &Path) -> (Vec<Prompt>, Vec<Prompt>) {
    let mut files = Vec::new();
    py_files(stdlib, &mut files);
    let mut code = Vec::new();
    let mut modules = Vec::new();
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
    (code, questions)
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

/// Every prompt, mixed deterministically: roughly half coding, the rest module
/// questions, arithmetic and writing.
pub fn build(stdlib: Option<&Path>, seed: u64) -> Vec<Prompt> {
    let (mut code, mut modules) = match stdlib {
        Some(d) => stdlib_prompts(d),
        None => (vec![], vec![]),
    };
    let mut math = arithmetic_prompts(2000, seed);
    let mut writing = writing_prompts();
    let mut r = Rng(seed ^ 0x5EED);
    r.shuffle(&mut code);
    r.shuffle(&mut modules);
    r.shuffle(&mut math);
    r.shuffle(&mut writing);
    let mut pools = [
        code.into_iter(),
        modules.into_iter(),
        math.into_iter(),
        writing.into_iter(),
    ];
    // Per 10 prompts: 5 code, 2 module, 2 math, 1 writing; exhausted pools are skipped.
    let pattern = [0, 2, 0, 1, 0, 3, 0, 2, 0, 1];
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for &p in &pattern {
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
