//! The general-chat pools of the `general` mix: explanations of everyday, science and
//! history topics, role-play requests, templated reasoning puzzles, and rewriting /
//! extraction requests over the standard library's docstrings. Every list here is
//! written for this file; none is taken from an evaluation set.

use super::{Prompt, Rng, NAMES};

const CONCEPTS: &[&str] = &[
    "photosynthesis",
    "inflation",
    "the water cycle",
    "black holes",
    "supply and demand",
    "plate tectonics",
    "vaccines",
    "compound interest",
    "the printing press",
    "DNA",
    "electric circuits",
    "gravity",
    "the Roman Empire",
    "the Industrial Revolution",
    "climate change",
    "entropy",
    "the immune system",
    "volcanoes",
    "the stock market",
    "the human heart",
    "magnetism",
    "evolution by natural selection",
    "the Silk Road",
    "renewable energy",
    "the speed of light",
    "antibiotics",
    "the Cold War",
    "rainbows",
    "sound waves",
    "the Moon's phases",
    "taxes",
    "the scientific method",
    "bacteria",
    "the Renaissance",
    "earthquakes",
    "interest rates",
    "sleep",
    "the ozone layer",
    "nuclear fission",
    "the Great Wall of China",
    "memory in the brain",
    "tides",
    "democracy",
    "the carbon cycle",
    "the Internet",
    "ancient Egypt",
    "probability",
    "the periodic table",
    "glaciers",
    "the French Revolution",
    "opportunity cost",
    "batteries",
    "the seasons",
    "microplastics",
    "the Olympic Games",
    "public libraries",
    "coral reefs",
    "the metric system",
    "jazz music",
    "the theory of relativity",
];

const EXPLAIN: &[&str] = &[
    "Explain {} in simple terms.",
    "What are the most important things to know about {}?",
    "Explain {} to a ten-year-old.",
    "Write three quiz questions about {}, with their answers.",
    "What are common misconceptions about {}?",
    "Give a short history of how people came to understand {}.",
    "Why does {} matter in everyday life?",
    "Write a short lesson plan for teaching {}.",
];

const ROLES: &[&str] = &[
    "a ship's captain",
    "a medieval blacksmith",
    "a museum tour guide",
    "a detective",
    "a pastry chef",
    "an astronaut on the space station",
    "a personal trainer",
    "a librarian",
    "a travel agent",
    "a kindergarten teacher",
    "a park ranger",
    "a radio host",
    "a bicycle mechanic",
    "a beekeeper",
    "a lighthouse keeper",
    "a customer support agent",
    "a chess coach",
    "a street musician",
    "a wildlife photographer",
    "a city bus driver",
];

const ROLE_TASKS: &[&str] = &[
    "Introduce yourself to someone you have just met.",
    "Describe a typical day at your work.",
    "Give advice to someone who wants to do your job.",
    "What is the hardest part of your job, and how do you handle it?",
    "Tell a short story about something surprising that happened to you at work.",
    "Answer a customer who is unhappy and wants help.",
];

const REWRITES: &[&str] = &[
    "Summarize the following text in one sentence:\n\n{}",
    "Rewrite the following text in plain language for a non-programmer:\n\n{}",
    "List the key terms in the following text and explain each briefly:\n\n{}",
    "Rewrite the following text in a more formal tone:\n\n{}",
    "Turn the following description into three bullet points:\n\n{}",
];

/// Explanation requests: every concept in every form.
pub fn explanation_prompts() -> Vec<Prompt> {
    let mut out = Vec::new();
    for (fi, f) in EXPLAIN.iter().enumerate() {
        for (ci, c) in CONCEPTS.iter().enumerate() {
            out.push(Prompt {
                id: format!("explain:{fi}:{ci}"),
                source: "explanation",
                text: f.replace("{}", c),
            });
        }
    }
    out
}

/// Role-play requests: every role with every task.
pub fn roleplay_prompts() -> Vec<Prompt> {
    let mut out = Vec::new();
    for (ri, r) in ROLES.iter().enumerate() {
        for (ti, t) in ROLE_TASKS.iter().enumerate() {
            out.push(Prompt {
                id: format!("role:{ri}:{ti}"),
                source: "roleplay",
                text: format!("Pretend you are {r}. Stay in character. {t}"),
            });
        }
    }
    out
}

const DAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Templated reasoning puzzles (orderings, days of the week, sequences, rates), numbers
/// and names from a seeded generator.
pub fn reasoning_prompts(n: usize, seed: u64) -> Vec<Prompt> {
    let mut r = Rng(seed ^ 0x7EA5);
    (0..n)
        .map(|i| {
            let (x, y, z) = (r.pick(NAMES), r.pick(NAMES), r.pick(NAMES));
            let (a, b) = (2 + r.below(9), 3 + r.below(30));
            let text = match i % 6 {
                0 => format!("{x} is older than {y}, and {y} is older than {z}. Who is the youngest? Explain your reasoning."),
                1 => format!("Today is {}. What day of the week will it be in {b} days? Explain how you worked it out.", r.pick(DAYS)),
                2 => format!("What is the next number in the sequence {}, {}, {}, {}? Explain the pattern.", a, a * 2 + 1, a * 4 + 3, a * 8 + 7),
                3 => format!("A train travels {} kilometres in {a} hours. At the same speed, how far does it travel in {} hours? Think step by step.", a * b, a + 2),
                4 => format!("If all {it} in a box are either red or blue, and there are {b} {it} with {a} more red than blue, how many are red?", it = r.pick(super::ITEMS)),
                _ => format!("{x} says: \"{y} always tells the truth.\" {y} says: \"{x} sometimes lies.\" Can both statements be true? Explain."),
            };
            Prompt { id: format!("reason:{seed}:{i}"), source: "reasoning", text }
        })
        .collect()
}

/// Rewriting and extraction requests over paragraphs of at least 80 characters (runs
/// of spaces collapsed).
pub fn rewrite_prompts(paragraphs: &[(String, String)]) -> Vec<Prompt> {
    paragraphs
        .iter()
        .map(|(key, p)| (key, p.split_whitespace().collect::<Vec<_>>().join(" ")))
        .filter(|(_, p)| p.len() >= 80)
        .enumerate()
        .map(|(i, (key, p))| Prompt {
            id: format!("rewrite:{key}"),
            source: "rewrite",
            text: REWRITES[i % REWRITES.len()].replace("{}", &p),
        })
        .collect()
}
