//! The JS API's chat request as the engine sees it: OpenAI defaults, the model's own
//! chat template, stop strings in both forms, and a typed error for each bad request.

use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf};
use dflash_core::Error;
use dflash_engine::errors::error_code;
use dflash_engine::request::{ChatRequest, DEFAULT_MAX_TOKENS};
use serde_json::json;

fn code(e: Error) -> &'static str {
    error_code(&dflash_gpu::GpuError::Core(e))
}

#[test]
fn a_request_becomes_the_engines_request_through_the_chat_template() {
    let c = tiny_config(Arch::Qwen2);
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 1), GgmlType::Q8_0)).unwrap();
    let msgs =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]);
    let r = ChatRequest::from_json(json!({"messages": msgs, "stop": "\n\n", "seed": 5, "temperature": 0, "stream": true, "model": "x"})).unwrap();
    let g = r
        .to_generate(&m.tokenizer, m.chat_template.as_ref(), 64, 99)
        .unwrap();
    let want = m
        .tokenizer
        .encode(
            &m.chat_template
                .as_ref()
                .unwrap()
                .render(&r.messages, true)
                .unwrap(),
            true,
        )
        .unwrap();
    assert_eq!(g.prompt_ids, want);
    assert_eq!(g.stop_strings, vec!["\n\n".to_string()]);
    assert_eq!(
        (g.sampling.temperature, g.sampling.seed, g.max_new_tokens),
        (0.0, 5, DEFAULT_MAX_TOKENS)
    );
    // OpenAI's defaults: temperature 1; the host's seed when none is given.
    let r = ChatRequest::from_json(
        json!({"messages": msgs, "max_completion_tokens": 7, "stop": ["a", "b"]}),
    )
    .unwrap();
    let g = r
        .to_generate(&m.tokenizer, m.chat_template.as_ref(), 1024, 99)
        .unwrap();
    assert_eq!(
        (g.sampling.temperature, g.sampling.seed, g.max_new_tokens),
        (1.0, 99, 7)
    );
    assert_eq!(g.stop_strings.len(), 2);
    assert!(
        !g.sampling.speculative_rejection,
        "exact-match verification unless asked"
    );
    let r = ChatRequest::from_json(
        json!({"messages": msgs, "temperature": 0.7, "rejection_sampling": true}),
    )
    .unwrap();
    assert!(
        r.to_generate(&m.tokenizer, m.chat_template.as_ref(), 1024, 1)
            .unwrap()
            .sampling
            .speculative_rejection
    );
    // A prompt past the context: ContextOverflow (a long max_tokens is clipped to the context).
    let r = ChatRequest::from_json(json!({"messages": msgs, "max_tokens": 60})).unwrap();
    assert_eq!(
        code(
            r.to_generate(&m.tokenizer, m.chat_template.as_ref(), 30, 0)
                .unwrap_err()
        ),
        "ContextOverflow"
    );
    // No chat template in the model: a typed error, not a guess.
    assert_eq!(
        code(r.to_generate(&m.tokenizer, None, 4096, 0).unwrap_err()),
        "BadRequest"
    );
}

#[test]
fn bad_requests_are_typed_errors() {
    let ok = json!([{"role": "user", "content": "hi"}]);
    for bad in [
        json!({"messages": []}),
        json!({"messages": [{"role": "robot", "content": "x"}]}),
        json!({"messages": "hi"}),
        json!({"messages": ok, "max_tokens": -1}),
    ] {
        let e = ChatRequest::from_json(bad.clone()).unwrap_err();
        assert_eq!(code(e), "BadRequest", "{bad}");
    }
    for bad in [
        json!({"messages": ok, "temperature": -1}),
        json!({"messages": ok, "top_p": 0}),
    ] {
        let r = ChatRequest::from_json(bad).unwrap();
        assert_eq!(code(r.sampling(0).unwrap_err()), "BadRequest");
    }
}

/// An explicit null means the field's default, as OpenAI's clients send them (NaN and
/// Infinity, which serde_wasm_bindgen would turn into null, are refused by the wasm
/// surface before that: tests/e2e); a non-finite value that does reach the sampler (from
/// Rust) is refused by its check.
#[test]
fn explicit_nulls_are_defaults_and_non_finite_values_are_refused() {
    let c = tiny_config(Arch::Qwen2);
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 1), GgmlType::Q8_0)).unwrap();
    let tpl = m.chat_template.as_ref();
    let ok = json!([{"role": "user", "content": "hi", "name": null}]);
    let plain = ChatRequest::from_json(json!({"messages": ok})).unwrap();
    let want = plain.to_generate(&m.tokenizer, tpl, 256, 5).unwrap();
    for field in [
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "stop",
        "block",
        "stream_options",
        "response_format",
        "tools",
        "tool_choice",
        "logprobs",
        "top_logprobs",
        "n",
        "user",
    ] {
        let mut v = json!({"messages": ok});
        v[field] = serde_json::Value::Null;
        let r = ChatRequest::from_json(v).unwrap();
        assert!(r.ignored_fields.is_empty(), "{field}");
        let g = r.to_generate(&m.tokenizer, tpl, 256, 5).unwrap();
        assert_eq!(
            (g.sampling, g.max_new_tokens, g.stop_strings, g.prompt_ids),
            (
                want.sampling.clone(),
                want.max_new_tokens,
                want.stop_strings.clone(),
                want.prompt_ids.clone()
            ),
            "{field}"
        );
    }
    for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for field in ["temperature", "top_p", "min_p"] {
            let mut r = ChatRequest::from_json(json!({"messages": ok})).unwrap();
            match field {
                "temperature" => r.temperature = Some(x),
                "top_p" => r.top_p = Some(x),
                _ => r.min_p = Some(x),
            }
            assert_eq!(
                code(r.sampling(0).unwrap_err()),
                "BadRequest",
                "{field} = {x}"
            );
        }
    }
    // A JSON number too large for the field is refused by the parser too.
    let v: serde_json::Value = serde_json::from_str(
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e300}"#,
    )
    .unwrap();
    assert_eq!(code(ChatRequest::from_json(v).unwrap_err()), "BadRequest");
}

/// A field of the wrong type or sign is refused with a message that names it (serde's
/// own message would not), before the sampler's checks; `validate` adds the sampling
/// parameters and the block size, as `validateRequest` does in JS.
#[test]
fn wrong_types_and_values_name_their_field() {
    let ok = json!([{"role": "user", "content": "hi"}]);
    for (field, value) in [
        ("max_tokens", json!(-1)),
        ("max_tokens", json!(2.5)),
        ("max_completion_tokens", json!("8")),
        ("top_k", json!(-3)),
        ("seed", json!(-1)),
        ("temperature", json!("0.5")),
        ("top_p", json!(true)),
        ("min_p", json!([0.1])),
        ("dflash", json!("yes")),
        ("stream", json!(1)),
        ("rejection_sampling", json!(0)),
        ("block", json!(-2)),
        ("block", json!("big")),
    ] {
        let mut v = json!({"messages": ok});
        v[field] = value.clone();
        let e = ChatRequest::from_json(v).unwrap_err();
        assert!(e.to_string().contains(field), "{field} = {value}: {e}");
        assert_eq!(code(e), "BadRequest");
    }
    for (bad, field) in [
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "user", "content": 3}]}),
            "messages[0].content",
        ),
        (json!({}), "messages"),
        (json!([1]), "object"),
    ] {
        let e = ChatRequest::from_json(bad).unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    for (field, value) in [
        ("temperature", json!(-1)),
        ("top_p", json!(1.5)),
        ("block", json!(0)),
    ] {
        let mut v = json!({"messages": ok});
        v[field] = value;
        let r = ChatRequest::from_json(v).unwrap();
        let e = r.validate().unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(code(e), "BadRequest");
    }
    let r = ChatRequest::from_json(json!({"messages": ok, "block": "auto", "seed": 3})).unwrap();
    r.validate().unwrap();
}

/// What OpenAI's client and code written for WebLLM send by default.
fn webllm_style() -> serde_json::Value {
    json!({
        "model": "x", "n": 1, "frequency_penalty": 0, "presence_penalty": 0, "user": "u-1",
        "logprobs": false, "top_logprobs": null, "logit_bias": {}, "stream": true,
        "stream_options": {"include_usage": true}, "response_format": {"type": "text"},
        "tools": [], "tool_choice": "none", "parallel_tool_calls": true, "store": false,
        "metadata": {"k": "v"}, "seed": 1, "temperature": 0,
        "messages": [
            {"role": "developer", "content": "Be brief.", "name": "dev"},
            {"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}], "name": "ann"},
        ]
    })
}

#[test]
fn openai_default_fields_are_accepted_and_change_nothing() {
    let c = tiny_config(Arch::Qwen2);
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 1), GgmlType::Q8_0)).unwrap();
    let r = ChatRequest::from_json(webllm_style()).unwrap();
    assert!(r.stream_options.as_ref().unwrap().include_usage);
    // The same engine request as the plain form: developer is system, parts joined.
    let plain = ChatRequest::from_json(json!({"seed": 1, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]}))
    .unwrap();
    let tpl = m.chat_template.as_ref();
    let g = r.to_generate(&m.tokenizer, tpl, 256, 0).unwrap();
    let want = plain.to_generate(&m.tokenizer, tpl, 256, 0).unwrap();
    assert_eq!(g.prompt_ids, want.prompt_ids);
    assert_eq!(g.sampling, want.sampling);
}

#[test]
fn openai_fields_that_would_change_the_answer_are_refused_by_name() {
    for (field, value) in [
        ("n", json!(2)),
        ("logprobs", json!("yes")),
        ("top_logprobs", json!(3)),
        ("logit_bias", json!({"42": 5})),
        (
            "response_format",
            json!({"type": "grammar", "grammar": "root ::= x"}),
        ),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "not a name"}}]),
        ),
        ("tool_choice", json!("required")),
        ("stream_options", json!({"include_usage": true, "x": 1})),
    ] {
        let mut v = webllm_style();
        v[field] = value;
        let e = ChatRequest::from_json(v)
            .and_then(|r| r.validate())
            .unwrap_err();
        let msg = e.to_string();
        assert_eq!(code(e), "BadRequest");
        let named = if field == "stream_options" {
            "x"
        } else {
            field
        };
        assert!(msg.contains(named), "{field}: {msg}");
    }
    let mut v = webllm_style();
    v["messages"][1]["content"] = json!([{"type": "image_url", "image_url": {"url": "data:"}}]);
    let msg = ChatRequest::from_json(v).unwrap_err().to_string();
    assert!(
        msg.contains("messages[1].content[0]") && msg.contains("image_url"),
        "{msg}"
    );
}

#[test]
fn penalties_reach_the_sampler_and_are_checked() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let r = ChatRequest::from_json(json!({"messages": msgs, "frequency_penalty": 0.5, "presence_penalty": -0.25, "repetition_penalty": 1.1})).unwrap();
    let sp = r.sampling(0).unwrap();
    assert_eq!(
        (
            sp.frequency_penalty,
            sp.presence_penalty,
            sp.repetition_penalty
        ),
        (0.5, -0.25, 1.1)
    );
    // The GPU sampler's refusal has its own code.
    let refused = dflash_gpu::GpuError::Unsupported("penalties on the GPU sampler".into());
    assert_eq!(error_code(&refused), "Unsupported");
    for (k, bad) in [
        ("frequency_penalty", 2.5),
        ("presence_penalty", -3.0),
        ("repetition_penalty", 0.0),
    ] {
        let mut v = json!({"messages": msgs});
        v[k] = json!(bad);
        let e = ChatRequest::from_json(v).unwrap().validate().unwrap_err();
        assert!(e.to_string().contains(k), "{e}");
    }
}

#[test]
fn request_fields_lists_exactly_the_fields_the_parser_takes() {
    let fields: Vec<&str> = dflash_engine::request::request_fields().collect();
    let mut unique = fields.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), fields.len(), "a field listed twice");
    let msgs = json!([{"role": "user", "content": "hi"}]);
    // serde names the struct's own fields when it refuses an unknown one (the parser
    // drops unknown fields before serde sees them).
    let e = serde_json::from_value::<ChatRequest>(json!({"messages": msgs, "no_such_field": 1}))
        .unwrap_err();
    let msg = e.to_string();
    let listed = msg
        .split("expected one of")
        .nth(1)
        .expect("serde's field list");
    let own: Vec<&str> = listed.split('`').skip(1).step_by(2).collect();
    for f in &own {
        assert!(fields.contains(f), "{f} is missing from request_fields()");
    }
    // Every listed field is taken (at a neutral value) rather than refused as unknown.
    let neutral = |f: &str| match f {
        "messages" => msgs.clone(),
        "n" | "repetition_penalty" => json!(1),
        "stream"
        | "dflash"
        | "rejection_sampling"
        | "sampled_drafts"
        | "logprobs"
        | "store"
        | "parallel_tool_calls" => json!(false),
        "stream_options" | "logit_bias" | "metadata" => json!({}),
        "response_format" => json!({"type": "text"}),
        "grammar" => json!({"type": "regex", "pattern": "a"}),
        "tools" | "functions" | "modalities" => json!([]),
        "tool_choice" | "function_call" => json!("none"),
        "block" => json!("auto"),
        "model" | "user" | "service_tier" | "stop" => json!("x"),
        _ => json!(0),
    };
    for &f in &fields {
        let mut v = json!({"messages": msgs});
        v[f] = neutral(f);
        if let Err(e) = ChatRequest::from_json(v) {
            panic!("{f}: {e}");
        }
    }
}

/// Fields the API does not have (a typo, another server's extension) are ignored, not
/// refused, and listed in the answer's `ignored_fields`.
#[test]
fn unknown_fields_are_ignored_and_listed() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let r = ChatRequest::from_json(
        json!({"messages": msgs, "temprature": 0.5, "reasoning_effort": "high", "seed": 2}),
    )
    .unwrap();
    assert_eq!(
        r.ignored_fields,
        vec!["reasoning_effort", "temprature"],
        "sorted"
    );
    assert_eq!(r.sampling(0).unwrap().temperature, 1.0);
    assert_eq!(r.seed, Some(2));
}

/// `response_format` and the `grammar` extension become the engine's grammar; each
/// malformed one is a BadRequest naming its place.
#[test]
fn response_formats_and_grammars_become_grammar_specs() {
    use dflash_core::grammar::GrammarSpec;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let spec = |extra: serde_json::Value| {
        let mut v = json!({"messages": msgs});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        ChatRequest::from_json(v).and_then(|r| r.grammar_spec())
    };
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    for (extra, want) in [
        (json!({"response_format": {"type": "text"}}), None),
        (
            json!({"response_format": {"type": "json_object"}}),
            Some(GrammarSpec::JsonObject),
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": true}}}),
            Some(GrammarSpec::JsonSchema {
                schema: schema.clone(),
                strict: true,
            }),
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": null}}}),
            Some(GrammarSpec::JsonSchema {
                schema: schema.clone(),
                strict: false,
            }),
        ),
        (
            json!({"response_format": {"type": "json_object", "schema": schema.to_string()}}),
            Some(GrammarSpec::JsonSchema {
                schema: schema.clone(),
                strict: true,
            }),
        ),
        (
            json!({"grammar": {"type": "lark", "grammar": "start: \"a\""}}),
            Some(GrammarSpec::Lark("start: \"a\"".into())),
        ),
        (
            json!({"grammar": {"type": "regex", "pattern": "[0-9]+"}}),
            Some(GrammarSpec::Regex("[0-9]+".into())),
        ),
    ] {
        assert_eq!(spec(extra.clone()).unwrap(), want, "{extra}");
    }
    for (extra, place) in [
        (json!({"response_format": "json"}), "response_format"),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (json!({"response_format": {}}), "response_format.type"),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_object", "schema": "{not json"}}),
            "response_format.schema",
        ),
        (
            json!({"grammar": {"type": "ebnf", "grammar": "x"}}),
            "grammar",
        ),
        (
            json!({"grammar": {"type": "lark", "grammar": 3}}),
            "grammar.grammar",
        ),
        (json!({"grammar": {"type": "regex"}}), "grammar.pattern"),
        (
            json!({"grammar": {"type": "regex", "pattern": "a"}, "response_format": {"type": "json_object"}}),
            "not both",
        ),
    ] {
        let e = spec(extra.clone()).unwrap_err();
        assert!(e.to_string().contains(place), "{extra}: {e}");
        assert_eq!(code(e), "BadRequest");
    }
}

#[test]
fn logprobs_reach_the_sampler_and_are_checked() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let wanted = |extra: serde_json::Value| {
        let mut v = json!({"messages": msgs});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        ChatRequest::from_json(v).and_then(|r| {
            r.validate()?;
            r.sampling(0).map(|s| s.logprobs)
        })
    };
    assert_eq!(wanted(json!({})).unwrap(), None);
    assert_eq!(wanted(json!({"logprobs": false})).unwrap(), None);
    assert_eq!(wanted(json!({"logprobs": true})).unwrap(), Some(0));
    assert_eq!(
        wanted(json!({"logprobs": true, "top_logprobs": 20})).unwrap(),
        Some(20)
    );
    assert_eq!(
        wanted(json!({"logprobs": 3})).unwrap(),
        Some(3),
        "a completion's count"
    );
    for (bad, field) in [
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": "yes"}), "logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": -1}),
            "top_logprobs",
        ),
    ] {
        let e = wanted(bad.clone()).unwrap_err();
        assert!(e.to_string().contains(field), "{bad}: {e}");
        assert_eq!(code(e), "BadRequest");
    }
}
