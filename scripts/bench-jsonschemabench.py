#!/usr/bin/env python3
"""JSONSchemaBench through `dflash serve`: a fixed sample of the benchmark's schemas
(the same per category: every k-th file in name order), each given to SmolLM2-135M with
its DFlash drafter (CPU engine) as `response_format: json_schema` with `strict: true`
(a keyword the grammar engine lacks is a 400 naming it; `--lenient` sends `strict:
false`, which ignores such keywords, so its answers may not validate), with a prompt
asking for an instance. Each answer is one of:
  valid    finish "stop" and the output validates against its schema (python jsonschema);
  invalid  finish "stop" but it does not validate (a defect: must be 0);
  length   the token budget ended it first (never claimed whole);
  refused  a 400 naming why the schema does not compile (an unsatisfiable schema, a
           feature not supported, a limit);
  error    anything else (a defect: must be 0).
The schemas are not ours to commit (the repository states no licence): the script reads
them from a checkout of github.com/guidance-ai/jsonschemabench (--data, default
$DFLASH_CACHE/evalsets/jsonschemabench, cloned there when missing).

  python3 scripts/bench-jsonschemabench.py [--per-category 24] [--max-tokens 384] [--out results/...]
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache/dflash"))
MODEL = CACHE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFTER = ROOT / "drafters/smollm2-135m-instruct-dflash-b16"
REPO = "https://github.com/guidance-ai/jsonschemabench"
PROMPT_SCHEMA_CHARS = 3000


def sample(data: Path, per_category: int):
    out = []
    for cat in sorted(p for p in (data / "data").iterdir() if p.is_dir()):
        files = sorted(cat.glob("*.json"))
        step = max(1, len(files) // per_category)
        out += [(cat.name, f) for f in files[::step][:per_category]]
    return out


def post(base, body, timeout=600):
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def judge(schema, status, answer):
    if status == 400:
        return "refused", answer["error"]["message"][:200]
    if status != 200:
        return "error", json.dumps(answer)[:200]
    choice = answer["choices"][0]
    text = choice["message"]["content"]
    if choice["finish_reason"] == "length":
        return "length", None
    try:
        instance = json.loads(text)
        validator = jsonschema.validators.validator_for(schema)(schema)
        errors = [e.message for e in validator.iter_errors(instance)]
    except json.JSONDecodeError as e:
        return "invalid", f"not JSON: {e}: {text[:100]}"
    except Exception as e:  # a schema python-jsonschema cannot check (remote $ref, ...)
        return "unverifiable", str(e)[:200]
    return ("valid", None) if not errors else ("invalid", errors[0][:200])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=CACHE / "evalsets/jsonschemabench")
    ap.add_argument("--per-category", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lenient", action="store_true",
                    help='"strict": false (keywords the grammar engine lacks are ignored: answers may not validate)')
    ap.add_argument("--only", nargs="*", help="category/file.json names to run (default: the sample)")
    a = ap.parse_args()
    if not (a.data / "data").is_dir():
        subprocess.run(["git", "clone", "--depth", "1", REPO, str(a.data)], check=True)
    schemas = sample(a.data, a.per_category)
    if a.only:
        schemas = [(c, a.data / "data" / c / f) for c, f in (x.split("/") for x in a.only)]
    server = subprocess.Popen([ROOT / "target/release/dflash", "serve", "--model", MODEL, "--drafter", DRAFTER,
                               "--device", "cpu", "--port", "0"], stderr=subprocess.PIPE, text=True)
    counts, rows = {}, []
    t0 = time.time()
    try:
        base = server.stderr.readline().strip().rsplit(" ", 1)[-1]
        for cat, path in schemas:
            text = path.read_text()
            schema = json.loads(text)
            prompt = ("Write one JSON value that follows this JSON schema. Answer with the JSON only.\n\n"
                      + text[:PROMPT_SCHEMA_CHARS])
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": a.max_tokens, "temperature": 0,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": not a.lenient}}}
            status, answer = post(base, body)
            outcome, why = judge(schema, status, answer)
            counts[outcome] = counts.get(outcome, 0) + 1
            rows.append({"category": cat, "file": path.name, "outcome": outcome, "why": why,
                         "tokens": answer.get("usage", {}).get("completion_tokens")})
            print(f"{len(rows)}/{len(schemas)} {cat}/{path.name}: {outcome} {why or ''}"[:160], file=sys.stderr)
    finally:
        server.kill()
        server.wait()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report = {"bench": "jsonschemabench", "commit": commit, "model": MODEL.name, "drafter": DRAFTER.name,
              "strict": not a.lenient,
              "schemas": len(schemas), "per_category": a.per_category, "max_tokens": a.max_tokens,
              "counts": counts, "seconds": round(time.time() - t0, 1), "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
    return 0 if counts.get("invalid", 0) == 0 and counts.get("error", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
