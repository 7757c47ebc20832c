#!/usr/bin/env python3
"""Structured output, tool calls and logprobs of `dflash serve` through the official
`openai` Python client.

SmolLM2 with its DFlash drafter (CPU engine): `chat.completions.parse` with a Pydantic
model (a strict `json_schema`) parses, with DFlash and without, to the same object; the
same schema streamed joins to the same text; `json_object`, a regex and a Lark grammar
(our `grammar` extension) keep to their grammars; `logprobs` with `top_logprobs` come
back in the client's types, equal with DFlash and without; bad grammars and tools are
`BadRequestError`s naming the place; unknown fields come back in `ignored_fields`.

Qwen2.5-Coder-0.5B-Instruct (its own template writes Hermes `<tool_call>`s): tool
calls non-streamed and streamed (the client's stream helper accumulates the deltas
into the same calls), `tool_choice` required and named, and a two-turn conversation
(the call and the tool's result sent back) answered in text. Prints one JSON line.

  python3 tests/serve/structured_client.py   (needs `pip install openai`)
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import openai
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DFLASH = ROOT / "target/release/dflash"
MODELS = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache/dflash")) / "models"
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN = MODELS / "Qwen2.5-Coder-0.5B-Instruct.gguf"
DRAFTER = ROOT / "drafters/smollm2-135m-instruct-dflash-b16"


class Cat(BaseModel):
    name: str
    age: int
    indoor: bool


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}]


def serve(model, drafter=None):
    args = [DFLASH, "serve", "--model", model, "--device", "cpu", "--port", "0"]
    if drafter:
        args += ["--drafter", drafter]
    server = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    base = server.stderr.readline().strip().rsplit(" ", 1)[-1]
    assert base.startswith("http://127.0.0.1:"), base
    return server, openai.OpenAI(base_url=f"{base}/v1", api_key="none")


def refused(call, place):
    try:
        call()
    except openai.BadRequestError as e:
        assert place in str(e), (place, str(e))
        return str(e)[:100]
    raise AssertionError(f"not refused: {place}")


def structured(client, seen):
    m = client.models.list().data[0].id
    ask = [{"role": "user", "content": "Describe a cat as JSON with its name, age and whether it is indoor."}]
    parsed = []
    for dflash in (True, False):
        r = client.chat.completions.parse(model=m, messages=ask, response_format=Cat, max_tokens=60,
                                          temperature=0, extra_body={"dflash": dflash, "block": 8})
        assert r.choices[0].finish_reason == "stop", r
        parsed.append((r.choices[0].message.parsed, r.choices[0].message.content))
    assert parsed[0] == parsed[1] and isinstance(parsed[0][0], Cat), parsed
    seen["parse"] = parsed[0][1]
    schema = {"type": "json_schema", "json_schema": {"name": "Cat", "schema": Cat.model_json_schema(), "strict": True}}
    chunks = list(client.chat.completions.create(model=m, messages=ask, response_format=schema, max_tokens=60,
                                                 temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert Cat.model_validate_json(streamed) == parsed[0][0], streamed
    r = client.chat.completions.create(model=m, messages=ask, response_format={"type": "json_object"},
                                       max_tokens=60, temperature=0.7, seed=3)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    phone = client.chat.completions.create(model=m, messages=[{"role": "user", "content": "Give a US phone number."}],
                                           max_tokens=20, temperature=0,
                                           extra_body={"grammar": {"type": "regex", "pattern": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"}})
    assert re.fullmatch(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", phone.choices[0].message.content), phone
    lark = 'start: "[" item (", " item)* "]"\nitem: /[a-z]{2,8}/'
    fruit = client.chat.completions.create(model=m, messages=[{"role": "user", "content": "List three fruits."}],
                                           max_tokens=40, temperature=0,
                                           extra_body={"grammar": {"type": "lark", "grammar": lark}, "surprise": 1})
    assert re.fullmatch(r"\[[a-z]{2,8}(, [a-z]{2,8})*\]", fruit.choices[0].message.content), fruit
    assert fruit.model_extra["ignored_fields"] == ["surprise"], fruit.model_extra
    seen["regex"], seen["lark"] = phone.choices[0].message.content, fruit.choices[0].message.content
    lps = []
    for dflash in (True, False):
        r = client.chat.completions.create(model=m, messages=ask, max_tokens=12, temperature=0, logprobs=True,
                                           top_logprobs=3, extra_body={"dflash": dflash})
        content = r.choices[0].logprobs.content
        assert len(content) == 12 and all(len(t.top_logprobs) == 3 for t in content), r
        assert all(t.token == t.top_logprobs[0].token for t in content), "greedy takes the most likely"
        lps.append([(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in content])
    assert lps[0] == lps[1], "logprobs with DFlash equal those without"
    seen["logprobs"] = lps[0][0]
    seen["bad_schema"] = refused(lambda: client.chat.completions.create(
        model=m, messages=ask, max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}),
        "grammar")
    seen["bad_regex"] = refused(lambda: client.chat.completions.create(
        model=m, messages=ask, max_tokens=4, extra_body={"grammar": {"type": "regex", "pattern": "(ab"}}), "grammar")
    seen["no_tools_template"] = refused(lambda: client.chat.completions.create(
        model=m, messages=ask, max_tokens=4, tools=WEATHER), "tool calls")


def tools(client, seen):
    m = client.models.list().data[0].id
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    r = client.chat.completions.create(model=m, messages=ask, tools=WEATHER, tool_choice="required", max_tokens=60,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", r
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"], call
    seen["tool_call"] = call.function.arguments
    with client.chat.completions.stream(model=m, messages=ask, tools=WEATHER, tool_choice="required",
                                        max_tokens=60, temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in streamed] == [(call.function.name, call.function.arguments)]
    assert final.choices[0].finish_reason == "tool_calls"
    named = client.chat.completions.create(model=m, messages=ask, tools=WEATHER, max_tokens=60, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    turn2 = ask + [choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    answer = client.chat.completions.create(model=m, messages=turn2, tools=WEATHER, tool_choice="none",
                                            max_tokens=40, temperature=0)
    text = answer.choices[0].message.content
    assert answer.choices[0].message.tool_calls is None and text, answer
    seen["two_turns"] = text[:80]
    seen["unknown_tool"] = refused(lambda: client.chat.completions.create(
        model=m, messages=ask, tools=WEATHER, max_tokens=4,
        tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name")
    seen["bad_parameters"] = refused(lambda: client.chat.completions.create(
        model=m, messages=ask, max_tokens=4,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "minLength": 5, "maxLength": 1}}}]),
        "tools[0].function.parameters")


def main():
    seen = {"openai": openai.__version__}
    for model, drafter, check in ((SMOL, DRAFTER, structured), (QWEN, None, tools)):
        server, client = serve(model, drafter)
        try:
            check(client, seen)
        finally:
            server.kill()
            server.wait()
    print(json.dumps(seen))


if __name__ == "__main__":
    sys.exit(main())
