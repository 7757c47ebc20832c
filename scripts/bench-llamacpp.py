#!/usr/bin/env python3
"""llama.cpp's CPU prefill and decode speed on a GGUF, on the prompts `dflash bench` uses.

Setup (llama.cpp's server code, in-process):
    python3 -m pip install xllamacpp==2026.10.11549

Usage:
    python3 scripts/bench-llamacpp.py $(scripts/fetch-models.sh smollm2) \
        --prompts fixtures/prompts/chat20.jsonl --max-prompts 8 --max-new-tokens 32 --threads 2

Each prompt line is JSON with `chat` (one user message, rendered by the model's own chat
template through llama.cpp's /v1/chat/completions) or `prompt` (raw text, /completion).
Decoding is greedy, with no prompt-cache reuse between prompts (so prefill is measured
in full) and with EOS ignored, so every prompt decodes exactly --max-new-tokens tokens
(`ignore_eos_honoured` in the output says whether llama.cpp did). One warm-up request
runs first and is not counted. Speeds come from llama.cpp's own `timings`; prints one
JSON object.
"""
import argparse, json, urllib.request
import xllamacpp as x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", default="fixtures/prompts/chat20.jsonl")
    ap.add_argument("--max-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    with open(a.prompts) as f:
        rows = [json.loads(line) for line in f if line.strip()][: a.max_prompts]

    p = x.CommonParams()
    p.model.path = a.model
    p.n_ctx = 2048
    p.n_parallel = 1
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    p.n_gpu_layers = 0
    p.use_jinja = True
    p.cache_prompt = False
    p.cache_ram_mib = 0  # no host-side prompt cache either
    p.sampling.ignore_eos = True
    server = x.Server(p)
    base = server.listening_address

    def post(path, body):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req).read())

    common = {"max_tokens": a.max_new_tokens, "n_predict": a.max_new_tokens,
              "temperature": 0, "top_k": 1, "cache_prompt": False, "ignore_eos": True}

    def run(row):
        if "chat" in row:
            r = post("/v1/chat/completions",
                     {"messages": [{"role": "user", "content": row["chat"]}], **common})
        else:
            r = post("/completion", {"prompt": row["prompt"], **common})
        return r["timings"]

    run(rows[0])  # warm-up, not counted
    per = []
    for i, row in enumerate(rows):
        t = run(row)
        per.append({"id": row.get("id", str(i + 1)),
                    "prompt_n": t["prompt_n"], "prompt_ms": round(t["prompt_ms"], 3),
                    "prompt_tok_s": round(t["prompt_per_second"], 2),
                    "predicted_n": t["predicted_n"], "predicted_ms": round(t["predicted_ms"], 3),
                    "predicted_tok_s": round(t["predicted_per_second"], 2)})

    pn = sum(r["prompt_n"] for r in per)
    dn = sum(r["predicted_n"] for r in per)
    print(json.dumps({
        "engine": "llama.cpp", "xllamacpp": x.__version__, "threads": a.threads,
        "model": a.model, "prompts": len(per),
        "prefill_tokens": pn,
        "prefill_tok_s": round(pn / (sum(r["prompt_ms"] for r in per) / 1e3), 2),
        "decode_tokens": dn,
        "decode_tok_s": round(dn / (sum(r["predicted_ms"] for r in per) / 1e3), 2),
        "ignore_eos_honoured": all(r["predicted_n"] == a.max_new_tokens for r in per),
        "per_prompt": per,
    }))


if __name__ == "__main__":
    main()
