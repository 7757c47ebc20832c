#!/usr/bin/env bash
# Plain decode of two `dflash` binaries measured side by side in one run, on the same
# adapter: rounds alternate A and B, so both see the same machine load.
#   scripts/bench-side-by-side.sh OLD_DFLASH NEW_DFLASH [MODEL] [ROUNDS] [PROMPT_TOKENS]
# Prints one JSON line per run and a summary: median decode tok/s of each, the ratio.
set -euo pipefail
a=$1 b=$2
model=${3:-${DFLASH_CACHE:-$HOME/.cache/dflash}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${4:-3}
prompt=${5:-64}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
out=$(mktemp)
for r in $(seq "$rounds"); do
  for which in a b; do
    bin=${!which}
    "$bin" bench --model "$model" --prompt-tokens "$prompt" --decode-tokens 32 --json |
      python3 -c 'import json,sys; v=json.load(sys.stdin); print(json.dumps({"which": sys.argv[1], "round": int(sys.argv[2]), "decode_tok_s": v["decode_tok_s"], "prefill_tok_s": v["prefill_tok_s"], "adapter": v["adapter"]["name"]}))' "$which" "$r" |
      tee -a "$out"
  done
done
python3 - "$out" "$a" "$b" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda w, k: statistics.median(r[k] for r in rows if r["which"] == w)
print(json.dumps({
    "a": sys.argv[2], "b": sys.argv[3], "adapter": rows[0]["adapter"],
    "a_decode_tok_s": med("a", "decode_tok_s"), "b_decode_tok_s": med("b", "decode_tok_s"),
    "b_over_a_decode": med("b", "decode_tok_s") / med("a", "decode_tok_s"),
    "a_prefill_tok_s": med("a", "prefill_tok_s"), "b_prefill_tok_s": med("b", "prefill_tok_s"),
}))
PY
rm -f "$out"
