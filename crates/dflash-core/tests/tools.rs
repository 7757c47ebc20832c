//! Tool calls (`dflash_core::tools`): the grammars of each format and `tool_choice`
//! accept the calls they should and refuse the rest, constrained generation with a
//! random model writes calls of the offered tools whose arguments keep to the tools'
//! schemas, and DFlash under a tool grammar gives plain decoding's tokens.

use dflash_core::cpu::CpuModel;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::{generate_cpu, FinishReason, GenerateRequest};
use dflash_core::grammar::{GrammarSpec, Grammars};
use dflash_core::model_files::{load_gguf, LoadedModel};
use dflash_core::sampling::SamplingParams;
use dflash_core::testutil::{random_weights, tiny_drafter_target, write_gguf};
use dflash_core::tools::{tool_grammar, ToolChoice, ToolFormat, ToolSpec, ToolStream};
use serde_json::{json, Value};

fn tiny() -> LoadedModel {
    let c = tiny_drafter_target();
    load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap()
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "now".into(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
    ]
}

/// Whether `spec` accepts `text` whole (fed token by token under the masks).
fn accepts(m: &LoadedModel, g: &Grammars, spec: &GrammarSpec, text: &str) -> bool {
    let mut c = g.compile(spec).unwrap();
    for t in m.tokenizer.encode(text, false).unwrap() {
        if !c.mask().unwrap().allows(t) {
            return false;
        }
        c.commit(t).unwrap();
    }
    c.is_accepting()
}

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>";
const CALL2: &str = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";

#[test]
fn hermes_grammars_take_the_calls_tool_choice_allows() {
    let m = tiny();
    let g = Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap();
    let grammar = |choice: ToolChoice, parallel: bool| {
        tool_grammar(ToolFormat::Hermes, &tools(), &choice, parallel)
            .unwrap()
            .unwrap()
    };
    let two = format!("{CALL}\n{CALL2}");
    let after_text = format!("Let me check.\n{CALL}");
    let bad_args = CALL.replace("3}", "9}");
    let unknown = CALL.replace("get_weather", "get_time");
    let auto = grammar(ToolChoice::Auto, true);
    for (text, want) in [
        ("Hello there.", true),
        (CALL, true),
        (two.as_str(), true),
        (after_text.as_str(), true),
        (bad_args.as_str(), false),
        (unknown.as_str(), false),
        ("<tool_call>\nnot json\n</tool_call>", false),
    ] {
        assert_eq!(accepts(&m, &g, &auto, text), want, "auto: {text:?}");
    }
    let required = grammar(ToolChoice::Required, true);
    assert!(accepts(&m, &g, &required, CALL));
    assert!(accepts(&m, &g, &required, &two));
    assert!(!accepts(&m, &g, &required, "Hello"));
    assert!(!accepts(&m, &g, &required, &after_text));
    let single = grammar(ToolChoice::Required, false);
    assert!(accepts(&m, &g, &single, CALL));
    assert!(
        !accepts(&m, &g, &single, &two),
        "parallel_tool_calls: false"
    );
    let named = grammar(ToolChoice::Named("now".into()), true);
    assert!(accepts(&m, &g, &named, CALL2));
    assert!(!accepts(&m, &g, &named, CALL));
    assert!(
        tool_grammar(ToolFormat::Hermes, &tools(), &ToolChoice::None, true)
            .unwrap()
            .is_none()
    );
}

#[test]
fn llama_json_grammars_take_a_call_or_text_not_starting_with_a_brace() {
    let m = tiny();
    let g = Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap();
    let auto = tool_grammar(ToolFormat::Llama3Json, &tools(), &ToolChoice::Auto, true)
        .unwrap()
        .unwrap();
    let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}";
    assert!(accepts(&m, &g, &auto, call));
    assert!(accepts(&m, &g, &auto, "It is sunny."));
    assert!(!accepts(&m, &g, &auto, "{\"x\": 1}"));
    assert!(!accepts(
        &m,
        &g,
        &auto,
        &call.replace("parameters", "arguments")
    ));
}

/// Constrained generation with the tiny random model: `required` always ends in calls
/// of the offered tools with arguments their schemas accept, parsed by `ToolStream`.
#[test]
fn required_calls_from_a_random_model_parse_and_keep_to_their_schemas() {
    let m = tiny();
    let g = Grammars::new(&m.tokenizer, m.config().vocab_size).unwrap();
    let cpu = CpuModel::new(&m.weights);
    let mut checked = 0;
    for (format, seed) in [
        (ToolFormat::Hermes, 1),
        (ToolFormat::Hermes, 2),
        (ToolFormat::Llama3Json, 3),
    ] {
        let spec = tool_grammar(format, &tools(), &ToolChoice::Required, true)
            .unwrap()
            .unwrap();
        let req = GenerateRequest {
            prompt_ids: m.tokenizer.encode("call", false).unwrap(),
            max_new_tokens: 120,
            sampling: SamplingParams {
                temperature: 1.0,
                seed,
                ..Default::default()
            },
            stop_strings: vec![],
            context: 256,
            interrupt: Default::default(),
            grammar: Some(g.compile(&spec).unwrap()),
        };
        let r = generate_cpu(&cpu, &m.tokenizer, &req, &|| 0.0, &mut |_| {}).unwrap();
        if r.finish_reason == FinishReason::Length {
            continue;
        }
        let mut s = ToolStream::new(format, "call_");
        let (_, mut calls) = s.push(&r.text);
        calls.extend(s.finish().1);
        assert!(!calls.is_empty(), "{format:?}: {:?}", r.text);
        checked += 1;
        for c in calls {
            let args: Value = serde_json::from_str(&c.arguments).unwrap();
            match c.name.as_str() {
                "get_weather" => {
                    assert!(args["city"].as_str().unwrap().chars().count() <= 8);
                    assert!((1..=7).contains(&args["days"].as_u64().unwrap()));
                }
                "now" => assert_eq!(args, json!({})),
                other => panic!("{other}"),
            }
        }
    }
    assert!(checked >= 2, "most runs end their calls within the budget");
}
