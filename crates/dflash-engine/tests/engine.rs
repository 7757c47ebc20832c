//! The engine every host calls: one request through `Engine::answer` on the CPU engine
//! with a drafter gives plain decoding's tokens at every block size (greedy and seeded),
//! remembers auto mode's costs and the conversation's KV rows, stops on an interrupt, and
//! refuses a bad request with its typed code before anything runs; the answer's OpenAI
//! objects are shaped once.

use dflash_core::cpu::{CpuKernels, CpuModel};
use dflash_core::drafter::{CpuDrafter, DrafterPrecision, DrafterWeights};
use dflash_core::formats::ggml::GgmlType;
use dflash_core::generate::{Interrupt, Piece};
use dflash_core::model_files::load_gguf;
use dflash_core::testutil::{
    random_weights, tiny_drafter_target, write_drafter, write_gguf, DrafterSpec,
};
use dflash_engine::device::NativeHost;
use dflash_engine::errors::error_code;
use dflash_engine::request::{BlockArg, Endpoint, Request};
use dflash_engine::response::Reply;
use dflash_engine::{Answer, Engine, Job, Runner};
use serde_json::{json, Value};

/// The tiny target and a random drafter for it.
fn tiny_pair() -> (dflash_core::model_files::LoadedModel, DrafterWeights) {
    let c = tiny_drafter_target();
    let m = load_gguf(&write_gguf(&c, &random_weights(&c, 41), GgmlType::Q8_0)).unwrap();
    let files = write_drafter(&c, &DrafterSpec::new(&c, 2, 5));
    let cfg = std::str::from_utf8(&files["config.json"]).unwrap();
    let w = DrafterWeights::load(
        cfg,
        vec![("model.safetensors", &files["model.safetensors"][..])],
        DrafterPrecision::Q8,
    )
    .unwrap();
    (m, w)
}

/// The tiny target on the quantized CPU engine with a random drafter (its drafts are
/// rarely accepted: every step tests the rollback).
fn engine() -> Engine {
    let (m, w) = tiny_pair();
    let target = CpuModel::with_kernels(&m.weights, CpuKernels::Quantized);
    let drafter = CpuDrafter::with_kernels(&w, CpuKernels::Quantized);
    let runner = Runner::cpu(target, Some(drafter));
    Engine::new(runner, m.tokenizer, m.chat_template, 256, "cpu".into())
}

fn chat(extra: Value) -> Request {
    let mut v =
        json!({"messages": [{"role": "user", "content": "the hello world"}], "max_tokens": 24});
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    Request::chat(v).unwrap()
}

fn run(e: &mut Engine, req: &Request) -> (Answer, String) {
    let mut text = String::new();
    let a = e
        .answer_blocking(
            req,
            &Interrupt::default(),
            &NativeHost::default(),
            &mut |p| text.push_str(p.text),
        )
        .unwrap();
    (a, text)
}

#[test]
fn dflash_through_the_engine_gives_plain_decodings_tokens_at_every_block() {
    let mut e = engine();
    for sampling in [
        json!({"temperature": 0}),
        json!({"temperature": 0.8, "seed": 7}),
    ] {
        let mut plain_req = sampling.clone();
        plain_req["dflash"] = json!(false);
        let (plain, plain_text) = run(&mut e, &chat(plain_req));
        assert_eq!(plain.usage["dflash"]["enabled"], false);
        assert_eq!(plain_text, plain.result.text);
        for block in [json!(1), json!(4), json!("auto")] {
            let mut r = sampling.clone();
            r["block"] = block.clone();
            e.runner.forget_conversation();
            let (spec, text) = run(&mut e, &chat(r));
            assert_eq!(
                spec.result.tokens, plain.result.tokens,
                "{sampling} block {block}"
            );
            assert_eq!(text, plain_text);
            let d = spec.dflash().expect("DFlash ran");
            let label = block.as_str().map_or(block.to_string(), String::from);
            assert_eq!(d["block"], label.as_str());
        }
    }
    let costs = e.step_costs().expect("an auto request left its costs");
    assert_eq!(
        costs.len(),
        16 + 1,
        "costs of 0..=16 rows (the drafter's block)"
    );
}

#[test]
fn a_conversation_keeps_its_kv_rows_until_it_is_forgotten() {
    let mut e = engine();
    let req = chat(json!({"temperature": 0, "dflash": false}));
    let (first, _) = run(&mut e, &req);
    assert_eq!(first.usage["prompt_tokens_details"]["cached_tokens"], 0);
    let (again, _) = run(&mut e, &req);
    let cached = again.usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0, "the same prompt again reuses its rows");
    assert_eq!(again.result.tokens, first.result.tokens);
    e.runner.forget_conversation();
    let (fresh, _) = run(&mut e, &req);
    assert_eq!(fresh.usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(fresh.result.tokens, first.result.tokens);
}

#[test]
fn an_interrupted_request_ends_with_abort_and_the_engine_goes_on() {
    let mut e = engine();
    let req = chat(json!({"temperature": 0}));
    let stop = Interrupt::default();
    stop.set();
    let a = e
        .answer_blocking(&req, &stop, &NativeHost::default(), &mut |_| {})
        .unwrap();
    assert_eq!(a.finish_reason(), "abort");
    assert!(
        a.result.tokens.len() <= 1,
        "nothing after the prefill's token"
    );
    let (next, _) = run(&mut e, &req);
    assert_ne!(next.finish_reason(), "abort");
    assert!(!next.result.tokens.is_empty());
}

#[test]
fn bad_requests_get_their_codes_before_anything_runs() {
    let mut e = engine();
    let host = NativeHost::default();
    let code = |e: &mut Engine, r: Request| {
        let err = e
            .answer_blocking(&r, &Interrupt::default(), &host, &mut |_| {
                panic!("nothing is generated")
            })
            .err()
            .expect("refused");
        error_code(&err)
    };
    let job_code = |e: &mut Engine, block: BlockArg| {
        let g = chat(json!({})).to_generate(&e.tokenizer, e.chat_template.as_ref(), 256, 0);
        let job = Job {
            gen: &g.unwrap(),
            dflash: true,
            block: Some(&block),
        };
        let err = e.generate_blocking(&job, &host, &mut |_| panic!("nothing is generated"));
        error_code(&err.err().expect("refused"))
    };
    assert_eq!(
        job_code(&mut e, BlockArg::Named("big".into())),
        "BadRequest"
    );
    assert_eq!(job_code(&mut e, BlockArg::Rows(0)), "BadRequest");
    let long = json!({"messages": [{"role": "user", "content": "hello ".repeat(300)}]});
    assert_eq!(
        code(&mut e, Request::chat(long).unwrap()),
        "ContextOverflow"
    );
    let refused = |body: &str, endpoint| {
        let err = Request::from_body(body.as_bytes(), endpoint).unwrap_err();
        error_code(&err.into())
    };
    assert_eq!(refused("{not json", Endpoint::Chat), "BadRequest");
    assert_eq!(refused("[1]", Endpoint::Chat), "BadRequest");
    assert_eq!(
        refused(r#"{"max_tokens": 2}"#, Endpoint::Completion),
        "BadRequest"
    );
    assert_eq!(
        refused(r#"{"prompt": 3}"#, Endpoint::Completion),
        "BadRequest"
    );
    let block0 = r#"{"messages": [{"role": "user", "content": "x"}], "block": 0}"#;
    assert_eq!(refused(block0, Endpoint::Chat), "BadRequest");
    let big = r#"{"messages": [{"role": "user", "content": "x"}], "block": "big"}"#;
    assert_eq!(refused(big, Endpoint::Chat), "BadRequest");
}

#[test]
fn a_completion_prompt_is_tokenized_as_is() {
    let e = engine();
    let r = Request::from_body(
        br#"{"prompt": "the hello world", "max_tokens": 3, "seed": 4}"#,
        Endpoint::Completion,
    )
    .unwrap();
    let g = r
        .to_generate(&e.tokenizer, e.chat_template.as_ref(), e.context, 0)
        .unwrap();
    assert_eq!(
        g.prompt_ids,
        e.tokenizer.encode("the hello world", true).unwrap()
    );
    assert_eq!((g.max_new_tokens, g.sampling.seed), (3, 4));
}

#[test]
fn answers_are_shaped_as_openai_objects() {
    let mut e = engine();
    let req =
        chat(json!({"temperature": 0, "stream": true, "stream_options": {"include_usage": true}}));
    let (a, text) = run(&mut e, &req);
    let reply = Reply::new(&req, "chatcmpl-x".into(), 7, "m".into());
    let whole = reply.whole(&text, &a);
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(whole["choices"][0]["finish_reason"], a.finish_reason());
    assert_eq!(whole["usage"], a.usage);
    let first = reply
        .first_chunk()
        .expect("a chat stream opens with the role");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let piece = reply.piece_chunk(&Piece {
        text: "he",
        ids: &[3, 9],
        drafted: true,
        logprobs: &[],
        tool_calls: &[],
    });
    assert_eq!(piece["choices"][0]["delta"]["content"], "he");
    assert_eq!(
        piece["dflash"],
        json!({"drafted": true, "token_ids": [3, 9]})
    );
    let last = reply.last_chunks(&a);
    assert_eq!(last.len(), 2, "the finish, then include_usage's chunk");
    assert_eq!(last[0]["choices"][0]["finish_reason"], a.finish_reason());
    assert_eq!(last[1]["choices"], json!([]));
    assert_eq!(last[1]["usage"], a.usage);
    let raw = Request::from_body(br#"{"prompt": "hi"}"#, Endpoint::Completion).unwrap();
    let reply = Reply::new(&raw, "cmpl-x".into(), 7, "m".into());
    assert_eq!(reply.whole("yo", &a)["object"], "text_completion");
    assert_eq!(reply.whole("yo", &a)["choices"][0]["text"], "yo");
    assert!(reply.first_chunk().is_none());
}

/// `response_format` through the engine: JSON that parses, the same tokens with DFlash
/// at every block as without, a bad schema a BadRequest before anything is generated,
/// and unknown fields listed in the answer.
#[test]
fn response_format_constrains_the_answer_with_and_without_dflash() {
    let mut e = engine();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "maximum": 99}, "b": {"type": "boolean"}}, "required": ["a", "b"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": true}});
    for sampling in [
        json!({"temperature": 0}),
        json!({"temperature": 0.9, "seed": 3}),
    ] {
        let mut plain_req = sampling.clone();
        plain_req["dflash"] = json!(false);
        plain_req["response_format"] = format.clone();
        let (plain, text) = run(&mut e, &chat(plain_req));
        assert_eq!(plain.finish_reason(), "stop", "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["a"].as_u64().unwrap() <= 99 && v["b"].is_boolean(), "{v}");
        for block in [json!(4), json!(16), json!("auto")] {
            let mut r = sampling.clone();
            r["block"] = block.clone();
            r["response_format"] = format.clone();
            e.runner.forget_conversation();
            let (spec, _) = run(&mut e, &chat(r));
            assert_eq!(
                spec.result.tokens, plain.result.tokens,
                "{sampling} {block}"
            );
        }
    }
    let bad = chat(
        json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 3, "maximum": 1}}}}),
    );
    let err = e
        .answer_blocking(
            &bad,
            &Interrupt::default(),
            &NativeHost::default(),
            &mut |_| panic!("nothing is generated"),
        )
        .err()
        .unwrap();
    assert_eq!(error_code(&err), "BadRequest");
    assert!(err.to_string().contains("grammar"), "{err}");
    let req = chat(json!({"response_format": {"type": "json_object"}, "temprature": 1}));
    let (a, _) = run(&mut e, &req);
    let reply = Reply::new(&req, "x".into(), 0, "m".into());
    assert_eq!(
        reply.whole(&a.result.text, &a)["ignored_fields"],
        json!(["temprature"])
    );
    assert_eq!(
        reply.first_chunk().unwrap()["ignored_fields"],
        json!(["temprature"])
    );
}

/// `logprobs` in OpenAI's shapes: the whole answer's `choices[0].logprobs.content` (one
/// entry per token, `top_logprobs` most likely first), each streamed piece's own, and
/// the same figures with DFlash as without.
#[test]
fn logprobs_are_answered_in_openais_shapes_with_and_without_dflash() {
    let mut e = engine();
    let ask = json!({"logprobs": true, "top_logprobs": 3, "temperature": 0});
    let mut plain_req = ask.clone();
    plain_req["dflash"] = json!(false);
    let req = chat(plain_req);
    let reply = Reply::new(&req, "x".into(), 0, "m".into());
    let mut streamed = Vec::new();
    let a = e
        .answer_blocking(
            &req,
            &Interrupt::default(),
            &NativeHost::default(),
            &mut |p| {
                streamed.extend(
                    reply.piece_chunk(&p)["choices"][0]["logprobs"]["content"]
                        .as_array()
                        .unwrap()
                        .clone(),
                )
            },
        )
        .unwrap();
    let whole = reply.whole(&a.result.text, &a);
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), a.result.tokens.len());
    assert_eq!(
        content, streamed,
        "the pieces carry every token's entry once"
    );
    for c in &content {
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], c["token"], "greedy: the most likely");
        assert!(c["logprob"].as_f64().unwrap() <= 0.0);
        assert!(c["bytes"].is_array());
    }
    e.runner.forget_conversation();
    let (spec, _) = run(&mut e, &chat(ask));
    let spec_whole = reply.whole(&spec.result.text, &spec);
    assert_eq!(
        spec_whole["choices"][0]["logprobs"],
        whole["choices"][0]["logprobs"]
    );
    let none = chat(json!({}));
    let (a, _) = run(&mut e, &none);
    let r = Reply::new(&none, "x".into(), 0, "m".into());
    assert_eq!(
        r.whole(&a.result.text, &a)["choices"][0]["logprobs"],
        Value::Null
    );
}

/// The tiny engine with a chat template that renders tools in the Hermes format.
fn tool_engine() -> Engine {
    let mut e = engine();
    e.chat_template = Some(
        dflash_core::chat::ChatTemplate::new(
            dflash_core::testutil::HERMES_TOOLS_TEMPLATE,
            "",
            "<|im_end|>",
        )
        .unwrap(),
    );
    e
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["city", "days"], "additionalProperties": false}}}, {"type": "function", "function": {"name": "now"}}])
}

/// `tool_choice: "required"`: the answer is calls of the offered tools (arguments
/// within their schemas), `finish_reason: "tool_calls"`, the streamed deltas add up to
/// the whole answer's calls, DFlash gives the same tokens, and the calls fed back with
/// the tool's answer render through the template for a second turn.
#[test]
fn required_tool_calls_parse_stream_and_round_trip() {
    let mut e = tool_engine();
    let mut seen = 0;
    for seed in 1..=3 {
        let ask = json!({"tools": weather_tools(), "tool_choice": "required", "temperature": 0.9, "seed": seed, "max_tokens": 160, "dflash": false, "parallel_tool_calls": seed == 3});
        let req = chat(ask.clone());
        let reply = Reply::new(&req, "x".into(), 0, "m".into());
        let mut deltas = Vec::new();
        let a = e
            .answer_blocking(
                &req,
                &Interrupt::default(),
                &NativeHost::default(),
                &mut |p| {
                    let c = reply.piece_chunk(&p);
                    if let Some(calls) = c["choices"][0]["delta"]["tool_calls"].as_array() {
                        deltas.extend(calls.clone());
                    }
                },
            )
            .unwrap();
        if a.result.finish_reason != dflash_core::generate::FinishReason::Stop {
            eprintln!(
                "seed {seed}: {:?} {:?}",
                a.result.finish_reason, a.result.text
            );
            continue;
        }
        seen += 1;
        let whole = reply.whole(&a.result.text, &a);
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty());
        assert_eq!(deltas.len(), calls.len());
        for (d, c) in deltas.iter().zip(calls) {
            assert_eq!(d["function"], c["function"]);
            assert_eq!(d["id"], c["id"]);
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            match c["function"]["name"].as_str().unwrap() {
                "get_weather" => assert!((1..=3).contains(&args["days"].as_u64().unwrap())),
                "now" => assert!(args.is_object()),
                other => panic!("{other}"),
            }
        }
        let mut r = ask.clone();
        r["dflash"] = json!(true);
        r["block"] = json!(4);
        e.runner.forget_conversation();
        let (spec, _) = run(&mut e, &chat(r));
        assert_eq!(spec.result.tokens, a.result.tokens, "seed {seed}");
        // The second turn: the calls and a tool's answer go back through the template.
        let mut msgs = vec![json!({"role": "user", "content": "hi"})];
        msgs.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        for c in calls {
            msgs.push(json!({"role": "tool", "tool_call_id": c["id"], "content": "sunny"}));
        }
        let turn2 = Request::chat(json!({"messages": msgs, "max_tokens": 4})).unwrap();
        let g = turn2
            .to_generate(&e.tokenizer, e.chat_template.as_ref(), 256, 0)
            .unwrap();
        let prompt = e.tokenizer.decode(&g.prompt_ids, false).unwrap();
        assert!(
            prompt.contains("<tool_response>\nsunny\n</tool_response>"),
            "{prompt}"
        );
        let name = calls[0]["function"]["name"].as_str().unwrap();
        assert!(
            prompt.contains(&format!(
                "<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {{"
            )),
            "{prompt}"
        );
        run(&mut e, &turn2);
    }
    assert!(seen >= 2, "most answers end their calls within the budget");
}

#[test]
fn bad_tool_requests_name_their_place() {
    let mut e = tool_engine();
    let host = NativeHost::default();
    let code_of = |e: &mut Engine, extra: Value| {
        let mut v = json!({"messages": [{"role": "user", "content": "x"}]});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        let err = match Request::chat(v) {
            Err(e) => dflash_engine::Error::from(e),
            Ok(r) => e
                .answer_blocking(&r, &Interrupt::default(), &host, &mut |_| {
                    panic!("nothing is generated")
                })
                .err()
                .expect("refused"),
        };
        (error_code(&err), err.to_string())
    };
    for (extra, place) in [
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": 3, "maximum": 1}}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}),
            "tools[1].function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": weather_tools(), "response_format": {"type": "json_object"}}),
            "tools",
        ),
        (
            json!({"tools": weather_tools(), "tool_choice": "sometimes"}),
            "tool_choice",
        ),
    ] {
        let (code, msg) = code_of(&mut e, extra.clone());
        assert_eq!(code, "BadRequest", "{extra}: {msg}");
        assert!(msg.contains(place), "{extra}: {msg}");
    }
    let mut plain = engine();
    let (code, msg) = code_of(&mut plain, json!({"tools": weather_tools()}));
    assert_eq!(code, "BadRequest");
    assert!(msg.contains("renders no tool calls"), "{msg}");
}

/// A DFlash pair on the GPU engine (lavapipe in CI) answers a constrained request with
/// DFlash (a step's drafts read back, then its verify rows under their masks), giving
/// the tokens `dflash: false` gives.
#[test]
fn a_constrained_request_on_a_gpu_pair_gives_constrained_plain_decodings_tokens() {
    use dflash_engine::device::DeviceChoice;
    let (m, w) = tiny_pair();
    let opts = dflash_gpu::GpuOptions::default();
    let mut e = match Engine::on_device(m, Some(&w), DeviceChoice::Gpu, &opts, 256, &mut |_| {}) {
        Ok(e) => e,
        Err(err) if std::env::var("DFLASH_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("no GPU adapter: {err}");
            return;
        }
        Err(err) => panic!("{err}"),
    };
    assert!(matches!(e.runner, Runner::Spec(_)));
    let ask = json!({"response_format": {"type": "json_object"}, "temperature": 0});
    let (a, text) = run(&mut e, &chat(ask.clone()));
    assert_eq!(a.usage["dflash"]["enabled"], true);
    let mut off = ask;
    off["dflash"] = json!(false);
    e.runner.forget_conversation();
    let (b, _) = run(&mut e, &chat(off));
    assert_eq!(a.result.tokens, b.result.tokens);
    if a.finish_reason() == "stop" {
        assert!(
            serde_json::from_str::<Value>(&text).unwrap().is_object(),
            "{text}"
        );
    }
}

/// A schema keyword the grammar engine lacks: strict, a BadRequest naming it; not
/// strict, an answer that names it in `grammar_warnings` (never taken for held to it).
#[test]
fn unsupported_schema_keywords_are_refused_when_strict_and_reported_when_not() {
    let mut e = engine();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "if": {"required": ["a"]}, "then": {"required": ["a"]}});
    let format = |strict: bool| json!({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": strict}}, "temperature": 0});
    let err = e
        .answer_blocking(
            &chat(format(true)),
            &Interrupt::default(),
            &NativeHost::default(),
            &mut |_| {},
        )
        .err()
        .unwrap();
    assert_eq!(error_code(&err), "BadRequest");
    assert!(err.to_string().contains("\"if\""), "{err}");
    let req = chat(format(false));
    let (a, _) = run(&mut e, &req);
    assert!(
        a.grammar_warnings.iter().any(|w| w.contains("\"if\"")),
        "{:?}",
        a.grammar_warnings
    );
    let reply = Reply::new(&req, "x".into(), 0, "m".into());
    let whole = reply.whole(&a.result.text, &a);
    assert_eq!(whole["grammar_warnings"], json!(a.grammar_warnings));
    assert_eq!(
        reply.last_chunks(&a)[0]["grammar_warnings"],
        json!(a.grammar_warnings)
    );
}
