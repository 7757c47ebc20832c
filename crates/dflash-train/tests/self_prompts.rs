//! `data --mix self`: the target writes its own prompts from its chat template's user
//! turn; the samples resume, and a resumed run draws the same queries.

use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::{load_gguf, load_path};
use dflash_core::testutil::{cached_model, random_weights, tiny_drafter_target, write_gguf};
use dflash_train::data::{read_samples, DataOptions};
use dflash_train::self_prompts::{
    distill_self_written, prompt_id, query_prefix, write_query, written_queries, QueryOptions,
    Topic,
};
use dflash_train::TrainError;
use std::collections::HashSet;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dflash-self-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The prefix is the chat template's text before the user's message: a chat with any
/// message starts with it and continues with the message; a model without a template
/// gets a typed error.
#[test]
fn the_query_prefix_is_the_chat_up_to_the_users_message() {
    let c = tiny_drafter_target();
    let mut m = load_gguf(&write_gguf(&c, &random_weights(&c, 5), GgmlType::Q8_0)).unwrap();
    let prefix = query_prefix(&m, Topic::Any, 0).unwrap();
    assert!(!prefix.is_empty());
    let ids = m.chat_ids(None, "hello there").unwrap();
    assert!(
        ids.starts_with(&prefix),
        "{prefix:?} is not a prefix of {ids:?}"
    );
    let rest = m.tokenizer.decode(&ids[prefix.len()..], false).unwrap();
    assert!(rest.starts_with("hello there"), "{rest:?}");
    let code = query_prefix(&m, Topic::Code, 0).unwrap();
    let code_text = m.tokenizer.decode(&code, false).unwrap();
    assert!(code_text.contains("Python programmers"), "{code_text:?}");
    assert_ne!(code, prefix);
    let stub = query_prefix(&m, Topic::Stub, 0).unwrap();
    assert!(
        stub.starts_with(&code[..code.len() - 1]),
        "the stub prefix opens the user turn"
    );
    let stub_text = m.tokenizer.decode(&stub, false).unwrap();
    assert!(
        stub_text.starts_with(&code_text)
            && stub_text.ends_with("Complete the following Python function:\n```python\ndef"),
        "{stub_text:?}"
    );
    // Chat requests: index i after kind i % 7, each a prefix of its own.
    let kinds = Topic::Chat.systems().len() as u64;
    assert_eq!(kinds, 7);
    let chats: Vec<Vec<u32>> = (0..kinds)
        .map(|i| query_prefix(&m, Topic::Chat, i).unwrap())
        .collect();
    for (i, chat) in chats.iter().enumerate() {
        let text = m.tokenizer.decode(chat, false).unwrap();
        assert!(text.contains(Topic::Chat.systems()[i]), "{text:?}");
        assert!(chats[..i].iter().all(|other| other != chat), "kind {i}");
        let again = query_prefix(&m, Topic::Chat, i as u64 + kinds).unwrap();
        assert_eq!(&again, chat, "index {} takes kind {i}", i as u64 + kinds);
    }
    m.chat_template = None;
    for topic in [Topic::Any, Topic::Code, Topic::Stub, Topic::Chat] {
        assert!(matches!(
            query_prefix(&m, topic, 0),
            Err(TrainError::Data(_))
        ));
    }
}

/// On SmolLM2: every sample's prompt is the chat of a query the target wrote (plain
/// text, no chat markup, ended within the limit); the same index draws the same query
/// again; a cut last line is dropped and a larger run only adds the missing indices.
#[test]
fn self_written_prompts_are_the_targets_own_turns_and_resume() {
    let Some(path) = cached_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let m = load_path(&path).unwrap();
    let cpu = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    let dir = tmp("smollm2");
    let out = dir.join("data.jsonl");
    let opts = DataOptions {
        batch: 16,
        max_new_tokens: 6,
        max_prompt_tokens: 384,
    };
    let mut q = QueryOptions {
        prompts: 3,
        max_tokens: 64,
        ..QueryOptions::default()
    };
    let bar = indicatif::ProgressBar::hidden();
    let first = distill_self_written(&m, &cpu, &cpu, &out, &opts, &q, &bar).unwrap();
    assert!(first >= 2, "{first} of 3 queries kept");
    let text = std::fs::read_to_string(&out).unwrap();
    std::fs::write(&out, &text[..text.len() - 5]).unwrap();
    q.prompts = 4;
    let resumed = distill_self_written(&m, &cpu, &cpu, &out, &opts, &q, &bar).unwrap();
    let samples = read_samples(&out).unwrap();
    assert_eq!(
        samples.len(),
        first - 1 + resumed,
        "the cut line was dropped"
    );
    assert!((1..=2).contains(&resumed), "the cut sample and self:3 only");

    let prefix = query_prefix(&m, Topic::Any, 0).unwrap();
    let written = written_queries(&m, Topic::Any, &out).unwrap();
    assert_eq!(
        written.len(),
        samples.len(),
        "a resumed run knows every query"
    );
    assert!(written_queries(&m, Topic::Code, &out).unwrap().is_empty());
    let mut ids = HashSet::new();
    for s in &samples {
        assert!(ids.insert(s.id.clone()), "{} twice", s.id);
        assert_eq!(s.source, "self");
        assert!(s.prompt_ids.starts_with(&prefix));
        assert!(!s.response_ids.is_empty() && s.response_ids.len() <= 6);
        let index: u64 = s.id.strip_prefix("self:").unwrap().parse().unwrap();
        assert_eq!(s.id, prompt_id(Topic::Any, index));
        let again = write_query(&m, &cpu, &prefix, index, &q, &HashSet::new())
            .unwrap()
            .expect("the same draws keep the same query");
        assert_eq!(m.chat_ids(None, &again).unwrap(), s.prompt_ids);
        let plain = m
            .tokenizer
            .decode(&s.prompt_ids[prefix.len()..], true)
            .unwrap();
        assert!(plain.contains(again.as_str()), "{plain:?}");
        assert!(again.len() >= q.min_chars && again == again.trim());
        assert!(written.contains(&again), "{again:?} is not read back");
    }
}

/// `--mix self-code`, `self-stub` and `self-chat` on SmolLM2: the queries are drawn after
/// the topic's system message for their index and answered in a plain chat without it,
/// under ids and a source of their own; a self-stub query is a function the target
/// began at `def` itself, to complete, and a resumed run reads it back whole.
#[test]
fn self_code_prompts_are_drawn_after_the_coding_system_message() {
    let Some(path) = cached_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let m = load_path(&path).unwrap();
    let cpu = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    let opts = DataOptions {
        batch: 16,
        max_new_tokens: 4,
        max_prompt_tokens: 384,
    };
    let any_prefix = query_prefix(&m, Topic::Any, 0).unwrap();
    for topic in [Topic::Code, Topic::Stub, Topic::Chat] {
        let out = tmp(&format!("smollm2-{}", topic.name())).join("data.jsonl");
        let q = QueryOptions {
            topic,
            prompts: 2,
            max_tokens: topic.query_tokens(),
            ..QueryOptions::default()
        };
        let bar = indicatif::ProgressBar::hidden();
        let n = distill_self_written(&m, &cpu, &cpu, &out, &opts, &q, &bar).unwrap();
        assert!(n >= 1, "{n} of 2 {} queries kept", topic.name());
        let written = written_queries(&m, topic, &out).unwrap();
        let samples = read_samples(&out).unwrap();
        assert_eq!(
            written.len(),
            samples.len(),
            "a resumed run knows every query"
        );
        for s in samples {
            assert_eq!(s.source, topic.name());
            let own = format!("{}:", topic.name());
            let index: u64 = s.id.strip_prefix(own.as_str()).unwrap().parse().unwrap();
            assert_eq!(s.id, prompt_id(topic, index));
            let topic_prefix = query_prefix(&m, topic, index).unwrap();
            let query = write_query(&m, &cpu, &topic_prefix, index, &q, &HashSet::new())
                .unwrap()
                .expect("the same draws keep the same query");
            assert_eq!(m.chat_ids(None, &query).unwrap(), s.prompt_ids);
            assert!(written.contains(&query), "{query:?} is not read back");
            assert!(s.prompt_ids.starts_with(&any_prefix));
            assert!(!s.prompt_ids.starts_with(&topic_prefix));
            if topic == Topic::Stub {
                let lead = "Complete the following Python function:\n```python\ndef ";
                assert!(query.starts_with(lead), "{query:?}");
                assert!(query.len() > lead.len() + 2, "{query:?}");
            }
        }
    }
}
