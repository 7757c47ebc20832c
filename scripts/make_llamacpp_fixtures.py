#!/usr/bin/env python3
"""Makes the llama.cpp reference fixtures that the CPU reference is checked against.

Run once (the output is committed in fixtures/llamacpp/):
    python3 -m pip install xllamacpp==2026.10.11549
    python3 scripts/make_llamacpp_fixtures.py $(scripts/fetch-models.sh smollm2) fixtures/llamacpp/smollm2.json
    python3 scripts/make_llamacpp_fixtures.py $(scripts/fetch-models.sh qwen25-coder) fixtures/llamacpp/qwen25-coder.json

For one model it records, through llama.cpp's own server code:
  * tokenizer: ids of texts with unicode, code, whitespace runs and chat markup;
  * teacher_forced: a multi-turn chat rendered by llama.cpp's chat template, tokenized,
    and for each of the first POSITIONS prefixes the top-2 next tokens with their
    log-probabilities (margin = logit gap between them);
  * greedy: 3 chat prompts, 32 greedy tokens each, with the top-2 margin of every step.
"""
import json, sys, urllib.request
import xllamacpp as x

POSITIONS = 560

CONVERSATION = [
    {"role": "user", "content": "I'm planning a week-long trip to Kyoto in April. What should I know about the cherry blossom season, and how crowded does it get?"},
    {"role": "assistant", "content": "Cherry blossom season in Kyoto usually peaks in the first week of April, although the exact timing shifts from year to year with the weather. It is the busiest time of the year: popular spots such as the Philosopher's Path, Maruyama Park and Arashiyama fill up by mid-morning, and hotels are often booked months in advance. Arrive early in the day, visit smaller temples, and book your accommodation as soon as you can."},
    {"role": "user", "content": "Can you write a Python function that counts how often each word appears in a text file, ignoring case and punctuation?"},
    {"role": "assistant", "content": "Here is a simple version:\n\n```python\nimport re\nfrom collections import Counter\n\ndef word_counts(path):\n    with open(path, encoding=\"utf-8\") as f:\n        text = f.read().lower()\n    words = re.findall(r\"[a-z']+\", text)\n    return Counter(words)\n\nif __name__ == \"__main__\":\n    for word, n in word_counts(\"book.txt\").most_common(10):\n        print(f\"{word:>12} {n}\")\n```\n\nThe regular expression keeps letters and apostrophes, so \"don't\" stays one word."},
    {"role": "user", "content": "Explain the difference between a list and a tuple in Python, with a short example of when to use each."},
    {"role": "assistant", "content": "A list is mutable: you can append, remove or change its items after it is created. A tuple is immutable: once made, its contents cannot change. Use a list for a collection that grows, such as the lines you read from a file. Use a tuple for a fixed group of values, such as a point (x, y) or a date (2024, 3, 15); tuples can also be dictionary keys because they are hashable."},
    {"role": "user", "content": "Summarise the water cycle in four steps for a ten-year-old, and add one fun fact at the end."},
    {"role": "assistant", "content": "1. Evaporation: the sun warms oceans, lakes and puddles, and water turns into invisible vapour that rises into the air.\n2. Condensation: high up, the air is cold, so the vapour cools into tiny droplets that form clouds.\n3. Precipitation: when the droplets join together and get heavy, they fall as rain, snow or hail.\n4. Collection: the water gathers in rivers, lakes, oceans and underground, and the cycle starts again.\n\nFun fact: the water you drink today may once have been drunk by a dinosaur!"},
    {"role": "user", "content": "What are three good habits for writing maintainable code?"},
]

GREEDY_PROMPTS = [
    "What is the capital of France, and why is it famous?",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for sleeping better.",
]

TOKENIZER_TEXTS = [
    "Hello world",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\tnewlines\n\n\nand  multiple   spaces",
    "Unicode: café, naïve, Straße, Ελληνικά, русский, 日本語のテキスト, 中文, 한국어, emoji 🚀🎉👍🏽",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "Numbers: 3.14159 1234567890 1,000,000 -42 0x1F",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "I'm can't won't they'll we've it's",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "",
]


def main(model_path, out_path):
    p = x.CommonParams()
    p.model.path = model_path
    p.n_ctx = 4096
    p.n_parallel = 1
    p.cpuparams.n_threads = 2
    p.warmup = False
    p.use_jinja = True
    server = x.Server(p)
    base = server.listening_address

    def post(path, body):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req).read())

    def tokenize(text):
        return post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]

    def probs(resp):
        return resp.get("completion_probabilities") or resp["choices"][0]["logprobs"]["content"]

    out = {"llama_cpp": "xllamacpp " + x.__version__, "model": model_path.split("/")[-1]}
    out["tokenizer"] = [{"text": t, "ids": tokenize(t)} for t in TOKENIZER_TEXTS]

    text = post("/apply-template", {"messages": CONVERSATION})["prompt"]
    ids = tokenize(text)
    assert len(ids) > POSITIONS, f"conversation has only {len(ids)} tokens"
    ids = ids[: POSITIONS + 1]
    rows = []
    for i in range(1, POSITIONS + 1):
        r = post("/completion", {"prompt": ids[:i], "n_predict": 1, "n_probs": 2, "temperature": 0, "cache_prompt": True})
        top = probs(r)[0]["top_logprobs"]
        rows.append({"top1": top[0]["id"], "top2": top[1]["id"], "margin": round(top[0]["logprob"] - top[1]["logprob"], 4)})
    out["teacher_forced"] = {"text": text, "ids": ids, "rows": rows}

    greedy = []
    for q in GREEDY_PROMPTS:
        prompt = post("/apply-template", {"messages": [{"role": "user", "content": q}]})["prompt"]
        pids = tokenize(prompt)
        r = post("/completion", {"prompt": pids, "n_predict": 32, "n_probs": 2, "temperature": 0, "cache_prompt": False})
        steps = probs(r)
        greedy.append({
            "chat": q, "prompt": prompt, "prompt_ids": pids,
            "tokens": [s["id"] for s in steps],
            "margins": [round(s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"], 4) for s in steps],
        })
    out["greedy"] = greedy
    with open(out_path, "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path}: {len(rows)} teacher-forced positions, {len(greedy)} greedy prompts")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
