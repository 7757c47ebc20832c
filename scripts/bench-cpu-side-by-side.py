#!/usr/bin/env python3
"""Our CPU engine against llama.cpp on the same GGUF, prompts, token count and threads,
in one run: prints one JSON object with both engines' prefill and decode speeds and
their ratios (ours / llama.cpp), and, when a drafter is given, `dflash bench --device
cpu` on the same prompts: plain against DFlash (`--block auto`) in one process.

Setup: `cargo build --release -p dflash-cli` and, for llama.cpp,
    python3 -m pip install xllamacpp==2026.10.11549

Usage:
    python3 scripts/bench-cpu-side-by-side.py $(scripts/fetch-models.sh smollm2) \
        --drafter drafters/smollm2-135m-instruct-dflash-b16 --threads 2 > results/cpu-side-by-side.json

Ours: `dflash generate --device cpu --json` per prompt (greedy; its own prefill/decode
timings, the model load excluded), RAYON_NUM_THREADS=--threads; DFlash: `dflash bench
--device cpu --drafter D --prompts P --block auto --json` (plain and DFlash decode of the
same prompts in the same run; the speedup is the ratio inside that run). llama.cpp:
scripts/bench-llamacpp.py with the same prompts and threads (EOS ignored). Ours stops at
EOS, so its token counts can be lower; speeds are rates either way.
"""
import argparse, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(a):
    return dict(os.environ, RAYON_NUM_THREADS=str(a.threads), XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))


def ours(a, prompts):
    pre_tok = pre_s = dec_tok = dec_s = 0.0
    for p in prompts:
        cmd = [os.path.join(ROOT, "target/release/dflash"), "generate", "--model", a.model, "--device", "cpu",
               "--chat", p["chat"], "--max-new-tokens", str(a.max_new_tokens), "--json"]
        r = json.loads(subprocess.run(cmd, env=env(a), check=True, capture_output=True, text=True).stdout)
        t = r["timings"]
        pre_tok += r["prompt_tokens"]
        pre_s += t["prefill_s"]
        dec_tok += max(r["completion_tokens"] - 1, 0)
        dec_s += t["decode_s"]
    return {"prefill_tokens": int(pre_tok), "prefill_tok_s": pre_tok / pre_s, "decode_tokens": int(dec_tok), "decode_tok_s": dec_tok / dec_s}


def ours_dflash(a):
    cmd = [os.path.join(ROOT, "target/release/dflash"), "bench", "--device", "cpu", "--model", a.model,
           "--drafter", a.drafter, "--prompts", a.prompts, "--limit", str(a.max_prompts),
           "--max-new-tokens", str(a.max_new_tokens), "--block", "auto", "--json"]
    r = json.loads(subprocess.run(cmd, env=env(a), check=True, capture_output=True, text=True).stdout)
    keep = ("block", "cpu", "step_costs", "plain_tok_s", "dflash_tok_s", "speedup", "mean_tau", "steps", "lossless")
    return {k: r[k] for k in keep}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "fixtures/prompts/chat20.jsonl"))
    ap.add_argument("--max-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter")
    ap.add_argument("--python", default=sys.executable, help="a Python with xllamacpp")
    a = ap.parse_args()
    prompts = [json.loads(l) for l in open(a.prompts) if l.strip()]
    prompts = [p for p in prompts if "chat" in p][: a.max_prompts]
    llama = json.loads(subprocess.run(
        [a.python, os.path.join(ROOT, "scripts/bench-llamacpp.py"), a.model, "--prompts", a.prompts,
         "--max-prompts", str(a.max_prompts), "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads)],
        check=True, capture_output=True, text=True).stdout)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"commit": commit, "model": a.model, "threads": a.threads, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
           "llama_cpp": {k: llama[k] for k in ("xllamacpp", "prefill_tokens", "prefill_tok_s", "decode_tokens", "decode_tok_s", "ignore_eos_honoured")},
           "ours_plain": ours(a, prompts)}
    res["ratio_plain"] = {"prefill": res["ours_plain"]["prefill_tok_s"] / llama["prefill_tok_s"],
                          "decode": res["ours_plain"]["decode_tok_s"] / llama["decode_tok_s"]}
    if a.drafter:
        res["ours_dflash_bench"] = ours_dflash(a)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
