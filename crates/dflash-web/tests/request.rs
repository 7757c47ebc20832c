//! The JS API's chat request as the engine sees it: OpenAI defaults, the model's own
//! chat template, stop strings in both forms, and a typed error for each bad request.

use dflash_core::config::Arch;
use dflash_core::formats::ggml::GgmlType;
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{random_weights, tiny_config, write_gguf};
use dflash_core::Error;
use dflash_web::errors::error_code;
use dflash_web::request::{ChatRequest, DEFAULT_MAX_TOKENS};
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
        json!({"messages": [{"role": "tool", "content": "x"}]}),
        json!({"messages": ok, "temprature": 0.5}),
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

/// NaN and Infinity: JSON has neither, and serde_wasm_bindgen turns a non-finite JS
/// number into null, so `temperature: NaN` arrived as null and silently became the
/// default. Null in a numeric field is now a typed error; a non-finite value that does
/// reach the sampler (from Rust) is refused by its check.
#[test]
fn nan_and_infinity_are_typed_errors_not_defaults() {
    let ok = json!([{"role": "user", "content": "hi"}]);
    for field in [
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "max_tokens",
        "max_completion_tokens",
        "seed",
    ] {
        // What `JSON.stringify({temperature: NaN})` and serde_wasm_bindgen both give.
        let mut v = json!({"messages": ok});
        v[field] = serde_json::Value::Null;
        let e = ChatRequest::from_json(v).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(code(e), "BadRequest", "{field}");
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
