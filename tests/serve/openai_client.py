#!/usr/bin/env python3
"""`dflash serve` against the official `openai` Python client and curl.

Starts `target/release/dflash serve` on SmolLM2 with its DFlash drafter (CPU engine,
port chosen by the server), then checks with the `openai` client: models.list; a chat
completion at T=0 whose text equals `dflash generate --json`'s greedy text, DFlash on and
off; the same streamed (deltas joined, usage in the last chunk); a legacy completion;
a bad request raising openai.BadRequestError with the server's message; a wrong API key
raising openai.AuthenticationError; every request of the client over one kept-alive
connection (the server's count of connections opened); and with curl the same
non-streamed answer. Prints one JSON line of what it saw.

  python3 tests/serve/openai_client.py   (needs `pip install openai`; curl)
"""
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
DFLASH = ROOT / "target/release/dflash"
MODEL = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache/dflash")) / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFTER = ROOT / "drafters/smollm2-135m-instruct-dflash-b16"
PROMPT = "Write a Python function that returns the n-th Fibonacci number."
N = 24


def greedy(how, text, n=N):
    out = subprocess.run([DFLASH, "generate", "--model", MODEL, how, text, "--max-new-tokens", str(n),
                          "--device", "cpu", "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["text"]


def main():
    server = subprocess.Popen([DFLASH, "serve", "--model", MODEL, "--drafter", DRAFTER, "--device", "cpu",
                               "--port", "0", "--api-key", "sk-local"], stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        base = line.strip().rsplit(" ", 1)[-1]
        assert base.startswith("http://127.0.0.1:"), line
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-local")
        seen = {"openai": openai.__version__}
        models = [m.id for m in client.models.list()]
        assert models == ["SmolLM2-135M-Instruct.Q4_1"], models
        want = greedy("--chat", PROMPT)
        messages = [{"role": "user", "content": PROMPT}]
        for dflash in (True, False):
            r = client.chat.completions.create(model=models[0], messages=messages, max_tokens=N, temperature=0,
                                               extra_body={"dflash": dflash, "block": 4})
            assert r.choices[0].message.content == want, (dflash, r.choices[0].message.content, want)
            assert r.usage.completion_tokens == N
            seen[f"dflash_{dflash}"] = r.usage.model_extra.get("dflash")
        # With the fields OpenAI clients send by default set explicitly, and include_usage.
        stream = client.chat.completions.create(model=models[0], messages=messages, max_tokens=N, temperature=0,
                                                stream=True, stream_options={"include_usage": True}, n=1,
                                                frequency_penalty=0, presence_penalty=0, user="u", logprobs=False)
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want, (text, want)
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == N, chunks[-1]
        # Our extension on each piece: its token ids, every generated token once.
        ids = [t for c in chunks for t in ((c.model_extra or {}).get("dflash") or {}).get("token_ids", [])]
        assert len(ids) == N, ids
        seen["stream_chunks"] = len(chunks)
        # Penalties run on the CPU engine: a different, still deterministic answer.
        pen = [client.chat.completions.create(model=models[0], messages=messages, max_tokens=N, temperature=0,
                                              frequency_penalty=1.5).choices[0].message.content for _ in range(2)]
        assert pen[0] == pen[1] and pen[0] != want, pen
        seen["frequency_penalty"] = "changes the answer"
        c = client.completions.create(model=models[0], prompt="def fib(n):", max_tokens=8, temperature=0)
        assert c.choices[0].text == greedy("--prompt", "def fib(n):", 8), c.choices[0].text
        try:
            client.chat.completions.create(model=models[0], messages=[], max_tokens=4)
            raise AssertionError("an empty conversation was answered")
        except openai.BadRequestError as e:
            assert "messages" in str(e), e
            seen["bad_request"] = str(e)[:120]
        # Everything above went over one connection (the client keeps it alive).
        metrics = urllib.request.urlopen(f"{base}/metrics").read().decode()
        opened = int(next(l for l in metrics.splitlines() if l.startswith("dflash_connections_opened_total")).split()[-1])
        # (this request's one, and the client's: one, or two where it set one aside)
        assert opened <= 3, metrics
        seen["connections_for_9_requests"] = opened - 1
        try:
            openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0).models.list()
            raise AssertionError("a wrong key was let in")
        except openai.AuthenticationError as e:
            seen["wrong_key"] = e.status_code
        body = json.dumps({"messages": messages, "max_tokens": N, "temperature": 0})
        out = subprocess.run(["curl", "-sS", "-H", "Authorization: Bearer sk-local", "-H", "Content-Type: application/json", "-d", body,
                              f"{base}/v1/chat/completions"], check=True, capture_output=True, text=True).stdout
        assert json.loads(out)["choices"][0]["message"]["content"] == want
        seen["curl"] = "ok"
        print(json.dumps(seen))
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
