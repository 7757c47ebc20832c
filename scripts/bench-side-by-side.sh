#!/usr/bin/env bash
# Two `dflash` binaries measured side by side in one run: rounds alternate A and B, so
# both see the same machine load.
#   scripts/bench-side-by-side.sh OLD_DFLASH NEW_DFLASH [MODEL] [ROUNDS] [PROMPT_TOKENS]
# DEVICE=cpu: the quantized CPU engine (default: the GPU engine on the default adapter).
# DRAFTER=DIR: also each binary's DFlash step costs (`--block auto`'s measured
# step_costs, one-row steps per block size 1..16) on two chat prompts per round.
# Prints one JSON line per run and a summary: median decode and prefill tok/s of each,
# the ratio, and the median step costs.
set -euo pipefail
a=$1 b=$2
model=${3:-${DFLASH_CACHE:-$HOME/.cache/dflash}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${4:-3}
prompt=${5:-64}
device=${DEVICE:-gpu}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
out=$(mktemp)
for r in $(seq "$rounds"); do
  for which in a b; do
    bin=${!which}
    "$bin" bench --device "$device" --model "$model" --prompt-tokens "$prompt" --decode-tokens 32 --json |
      python3 -c 'import json,sys; v=json.load(sys.stdin); print(json.dumps({"which": sys.argv[1], "round": int(sys.argv[2]), "decode_tok_s": v["decode_tok_s"], "prefill_tok_s": v["prefill_tok_s"], "engine": v["adapter"]["name"] if "adapter" in v else v["cpu"]["kernel"]}))' "$which" "$r" |
      tee -a "$out"
    if [ -n "${DRAFTER:-}" ]; then
      "$bin" bench --device "$device" --model "$model" --drafter "$DRAFTER" --prompts fixtures/prompts/chat20.jsonl \
        --limit 2 --max-new-tokens 32 --block auto --json |
        python3 -c 'import json,sys; v=json.load(sys.stdin); v=v[0] if isinstance(v, list) else v; print(json.dumps({"which": sys.argv[1], "round": int(sys.argv[2]), "step_costs": v["step_costs"]}))' "$which" "$r" |
        tee -a "$out"
    fi
  done
done
python3 - "$out" "$a" "$b" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda w, k: statistics.median(r[k] for r in rows if r["which"] == w and k in r)
costs = lambda w: [round(statistics.median(c), 3) for c in zip(*(r["step_costs"] for r in rows if r["which"] == w and "step_costs" in r))]
summary = {
    "a": sys.argv[2], "b": sys.argv[3],
    "a_engine": next(r["engine"] for r in rows if r["which"] == "a" and "engine" in r),
    "b_engine": next(r["engine"] for r in rows if r["which"] == "b" and "engine" in r),
    "a_decode_tok_s": med("a", "decode_tok_s"), "b_decode_tok_s": med("b", "decode_tok_s"),
    "b_over_a_decode": med("b", "decode_tok_s") / med("a", "decode_tok_s"),
    "a_prefill_tok_s": med("a", "prefill_tok_s"), "b_prefill_tok_s": med("b", "prefill_tok_s"),
    "b_over_a_prefill": med("b", "prefill_tok_s") / med("a", "prefill_tok_s"),
}
if any("step_costs" in r for r in rows):
    summary["a_step_costs"], summary["b_step_costs"] = costs("a"), costs("b")
print(json.dumps(summary))
PY
rm -f "$out"
